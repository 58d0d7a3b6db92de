"""Backends turn a pass-optimized ExportedProgram into artifact files for one target.

Each backend module has `lower(program, board, target, tensor_inputs) -> Artifact`; BACKENDS maps the names users
type to those functions, imported only when used (a backend may need a heavy optional package).
"""
import importlib
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from edgedyn.errors import EdgedynError
from edgedyn.runtime.executors import executor_class
from edgedyn.runtime.format import MemoryBundle

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


@contextmanager
def open_executor(artifact: Artifact) -> Iterator[Tuple[Any, Dict[str, Any]]]:
    """(the runtime's executor over an artifact's files before any bundle exists, its manifest record)."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-artifact-") as workdir:
        names = {role: "{}/{}".format(role, artifact.file_names[role]) for role in artifact.files}
        files = MemoryBundle({names[role]: data for role, data in artifact.files.items()}, workdir)
        record = dict(artifact.meta, backend=artifact.backend, executor=artifact.executor, device=artifact.device,
                      arch=artifact.arch, target=artifact.target, files=names)
        yield executor_class(artifact.executor)(files, record, {"threads": None}), record
