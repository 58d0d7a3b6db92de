"""`edgedyn.export`: capture -> passes -> backend -> bundle, for one board. The CLI's export command calls this."""
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgedyn.registry import AUTO, BACKENDS, check_backend_name, get_backend, gpu_backends
from edgedyn.backends.artifact import Artifact, Build, open_executor
from edgedyn.boards import Board, Target, load_board
from edgedyn.bundle import BundleWriter
from edgedyn.errors import EdgedynError
from edgedyn.frontend import Captured, Specialization, capture
from edgedyn.frontend.buckets import parse_pad
from edgedyn.frontend.padding import prove_padding
from edgedyn.frontend.preprocess import parse_preprocess, preprocess_record
from edgedyn.passes import PIPELINES, run_pipeline
from edgedyn.passes.graph import op_count
from edgedyn.runtime.format import SUFFIX, host_arch, pack_arrays
from edgedyn.runtime.choice import unusable_reason
from edgedyn.runtime.program import DEVICES
from edgedyn.selection import choose
from edgedyn.version import __version__

Progress = Callable[[str], None]


def export(model: Any, example_inputs: Any = None, *, board: str = "x86-64",
           output: Optional[Union[str, Path]] = None, backend: str = AUTO, inputs: Optional[Sequence[str]] = None,
           pipeline: str = "default", device: str = "auto", precision: str = "auto", verify: bool = True,
           progress: Optional[Progress] = None, quantize: Optional[str] = None, calibration: Any = None,
           eval_inputs: Any = None, max_accuracy_drop: Optional[str] = None, pad: Any = None,
           pad_side: str = "right", nms: Any = None, preprocess: Any = None) -> Path:
    """Exports `model` for `board` into one bundle file and returns its path.

    `model`: an nn.Module (instance, class or zero-argument factory), a function, or "path.py:name".
    `example_inputs`: a tuple or dict of inputs, or a list of them for several specializations;
    `inputs`: `--input` strings instead (e.g. ["x=1x3x224x224", "x=8x3x224x224"]).
    `backend`: a registered backend, or "auto" to measure them here or follow the board's preference
    (edgedyn/selection.py). `device`: on a board with a GPU, "auto" bundles GPU code first and the CPU artifact
    as the fallback the runtime uses when the GPU cannot run; "gpu" or "cpu" builds only that one.
    `precision`: "auto" builds fp32 and every reduced float precision a backend computes natively on this CPU
    (bf16, fp16) and keeps a reduced one only when it passes the accuracy gate (`max_accuracy_drop`, default
    cosine 0.999 on `eval_inputs` or inputs drawn like the examples) and is faster; "fp32" keeps exact fp32;
    "bf16" / "fp16" only that one (edgedyn/quantize/precision.py). On a board with a GPU, "fp16" computes the GPU
    artifacts in half precision (accuracy recorded in the manifest).
    With `verify`, a bundle this machine can run is checked against torch eager before it is returned.
    `quantize`: "int8" (static, needs `calibration`: a folder of .npy, an .npz, "path.py:fn", an iterable of
    input tuples, or "random") or "int8-weights"; accuracy against torch eager on `eval_inputs` (default: a
    held-out share of the calibration data) is recorded, and `max_accuracy_drop` ("top1=1%", "cosine=0.99")
    fails the export when missed (edgedyn/quantize/).
    `pad`: for inputs given with bucket sizes (`inputs=["input_ids=1x{16,32,64}:int64"]`), the value each is padded
    with ("input_ids=0,attention_mask=0" or a dict), on the `pad_side` ("right" or "left") of the bucketed
    dimension; padding is proven exact against torch eager here, or refused (docs/buckets.md).
    `nms`: "iou=0.45,conf=0.25,max_det=300" (or an NmsOptions) appends NMS to a raw detection head such as
    YOLO's; the bundle then returns boxes, scores, labels and count (edgedyn/frontend/detection.py).
    `preprocess`: "letterbox" or "stretch,normalize=imagenet" (edgedyn/frontend/preprocess.py): the bundle then also takes
    uint8 camera frames of any size up to a bound, resizes and scales them itself, and returns detections in the
    frame's pixels (edgedyn/runtime/frames.py).
    """
    from edgedyn.quantize import plan as quantize_plan
    from edgedyn.quantize.precision import check_precision, float_gate

    step = progress or (lambda message: None)
    target_board = load_board(board)
    check_backend_name(backend)
    check_precision(precision)
    quantizing = quantize_plan.plan(quantize, backend, device, calibration, eval_inputs, max_accuracy_drop,
                                    precision=precision)
    target = target_board.target("cpu")
    gpu_target = None if quantizing else _gpu_target(target_board, backend, device, precision)
    # --precision fp16 on a board with a GPU is the GPU's; its CPU fallback keeps what auto finds for that CPU.
    cpu_precision = "auto" if gpu_target is not None and precision == "fp16" else precision
    _check_precision_available(backend, target_board, cpu_precision, quantizing)
    step("capturing {}".format(model if isinstance(model, str) else getattr(model, "__name__", type(model).__name__)))
    frame_options = parse_preprocess(preprocess)  # checked before the capture's work
    captured = capture(model, example_inputs, inputs=inputs, nms=nms)
    prove_padding(captured, parse_pad(pad, pad_side), step)
    frames = None if frame_options is None else preprocess_record(frame_options, captured.signature, [
        {name: (tuple(t.shape), str(t.numpy().dtype)) for name, t in zip(s.tensor_inputs, s.example_tensors)}
        for s in captured.specializations])
    writer = BundleWriter()
    records = []
    for index, spec in enumerate(captured.specializations):
        step("optimizing {} ({})".format(spec.name, pipeline))
        optimized = run_pipeline(spec.program, pipeline)
        artifacts, no_gpu_code = [], None
        if gpu_target is not None:
            gpu, no_gpu_code = _gpu_artifact(optimized, target_board, gpu_target, spec,
                                             "fp16" if precision == "fp16" else "fp32", device, backend, step)
            artifacts += [gpu] if gpu is not None else []
        accuracy = None if cpu_precision == "fp32" else float_gate(
            spec, eval_inputs if quantizing is None else None, max_accuracy_drop)
        probe = _probe(captured, target_board, spec, optimized, model, pipeline)
        if device != "gpu":
            kept = choose(backend, optimized, target_board, target, spec, progress=step, precision=cpu_precision,
                          accuracy=accuracy, probe=probe) if quantizing is None else _quantized_artifact(
                quantizing, backend, optimized, target_board, target, spec, step, cpu_precision, accuracy, probe)
            artifacts += [kept] + ([kept.fallback] if kept.fallback is not None else [])  # for CPUs without bf16
        records.append(_specialization_record(writer, index, spec, optimized, artifacts))
        if no_gpu_code is not None:
            records[-1]["no_gpu_code"] = no_gpu_code
    path = Path(output) if output else Path("{}-{}{}".format(captured.name, target_board.name, SUFFIX))
    step("writing {}".format(path))
    buckets = [bucket_record(writer, number, group) for number, group in enumerate(captured.buckets)]
    fit = _check_fit(target_board, records, writer, buckets)
    runnable = all(any(unusable_reason(a, host_arch(), "auto") is None for a in r["artifacts"]) for r in records)
    manifest = dict(_manifest(captured, target_board, records, model, pipeline), fit=fit)
    if buckets:
        manifest["buckets"] = buckets
    if frames is not None:
        manifest["preprocess"] = frames
    _write_verified(writer, path, manifest, verify and runnable, step)
    return path


def _write_verified(writer: BundleWriter, path: Path, manifest: Dict[str, Any], verify: bool, step: Progress) -> None:
    """Writes the bundle under a temporary name, verifies it when asked, and only then gives it its name: a bundle
    that disagrees with torch eager is never left behind (nor does it replace an older good one)."""
    staging = path.parent / ".{}.{}.partial{}".format(path.name, os.getpid(), SUFFIX)
    writer.write(staging, manifest)
    try:
        if verify:
            step("verifying {} on this machine".format(path.name))
            _verify_or_fail(staging, path.name)
        os.replace(str(staging), str(path))
    except BaseException:
        if staging.exists():
            staging.unlink()
        raise


def _quantized_artifact(quantizing: Any, backend: str, program: Any, board: Board, target: Target,
                        spec: Specialization, step: Progress, precision: str, accuracy: Any, probe: Any) -> Artifact:
    """The CPU artifact with int8 kernels, measured against torch eager and held to the accuracy gate (or, under
    auto, the faster fp32 or reduced-precision artifact: selection.py)."""
    from edgedyn.quantize import plan as quantize_plan

    step("quantizing {} ({})".format(spec.name, quantizing.mode))
    artifact = choose(backend, program, board, target, spec, progress=step,
                      quantization=quantizing.quantization(spec), precision=precision, accuracy=accuracy, probe=probe)
    if "quantization" not in artifact.meta:
        return artifact  # `auto` kept a float artifact, with fewer instructions or faster than every int8 one
    found = artifact.measured  # what its gate measured, here or on the emulated board
    if found is None:
        step("measuring {} int8 accuracy against torch eager".format(artifact.backend))
        with open_executor(artifact) as (executor, _):
            found = quantize_plan.measure(quantizing, spec, executor.run)
    return quantize_plan.finish(quantizing, artifact, spec, found)


def _probe(captured: Captured, board: Board, spec: Specialization, optimized: Any, model: Any,
           pipeline: str) -> Callable[[Artifact, Path], Path]:
    """Writes a bundle of `spec` holding one candidate artifact into a folder: what the emulated board runs and
    counts for `auto` (edgedyn/onboard.py)."""
    def write(artifact: Artifact, folder: Path) -> Path:
        writer = BundleWriter()
        record = _specialization_record(writer, 0, spec, optimized, [artifact])
        path = Path(folder) / "probe{}".format(SUFFIX)
        writer.write(path, _manifest(captured, board, [record], model, pipeline))
        return path

    return write


def _check_precision_available(backend: str, board: Board, precision: str, quantizing: Any) -> None:
    """Fails before any work when a reduced --precision has no candidate for this board and backend here."""
    from edgedyn.candidates import candidate_list, measuring_features, no_candidate
    from edgedyn.runtime.precision import REDUCED

    from edgedyn.onboard import unavailable

    here = board.arch == host_arch()
    on_board = not here and unavailable(board) is None
    features = measuring_features(board, here, on_board)
    if precision in REDUCED and quantizing is None and not candidate_list(backend, board, None, precision, features):
        raise no_candidate(backend, board, precision, here)


def _gpu_target(board: Board, backend: str, device: str, precision: str) -> Optional[Target]:
    """The CUDA target to build GPU code for, or None (no GPU on the board, or a CPU-only choice)."""
    if device not in DEVICES:
        raise EdgedynError("unknown device '{}'; choose from: {}".format(device, ", ".join(DEVICES)))
    builds_gpu = backend == AUTO or get_backend(backend).builds_for("cuda")
    wants_gpu = device != "cpu" and board.gpu_target is not None and builds_gpu
    gpu_choices = " or ".join(["--backend " + name for name in gpu_backends()] + ["auto"])
    if device == "gpu" and not wants_gpu:
        raise EdgedynError(
            "--device gpu needs a board with a GPU and a backend that builds GPU code ({}); board '{}' and "
            "backend '{}' have none".format(", ".join(gpu_backends()), board.name, backend),
            hint="use --board jetson-nano / jetson-xavier-nx / jetson-orin-nano with {}; for onnxruntime's "
                 "TensorRT/CUDA providers on a Jetson use --backend onnxruntime".format(gpu_choices))
    return board.target("gpu") if wants_gpu else None


def _gpu_backend(board: Board, backend: str) -> str:
    """The backend that builds GPU code: the one asked for, else the first of the board's GPU preference
    (`backends.gpu_preference`; by default every registered backend that builds CUDA code)."""
    if backend != AUTO:
        return backend
    return (list(board.gpu_backends) + gpu_backends())[0]


class GpuFallbackWarning(UserWarning):
    """An export for a GPU board ships only its CPU artifact, and the message says why."""


def gpu_or_why_not(build: Callable[[], Artifact], device: str) -> Tuple[Optional[Artifact], Optional[Dict[str, Any]]]:
    """(the GPU artifact `build()` makes, None), or, when GPU code cannot be built and `device` is "auto", (None,
    the manifest's `no_gpu_code` record) with a GpuFallbackWarning saying why: a GPU problem must never cost the
    user the CPU bundle, which the runtime would fall back to anyway. `--device gpu` asked for GPU code, so there
    the error stands. The record holds the reason and, when the backend named them, each function without GPU
    code with every scheduling rule's reason."""
    import warnings

    try:
        return build(), None
    except EdgedynError as error:
        if device == "gpu":
            raise
        warnings.warn("no GPU code in this bundle, it runs on the CPU: {}{}".format(
            error.message.strip(), " ({})".format(error.hint) if error.hint else ""), GpuFallbackWarning,
            stacklevel=4)
        return None, {"reason": error.message.strip(), "hint": error.hint,
                      "functions": dict(getattr(error, "functions", None) or {})}


def _gpu_artifact(program: Any, board: Board, target: Target, spec: Specialization, precision: str, device: str,
                  backend: str, step: Progress) -> Tuple[Optional[Artifact], Optional[Dict[str, Any]]]:
    """GPU code for the board, from the backend of its GPU preference, or the record of why there is none."""
    name = _gpu_backend(board, backend)
    step("building {} with {} for {} ({})".format(spec.name, name, target.name, precision))
    build = Build(program=program, board=board, target=target, tensor_inputs=list(spec.tensor_inputs),
                  precision=precision, reference=pack_arrays(_reference_arrays(spec)))
    artifact, why_not = gpu_or_why_not(lambda: BACKENDS[name].build(build), device)
    if artifact is None:
        step("{}: no GPU code for {} ({}); the bundle carries the CPU artifact only".format(
            spec.name, board.name, target.name))
        return None, dict(why_not, backend=name, target=target.name, arch=target.tvm.get("arch"))
    return artifact, None


def _reference_arrays(spec: Specialization) -> Dict[str, np.ndarray]:
    reference = {"input." + name: tensor.numpy() for name, tensor in zip(spec.tensor_inputs, spec.example_tensors)}
    reference.update({"output.{}".format(i): array for i, array in enumerate(spec.reference_outputs)})
    return reference


def _specialization_record(writer: BundleWriter, index: int, spec: Specialization, optimized: Any,
                           artifacts: List[Artifact]) -> Dict[str, Any]:
    prefix = "specs/{}".format(index)
    records = []
    for artifact in artifacts:
        files = {role: writer.add("{}/{}-{}/{}".format(prefix, artifact.backend, artifact.device,
                                                       artifact.file_names[role]), data)
                 for role, data in sorted(artifact.files.items())}
        records.append(dict(artifact.meta, backend=artifact.backend, executor=artifact.executor,
                            device=artifact.device, arch=artifact.arch, target=artifact.target, files=files))
    fallback = artifacts[-1]
    extra = {"detections": spec.detections} if spec.detections else {}  # type: Dict[str, Any]
    return {
        **extra,
        "name": spec.name,
        "guards": spec.guards,
        "inputs": [_tensor_record(name, tensor.numpy()) for name, tensor in zip(spec.tensor_inputs, spec.example_tensors)],
        "constants": spec.constants,
        "outputs": [_tensor_record(name, array) for name, array in zip(spec.output_names, spec.reference_outputs)],
        "output_tree": spec.output_tree,
        "graph": {"ops_captured": op_count(spec.program.graph_module), "ops_optimized": op_count(optimized.graph_module)},
        "artifacts": records,
        "reference": writer.add("{}/reference.npz".format(prefix), pack_arrays(_reference_arrays(spec))),
        "memory": _memory_record(writer, prefix, optimized, fallback, records[-1]["files"]),
    }


def _memory_record(writer: BundleWriter, prefix: str, optimized: Any, artifact: Artifact,
                   files: Dict[str, str]) -> Dict[str, Any]:
    """The memory plan summary: the executor's own when its backend planned an arena, else the graph's."""
    import json

    from edgedyn.passes.memory_check import check_if_debug
    from edgedyn.passes.memory_plan import plan_program

    check_if_debug(optimized, artifact.files.get("plan"))
    if "plan" in files and "memory" in artifact.meta:
        return dict(artifact.meta["memory"], plan=files["plan"], source=artifact.backend)
    plan = plan_program(optimized)
    member = writer.add("{}/memory_plan.json".format(prefix), json.dumps(plan.to_dict(), sort_keys=True).encode())
    return dict(plan.summary(), plan=member, source="graph")


def bucket_record(writer: BundleWriter, number: int, group: Any) -> Dict[str, Any]:
    """The manifest's `buckets` entry, with the proven padded calls as a member `verify` runs again."""
    record = group.to_record()
    if group.padding is not None and group.references:
        arrays = {}  # type: Dict[str, np.ndarray]
        for index, (length, inputs, outputs) in enumerate(group.references):
            arrays.update({"{}.input.{}".format(index, name): array for name, array in inputs.items()})
            arrays.update({"{}.output.{}".format(index, i): array for i, array in enumerate(outputs)})
        record["padding"] = dict(record["padding"], reference=writer.add(
            "buckets/{}/padded_calls.npz".format(number), pack_arrays(arrays)),
            reference_lengths=[length for length, _, _ in group.references])
    return record


def _check_fit(board: Board, records: List[Dict[str, Any]], writer: BundleWriter,
               buckets: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Fails when the bundle would not fit the board's memory budget (edgedyn/fit.py), warns when close."""
    import warnings

    from edgedyn import fit

    artifacts = [r["artifacts"][-1] for r in records]  # the CPU fallback: the artifact every board can run
    arenas = fit.shared_arenas([r["memory"]["arena_bytes"] for r in records], [a["executor"] for a in artifacts],
                               [group["specializations"] for group in buckets])
    report = fit.estimate(board, artifacts[0]["executor"], sum(len(data) for data in writer.members.values()),
                          [sum(len(writer.members[m]) for role, m in a["files"].items() if role != "plan")
                           for a in artifacts], arenas)
    warning = fit.check_fit(report, len(records))
    if warning:
        warnings.warn(warning, fit.FitWarning, stacklevel=3)
    return report.to_dict()


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

    versions = {"edgedyn": __version__, "torch": torch.__version__, "numpy": np.__version__,
                "python": platform.python_version()}
    if "tvm" in sys.modules:
        versions["tvm"] = sys.modules["tvm"].__version__
    return versions


class VerificationMismatch(AssertionError):
    """An exported bundle disagrees with torch eager: a bug in edgedyn or a backend, never the user's mistake."""


def _verify_or_fail(path: Path, name: str) -> None:
    from edgedyn.runtime import load

    failed = [r for r in load(path).verify() if not r["ok"]]
    if failed:
        worst = max(failed, key=lambda r: r["max_rel"])
        raise VerificationMismatch(
            "{}: the exported artifact ({}) disagrees with torch eager on {} output {}: {}max abs error {:.3g}, "
            "relative {:.3g} (tolerance rtol {}, atol {}); {} of the outputs failed. No bundle was written. This is "
            "a bug: please report it with EDGEDYN_DEBUG=1 output, and try another --backend meanwhile".format(
                name, worst.get("artifact"), worst["specialization"], worst["output"],
                worst["error"] + "; " if worst.get("error") else "", worst["max_abs"],
                worst["max_rel"], worst.get("rtol"), worst.get("atol"), len(failed)))
