"""Runs an OpenVINO IR (model.xml + weights.bin written by edgedyn's openvino backend) on the CPU with OpenVINO.

The artifact records the precision it was built and gated for (fp32, bf16, fp16); the executor asks OpenVINO for
exactly that (`INFERENCE_PRECISION_HINT`), never OpenVINO's own default (bf16 on x86 CPUs with AVX512_BF16 or AMX,
fp16 on Arm v8.2): the numbers the gate measured are the numbers the board computes. A CPU that lacks the feature
computes fp32, and describe() says why (runtime/precision.py).
"""
import threading
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime import precision as precisions
from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError, MissingDependencyError
from edgedyn.runtime.executors.openvino_ir import check_ir, outputs_in_order
from edgedyn.runtime.format import host_arch

_HINT = "pip install 'edgedyn[openvino]'"
# OpenVINO's names for the artifact's precision.
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
OPENVINO_PRECISION = {name: precision for precision, name in INFERENCE_PRECISION.items()}
# The CPU plugin properties a board file may set ([openvino] table, recorded in the artifact), each with the values
# it takes; anything else in a bundle is refused. Without a record: DEFAULT_PROPERTIES.
PROPERTY_CHOICES = {
    "PERFORMANCE_HINT": ("LATENCY", "THROUGHPUT"),
    "NUM_STREAMS": int,
    "ENABLE_CPU_PINNING": bool,
    "ENABLE_HYPER_THREADING": bool,
    "SCHEDULING_CORE_TYPE": ("ANY_CORE", "PCORE_ONLY", "ECORE_ONLY"),
}  # type: Dict[str, Any]
DEFAULT_PROPERTIES = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
MAX_STREAMS = 1024

_CORE = None  # type: Any
_CORE_LOCK = threading.Lock()


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError as error:
        raise MissingDependencyError(
            "this bundle runs on OpenVINO, which is not installed ({})".format(error),
            hint="{}  (Python 3.8 boards get OpenVINO 2024: see docs/backends.md)".format(_HINT))
    return openvino


def _core(openvino: Any) -> Any:
    """One OpenVINO Core per process: its compile_model is thread-safe, and each Core loads the plugins anew."""
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            _CORE = openvino.Core()
        return _CORE


def properties(artifact: Dict[str, Any]) -> Dict[str, Any]:
    """The artifact's recorded CPU properties over DEFAULT_PROPERTIES, each checked against PROPERTY_CHOICES."""
    recorded = artifact.get("openvino", {}).get("properties", {})
    if not isinstance(recorded, dict):
        raise BundleError("openvino.properties: expected a table, got {}".format(schema.short(recorded)),
                          hint=schema.HINT)
    settings = dict(DEFAULT_PROPERTIES, **recorded)
    for key, value in settings.items():
        kind = PROPERTY_CHOICES.get(key)
        valid = (kind is int and type(value) is int and 0 <= value <= MAX_STREAMS) or (
            kind is bool and isinstance(value, bool)) or (isinstance(kind, tuple) and value in kind)
        if not valid:
            raise BundleError("openvino.properties: {} = {} is not allowed".format(
                schema.short(key), schema.short(value)), hint="properties a board file may set: {}".format(
                    ", ".join(sorted(PROPERTY_CHOICES))))
    return settings


def _type_name(value: Any) -> str:
    """OpenVINO's element type as it spells it (`f32`, `bf16`), from a Type or a string."""
    name = getattr(value, "get_type_name", None)
    return str(name() if callable(name) else value)


# The layer types of OpenVINO's runtime model whose precision says where the arithmetic happens.
COMPUTING_LAYERS = ("Convolution", "Deconvolution", "FullyConnected", "MatMul")


class OpenVinoExecutor:
    """One compiled OpenVINO model; an infer request per calling thread (a request holds one call's tensors and is
    not safe to share, while the compiled model is)."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        openvino = _import_openvino()
        files = artifact["files"]
        xml, weights = bundle.read(files["model"]), bundle.read(files["weights"])
        check_ir(xml, len(weights), options.get("declared_bytes"), "bundle {}: {}".format(
            getattr(bundle, "path", "?"), files["model"]))
        requested = artifact.get("precision", precisions.FP32)
        if requested not in INFERENCE_PRECISION:
            raise BundleError("artifact precision {} is not one of {}".format(
                schema.short(requested), ", ".join(INFERENCE_PRECISION)), hint=schema.HINT)
        self._precision, self._why_not = precisions.effective(requested, host_arch())
        self._requested = requested
        self._threads = options.get("threads")
        config = dict(properties(artifact), INFERENCE_PRECISION_HINT=INFERENCE_PRECISION[self._precision])
        if self._threads:
            config["INFERENCE_NUM_THREADS"] = int(self._threads)
        core = _core(openvino)
        # The weights are handed over in place (no copy): `self._weights` keeps them alive as long as the model.
        self._weights = np.frombuffer(weights, np.uint8)
        try:
            model = core.read_model(model=xml.decode("utf-8"), weights=openvino.Tensor(self._weights))
            self._compiled = core.compile_model(model, "CPU", config)
        except (RuntimeError, UnicodeDecodeError) as error:  # OpenVINO's own refusal of what passed check_ir
            lines = [line for line in str(error).splitlines() if line.strip() and "Exception from" not in line]
            raise BundleError("bundle {}: OpenVINO {} could not compile {}: {}".format(
                getattr(bundle, "path", "?"), openvino.get_version(), files["model"],
                schema.short(lines[-1] if lines else type(error).__name__, 200)), hint=schema.HINT)
        names = {}  # type: Dict[str, int]
        for index, port in enumerate(self._compiled.outputs):
            for name in port.get_names():
                names[name] = index
        self._outputs = outputs_in_order(list(artifact["output_names"]), names)
        self._inputs = len(self._compiled.inputs)
        self._local = threading.local()
        self._version = openvino.get_version()
        self.artifact = artifact

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        return request

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        if len(inputs) != self._inputs:
            raise BundleError("the OpenVINO model takes {} inputs, the manifest {}".format(self._inputs, len(inputs)),
                              hint=schema.HINT)
        # The request reads the caller's arrays in place (OpenVINO copies one that is not contiguous, not float32 or
        # read-only) and hands back its own output memory, which its next call overwrites: each output is copied
        # once, here, into an array the caller owns. OpenVINO's defaults copy the inputs into the request and the
        # outputs out of it, and the copy here doubled that: 2.9 of 18.5 ms per call at one thread for
        # DeepLabV3-MobileNetV3 (a 5.5 MB output), tests/test_threads.py checks what the caller gets. A 0-d array is
        # handed over as a copy: OpenVINO 2026.4 refuses to share a read-only one ("array is not writeable").
        arrays = [np.array(array) if array.ndim == 0 else array for array in inputs]
        results = self._request().infer(arrays, share_inputs=True, share_outputs=True)
        values = list(results.values())
        return [np.array(values[index]) for index in self._outputs]

    def precision(self) -> Tuple[str, Optional[str]]:
        """(the precision this executor computes in, as OpenVINO's compiled model reports it; why it is not the
        artifact's, or None)."""
        reported = OPENVINO_PRECISION.get(_type_name(self._compiled.get_property("INFERENCE_PRECISION_HINT")),
                                          self._precision)
        if reported != self._precision and self._why_not is None:
            return reported, "OpenVINO computes {} in {} on this CPU".format(self._requested, reported)
        return reported, self._why_not

    def describe(self) -> Dict[str, Any]:
        described = {"executor": "openvino", "device": "cpu", "openvino": self._version,
                     "precision": self._precision, "precision_requested": self._requested,
                     "threads": self._threads,
                     "inference_precision": _type_name(self._compiled.get_property("INFERENCE_PRECISION_HINT"))}
        if self._why_not:
            described["precision_note"] = self._why_not
        computed = self.computed_in()
        if computed:
            described["computed_in"] = computed
        return described

    def computed_in(self) -> Dict[str, int]:
        """How many of the compiled model's convolutions and matrix products run in each precision, as OpenVINO's
        runtime model reports it (a mixed artifact's first layers in f32, the rest in bf16); {} if it reports none."""
        counts = {}  # type: Dict[str, int]
        try:
            for op in self._compiled.get_runtime_model().get_ordered_ops():
                info = op.get_rt_info()
                if "layerType" in info and "runtimePrecision" in info and str(
                        info["layerType"].astype(str)) in COMPUTING_LAYERS:
                    precision = str(info["runtimePrecision"].astype(str))
                    counts[precision] = counts.get(precision, 0) + 1
        except (AttributeError, RuntimeError, TypeError):  # an OpenVINO that reports less: nothing to say
            return {}
        return counts
