"""Pooling and reductions: MAX_POOL_2D/AVERAGE_POOL_2D in NHWC, MEAN/SUM/REDUCE_MAX over any layout."""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, mirrors
from edgedyn.backends.tflite.ops.padding import MAX_POOL_FILL, pair, spatial_padding, window_flip
from edgedyn.backends.tflite.writer import Quant
from edgedyn.runtime.kernels.base import is_global_average

aten = torch.ops.aten


def output_shape(node: Any) -> List[int]:
    """The torch shape of the node's (first) output."""
    val = node.meta["val"]
    return list((val[0] if isinstance(val, (tuple, list)) else val).shape)


def window(node: Any, x: Value, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
            ceil_mode: bool) -> Any:
    kernel = pair(kernel)
    stride = pair(stride) if stride else kernel
    padding = pair(padding)
    if x.rank != 4:
        raise Unsupported("{}-d pooling; the TFLite writer handles 2-d".format(x.rank - 2))
    floor_shape = [(x.shape[2 + i] + 2 * padding[i] - kernel[i]) // stride[i] + 1 for i in range(2)]
    if ceil_mode and floor_shape != output_shape(node)[2:]:
        raise Unsupported("ceil_mode=True where it changes the output size")
    return kernel, stride, padding


def never_negative(node: Any) -> bool:
    """Whether the fx node's values are >= 0 by construction: a ReLU, or a clamp/hardtanh with a lower bound >= 0."""
    target = getattr(node, "target", None)
    if target in (aten.relu.default, aten.relu6.default):
        return True
    if target == aten.hardtanh.default:
        return float(node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)) >= 0
    if target == aten.clamp.default:
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        return isinstance(low, (int, float)) and low >= 0
    return False


@mirrors
def max_pool2d(ctx: Lowering, node: Any, x: Value, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> Any:
    if any(d != 1 for d in pair(dilation)):
        raise Unsupported("dilated max pooling")
    kernel, stride, padding = window(node, x, kernel, stride, padding, ceil_mode)
    fill = 0.0 if never_negative(node.args[0]) else MAX_POOL_FILL
    mirror, flip = window_flip(ctx)
    source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC, flip), x.shape, kernel, stride, padding, (1, 1),
                                   pad_value=fill, mirrored=mirror)
    out = ctx.emit("MAX_POOL_2D", [source], output_shape(node), layout.NHWC, "Pool2DOptions", padding=mode,
                   stride_h=stride[0], stride_w=stride[1], filter_height=kernel[0], filter_width=kernel[1], flip=flip)
    return out, None  # no indices: getitem(…, 1) reports that


@mirrors
def max_pool2d_only(ctx: Lowering, node: Any, *args: Any, **kwargs: Any) -> Value:
    return max_pool2d(ctx, node, *args, **kwargs)[0]


@mirrors
def avg_pool2d(ctx: Lowering, node: Any, x: Value, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> Value:
    if divisor_override is not None:
        raise Unsupported("divisor_override")
    if x.rank == 4 and is_global_average(x.shape[2:], output_shape(node)[2:], pair(kernel), pair(padding)):
        return reduce(ctx, "MEAN", x, [2, 3], True)
    kernel, stride, padding = window(node, x, kernel, stride, padding, ceil_mode)
    mirror, flip = window_flip(ctx)
    source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC, flip), x.shape, kernel, stride, padding, (1, 1),
                                   same_ok=not count_include_pad, mirrored=mirror)
    out = _average(ctx, source, output_shape(node), kernel, stride, mode, flip)
    if mode == 1 and any(padding) and not count_include_pad:
        scale = real_window_scale(x.shape[2:], kernel, stride, padding)
        scale = np.asarray(scale[:, ::-1, ::-1], order="C") if mirror else scale
        return ctx.emit("MUL", [out.tensor, ctx.writer.constant(scale)], out.shape, layout.NHWC, "MulOptions",
                        flip=flip)
    return out


def real_window_scale(size: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int]) -> np.ndarray:
    """count_include_pad=False on padding that SAME cannot say: the VALID average over zero borders divides each
    window's sum by the whole window; times this (1, H, W, 1) factor it divides by the window's real values."""
    counts = []
    for i in range(2):
        starts = np.arange((size[i] + 2 * padding[i] - kernel[i]) // stride[i] + 1) * stride[i] - padding[i]
        counts.append(np.minimum(starts + kernel[i], size[i]) - np.maximum(starts, 0))
    scale = kernel[0] * kernel[1] / np.outer(counts[0], counts[1])
    return scale.astype(np.float32)[None, :, :, None]


def _average(ctx: Lowering, source: int, shape: List[int], kernel: Sequence[int], stride: Sequence[int],
             mode: int, flip: Sequence[int] = ()) -> Value:
    return ctx.emit("AVERAGE_POOL_2D", [source], shape, layout.NHWC, "Pool2DOptions", padding=mode,
                    stride_h=stride[0], stride_w=stride[1], filter_height=kernel[0], filter_width=kernel[1], flip=flip)


@mirrors
def adaptive_avg_pool2d(ctx: Lowering, node: Any, x: Value, output_size: Sequence[int]) -> Value:
    """A mean for output 1x1, an average pool when the output size divides the input; nothing else."""
    size = pair(output_size)
    if size == [1, 1]:
        return reduce(ctx, "MEAN", x, [2, 3], True)
    if any(x.shape[2 + i] % size[i] for i in range(2)):
        raise Unsupported("adaptive pooling from {} to {}, which is not a fixed window".format(
            list(x.shape[2:]), size))
    kernel = [x.shape[2 + i] // size[i] for i in range(2)]  # windows that tile the input: mirrored or not alike
    return _average(ctx, ctx.tensor(x, layout.NHWC, x.flip), output_shape(node), kernel, kernel, 1, x.flip)


def reduce(ctx: Lowering, op: str, x: Value, dims: Optional[Sequence[int]], keepdim: bool,
           quant: Optional[Quant] = None) -> Value:
    """Reduces torch dims `dims` in the layout x is stored in; without keepdim the rest keep their order.
    `quant`: the int8 output's scale (ops/int8.py), None for float."""
    dims = sorted({d % x.rank for d in dims}) if dims else list(range(x.rank))
    axes = [x.perm.index(d) for d in dims]
    if keepdim:
        shape = [1 if i in dims else n for i, n in enumerate(x.shape)]
        perm, flip = x.perm, list(x.flip)  # a reduced dim has size 1: no longer flipped (Value)
    else:
        shape = [n for i, n in enumerate(x.shape) if i not in dims]
        perm = layout.drop_dims(x.perm, dims)
        flip = [d - sum(1 for r in dims if r < d) for d in x.flip if d not in dims]
    return ctx.emit(op, [ctx.tensor(x, x.perm, x.flip), ctx.ints(axes)], shape, perm, "ReducerOptions", x.dtype,
                    quant, flip=flip, keep_dims=keepdim)


def _reducer(op: str) -> Any:
    @mirrors
    def convert(ctx: Lowering, node: Any, x: Value, dims: Optional[Sequence[int]] = None, keepdim: bool = False,
                dtype: Any = None) -> Value:
        if dtype is not None and dtype != torch.float32:
            raise Unsupported("reduction to {}".format(dtype))
        return reduce(ctx, op, x, dims, keepdim)

    return convert


CONVERTERS = {
    aten.max_pool2d_with_indices.default: max_pool2d,
    aten.max_pool2d.default: max_pool2d_only,
    aten.avg_pool2d.default: avg_pool2d,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.mean.dim: _reducer("MEAN"),
    aten.sum.dim_IntList: _reducer("SUM"),
    aten.amax.default: _reducer("REDUCE_MAX"),
}
