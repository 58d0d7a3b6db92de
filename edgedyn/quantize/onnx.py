"""int8 for the onnxruntime backend: the ONNX Runtime quantizer over the exported, basic-optimized ONNX model.

Static (`int8`): QDQ format, weights int8 per output channel (symmetric), activations uint8 per tensor from MinMax
calibration. The QDQ pattern is standard ONNX (opset >= 13), so the file stays portable; onnxruntime fuses it into
QLinearConv / QGemm / QLinearAdd / QLinearMatMul at session creation on the board, for that CPU's kernels.
Activations are uint8 (U8S8) because that is the combination for which ORT's CPU kernels cover the most ops on
both x86 and ARM64: with int8 activations (S8S8), ORT 1.32 on x86 left the depthwise convolutions and residual
adds in float (measured on examples/mobilenet_v2.py: 1.49 ms S8S8 against 0.95 ms U8S8, fp32 1.34 ms).
Weights are quantized to 7 bits ([-64, 64], onnxruntime's reduce_range) on both paths. Note: onnxruntime's uint8 x
int8 kernels on x86 CPUs without VNNI (AVX2, and AVX-512 before VNNI: vpmaddubsw) add pairs of products into 16 bits
with saturation; with 8-bit weights 2 x 255 x 127 overflows it. Measured on a Zen 3 host (AVX2), 2026-12-02: the
example MobileNetV2's int8 outputs lay 10.9% of the largest output away from the same QDQ graph computed in float,
and the example MLP's 4.8% away from the emulated Raspberry Pi's, which multiplies exactly, so `edgedyn verify`
failed on the board against outputs recorded on the host. With 7 bits: 0.8% (the rounding of requantization) and
6e-8. The bundle's arithmetic then no longer depends on which x86 CPU runs it.
Weight-only (`int8-weights`): dynamic quantization of MatMul/Gemm (int8 weights per channel, activations
quantized at run time: MatMulInteger / DynamicQuantizeMatMul). Convolutions stay float: ORT's dynamic ConvInteger
kernel ran 10x slower than the float Conv on MobileNetV2, so int8-weights shrinks and speeds up linear layers only.
"""
import logging
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.quantize import sensitivity
from edgedyn.quantize.accuracy import INT8_TOLERANCE



def quantize(onnx: Any, model: Any, quantization: Any, input_names: List[str]) -> Tuple[Any, Dict[str, Any]]:
    """The quantized model and its manifest record (scheme, weight bytes before and after, ops)."""
    try:
        from onnxruntime import quantization as ort_quantization
    except ImportError as error:
        raise MissingDependencyError("--quantize with onnxruntime needs onnxruntime.quantization ({})".format(error),
                                     hint="pip install 'edgedyn[onnxruntime]'")
    before = _initializer_bytes(model)
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantizer logs "consider pre-processing" on the root logger
    try:
        return _quantize(onnx, model, quantization, input_names, ort_quantization, before)
    finally:
        root.setLevel(level)


def _quantize(onnx: Any, model: Any, quantization: Any, input_names: List[str], ort_quantization: Any,
              before: int) -> Tuple[Any, Dict[str, Any]]:
    if quantization.static:
        model = _initializers_unshared(model)
    with tempfile.TemporaryDirectory(prefix="edgedyn-quantize-") as workdir:
        source = Path(workdir) / "float.onnx"
        onnx.save(model, str(source))
        attempt = _attempt_builder(onnx, ort_quantization, quantization, input_names, source, Path(workdir))
        try:
            if quantization.static:
                found = sensitivity.search(onnx, model, quantization, input_names, attempt)
            else:
                weights_only = sensitivity.Attempt(scheme="dynamic")
                found = sensitivity.Found(attempt(weights_only), weights_only)
        except Exception as error:
            raise BackendError("onnxruntime's quantizer failed: {}: {}".format(type(error).__name__, error),
                               hint="try --backend tflite, or report this with EDGEDYN_DEBUG=1 output")
    quantized = found.model
    quantized.ir_version = model.ir_version  # the quantizer stamps its onnx's newest; keep the backend's
    onnx.checker.check_model(quantized)
    ops = sorted({node.op_type for node in quantized.graph.node})
    record = {
        "mode": quantization.mode, "backend": "onnxruntime", "scheme": found.chosen.describe(),
        "weights": {"fp32_bytes": before, "quantized_bytes": _initializer_bytes(quantized)},
        "onnx_ops": ops, "tolerance": dict(INT8_TOLERANCE), "float_ops": found.chosen.float_ops_record()}
    if found.search:
        record["search"] = found.search
    return quantized, record


def _attempt_builder(onnx: Any, ort_quantization: Any, quantization: Any, input_names: List[str], source: Path,
                     workdir: Path) -> Any:
    """A function quantizing the float model as one Attempt says (scheme, calibration method, nodes kept float)."""
    QuantFormat, QuantType = ort_quantization.QuantFormat, ort_quantization.QuantType
    methods = {"minmax": ort_quantization.CalibrationMethod.MinMax,
               "percentile": ort_quantization.CalibrationMethod.Percentile,
               "entropy": ort_quantization.CalibrationMethod.Entropy}
    counter = [0]

    def attempt(how: Any, batches: Any = None) -> Any:
        counter[0] += 1
        target = workdir / "int8-{}.onnx".format(counter[0])
        if how.scheme == "dynamic":
            ort_quantization.quantize_dynamic(str(source), str(target), per_channel=True, reduce_range=True,
                                              weight_type=QuantType.QInt8,
                                              op_types_to_quantize=["MatMul", "Gemm"],
                                              nodes_to_exclude=list(how.excluded))
        else:
            ort_quantization.quantize_static(
                str(source), str(target), sensitivity.Reader(batches or quantization.calibration, input_names),
                quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8, calibrate_method=methods[how.method],
                nodes_to_exclude=list(how.excluded))
        return onnx.load(str(target))

    return attempt


def _initializers_unshared(model: Any) -> Any:
    """A copy of `model` in which each node reads its own copy of a float initializer that several nodes read.

    Note: onnxruntime's static quantizer (1.32) refuses a weight read by two quantized nodes ("Quantization
    parameter shared mode is not supported for weight yet"); the exporter stores equal constants once, and the zoo
    PoolFormer's layer-scale Muls share them (16 to 128 floats each). Only float initializers are copied (shapes
    and axes are integers), and only for the static path: the dynamic one quantizes MatMul/Gemm alone, where a
    tied embedding would otherwise be stored twice."""
    import copy

    from onnx import numpy_helper

    floats = {t.name: t for t in model.graph.initializer if numpy_helper.to_array(t).dtype.kind == "f"}
    readers = {}  # type: Dict[str, int]
    for node in model.graph.node:
        for name in node.input:
            if name in floats:
                readers[name] = readers.get(name, 0) + 1
    if not any(count > 1 for count in readers.values()):
        return model
    model = copy.deepcopy(model)
    seen = {}  # type: Dict[str, int]
    for index, node in enumerate(model.graph.node):
        for position, name in enumerate(node.input):
            if readers.get(name, 0) < 2:
                continue
            seen[name] = seen.get(name, 0) + 1
            if seen[name] == 1:
                continue  # the first reader keeps the original
            twin = copy.deepcopy(floats[name])
            twin.name = "{}__reader{}".format(name, seen[name])
            model.graph.initializer.append(twin)
            node.input[position] = twin.name
    return model


def _initializer_bytes(model: Any) -> int:
    from onnx import numpy_helper

    return int(sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer))
