"""int8 between the int8 layers: ADD, pooling, MEAN, CONCATENATION, PAD, reshapes and activations on int8 tensors.

Static int8 (`--quantize int8`) keeps every tensor between two int8 convolutions int8, as TFLite's converter
writes a full-integer model, so no DEQUANTIZE/QUANTIZE pair sits between them. Scales follow TFLite's kernels:
- ops that only move or select elements (RESHAPE and its relatives, MAX_POOL_2D, AVERAGE_POOL_2D, PAD) keep the
  input's scale and zero point: their int8 kernels do not rescale;
- ADD, MUL, MEAN, RELU/RELU6, HARD_SWISH (matched in core ATen's decomposition of hardswish) take their output
  scale from the calibrated range of their output (ADD, MUL and the convolutions take it from a ReLU/ReLU6 that
  follows, which is fused, so the clamp costs nothing);
- CONCATENATION's int8 kernel wants one scale for every input and the output: inputs on another scale are
  requantized (int8 QUANTIZE) to the output's calibrated range;
- LOGISTIC's int8 output is fixed at scale 1/256, zero point -128 (its kernel's only choice).
A converter returns None for a case it does not cover (a constant operand, broadcasting, no calibrated range):
the lowering then runs the float converter on the dequantized inputs, as before.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops import pooling, shapes
from edgedyn.backends.tflite.ops.elementwise import operand_layout
from edgedyn.backends.tflite.ops.pad import stored_pads
from edgedyn.backends.tflite.ops.padding import MAX_POOL_FILL, explicit, pair, spatial_padding
from edgedyn.backends.tflite.ops.fusion import fused, fused_activation, hardswish_end
from edgedyn.backends.tflite.ops.quantized import output_quant
from edgedyn.backends.tflite.writer import Quant

aten = torch.ops.aten
# Operator versions from which LiteRT registers the int8 kernels (tensorflow/lite/tools/versioning/op_version.cc).
INT8_VERSIONS = {"ADD": 2, "MUL": 2, "MEAN": 2, "AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2, "CONCATENATION": 2, "PAD": 3,
                 "RESHAPE": 1, "RELU": 2, "RELU6": 2, "LOGISTIC": 2, "HARD_SWISH": 1, "QUANTIZE": 2}
LOGISTIC_QUANT = (1.0 / 256.0, -128)


def is_int8(value: Any) -> bool:
    return isinstance(value, Value) and value.quant is not None


def _calibrated(ctx: Lowering, node: Any) -> Optional[Quant]:
    return output_quant(ctx, node) if node.name in ctx.ranges else None


def _emit(ctx: Lowering, op: str, inputs: Sequence[int], shape: Sequence[int], perm: Any, quant: Quant,
          options: Optional[str] = None, **fields: Any) -> Value:
    ctx.writer.require_version(op, INT8_VERSIONS[op])
    return ctx.emit(op, inputs, shape, perm, options, dtype=np.int8, quant=quant, **fields)


def requantized(ctx: Lowering, value: Value, quant: Quant) -> Value:
    """`value` on scale and zero point `quant` (an int8 -> int8 QUANTIZE when they differ)."""
    if value.quant.key() == quant.key():
        return value
    return _emit(ctx, "QUANTIZE", [ctx.tensor(value)], value.shape, value.perm, quant)


def add(ctx: Lowering, node: Any, a: Any, b: Any, alpha: float = 1) -> Optional[Value]:
    """Two int8 tensors (residual connections), each on its own scale, into the output's; or a hard-swish."""
    if alpha != 1:
        return None
    if hardswish_end(node) is not None:
        return hardswish(ctx, node, a)
    return _binary(ctx, "ADD", node, a, b, "AddOptions")


def mul(ctx: Lowering, node: Any, a: Any, b: Any) -> Optional[Value]:
    """Two int8 tensors (SiLU's x * sigmoid(x), squeeze-and-excitation's scaling), into the output's scale."""
    return _binary(ctx, "MUL", node, a, b, "MulOptions")


def _binary(ctx: Lowering, op: str, node: Any, a: Any, b: Any, options: str) -> Optional[Value]:
    """ADD/MUL of two computed tensors of one rank (up to 4, which TFLite's int8 broadcasting covers)."""
    operands = (a, b)
    if not all(isinstance(v, Value) and not v.is_constant for v in operands) or a.rank != b.rank or a.rank > 4:
        return None
    activation, produced = fused_activation(node)
    quant = _calibrated(ctx, produced)
    if quant is None or any(not is_int8(v) and arg.name not in ctx.ranges for v, arg in zip(operands, node.args)):
        return None
    a, b = [ctx.quantized(v, arg) for v, arg in zip(operands, node.args)]
    perm = operand_layout((a, b), a.rank)
    out = _emit(ctx, op, [ctx.tensor(a, perm), ctx.tensor(b, perm)], pooling.output_shape(node), perm, quant, options,
                fused_activation_function=activation)
    return fused(ctx, produced, node, out)


def hardswish(ctx: Lowering, start: Any, x: Value) -> Optional[Value]:
    """HARD_SWISH for the whole decomposed pattern: the steps in between are marked done, with no operators."""
    end = hardswish_end(start)
    quant = _calibrated(ctx, end)
    if not is_int8(x) or quant is None:
        return None
    return fused(ctx, end, start, _emit(ctx, "HARD_SWISH", [ctx.tensor(x)], x.shape, x.perm, quant))


def _keeps_scale(convert: Callable[..., Any]) -> Callable[..., Any]:
    """A converter that only moves elements, run on the int8 tensor (its output keeps the input's scale)."""
    def int8(ctx: Lowering, node: Any, x: Any, *args: Any, **kwargs: Any) -> Optional[Value]:
        if not is_int8(x):
            return None
        out = convert(ctx, node, x, *args, **kwargs)
        return out if is_int8(out) else None

    int8.__name__ = convert.__name__
    return int8


def max_pool2d(ctx: Lowering, node: Any, x: Value, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> Any:
    if not is_int8(x) or any(d != 1 for d in pair(dilation)):
        return None
    kernel, stride, padding = pooling.window(node, x, kernel, stride, padding, ceil_mode)
    source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC), x.shape, kernel, stride, padding, (1, 1),
                                   pad_value=MAX_POOL_FILL, quant=x.quant)
    out = _emit(ctx, "MAX_POOL_2D", [source], pooling.output_shape(node), layout.NHWC, x.quant, "Pool2DOptions",
                padding=mode, stride_h=stride[0], stride_w=stride[1], filter_height=kernel[0], filter_width=kernel[1])
    return out, None


def _first(outputs: Optional[Any]) -> Optional[Value]:
    """max_pool2d without indices: the int8 output of max_pool2d_with_indices' converter, or None."""
    return outputs[0] if outputs is not None else None


def avg_pool2d(ctx: Lowering, node: Any, x: Value, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> Optional[Value]:
    if not is_int8(x) or divisor_override is not None or x.rank != 4:
        return None
    if pooling.is_global_average(x.shape[2:], pooling.output_shape(node)[2:], pair(kernel), pair(padding)):
        return _mean(ctx, node, x, [2, 3], True)
    kernel, stride, padding = pooling.window(node, x, kernel, stride, padding, ceil_mode)
    if not count_include_pad and explicit(x.shape, kernel, stride, padding, (1, 1)):
        return None  # the float average scales each window by its real values (pooling.real_window_scale)
    source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC), x.shape, kernel, stride, padding, (1, 1),
                                   same_ok=not count_include_pad, quant=x.quant)
    return _average(ctx, source, pooling.output_shape(node), kernel, stride, mode, x.quant)


def _average(ctx: Lowering, source: int, shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
             mode: int, quant: Quant) -> Value:
    return _emit(ctx, "AVERAGE_POOL_2D", [source], shape, layout.NHWC, quant, "Pool2DOptions", padding=mode,
                 stride_h=stride[0], stride_w=stride[1], filter_height=kernel[0], filter_width=kernel[1])


def adaptive_avg_pool2d(ctx: Lowering, node: Any, x: Value, output_size: Sequence[int]) -> Optional[Value]:
    size = pair(output_size)
    if not is_int8(x):
        return None
    if size == [1, 1]:
        return _mean(ctx, node, x, [2, 3], True)
    if any(x.shape[2 + i] % size[i] for i in range(2)):
        return None
    kernel = [x.shape[2 + i] // size[i] for i in range(2)]
    return _average(ctx, ctx.tensor(x, layout.NHWC), pooling.output_shape(node), kernel, kernel, 1, x.quant)


def mean(ctx: Lowering, node: Any, x: Value, dims: Optional[Sequence[int]] = None, keepdim: bool = False,
         dtype: Any = None) -> Optional[Value]:
    if not is_int8(x) or (dtype is not None and dtype != torch.float32):
        return None
    return _mean(ctx, node, x, dims, keepdim)


def _mean(ctx: Lowering, node: Any, x: Value, dims: Optional[Sequence[int]], keepdim: bool) -> Optional[Value]:
    """int8 MEAN rescales to its own output range (the mean of a feature map spans less than the map)."""
    quant = _calibrated(ctx, node)
    if quant is None:
        return None
    ctx.writer.require_version("MEAN", INT8_VERSIONS["MEAN"])
    return pooling.reduce(ctx, "MEAN", x, dims, keepdim, quant=quant)


def cat(ctx: Lowering, node: Any, tensors: Sequence[Value], dim: int = 0) -> Optional[Value]:
    quant = _calibrated(ctx, node)
    if quant is None or not any(is_int8(t) for t in tensors) or any(t.is_constant for t in tensors):
        return None
    if any(not is_int8(t) and arg.name not in ctx.ranges for t, arg in zip(tensors, node.args[0])):
        return None
    parts = [requantized(ctx, ctx.quantized(t, arg), quant) for t, arg in zip(tensors, node.args[0])]
    ctx.writer.require_version("CONCATENATION", INT8_VERSIONS["CONCATENATION"])
    return shapes.cat(ctx, node, parts, dim, quant=quant)


def constant_pad_nd(ctx: Lowering, node: Any, x: Value, pad: Sequence[int], value: float = 0.0) -> Optional[Value]:
    """Zero padding on int8 is padding with the zero point (TFLite's PAD does that for a quantized input)."""
    if not is_int8(x) or value != 0 or any(p < 0 for p in pad):
        return None
    if not any(pad):
        return x
    stored = stored_pads(x, pad)
    return _emit(ctx, "PAD", [ctx.tensor(x), ctx.writer.constant(stored)], pooling.output_shape(node), x.perm, x.quant,
                 "PadOptions")


def _activation(op: str) -> Callable[..., Any]:
    """An int8 activation whose output takes its calibrated range (or LOGISTIC's fixed one)."""
    def convert(ctx: Lowering, node: Any, x: Value, *args: Any) -> Optional[Value]:
        if not is_int8(x):
            return None
        quant = Quant(*LOGISTIC_QUANT) if op == "LOGISTIC" else _calibrated(ctx, node)
        if quant is None:
            return None
        return _emit(ctx, op, [ctx.tensor(x)], x.shape, x.perm, quant)

    convert.__name__ = op.lower()
    return convert


def clamp(ctx: Lowering, node: Any, x: Value, min: Any = None, max: Any = None) -> Optional[Value]:
    """A ReLU/ReLU6 that could not be fused into its producer (it has other users)."""
    op = {(0, None): "RELU", (0, 6): "RELU6"}.get((min, max))
    return _activation(op)(ctx, node, x) if op else None


def hardtanh(ctx: Lowering, node: Any, x: Value, min_val: float = -1.0, max_val: float = 1.0) -> Optional[Value]:
    return clamp(ctx, node, x, min_val, max_val)


_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dims,
             aten.squeeze.dim, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints,
             aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
             aten.permute.default, aten.transpose.int, aten.t.default)

# Note: the lowering asks these first for an op whose input is int8 (lowering.py, _convert); None falls back to
# the float converter in ops/ on dequantized inputs.
INT8_CONVERTERS = {
    aten.add.Tensor: add,
    aten.mul.Tensor: mul,
    aten.max_pool2d_with_indices.default: max_pool2d,
    aten.max_pool2d.default: lambda ctx, node, *a, **k: _first(max_pool2d(ctx, node, *a, **k)),
    aten.avg_pool2d.default: avg_pool2d,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.mean.dim: mean,
    aten.cat.default: cat,
    aten.constant_pad_nd.default: constant_pad_nd,
    aten.relu.default: _activation("RELU"),
    aten.sigmoid.default: _activation("LOGISTIC"),
    aten.hardswish.default: _activation("HARD_SWISH"),
    aten.clamp.default: clamp,
    aten.hardtanh.default: hardtanh,
}  # type: Dict[Any, Callable[..., Any]]
INT8_CONVERTERS.update({op: _keeps_scale(shapes.CONVERTERS[op]) for op in _RESHAPES})
