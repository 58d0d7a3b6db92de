"""int8 CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED: the kernels LiteRT hands to XNNPACK's int8 paths.

Static int8 (`--quantize int8`), as TFLite's own converter writes it: int8 input with a per-tensor scale and zero
point from calibration, int8 weights with one symmetric scale per output channel (zero point 0), int32 bias with
scale input_scale * weight_scale[c], int8 output scaled by the calibrated range of the op's output, or of the
ReLU/ReLU6 that follows it, which is fused (fused_activation_function) so the clamp costs nothing.
Weight-only (`--quantize int8-weights`): float input and output, int8 per-channel weights: TFLite's hybrid kernels
quantize the input on the fly (dynamic range quantization).
"""
from typing import Any, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.fusion import fused, fused_activation
from edgedyn.backends.tflite.ops.padding import spatial_padding
from edgedyn.backends.tflite.writer import Quant
from edgedyn.quantize.ranges import per_channel_weights, qparams

aten = torch.ops.aten
_NO_BIAS = -1
# Operator versions from which LiteRT's registrations describe int8 (static) and hybrid (weight-only) kernels.
STATIC_VERSIONS = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4}
HYBRID_VERSIONS = {"CONV_2D": 5, "DEPTHWISE_CONV_2D": 6, "FULLY_CONNECTED": 3}


def output_quant(ctx: Lowering, node: Any) -> Quant:
    """The int8 scale and zero point of the calibrated range of `node`'s output."""
    scale, zero_point = qparams(*ctx.ranges[node.name])
    return Quant(scale, zero_point)


def convolution(ctx: Lowering, node: Any, x: Value, w: np.ndarray, b: np.ndarray, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], groups: int) -> Value:
    out_channels, _, kh, kw = w.shape
    depthwise = groups != 1
    op, options = ("DEPTHWISE_CONV_2D", "DepthwiseConv2DOptions") if depthwise else ("CONV_2D", "Conv2DOptions")
    # TFLite's filter layouts: 1HWO for depthwise (channels last), OHWI otherwise (channels first).
    axis = 3 if depthwise else 0
    stored = w.transpose(1, 2, 3, 0) if depthwise else w.transpose(0, 2, 3, 1)
    weights, scales = per_channel_weights(stored, axis)
    fields = dict(stride_h=stride[0], stride_w=stride[1], dilation_h_factor=dilation[0],
                  dilation_w_factor=dilation[1])
    if depthwise:
        fields["depth_multiplier"] = out_channels // x.shape[1]
    shape = list(node.meta["val"].shape)
    if ctx.quantize == "int8-weights":
        source, mode = spatial_padding(ctx, ctx.tensor(x, layout.NHWC), x.shape, (kh, kw), stride, padding, dilation)
        ctx.writer.require_version(op, HYBRID_VERSIONS[op])
        inputs = [source, ctx.writer.constant(weights, "filter", Quant(scales, 0, axis)), ctx.writer.constant(b)]
        return ctx.emit(op, inputs, shape, layout.NHWC, options, padding=mode, **fields)
    activation, produced = fused_activation(node)
    xq = ctx.quantized(x, node.args[0])
    source, mode = spatial_padding(ctx, ctx.tensor(xq, layout.NHWC), x.shape, (kh, kw), stride, padding, dilation,
                                   quant=xq.quant)
    in_scale = float(xq.quant.scale[0])
    bias = np.round(b.astype(np.float64) / (in_scale * scales.astype(np.float64))).astype(np.int32)
    ctx.writer.require_version(op, STATIC_VERSIONS[op])
    inputs = [source, ctx.writer.constant(weights, "filter", Quant(scales, 0, axis)),
              ctx.writer.constant(bias, "bias", Quant(in_scale * scales, 0, 0))]
    out = ctx.emit(op, inputs, shape, layout.NHWC, options, dtype=np.int8, quant=output_quant(ctx, produced),
                   padding=mode, fused_activation_function=activation, **fields)
    return fused(ctx, produced, node, out)


def fully_connected(ctx: Lowering, node: Any, x: Value, weight: np.ndarray, bias: Optional[Value],
                    x_node: Any) -> Value:
    """int8 (or hybrid) x @ weight.T + bias; a bias that is not one value per output is added in float after."""
    from edgedyn.backends.tflite.ops.elementwise import binary

    shape = list(node.meta["val"].shape)
    weights, scales = per_channel_weights(weight.astype(np.float32), 0)
    folded = bias is not None and bias.is_constant and bias.data.shape == (weight.shape[0],)
    b = bias.data.astype(np.float64) if folded else None
    rest = None if folded else bias
    keep = dict(keep_num_dims=x.rank > 2)
    if ctx.quantize == "int8-weights":
        ctx.writer.require_version("FULLY_CONNECTED", HYBRID_VERSIONS["FULLY_CONNECTED"])
        inputs = [ctx.tensor(x, layout.identity(x.rank)),
                  ctx.writer.constant(weights, "weights", Quant(scales, 0, 0)),
                  ctx.writer.constant(b.astype(np.float32)) if b is not None else _NO_BIAS]
        out = ctx.emit("FULLY_CONNECTED", inputs, shape, None, "FullyConnectedOptions",
                       asymmetric_quantize_inputs=True, **keep)
    else:
        xq = ctx.quantized(x, x_node)
        in_scale = float(xq.quant.scale[0])
        ctx.writer.require_version("FULLY_CONNECTED", STATIC_VERSIONS["FULLY_CONNECTED"])
        inputs = [ctx.tensor(xq, layout.identity(x.rank)),
                  ctx.writer.constant(weights, "weights", Quant(scales, 0, 0)),
                  ctx.writer.constant(np.round(b / (in_scale * scales)).astype(np.int32), "bias",
                                      Quant(in_scale * scales, 0, 0)) if b is not None else _NO_BIAS]
        out = ctx.emit("FULLY_CONNECTED", inputs, shape, None, "FullyConnectedOptions", dtype=np.int8,
                       quant=output_quant(ctx, node), **keep)
    if rest is None:
        return out
    return binary(ctx, "ADD", ctx.dequantized(out), rest, shape, "AddOptions")
