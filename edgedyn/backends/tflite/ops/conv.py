"""2-d convolution in NHWC: CONV_2D (weights OHWI) and DEPTHWISE_CONV_2D (weights 1HWO), with torch's padding."""
from typing import Any, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.padding import pair, spatial_padding

aten = torch.ops.aten


def convolution(ctx: Lowering, node: Any, x: Value, weight: Value, bias: Optional[Value], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                groups: int) -> Value:
    if transposed:
        raise Unsupported("transposed convolution (ConvTranspose2d)")
    if x.rank != 4:
        raise Unsupported("{}-d convolution; the TFLite writer handles 2-d".format(x.rank - 2))
    if not weight.is_constant or (bias is not None and not bias.is_constant):
        raise Unsupported("convolution weights computed at run time")
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    w = weight.data.astype(np.float32)
    out_channels, per_group, kh, kw = w.shape
    in_channels = x.shape[1]
    b = bias.data.astype(np.float32) if bias is not None else np.zeros(out_channels, np.float32)
    if ctx.quantize and (groups == 1 or (groups == in_channels and per_group == 1)):
        from edgedyn.backends.tflite.ops import quantized

        return quantized.convolution(ctx, node, x, w, b, stride, padding, dilation, groups)
    x = ctx.dequantized(x)
    source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC), x.shape, (kh, kw), stride, padding, dilation)
    fields = dict(padding=mode, stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                  dilation_w_factor=dilation[1])
    shape = list(node.meta["val"].shape)
    if groups == 1:
        inputs = [source, ctx.writer.constant(w.transpose(0, 2, 3, 1)), ctx.writer.constant(b)]
        return ctx.emit("CONV_2D", inputs, shape, layout.NHWC, "Conv2DOptions", **fields)
    if groups == in_channels and per_group == 1:
        # depthwise: output channel o reads input channel o // multiplier, as TFLite's 1HWO layout does
        inputs = [source, ctx.writer.constant(w.transpose(1, 2, 3, 0)), ctx.writer.constant(b)]
        return ctx.emit("DEPTHWISE_CONV_2D", inputs, shape, layout.NHWC, "DepthwiseConv2DOptions",
                        depth_multiplier=out_channels // in_channels, **fields)
    raise Unsupported("grouped convolution with groups={} of {} channels (only 1 or depthwise)".format(
        groups, in_channels))


CONVERTERS = {aten.convolution.default: convolution}
