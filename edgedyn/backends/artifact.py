"""What a backend is given (`Build`) and what it returns (`Artifact`), and an executor over an artifact before any
bundle exists (for `auto`'s checks and the int8 accuracy measurement)."""
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from edgedyn.boards import Board, Target
from edgedyn.runtime.executors import executor_class
from edgedyn.runtime.format import MemoryBundle


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
    # What an int8 candidate's gate measured where it computes (here, or on the emulated board: onboard.py), as
    # quantize.plan.measure returns it: the export records these numbers rather than running the held-out split
    # again (exporter.py).
    measured: Optional[Dict[str, Any]] = field(default=None, compare=False, repr=False)
    # An fp32 artifact the bundle carries after this reduced-precision one, for CPUs without its feature
    # (selection._fp32_fallback); the exporter writes it as the specialization's next artifact.
    fallback: Optional["Artifact"] = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Build:
    """Everything a backend's `lower` receives for one specialization; backends read what applies to them."""

    program: Any  # the pass-optimized torch.export.ExportedProgram
    board: "Board"
    target: "Target"
    tensor_inputs: List[str]  # names of the tensor inputs, in the order the executor receives them
    precision: str = "fp32"  # "fp16": GPU artifacts compute in half precision
    quantization: Optional[Any] = None  # an edgedyn.quantize.Quantization (backends with quantizes=True)
    reference: Optional[bytes] = None  # reference .npz (inputs and torch outputs), for accuracy measured in a build
    tuning: bool = True  # False: build without the target's tuning records (a tuned build that disagreed)
    fp32_share: float = 0.0  # a reduced precision's first layers kept in fp32, as a share (backends that `mix`)
    fp32_layers: Tuple[str, ...] = ()  # the named layers kept in fp32 in a reduced precision (backends that `probe`)


@contextmanager
def open_executor(artifact: Artifact, threads: Optional[int] = None) -> Iterator[Tuple[Any, Dict[str, Any]]]:
    """(the runtime's executor over an artifact's files before any bundle exists, its manifest record); `threads`
    as the runtime's `load(threads=...)` takes it (None: the runtime's default)."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-artifact-") as workdir:
        names = {role: "{}/{}".format(role, artifact.file_names[role]) for role in artifact.files}
        files = MemoryBundle({names[role]: data for role, data in artifact.files.items()}, workdir)
        record = dict(artifact.meta, backend=artifact.backend, executor=artifact.executor, device=artifact.device,
                      arch=artifact.arch, target=artifact.target, files=names)
        yield executor_class(artifact.executor)(files, record, {"threads": threads}), record

