"""Matrix products: FULLY_CONNECTED when the right-hand side is a weight, BATCH_MATMUL when it is computed."""
from typing import Any, Optional

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.elementwise import binary
from edgedyn.backends.tflite.ops.fusion import NONE, fused, fused_activation

aten = torch.ops.aten
_NO_BIAS = -1  # TFLite's marker for an omitted optional input


def fully_connected(ctx: Lowering, node: Any, x: Value, weight: np.ndarray, bias: Optional[Value],
                    x_node: Any = None) -> Value:
    """x @ weight.T + bias, with weight (out, in) as torch's Linear stores it; `x_node` is x's graph node."""
    if ctx.quantize:
        from edgedyn.backends.tflite.ops import quantized

        return quantized.fully_connected(ctx, node, x, weight, bias, x_node)
    shape = list(node.meta["val"].shape)
    bias_tensor = _NO_BIAS
    if bias is not None and bias.is_constant and bias.data.shape == (weight.shape[0],):
        bias_tensor, bias = ctx.writer.constant(bias.data.astype(np.float32)), None
    inputs = [ctx.tensor(x, layout.identity(x.rank)), ctx.writer.constant(weight.astype(np.float32)), bias_tensor]
    activation, produced = fused_activation(node) if bias is None else (NONE, node)
    out = ctx.emit("FULLY_CONNECTED", inputs, shape, None, "FullyConnectedOptions", keep_num_dims=x.rank > 2,
                   fused_activation_function=activation)
    return binary(ctx, "ADD", out, bias, shape, "AddOptions") if bias is not None else fused(ctx, produced, node, out)


def batch_matmul(ctx: Lowering, node: Any, a: Value, b: Value) -> Value:
    if a.rank < 2 or b.rank < 2:
        raise Unsupported("matrix-vector products (an operand of rank {})".format(min(a.rank, b.rank)))
    inputs = [ctx.tensor(v, layout.identity(v.rank)) for v in (a, b)]
    return ctx.emit("BATCH_MATMUL", inputs, list(node.meta["val"].shape), None, "BatchMatMulOptions")


def addmm(ctx: Lowering, node: Any, bias: Value, a: Value, b: Value, beta: float = 1, alpha: float = 1) -> Value:
    if beta != 1 or alpha != 1:
        raise Unsupported("addmm with beta={} alpha={}".format(beta, alpha))
    if b.is_constant:
        return fully_connected(ctx, node, a, b.data.T, bias, node.args[1])
    a, b, bias = ctx.dequantized(a), ctx.dequantized(b), ctx.dequantized(bias)
    product = batch_matmul(ctx, node, a, b)
    return binary(ctx, "ADD", product, bias, product.shape, "AddOptions")


def mm(ctx: Lowering, node: Any, a: Value, b: Value) -> Value:
    if b.is_constant:
        return fully_connected(ctx, node, a, b.data.T, None, node.args[0])
    return batch_matmul(ctx, node, ctx.dequantized(a), ctx.dequantized(b))


def linear(ctx: Lowering, node: Any, x: Value, weight: Value, bias: Optional[Value] = None) -> Value:
    if not weight.is_constant:
        raise Unsupported("linear weights computed at run time")
    return fully_connected(ctx, node, x, weight.data, bias, node.args[0])


CONVERTERS = {
    aten.addmm.default: addmm,
    aten.mm.default: mm,
    aten.bmm.default: batch_matmul,
    aten.matmul.default: batch_matmul,
    aten.linear.default: linear,
}
