"""Normalizations TFLite has no builtin for, written with MEAN, SUB, MUL, ADD and RSQRT."""
from typing import Any, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, constant
from edgedyn.backends.tflite.ops.elementwise import binary
from edgedyn.backends.tflite.ops.pooling import reduce

aten = torch.ops.aten


def layer_norm(ctx: Lowering, node: Any, x: Value, normalized_shape: Sequence[int], weight: Optional[Value],
               bias: Optional[Value], eps: float) -> Any:
    """(x - mean) * rsqrt(var + eps) * weight + bias over the last dims; mean and rstd outputs are not kept."""
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    centered = binary(ctx, "SUB", x, reduce(ctx, "MEAN", x, dims, True), x.shape, "SubOptions")
    squared = binary(ctx, "MUL", centered, centered, x.shape, "MulOptions")
    variance = reduce(ctx, "MEAN", squared, dims, True)
    rstd = ctx.unary("RSQRT", binary(ctx, "ADD", variance, float(eps), variance.shape, "AddOptions"))
    y = binary(ctx, "MUL", centered, rstd, x.shape, "MulOptions")
    if weight is not None:
        y = binary(ctx, "MUL", y, weight, x.shape, "MulOptions")
    if bias is not None:
        y = binary(ctx, "ADD", y, bias, x.shape, "AddOptions")
    return y, None, None


def group_norm(ctx: Lowering, node: Any, x: Value, weight: Optional[Value], bias: Optional[Value], n: int,
               channels: int, spatial: int, groups: int, eps: float) -> Any:
    """Statistics over each group of channels (PoolFormer, Wav2Vec2): the same arithmetic as layer norm on x
    viewed as (N, groups, rest), then the per-channel affine on x's own shape."""
    grouped = ctx.reshape(x, [n, groups, (channels // groups) * spatial])
    normalized, _, _ = layer_norm(ctx, node, grouped, [grouped.shape[-1]], None, None, eps)
    y = ctx.reshape(normalized, x.shape)
    per_channel = (channels,) + (1,) * (x.rank - 2)
    if weight is not None:
        y = binary(ctx, "MUL", y, _per_channel(weight, per_channel), x.shape, "MulOptions")
    if bias is not None:
        y = binary(ctx, "ADD", y, _per_channel(bias, per_channel), x.shape, "AddOptions")
    return y, None, None


def _per_channel(value: Value, shape: Sequence[int]) -> Value:
    if not value.is_constant:
        raise Unsupported("normalization weights computed at run time")
    return constant(value.data.astype(np.float32).reshape(shape))


def batch_norm(ctx: Lowering, node: Any, x: Value, weight: Optional[Value], bias: Optional[Value], mean: Value,
               var: Value, momentum: float, eps: float) -> Any:
    """Inference batch norm left unfolded (no convolution before it): one MUL and one ADD per channel."""
    if not all(v is None or v.is_constant for v in (weight, bias, mean, var)):
        raise Unsupported("batch norm statistics computed at run time")
    channels = x.shape[1]
    scale = 1.0 / np.sqrt(var.data.astype(np.float64) + eps)
    if weight is not None:
        scale = scale * weight.data
    shift = -mean.data * scale + (bias.data if bias is not None else 0.0)
    per_channel = (channels,) + (1,) * (x.rank - 2)
    y = binary(ctx, "MUL", x, constant(scale.astype(np.float32).reshape(per_channel)), x.shape, "MulOptions")
    y = binary(ctx, "ADD", y, constant(shift.astype(np.float32).reshape(per_channel)), x.shape, "AddOptions")
    return y, None, None


CONVERTERS = {
    aten.native_layer_norm.default: layer_norm,
    aten.native_group_norm.default: group_norm,
    aten._native_batch_norm_legit_no_training.default: batch_norm,
}
