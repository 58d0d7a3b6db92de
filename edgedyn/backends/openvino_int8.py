"""int8 for the openvino backend: NNCF (OpenVINO's own compression library) over the converted OpenVINO model.

Static (`int8`): NNCF's post-training int8 with its MIXED preset (weights int8 symmetric per output channel,
activations int8 asymmetric per tensor: hard-swish and SiLU outputs reach below zero, where a symmetric range wastes
half its steps), fast bias correction. Where every layer in int8 misses the target on a validation split, the first
layers stay float (FLOAT_FIRST): int8's error, like bf16's, is largest near the input and compounds through the
network. The layers NNCF leaves float compute in the artifact's float precision (bf16 on a CPU with AVX512_BF16,
as the precision issue asks for the layers kept out of int8), or, when that misses, the first tenth of the network's
layers in fp32 and the rest of the prefix reduced, and then the whole prefix in fp32 (the layers marked as a mixed
bf16 artifact's are: backends/openvino_marks.py).
The metric is edgedyn's: the mean cosine of the outputs to torch eager's (the worst output's), and the target is the
gate's cosine (`Quantization.target_cosine`, 0.99 by default) with a margin (VALIDATION_MARGIN), so that the held-out
gate afterwards, on data NNCF never saw, passes what the validation split chose.
Measured (benchmarks/README.md, int8 on full-size models; random weights, batch norms measured on their activations,
48 random-normal calibration inputs, 12 fresh ones for the cosine; 2-core Zen 4 with VNNI and AVX512_BF16, 2
threads, in one process): every layer int8 reached cosine 0.976 on torchvision's MobileNetV3-Large (0.970 with
NNCF's default symmetric preset), 0.978 on EfficientNet-B0, 0.930 on DeepLabV3-MobileNetV3 and 0.9997 on YOLO11n;
with the first fifth float (bf16) MobileNetV3 0.9928 and EfficientNet 0.9926, with half DeepLabV3 0.992, at 2.2x,
1.7x and 2.5x OpenVINO's fp32 time. NNCF's accuracy control (which reverts single layers, ranked one by one: a
compile and a validation run each, 72 s on MobileNetV3 and over 20 minutes on an attention model) reached the same
accuracy as the prefix on MobileNetV3 by reverting nine layers of its first blocks; it is the last resort, when no
prefix meets the target (MAX_RANKED).
The validation split is the last quarter of the calibration batches (at least one; all of them when there are
fewer than four), with torch eager's outputs on them.
Weight-only (`int8-weights`): `nncf.compress_weights`, int8 weights per channel, activations in float.
OpenVINO's CPU plugin runs the quantized IR with int8 kernels (VNNI and AMX where the CPU has them).
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.quantize.accuracy import INT8_TOLERANCE, worst_cosine
from edgedyn.runtime.precision import FP32

VALIDATION_SHARE = 4  # one calibration batch in this many validates
# The shares of the first computing layers (cut before the next convolution or matrix product, as a mixed float
# artifact's) left out of int8, tried in turn until the validation split meets the target. Past half, int8 would
# save too little to be faster than the float candidates beside it.
FLOAT_FIRST = (0.0, 0.1, 0.2, 0.3, 0.5)
# Where a float prefix in bf16/fp16 misses, the first FP32_FIRST of the network's layers (a mixed float artifact's
# smallest share: candidates.FP32_SHARES) are marked fp32 and the rest of the prefix stays reduced, before the whole
# prefix is marked fp32 (fp32_parts): a rounding near the input has the whole network to grow through.
FP32_FIRST = 0.1
# The validation split must reach the target plus this share of what the gate allows (0.99: 0.992): it has 16
# samples, the held-out gate 32 others.
VALIDATION_MARGIN = 0.2


Ir = Tuple[bytes, bytes]  # (model.xml, weights.bin)


def quantize(openvino: Any, model: Any, quantization: Any, program: Any,
             precision: str = FP32) -> Tuple[Any, Dict[str, Any], Optional[Ir]]:
    """(the quantized OpenVINO model, its manifest record (scheme, weight bytes before and after, the layers left
    float), None or the IR with its float prefix marked fp32, as it was measured). The float layers compute in
    `precision`."""
    import logging

    # NNCF imports torch's C++ extension helpers, which warn on a CUDA build of torch with no CUDA here: not ours.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        import nncf
    except ImportError as error:
        raise MissingDependencyError("--quantize with openvino needs NNCF ({})".format(error),
                                     hint="pip install 'edgedyn[nncf]'")
    before = _constant_bytes(model)
    first = {"first": 0, "share": 0.0, "computes_in": precision}  # type: Dict[str, Any]
    prefix = []  # type: List[str]
    marked = None  # type: Optional[Ir]
    try:
        if quantization.static:
            quantized, first, prefix, marked = _static(nncf, openvino, model, quantization, program, precision)
        else:
            quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)
    except BackendError:
        raise
    except Exception as error:  # NNCF's own error types
        raise BackendError("NNCF could not quantize the OpenVINO model: {}: {}".format(
            type(error).__name__, str(error).strip().splitlines()[-1:] or ""),
            hint="try --backend onnxruntime or tflite, or report this with EDGEDYN_DEBUG=1 output")
    float_words = "; the first {} of {} computing layers float ({}{})".format(
        first["first"], first["of"], first["computes_in"], ", the first {} of them fp32".format(first["fp32_first"])
        if 0 < first.get("fp32_first", 0) < first["first"] else "") if first["first"] else ""
    if first.get("accuracy_control"):
        float_words = "; NNCF's accuracy control put layers back in float"
    record = {"mode": quantization.mode, "backend": "openvino",
              "scheme": "NNCF post-training int8 (weights symmetric per output channel, activations asymmetric per "
                        "tensor, fast bias correction; target cosine {:g}{}); other layers in {}".format(
                            quantization.target_cosine, float_words, precision)
              if quantization.static else "NNCF int8 weight compression (symmetric, per channel); activations in "
                                          "float",
              "weights": {"fp32_bytes": before, "quantized_bytes": _constant_bytes(quantized)},
              "tolerance": dict(INT8_TOLERANCE), "float_precision": precision,
              "float_ops": [{"op": name, "why": "computes in float: no int8 input"}
                            for name in _float_computing(quantized) if name not in prefix]}
    if quantization.static:
        record["float_first"] = first  # its layers are not listed in float_ops
    return quantized, record, marked


def _static(nncf: Any, openvino: Any, model: Any, quantization: Any, program: Any,
            precision: str) -> Tuple[Any, Dict[str, Any], List[str], Optional[Ir]]:
    """(the int8 model, its float prefix's record, the prefix's layer names, None or the IR with the prefix marked
    fp32): the smallest share of FLOAT_FIRST whose int8 model meets the target on the validation split, its float
    layers in `precision`, or, when that misses, with their first ones in fp32 (fp32_parts). Shares that cut the
    same prefix (the cut extends to the next convolution) are tried once."""
    import xml.etree.ElementTree as ElementTree

    from edgedyn.backends.openvino_marks import first_layers, mark_named_fp32, serialized
    from edgedyn.runtime.executors.openvino import INFERENCE_PRECISION
    from edgedyn.runtime.format import host_arch
    from edgedyn.runtime.precision import effective

    batches = quantization.calibration
    split = len(batches) - max(1, len(batches) // VALIDATION_SHARE) if len(batches) >= VALIDATION_SHARE else 0
    validation = batches[split:]
    references = _torch_outputs(program, validation)
    calibration = nncf.Dataset([list(batch) for batch in batches[:split] or batches])
    subset = max(1, len(batches[:split] or batches))
    want = quantization.target_cosine + (1.0 - quantization.target_cosine) * VALIDATION_MARGIN
    core = openvino.Core()
    hint = INFERENCE_PRECISION[effective(precision, host_arch())[0]]  # fp32 where this CPU lacks it

    def reached(candidate: Any) -> float:
        compiled = core.compile_model(candidate, "CPU", {"INFERENCE_PRECISION_HINT": hint})
        return _worst_cosine(compiled, validation, references)

    root = ElementTree.fromstring(serialized(openvino, model)[0])
    tried = []  # type: List[str]
    ranked = 0  # the quantized layers of every-layer int8: what accuracy control would rank
    lengths = set()  # the prefix lengths tried
    tenth = [layer.get("name") for layer in first_layers(root, FP32_FIRST)[0]]  # what fp32_parts may mark first
    for share in FLOAT_FIRST:
        layers, total = first_layers(root, share)
        names = [layer.get("name") for layer in layers]
        if len(names) in lengths:
            continue
        lengths.add(len(names))
        scope = nncf.IgnoredScope(names=names, validate=False)
        quantized = nncf.quantize(model, calibration, subset_size=subset, preset=nncf.QuantizationPreset.MIXED,
                                  ignored_scope=scope)
        first = {"first": len(names), "of": total, "share": share, "computes_in": precision}
        ranked = ranked or sum(1 for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize")
        cosine = reached(quantized)
        tried.append("{:.4f} ({})".format(cosine, "every layer int8" if not names else "first {:.0%} in {}".format(
            share, precision)))
        if cosine >= want:
            return quantized, first, names, None
        if names and precision != FP32:
            xml, weights = serialized(openvino, quantized)
            for kept in fp32_parts(tenth, names):
                marked = (mark_named_fp32(xml, set(kept)), weights)
                cosine = reached(core.read_model(marked[0], openvino.Tensor(np.frombuffer(weights, np.uint8))))
                whole = len(kept) == len(names)
                tried.append("{:.4f} (first {:.0%} in {})".format(cosine, share, "fp32" if whole else "{}, its first "
                                                                   "{} layers fp32".format(precision, len(kept))))
                if cosine >= want:
                    return quantized, dict(first, computes_in=FP32 if whole else precision, fp32_first=len(kept),
                                           fp32_share=share if whole else FP32_FIRST), names, marked
    if ranked > MAX_RANKED:
        raise BackendError("NNCF's int8 reaches cosine {} on the validation split, below the target {:g} (+{:g} "
                           "margin), and its accuracy control would rank {} quantized layers one by one (over {}: "
                           "tens of minutes)".format(", ".join(tried), quantization.target_cosine,
                                                     want - quantization.target_cosine, ranked, MAX_RANKED))
    return _accuracy_control(nncf, model, calibration, validation, references, want, subset, precision)


# NNCF's accuracy control ranks every quantized layer by reverting it alone (a model copy, a compile and a validation
# run each) before it puts any back in float: on 2 cores an attention model's ranking ran over 20 minutes. It is
# the last resort, after the float prefixes, on a model with at most MAX_RANKED quantized layers (NNCF's
# FakeQuantize count: torchvision's MobileNetV3-Large 91, EfficientNet-B0 124, the zoo's MobileViT 133); a model
# that needs more than MAX_RESTORED layers in float keeps too little int8 to be faster, and the held-out gate then
# refuses it. Its error spread over the network rather than at the input, timm's MobileNetV4-conv-small reaches
# cosine 0.987 with half its layers float (bf16), 0.992 with them in fp32.
MAX_RANKED = 128
MAX_RESTORED = 12
RANKING_SAMPLES = 8


def fp32_parts(tenth: List[str], prefix: List[str]) -> List[List[str]]:
    """The layers of a float prefix to mark fp32, in the order tried: its first FP32_FIRST of the network (`tenth`)
    when that is a part of it, then all of it."""
    return ([tenth] if 0 < len(tenth) < len(prefix) else []) + [prefix]


def _accuracy_control(nncf: Any, model: Any, calibration: Any, validation: List[List[np.ndarray]],
                      references: List[List[np.ndarray]], want: float, subset: int,
                      precision: str) -> Tuple[Any, Dict[str, Any], List[str], Optional[Ir]]:
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    def metric(compiled: Any, data: Any) -> float:
        pairs = list(data)
        return _worst_cosine(compiled, [inputs for inputs, _ in pairs], [reference for _, reference in pairs])

    checks = nncf.Dataset(list(zip([list(b) for b in validation], references)))
    quantized = nncf.quantize_with_accuracy_control(
        model, calibration, checks, validation_fn=metric, max_drop=1.0 - want, drop_type=nncf.DropType.ABSOLUTE,
        subset_size=subset, preset=nncf.QuantizationPreset.MIXED,
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
            max_num_iterations=MAX_RESTORED, ranking_subset_size=min(len(validation), RANKING_SAMPLES)))
    return quantized, {"first": 0, "share": 0.0, "computes_in": precision, "accuracy_control": True}, [], None


def _worst_cosine(compiled: Any, batches: List[Any], references: List[List[np.ndarray]]) -> float:
    """The lowest over outputs of the mean cosine of a compiled model's outputs on `batches` to `references`: the
    validation split's metric, for the float prefixes and for NNCF's accuracy control."""
    got = [[np.asarray(v) for v in compiled(list(inputs)).values()] for inputs in batches]
    return worst_cosine(got, references)


def _float_computing(model: Any) -> List[str]:
    """The convolutions and matrix products of an int8 model that compute in float (no FakeQuantize feeds them)."""
    return sorted({op.get_friendly_name() for op in model.get_ops()
                   if op.get_type_name() in ("Convolution", "GroupConvolution", "MatMul")
                   and not _fed_by_fake_quantize(op)})


# Layers that move or select int8 values without computing: NNCF quantizes before them (YOLO11n's convolutions
# after a Split or Concat of quantized tensors are int8, with no FakeQuantize of their own).
PASS_THROUGH = ("Concat", "Split", "VariadicSplit", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "StridedSlice",
                "MaxPool", "Interpolate", "Pad")


def _fed_by_fake_quantize(op: Any) -> bool:
    """Whether an operation's activation input comes through a FakeQuantize (NNCF's int8 marker), directly or
    through PASS_THROUGH layers (every input of a Concat)."""
    return _int8_values(op.input_value(0).get_node())


def _int8_values(node: Any, depth: int = 0) -> bool:
    """Whether `node` outputs int8 values: a FakeQuantize, or a PASS_THROUGH layer fed by them (a Concat by every
    input, the others by their first)."""
    kind = node.get_type_name()
    if kind == "FakeQuantize":
        return True
    if kind not in PASS_THROUGH or depth >= 32:
        return False
    sources = node.input_values() if kind == "Concat" else node.input_values()[:1]
    return all(_int8_values(value.get_node(), depth + 1) for value in sources)


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


def _constant_bytes(model: Any) -> int:
    return int(sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant"))
