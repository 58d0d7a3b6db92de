"""Errors for graphs the TFLite writer cannot express: the ATen op, the user's line, and what to use instead."""
import os
import re
from pathlib import Path
from typing import Any, List, Optional

from edgedyn.errors import BackendError

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_EDGEDYN = str(Path(__file__).resolve().parents[2])


class Unsupported(Exception):
    """Raised by an op converter for a case it cannot express; the lowering adds the op and source line."""


def source_line(node: Any) -> Optional[str]:
    """The innermost line of the user's own code that produced `node`, as `file:line in function: code`."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if not _is_library(f[0])]
    if not frames:
        return None
    path, line, function, code = frames[-1]
    return "{}:{} in {}: {}".format(_relative(path), line, function, code.strip())


def _is_library(path: str) -> bool:
    resolved = str(Path(path).resolve()) if os.path.isabs(path) else path
    parts = Path(resolved).parts
    return resolved.startswith(_EDGEDYN + os.sep) or "site-packages" in parts or "dist-packages" in parts or (
        "torch" in parts and "lib" in parts)


def _relative(path: str) -> str:
    """Relative to the working directory when the file is below it, as the user would type it."""
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return path if relative.startswith(os.pardir) else relative


def op_name(node: Any) -> str:
    """`aten.grid_sampler_2d.default` for an OpOverload target, the function name otherwise."""
    return str(node.target) if hasattr(node.target, "_schema") else getattr(node.target, "__name__", str(node.target))


def unsupported_error(node: Any, reason: str, others: List[str], alternatives: List[str]) -> BackendError:
    """The error for the first node the writer cannot express, naming the others of the graph too."""
    where = source_line(node)
    # torch.export records lines inside nn.Module.forward methods only: a plain function's nodes have none.
    message = "the tflite backend cannot express {} ({}), at {}".format(
        op_name(node), reason, where or "graph node '{}' (no source line recorded)".format(node.name))
    if others:
        message += "; this graph also uses: {}".format(", ".join(others))
    if alternatives:
        hint = "backends that support it: {}; export with --backend {}".format(
            ", ".join(alternatives), alternatives[0])
    else:
        hint = "rewrite that line with supported ops"
    return BackendError(message, hint=hint + " (TFLite's op list: docs/tflite.md)")
