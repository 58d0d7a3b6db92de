"""2-d convolution in NHWC: CONV_2D (weights OHWI) and DEPTHWISE_CONV_2D (weights 1HWO), with torch's padding."""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, mirrors
from edgedyn.backends.tflite.ops.fusion import NONE, fused, fused_activation
from edgedyn.backends.tflite.ops.padding import pair, spatial_padding, window_flip

aten = torch.ops.aten


@mirrors
def convolution(ctx: Lowering, node: Any, x: Value, weight: Value, bias: Optional[Value], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                groups: int) -> Value:
    if transposed:
        raise Unsupported("transposed convolution (ConvTranspose2d)")
    if x.rank not in (3, 4):
        raise Unsupported("{}-d convolution; the TFLite writer handles 1-d and 2-d".format(x.rank - 2))
    if not weight.is_constant or (bias is not None and not bias.is_constant):
        raise Unsupported("convolution weights computed at run time")
    w = weight.data.astype(np.float32)
    b = bias.data.astype(np.float32) if bias is not None else np.zeros(w.shape[0], np.float32)
    shape = list(node.meta["val"].shape)
    if x.rank == 3:
        return _conv1d(ctx, x, w, b, stride, padding, dilation, groups, shape)
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    if ctx.quantize and (groups == 1 or (groups == x.shape[1] and w.shape[1] == 1)):
        from edgedyn.backends.tflite.ops import quantized

        return quantized.convolution(ctx, node, x, w, b, stride, padding, dilation, groups)
    activation, produced = fused_activation(node)
    out = _conv2d(ctx, ctx.dequantized(x), w, b, stride, padding, dilation, groups, shape, activation,
                  same=node in ctx.same)
    return fused(ctx, produced, node, out)


def _conv1d(ctx: Lowering, x: Value, w: np.ndarray, b: np.ndarray, stride: Sequence[int], padding: Sequence[int],
            dilation: Sequence[int], groups: int, shape: List[int]) -> Value:
    """(N, C, L) as (N, C, 1, L) through the 2-d kernels (TFLite has no 1-d convolution; Whisper, Wav2Vec2)."""
    x = ctx.dequantized(x)
    image = ctx.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
    out = _conv2d(ctx, image, w[:, :, None, :], b, [1, stride[0]], [0, padding[0]], [1, dilation[0]], groups,
                  [shape[0], shape[1], 1, shape[2]], mirror=False)
    return ctx.reshape(out, shape)


def _conv2d(ctx: Lowering, x: Value, w: np.ndarray, b: np.ndarray, stride: List[int], padding: List[int],
            dilation: List[int], groups: int, shape: List[int], activation: int = NONE, same: bool = False,
            mirror: bool = True) -> Value:
    """The convolution in NHWC; `activation` (fusion.py) is applied by the op itself; `same`: pad x with SAME (its
    PAD was folded in, ops/pad.py); in mirrored coordinates (../mirror.py) where the lowering mirrors, `mirror`
    allows it and the windows can: the kernel flipped, rows and columns in and out back to front."""
    out_channels, per_group, kh, kw = w.shape
    in_channels = x.shape[1]
    mirror, flip = window_flip(ctx, mirror and not same)
    if mirror:
        w = np.asarray(w[:, :, ::-1, ::-1], order="C")
    source = ctx.tensor(x, layout.NHWC, flip)
    source, mode = ((source, 0) if same else
                    spatial_padding(ctx, source, x.shape, (kh, kw), stride, padding, dilation, mirrored=mirror))
    fields = dict(padding=mode, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                  dilation_w_factor=dilation[1], fused_activation_function=activation)
    if groups == 1:
        inputs = [source, ctx.writer.constant(w.transpose(0, 2, 3, 1)), ctx.writer.constant(b)]
        return ctx.emit("CONV_2D", inputs, shape, layout.NHWC, "Conv2DOptions", flip=flip, **fields)
    if groups == in_channels and per_group == 1:
        # depthwise: output channel o reads input channel o // multiplier, as TFLite's 1HWO layout does
        inputs = [source, ctx.writer.constant(w.transpose(1, 2, 3, 0)), ctx.writer.constant(b)]
        return ctx.emit("DEPTHWISE_CONV_2D", inputs, shape, layout.NHWC, "DepthwiseConv2DOptions",
                        depth_multiplier=out_channels // in_channels, flip=flip, **fields)
    return _grouped(ctx, source, w, b, groups, shape, fields, flip)


def _grouped(ctx: Lowering, source: int, w: np.ndarray, b: np.ndarray, groups: int, shape: List[int],
             fields: Any, flip: Any) -> Value:
    """Neither 1 nor depthwise (ResNeXt, Wav2Vec2's positional convolution): TFLite's CONV_2D takes no groups
    that XNNPACK runs, so each group is a STRIDED_SLICE of the channels, a CONV_2D, and one CONCATENATION."""
    per_group, per_out = w.shape[1], w.shape[0] // groups
    padded = ctx.writer.shape(source)  # NHWC, after any explicit PAD
    parts = []
    for g in range(groups):
        part = ctx.writer.tensor("group", padded[:3] + [per_group], np.float32)
        ctx.writer.operator("STRIDED_SLICE", [source, ctx.ints([0, 0, 0, g * per_group]),
                                              ctx.ints(padded[:3] + [(g + 1) * per_group]), ctx.ints([1, 1, 1, 1])],
                            [part], "StridedSliceOptions")
        outputs = slice(g * per_out, (g + 1) * per_out)
        inputs = [part, ctx.writer.constant(w[outputs].transpose(0, 2, 3, 1)), ctx.writer.constant(b[outputs])]
        out = ctx.emit("CONV_2D", inputs, shape[:1] + [per_out] + shape[2:], layout.NHWC, "Conv2DOptions", **fields)
        parts.append(out.tensor)
    return ctx.emit("CONCATENATION", parts, shape, layout.NHWC, "ConcatenationOptions", flip=flip, axis=3)


CONVERTERS = {aten.convolution.default: convolution}
