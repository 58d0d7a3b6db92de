"""The backend registry: one `Backend` record per backend, in BACKENDS below, read by everything else.

A backend module (edgedyn/backends/) has `lower(build: Build) -> Artifact` (both in backends/artifact.py, which
the board never needs). Its record says how to reach that function (imported
only when used: a backend may need a heavy optional package), which runtime executor runs its artifacts, which
devices it builds for, whether it quantizes, which pip extras it needs and what its runtime costs on a board.
The CLI help, `--backend auto`, the GPU build, the quantization checks, the board-fit check, board-file
validation and the tests all derive from these records. Adding a backend: docs/architecture.md.

This module runs on the board too (board files name backends): standard library only, Python 3.8 syntax.
"""
import difflib
import importlib
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from edgedyn.errors import EdgedynError
from edgedyn.runtime.executors import EXECUTORS
from edgedyn.runtime.precision import FP32, REDUCED

MB = 1 << 20
BUILD_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    """One backend: how it lowers, what runs it on the board, and what it needs there."""

    name: str
    lower: str  # "module:function" taking a Build, imported on first use
    executor: str  # the edgedyn.runtime.executors name that runs its artifacts
    devices: Tuple[str, ...]  # what it builds for: "cpu", "cuda"
    quantizes: bool  # builds int8 kernels that run as integers on the board
    extra: str  # pip extras needed to build with it on the host
    board_extra: str  # pip extra needed on the board to run its artifacts
    # Peak RSS of a fresh interpreter that imported numpy, edgedyn.runtime and this executor's runtime, loading no
    # bundle (benchmarks/overheads.py re-measures it; board-fit check, edgedyn/fit.py). None: not measured.
    overhead_bytes: Optional[int]
    overhead_import: str  # the statement that loads this executor's runtime, for measuring the overhead
    general: bool  # takes every core-ATen op (named as the alternative when another backend cannot express one)
    pipeline: str = "default"  # the pass pipeline (edgedyn/passes PIPELINES) whose graph it lowers
    no_int8_reason: str = ""  # why --quantize is refused, for backends that do not quantize
    summary: str = ""  # one line for CLI help and docs
    # Its executor takes a thread count per loaded model, not for the whole process (TVM's is an environment
    # variable): `auto` may then record one thread for an artifact that runs faster so (edgedyn/selection.py).
    threads_per_model: bool = False
    # The reduced float precisions (edgedyn/runtime/precision.py) its CPU artifacts can compute in, each with the CPU
    # architectures where it can: `auto` builds those the CPU has the feature for as candidates beside fp32.
    precisions: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    # Its reduced-precision artifacts can keep their first layers in fp32 (Build.fp32_share): `auto` tries that when
    # the whole artifact misses the float gate (edgedyn/candidates.py FP32_SHARES).
    mixes: bool = False
    # Its reduced-precision artifacts can keep named layers in fp32 (Build.fp32_layers): on an emulated board, `auto`
    # probes which layers the reduced precision costs most accuracy in when the whole artifact misses the float gate,
    # and tries it with those in fp32 (edgedyn/layer_probe.py).
    probes_layers: bool = False
    # Its int8 artifacts compute the layers kept out of int8 in a reduced precision of `precisions` where the CPU has
    # it (OpenVINO's inference precision applies to every layer without int8 inputs): candidates.int8_floats.
    int8_floats: bool = False
    # Its executor runs every bucket of a group in one arena per thread, sized for the largest (runtime/buckets.py
    # ArenaPool): the board-fit check counts that arena once per group.
    shares_arena: bool = False
    # Why `auto` holds its CPU candidate back until the target has tuning records (`edgedyn tune`) or no other
    # candidate verifies (candidates.held_back); empty: always a candidate.
    held_back_untuned: str = ""

    def __post_init__(self) -> None:
        if ":" not in self.lower:
            raise ValueError("backend {}: lower must be 'module:function', got {!r}".format(self.name, self.lower))
        if self.executor not in EXECUTORS:
            raise ValueError("backend {}: unknown executor {!r}; runtime executors: {}".format(
                self.name, self.executor, ", ".join(sorted(EXECUTORS))))
        if not self.devices or any(d not in BUILD_DEVICES for d in self.devices):
            raise ValueError("backend {}: devices must be drawn from {}, got {}".format(
                self.name, BUILD_DEVICES, self.devices))
        for precision, arches in self.precisions:
            if precision not in REDUCED or not arches or any(a not in ("aarch64", "x86_64") for a in arches):
                raise ValueError("backend {}: precisions are (one of {}, CPU architectures), got {}".format(
                    self.name, REDUCED, (precision, arches)))
        if not self.quantizes and not self.no_int8_reason:
            raise ValueError("backend {}: a backend that does not quantize says why (no_int8_reason)".format(
                self.name))

    def build(self, build: Any) -> Any:
        """Lowers one specialization with this backend: an edgedyn.backends.artifact.Build in, an Artifact out."""
        module_name, function = self.lower.split(":")
        return getattr(importlib.import_module(module_name), function)(build)

    def builds_for(self, device: str) -> bool:
        return device in self.devices

    def computes(self, precision: str, arch: str) -> bool:
        """True when its CPU artifacts for `arch` can compute in `precision` (fp32 always)."""
        return precision == FP32 or any(p == precision and arch in arches for p, arches in self.precisions)


# Note: the one list of backends. Measured overheads: x86_64, Python 3.11, numpy 2.4, 2026-11, torch blocked in
# the measuring process as on a board (the tvm package imports torch when it can, ~200 MB no board pays).
BACKENDS = {
    "ncnn": Backend(
        name="ncnn", lower="edgedyn.backends.ncnn:lower", executor="ncnn", devices=("cpu",), quantizes=False,
        extra="export,ncnn-export", board_extra="ncnn", overhead_bytes=36 * MB, overhead_import="import ncnn; ncnn.Net()",
        general=False, pipeline="onnxruntime",
        no_int8_reason="edgedyn's ncnn backend has no int8 path yet (ncnn's int8 needs its own calibration table)",
        threads_per_model=True, precisions=(("fp16", ("aarch64",)),), probes_layers=True,
        summary="an ncnn model converted by pnnx, run by ncnn on the CPU, in fp32 or fp16 (Arm v8.2 cores)"),
    "onnxruntime": Backend(
        name="onnxruntime", lower="edgedyn.backends.onnxruntime:lower", executor="onnxruntime", devices=("cpu",),
        quantizes=True, extra="export,onnxruntime", board_extra="onnxruntime", overhead_bytes=52 * MB,
        overhead_import="import onnxruntime", general=True, pipeline="onnxruntime", threads_per_model=True,
        summary="ONNX for onnxruntime; the board's execution providers (TensorRT/CUDA on a Jetson) are tried first"),
    "openvino": Backend(
        name="openvino", lower="edgedyn.backends.openvino:lower", executor="openvino", devices=("cpu",),
        quantizes=True, extra="export,openvino,nncf", board_extra="openvino", overhead_bytes=55 * MB,
        overhead_import="import openvino; openvino.Core()", general=False, pipeline="onnxruntime",
        threads_per_model=True, precisions=(("bf16", ("x86_64",)), ("fp16", ("aarch64", "x86_64"))), mixes=True,
        int8_floats=True,
        summary="an OpenVINO IR run by OpenVINO's CPU plugin, in fp32, bf16 (x86 with AVX512_BF16 or AMX) or fp16 "
                "(Arm v8.2 cores)"),
    "portable": Backend(
        name="portable", lower="edgedyn.backends.portable:lower", executor="portable", devices=("cpu",),
        quantizes=False, extra="export", board_extra="", overhead_bytes=35 * MB,
        overhead_import="import edgedyn.runtime.executors.portable", general=False,
        no_int8_reason="the portable executor computes in numpy float32", shares_arena=True,
        summary="a JSON graph run by numpy kernels in one planned arena; needs nothing but numpy on the board"),
    "tflite": Backend(
        name="tflite", lower="edgedyn.backends.tflite:lower", executor="litert", devices=("cpu",),
        quantizes=True, extra="export,litert", board_extra="litert", overhead_bytes=41 * MB,
        overhead_import="from ai_edge_litert.interpreter import Interpreter", general=False, threads_per_model=True,
        precisions=(("fp16", ("aarch64",)),),
        summary="a .tflite file written without TensorFlow, run by LiteRT with XNNPACK"),
    "tvm": Backend(
        name="tvm", lower="edgedyn.backends.tvm:lower", executor="tvm", devices=("cpu", "cuda"),
        quantizes=False, extra="export,tvm", board_extra="tvm", overhead_bytes=81 * MB,
        overhead_import="import edgedyn.runtime.executors.tvm as t; t._import_tvm()", general=True,
        no_int8_reason="TVM's frontends compute in float between quantize and dequantize ops, so int8 gives no "
                       "integer kernels there",
        summary="Apache TVM 0.27: a shared library for the board's CPU (cross-linked for aarch64), CUDA for Jetsons",
        # Measured: in the 254 exports of benchmarks/results whose candidates were timed, untuned TVM took 3.9x to
        # 1675x the fastest other candidate's time (median 23x); in the 20 counted on an emulated board, 9x to 38x
        # its instructions, and 43-65% of all the instructions the export counted. Holding it back took the auto
        # export of ResNet-18 for this x86 host from 41 to 33 s, DistilBERT's from 100 to 58 s (2026-12-06, Zen 4).
        held_back_untuned="untuned TVM was slower than the fastest other candidate in every export measured "
                          "(3.9x-1675x, median 23x: benchmarks/README.md)"),
}
AUTO = "auto"


def backend_names() -> List[str]:
    """The registered backends, sorted."""
    return sorted(BACKENDS)


def backend_choices() -> List[str]:
    """What `--backend` accepts: the registered backends and `auto`."""
    return sorted(list(BACKENDS) + [AUTO])


def get_backend(name: str) -> Backend:
    """The record of a backend, with the valid names listed (and the closest one suggested) when `name` is unknown."""
    if name not in BACKENDS:
        close = difflib.get_close_matches(name, backend_choices(), n=1)
        raise EdgedynError("unknown backend '{}'; choose from: {}".format(name, ", ".join(backend_choices())),
                           hint="did you mean '{}'?".format(close[0]) if close else
                           "auto measures the installed backends on this machine, or follows the board's preference")
    return BACKENDS[name]


def check_backend_name(name: str) -> None:
    """Fails before any work when `name` is neither a registered backend nor `auto`."""
    if name != AUTO:
        get_backend(name)


def quantizing_backends() -> List[str]:
    """Backends whose artifacts run integer kernels on the board, sorted."""
    return sorted(name for name, backend in BACKENDS.items() if backend.quantizes)


def gpu_backends() -> List[str]:
    """Backends that build CUDA code, sorted."""
    return sorted(name for name, backend in BACKENDS.items() if backend.builds_for("cuda"))


def general_backends() -> List[str]:
    """Backends that take every core-ATen op, sorted: the alternative named when another cannot express an op."""
    return sorted(name for name, backend in BACKENDS.items() if backend.general)


def backend_of_executor(executor: str) -> Optional[Backend]:
    """The record whose artifacts run on `executor`, or None."""
    return next((b for b in BACKENDS.values() if b.executor == executor), None)


def backends_help() -> str:
    """The `--backend` help text: every backend with its one-line summary, then auto."""
    lines = ["{}: {}.".format(name, BACKENDS[name].summary) for name in backend_names()]
    return " ".join(lines + ["auto (default): on this machine's own board, build each installed backend, verify and "
                             "time it and keep the fastest; for another board, follow its backends.preference."])
