"""Backends turn a pass-optimized ExportedProgram into artifact files for one target.

Each backend module has `lower(program, board, target, tensor_inputs) -> Artifact`; BACKENDS maps the names users
type to those functions, imported only when used (a backend may need a heavy optional package).
"""
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from edgedyn.errors import EdgedynError

BACKENDS = {
    "onnxruntime": "edgedyn.backends.onnxruntime:lower",
    "portable": "edgedyn.backends.portable:lower",
    "tflite": "edgedyn.backends.tflite:lower",
    "tvm": "edgedyn.backends.tvm:lower",
}


@dataclass
class Artifact:
    """What a backend produced for one specialization: member files plus the manifest fields the executor reads."""

    backend: str
    executor: str
    device: str  # "cpu" or "cuda"
    arch: Optional[str]  # CPU architecture the files need, None when portable
    target: str
    files: Dict[str, bytes]  # role -> content, e.g. {"library": b"\x7fELF...", "weights": b"PK..."}
    file_names: Dict[str, str]  # role -> file name inside the bundle, e.g. {"library": "model.so"}
    meta: Dict[str, Any] = field(default_factory=dict)


def get_backend(name: str) -> Callable[..., Artifact]:
    """The lowering function of a backend, with the valid names listed when `name` is unknown."""
    if name not in BACKENDS:
        raise EdgedynError("unknown backend '{}'; choose from: {}".format(name, ", ".join(sorted(BACKENDS))))
    module_name, function = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), function)
