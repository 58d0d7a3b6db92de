"""Activations and other one-input math: layout-agnostic, so the output stays in its input's layout."""
from typing import Any, Optional

import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, mirrors
from edgedyn.backends.tflite.ops.elementwise import binary
from edgedyn.backends.tflite.ops.fusion import fused, relu6_end

aten = torch.ops.aten


def _simple(op: str) -> Any:
    def convert(ctx: Lowering, node: Any, x: Value) -> Value:
        return ctx.unary(op, x)

    convert.__name__ = op.lower()
    return mirrors(convert)


@mirrors
def gelu(ctx: Lowering, node: Any, x: Value, approximate: str = "none") -> Value:
    return ctx.unary("GELU", x, "GeluOptions", approximate=approximate == "tanh")


@mirrors
def leaky_relu(ctx: Lowering, node: Any, x: Value, negative_slope: float = 0.01) -> Value:
    return ctx.unary("LEAKY_RELU", x, "LeakyReluOptions", alpha=float(negative_slope))


@mirrors
def clamp(ctx: Lowering, node: Any, x: Value, min: Optional[float] = None, max: Optional[float] = None) -> Value:
    """ReLU6 (hardtanh 0..6), ReLU and RELU_N1_TO_1 when the bounds match one, MAXIMUM/MINIMUM otherwise."""
    if isinstance(min, Value) or isinstance(max, Value):
        raise Unsupported("bounds given as tensors")
    bounds = (min, max)
    if bounds == (0, 6):
        return ctx.unary("RELU6", x)
    if bounds == (0, None):
        then = relu6_end(node)  # clamp(clamp(x, 0), None, 6): one RELU6
        return fused(ctx, then, node, ctx.unary("RELU6", x)) if then is not None else ctx.unary("RELU", x)
    if bounds == (-1, 1):
        return ctx.unary("RELU_N1_TO_1", x)
    if min is not None:
        x = binary(ctx, "MAXIMUM", x, float(min), x.shape)
    if max is not None:
        x = binary(ctx, "MINIMUM", x, float(max), x.shape)
    return x


@mirrors
def hardtanh(ctx: Lowering, node: Any, x: Value, min_val: float = -1.0, max_val: float = 1.0) -> Value:
    return clamp(ctx, node, x, min_val, max_val)


@mirrors
def hardsigmoid(ctx: Lowering, node: Any, x: Value) -> Value:
    """relu6(x + 3) / 6."""
    shifted = binary(ctx, "ADD", x, 3.0, x.shape, "AddOptions")
    return binary(ctx, "MUL", ctx.unary("RELU6", shifted), 1.0 / 6.0, x.shape, "MulOptions")


@mirrors
def silu(ctx: Lowering, node: Any, x: Value) -> Value:
    return binary(ctx, "MUL", x, ctx.unary("LOGISTIC", x), x.shape, "MulOptions")


CONVERTERS = {
    aten.relu.default: _simple("RELU"),
    aten.sigmoid.default: _simple("LOGISTIC"),
    aten.tanh.default: _simple("TANH"),
    aten.hardswish.default: _simple("HARD_SWISH"),
    aten.exp.default: _simple("EXP"),
    aten.log.default: _simple("LOG"),
    aten.sqrt.default: _simple("SQRT"),
    aten.rsqrt.default: _simple("RSQRT"),
    aten.neg.default: _simple("NEG"),
    aten.abs.default: _simple("ABS"),
    aten.gelu.default: gelu,
    aten.leaky_relu.default: leaky_relu,
    aten.clamp.default: clamp,
    aten.hardtanh.default: hardtanh,
    aten.hardsigmoid.default: hardsigmoid,
    aten.silu.default: silu,
}
