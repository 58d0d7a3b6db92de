"""int8 for the openvino backend: NNCF (OpenVINO's own compression library) over the converted OpenVINO model.

Static (`int8`): NNCF's default post-training scheme (weights int8 per output channel, activations int8 per tensor,
fast bias correction); when its accuracy on a validation split is below the target,
`nncf.quantize_with_accuracy_control` puts the layers that cost the most back in float, one group at a time
(bounded: see MAX_RANKED).
The metric is edgedyn's: the mean cosine of the outputs to torch eager's (the worst output's), and the target is the
gate's cosine (`Quantization.target_cosine`, 0.99 by default), so NNCF stops where the gate would pass. Measured on
torchvision's MobileNetV3-Large at 224 (random weights, batch norms measured on their activations; 64 calibration
and 16 validation inputs), 2026-12-03 on a 2-core Zen 4 host: plain post-training int8 reached cosine 0.969 (the
gate refuses it), accuracy control 0.990 at 9.0 ms a call against fp32's 17.7 ms (a busy machine: timings rough).
The validation split is the last quarter of the calibration batches (at least one; all of them when there are
fewer than four), with torch eager's outputs on them; the held-out gate afterwards uses data NNCF never saw.
Weight-only (`int8-weights`): `nncf.compress_weights`, int8 weights per channel, activations in float.
OpenVINO's CPU plugin runs the quantized IR with int8 kernels (VNNI and AMX where the CPU has them).
"""
from typing import Any, Dict, List, Tuple

import numpy as np

from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.quantize.accuracy import INT8_TOLERANCE

VALIDATION_SHARE = 4  # one calibration batch in this many validates


def quantize(openvino: Any, model: Any, quantization: Any, program: Any) -> Tuple[Any, Dict[str, Any]]:
    """The quantized OpenVINO model and its manifest record (scheme, weight bytes before and after, float layers)."""
    import logging

    # NNCF imports torch's C++ extension helpers, which warn on a CUDA build of torch with no CUDA here: not ours.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        import nncf
    except ImportError as error:
        raise MissingDependencyError("--quantize with openvino needs NNCF ({})".format(error),
                                     hint="pip install 'edgedyn[nncf]'")
    before = _constant_bytes(model)
    try:
        if quantization.static:
            quantized, kept = _static(nncf, openvino, model, quantization, program)
        else:
            quantized, kept = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM), []
    except BackendError:
        raise
    except Exception as error:  # NNCF's own error types
        raise BackendError("NNCF could not quantize the OpenVINO model: {}: {}".format(
            type(error).__name__, str(error).strip().splitlines()[-1:] or ""),
            hint="try --backend onnxruntime or tflite, or report this with EDGEDYN_DEBUG=1 output")
    record = {"mode": quantization.mode, "backend": "openvino",
              "scheme": "NNCF {}".format("post-training int8{} (weights per output channel, activations per tensor, "
                                         "fast bias correction; target cosine {:g})".format(
                                             " with accuracy control" if kept else "", quantization.target_cosine)
                                         if quantization.static else "int8 weight compression (symmetric, per "
                                                                     "channel); activations in float"),
              "weights": {"fp32_bytes": before, "quantized_bytes": _constant_bytes(quantized)},
              "tolerance": dict(INT8_TOLERANCE),
              "float_ops": [{"op": name, "why": "NNCF's accuracy control kept it in float to reach the target cosine"}
                            for name in kept]}
    return quantized, record


# NNCF's accuracy control ranks every quantized layer by reverting it alone (a model copy, a compile and a validation
# run each) before it puts any back in float: on 2 cores an attention model's ranking ran over 20 minutes. So the plain
# post-training result is tried first (it meets the gate on ResNet-18, cosine 0.999), and the search runs only on a
# model with at most MAX_RANKED quantized layers (NNCF's FakeQuantize count: torchvision's MobileNetV3-Large 91,
# EfficientNet-B0 124, the zoo's MobileViT 133); a model that needs more than MAX_RESTORED layers in float keeps too
# little int8 to be faster, and the held-out gate then refuses it.
MAX_RANKED = 128
MAX_RESTORED = 12
RANKING_SAMPLES = 8


def _static(nncf: Any, openvino: Any, model: Any, quantization: Any, program: Any) -> Tuple[Any, List[str]]:
    """(the int8 model, the layers kept in float): plain post-training int8 when it meets the target cosine on the
    validation split, else NNCF's accuracy control (bounded as above)."""
    batches = quantization.calibration
    split = len(batches) - max(1, len(batches) // VALIDATION_SHARE) if len(batches) >= VALIDATION_SHARE else 0
    validation = batches[split:]
    references = _torch_outputs(program, validation)
    calibration = nncf.Dataset([list(batch) for batch in batches[:split] or batches])
    checks = nncf.Dataset(list(zip([list(b) for b in validation], references)))
    subset = max(1, len(batches[:split] or batches))

    def metric(compiled: Any, data: Any) -> float:
        got = [[np.asarray(v) for v in compiled(list(inputs)).values()] for inputs, _ in data]
        want = [reference for _, reference in data]
        return min(_mean_cosine([g[i] for g in got], [w[i] for w in want]) for i in range(len(want[0])))

    plain = nncf.quantize(model, calibration, subset_size=subset)
    reached = metric(openvino.Core().compile_model(plain, "CPU"), checks.get_data())
    if reached >= quantization.target_cosine:
        return plain, []
    layers = sum(1 for op in plain.get_ops() if op.get_type_name() == "FakeQuantize")
    if layers > MAX_RANKED:
        raise BackendError("NNCF's plain int8 reaches cosine {:.4f} on the validation split, below the target {:g}, "
                           "and its accuracy control would rank {} quantized layers one by one (over {}: tens of "
                           "minutes)".format(reached, quantization.target_cosine, layers, MAX_RANKED))
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    quantized = nncf.quantize_with_accuracy_control(
        model, calibration, checks, validation_fn=metric, max_drop=1.0 - quantization.target_cosine,
        drop_type=nncf.DropType.ABSOLUTE, subset_size=subset,
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
            max_num_iterations=MAX_RESTORED, ranking_subset_size=min(len(validation), RANKING_SAMPLES)))
    kept = sorted({op.get_friendly_name() for op in quantized.get_ops()
                   if op.get_type_name() in ("Convolution", "GroupConvolution", "MatMul")
                   and not _fed_by_fake_quantize(op)})
    return quantized, kept


def _fed_by_fake_quantize(op: Any) -> bool:
    """Whether an operation's activation input comes through a FakeQuantize (NNCF's int8 marker)."""
    source = op.input_value(0).get_node()
    return source.get_type_name() == "FakeQuantize"


def _torch_outputs(program: Any, batches: List[List[np.ndarray]]) -> List[List[np.ndarray]]:
    import torch

    module = program.module()
    outputs = []
    with torch.no_grad():
        for batch in batches:
            result = module(*[torch.from_numpy(np.asarray(a)) for a in batch])
            result = result if isinstance(result, (list, tuple)) else [result]
            outputs.append([np.asarray(r.detach().numpy()) for r in result])
    return outputs


def _mean_cosine(got: List[np.ndarray], want: List[np.ndarray]) -> float:
    a = np.concatenate([np.asarray(g, np.float64).reshape(1, -1) for g in got])
    b = np.concatenate([np.asarray(w, np.float64).reshape(1, -1) for w in want])
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(np.where(norms > 0, np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1), 1.0)))


def _constant_bytes(model: Any) -> int:
    return int(sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant"))
