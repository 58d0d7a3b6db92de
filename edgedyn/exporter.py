"""`edgedyn.export`: capture -> passes -> backend -> bundle, for one board. The CLI's export command calls this."""
import datetime
import platform
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

import edgedyn
from edgedyn.backends import Artifact, get_backend
from edgedyn.boards import Board, load_board
from edgedyn.bundle import BundleWriter
from edgedyn.errors import BackendError
from edgedyn.frontend import Captured, Specialization, capture
from edgedyn.passes import PIPELINES, run_pipeline
from edgedyn.passes.graph import op_count
from edgedyn.runtime.format import SUFFIX, host_arch, pack_arrays

Progress = Callable[[str], None]


def export(model: Any, example_inputs: Any = None, *, board: str = "x86-64",
           output: Optional[Union[str, Path]] = None, backend: str = "tvm", inputs: Optional[Sequence[str]] = None,
           pipeline: str = "default", verify: bool = True, progress: Optional[Progress] = None) -> Path:
    """Exports `model` for `board` into one bundle file and returns its path.

    `model`: an nn.Module (instance, class or zero-argument factory), a function, or "path.py:name".
    `example_inputs`: a tuple or dict of inputs, or a list of them for several specializations;
    `inputs`: `--input` strings instead (e.g. ["x=1x3x224x224", "x=8x3x224x224"]).
    With `verify`, a bundle this machine can run is checked against torch eager before it is returned.
    """
    step = progress or (lambda message: None)
    target_board = load_board(board)
    lower = get_backend(backend)
    target = target_board.target("cpu")
    step("capturing {}".format(model if isinstance(model, str) else getattr(model, "__name__", type(model).__name__)))
    captured = capture(model, example_inputs, inputs=inputs)
    writer = BundleWriter()
    records = []
    for index, spec in enumerate(captured.specializations):
        step("optimizing {} ({})".format(spec.name, pipeline))
        optimized = run_pipeline(spec.program, pipeline)
        step("building {} with {} for {}".format(spec.name, backend, target.name))
        artifact = lower(optimized, target_board, target, spec.tensor_inputs)
        records.append(_specialization_record(writer, index, spec, optimized, artifact))
    path = Path(output) if output else Path("{}-{}{}".format(captured.name, target_board.name, SUFFIX))
    step("writing {}".format(path))
    writer.write(path, _manifest(captured, target_board, records, model, pipeline))
    if verify and all(a["arch"] in (None, host_arch()) for r in records for a in r["artifacts"]):
        step("verifying {} on this machine".format(path.name))
        _verify_or_fail(path)
    return path


def _specialization_record(writer: BundleWriter, index: int, spec: Specialization, optimized: Any,
                           artifact: Artifact) -> Dict[str, Any]:
    prefix = "specs/{}".format(index)
    files = {role: writer.add("{}/{}-{}/{}".format(prefix, artifact.backend, artifact.device,
                                                   artifact.file_names[role]), data)
             for role, data in sorted(artifact.files.items())}
    reference = {"input." + name: tensor.numpy() for name, tensor in zip(spec.tensor_inputs, spec.example_tensors)}
    reference.update({"output.{}".format(i): array for i, array in enumerate(spec.reference_outputs)})
    return {
        "name": spec.name,
        "guards": spec.guards,
        "inputs": [_tensor_record(name, tensor.numpy()) for name, tensor in zip(spec.tensor_inputs, spec.example_tensors)],
        "constants": spec.constants,
        "outputs": [_tensor_record("output_{}".format(i), array) for i, array in enumerate(spec.reference_outputs)],
        "output_tree": spec.output_tree,
        "graph": {"ops_captured": op_count(spec.program.graph_module), "ops_optimized": op_count(optimized.graph_module)},
        "artifacts": [dict(artifact.meta, backend=artifact.backend, executor=artifact.executor, device=artifact.device,
                           arch=artifact.arch, target=artifact.target, files=files)],
        "reference": writer.add("{}/reference.npz".format(prefix), pack_arrays(reference)),
    }


def _tensor_record(name: str, array: np.ndarray) -> Dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "dtype": str(array.dtype)}


def _manifest(captured: Captured, board: Board, records: List[Dict[str, Any]], model: Any,
              pipeline: str) -> Dict[str, Any]:
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "producer": _producer_versions(),
        "model": {"name": captured.name, "source": model if isinstance(model, str) else captured.name},
        "board": board.to_dict(),
        "signature": captured.signature,
        "pipeline": {"name": pipeline, "passes": [p.__name__ for p in PIPELINES[pipeline]]},
        "specializations": records,
    }


def _producer_versions() -> Dict[str, str]:
    import torch

    versions = {"edgedyn": edgedyn.__version__, "torch": torch.__version__, "numpy": np.__version__,
                "python": platform.python_version()}
    if "tvm" in sys.modules:
        versions["tvm"] = sys.modules["tvm"].__version__
    return versions


def _verify_or_fail(path: Path) -> None:
    from edgedyn.runtime import load

    failed = [r for r in load(path).verify() if not r["ok"]]
    if failed:
        worst = failed[0]
        raise BackendError(
            "the exported artifact disagrees with torch eager on {} output {}: max abs error {:.3g}, "
            "relative {:.3g} (tolerance rtol {})".format(worst["specialization"], worst["output"], worst["max_abs"],
                                                      worst["max_rel"], worst.get("rtol")),
            hint="this is a backend bug; try another --backend and report it with EDGEDYN_DEBUG=1 output",
        )
