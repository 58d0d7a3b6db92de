"""ONNX layer operators (convolution, pooling, normalization, resize, pad, reductions) for onnx_ops.OPS."""
import math
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from edgedyn.errors import CaptureError
from edgedyn.frontend.onnx_ops import OPS, Attributes, Op, Value, as_tensor, axes_input, ints, op

# Not an ONNX operator: onnx_import fuses MatMul(x, constant W) + Add(constant b) into it.
LINEAR = "edgedyn.Linear"


@op(LINEAR)
def _linear(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, weight, bias = (as_tensor(v) for v in inputs)  # type: ignore[arg-type]
    if weight.dim() != 2 or bias.dim() > 1:
        return [torch.matmul(x, weight) + bias]
    return [F.linear(x, weight.t(), bias)]

def _spatial_padding(x: torch.Tensor, attributes: Attributes, kernel: Sequence[int], strides: Sequence[int],
                     dilations: Sequence[int]) -> "tuple":
    """(x padded where ONNX pads are asymmetric or SAME_*, the symmetric padding left for the torch op)."""
    rank = len(kernel)
    auto_pad = attributes.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []  # type: List[int]
        ends = []  # type: List[int]
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            pads.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID":
        pads, ends = [0] * rank, [0] * rank
    else:
        given = list(attributes.get("pads", [0] * 2 * rank))
        pads, ends = given[:rank], given[rank:]
    if pads == ends:
        return x, pads
    flat = []  # type: List[int]
    for begin, end in reversed(list(zip(pads, ends))):
        flat += [begin, end]
    return F.pad(x, flat), [0] * rank


@op("Conv")
def _conv(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, weight = as_tensor(inputs[0]), as_tensor(inputs[1])  # type: ignore[arg-type]
    bias = as_tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    rank = weight.dim() - 2
    kernel = list(weight.shape[2:])
    strides = list(attributes.get("strides", [1] * rank))
    dilations = list(attributes.get("dilations", [1] * rank))
    x, padding = _spatial_padding(x, attributes, kernel, strides, dilations)
    function = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    return [function(x, weight, bias, strides, padding, dilations, attributes.get("group", 1))]


@op("MaxPool", "AveragePool")
def _pool(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    kernel = list(attributes["kernel_shape"])
    rank = len(kernel)
    strides = list(attributes.get("strides", [1] * rank))
    dilations = list(attributes.get("dilations", [1] * rank))
    ceil = bool(attributes.get("ceil_mode", 0))
    padded, padding = _spatial_padding(x, attributes, kernel, strides, dilations)
    return [_pool_call(padded, attributes, kernel, strides, padding, dilations, ceil)]


def _pool_call(x: torch.Tensor, attributes: Attributes, kernel: List[int], strides: List[int], padding: List[int],
               dilations: List[int], ceil: bool) -> torch.Tensor:
    rank = len(kernel)
    if attributes["_op"] == "MaxPool":
        function = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]
        return function(x, kernel, strides, padding, dilations, ceil_mode=ceil)
    if any(d != 1 for d in dilations):
        raise CaptureError("ONNX AveragePool with dilations is not supported")
    function = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank]
    return function(x, kernel, strides, padding, ceil_mode=ceil,
                    count_include_pad=bool(attributes.get("count_include_pad", 0)))


@op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    axes = list(range(2, x.dim()))
    if attributes["_op"] == "GlobalMaxPool":
        return [torch.amax(x, dim=axes, keepdim=True)]
    return [torch.mean(x, dim=axes, keepdim=True)]


@op("BatchNormalization")
def _batch_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, scale, bias, mean, var = (as_tensor(v) for v in inputs[:5])  # type: ignore[arg-type]
    return [F.batch_norm(x, mean, var, scale, bias, False, 0.0, attributes.get("epsilon", 1e-5))]


@op("LayerNormalization")
def _layer_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", -1) % x.dim()
    bias = as_tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    return [F.layer_norm(x, list(x.shape[axis:]), as_tensor(inputs[1]), bias,  # type: ignore[arg-type]
                         attributes.get("epsilon", 1e-5))]


@op("InstanceNormalization")
def _instance_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, scale, bias = (as_tensor(v) for v in inputs[:3])  # type: ignore[arg-type]
    return [F.instance_norm(x, weight=scale, bias=bias, eps=attributes.get("epsilon", 1e-5))]


@op("Pad")
def _pad(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    pads = ints(inputs[1]) if len(inputs) > 1 else list(attributes.get("pads", []))
    rank = x.dim()
    axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(rank))
    begins, ends = [0] * rank, [0] * rank
    for position, axis in enumerate(axes):
        begins[axis % rank], ends[axis % rank] = pads[position], pads[position + len(axes)]
    flat = []  # type: List[int]
    for axis in reversed(range(rank)):
        flat += [begins[axis], ends[axis]]
    value = float(np.asarray(inputs[2])) if len(inputs) > 2 and inputs[2] is not None else 0.0
    mode = attributes.get("mode", "constant")
    if mode != "constant":
        flat = flat[:2 * (rank - 2)]
        return [F.pad(x, flat, mode={"reflect": "reflect", "edge": "replicate"}[mode])]
    return [F.pad(x, flat, value=value)]


@op("Resize")
def _resize(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    sizes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else []
    scales = [float(s) for s in np.asarray(inputs[2]).reshape(-1)] if len(inputs) > 2 and inputs[2] is not None \
        and np.asarray(inputs[2]).size else []
    target = sizes[2:] if sizes else [int(math.floor(n * s)) for n, s in zip(x.shape[2:], scales[2:])]
    mode = attributes.get("mode", "nearest")
    transform = attributes.get("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest" and transform == "asymmetric" and attributes.get("nearest_mode", "round_prefer_floor") \
            == "floor":
        return [F.interpolate(x, size=target, mode="nearest")]
    if mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        kind = {3: "linear", 4: "bilinear", 5: "trilinear"}[x.dim()]
        return [F.interpolate(x, size=target, mode=kind, align_corners=transform == "align_corners")]
    if mode == "cubic" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners") and x.dim() == 4:
        return [F.interpolate(x, size=target, mode="bicubic", align_corners=transform == "align_corners")]
    raise CaptureError("ONNX Resize with mode {} and coordinate_transformation_mode {} is not supported yet".format(
        mode, transform))


def _reduce(torch_function: Callable[..., torch.Tensor]) -> Op:
    def run(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
        x = as_tensor(inputs[0])  # type: ignore[arg-type]
        axes = axes_input(inputs, attributes)
        if not axes:
            if attributes.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.dim()))
        return [torch_function(x, axes, bool(attributes.get("keepdims", 1)))]
    return run


OPS.update({
    "ReduceMean": _reduce(lambda x, axes, keep: torch.mean(x, dim=axes, keepdim=keep)),
    "ReduceSum": _reduce(lambda x, axes, keep: torch.sum(x, dim=axes, keepdim=keep)),
    "ReduceMax": _reduce(lambda x, axes, keep: torch.amax(x, dim=axes, keepdim=keep)),
    "ReduceMin": _reduce(lambda x, axes, keep: torch.amin(x, dim=axes, keepdim=keep)),
    "ReduceProd": _reduce(lambda x, axes, keep: _product(x, axes, keep)),
    "ReduceL2": _reduce(lambda x, axes, keep: torch.sqrt(torch.sum(x * x, dim=axes, keepdim=keep))),
})


def _product(x: torch.Tensor, axes: List[int], keep: bool) -> torch.Tensor:
    for axis in sorted((a % x.dim() for a in axes), reverse=True):
        x = torch.prod(x, dim=axis, keepdim=keep)
    return x


@op("ArgMax", "ArgMin")
def _arg_extreme(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    function = torch.argmax if attributes["_op"] == "ArgMax" else torch.argmin
    return [function(x, dim=attributes.get("axis", 0), keepdim=bool(attributes.get("keepdims", 1)))]
