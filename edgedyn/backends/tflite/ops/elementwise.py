"""Arithmetic with numpy broadcasting (add, sub, mul, div, maximum, minimum, pow) in whatever layout the operands have."""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, constant, mirrors
from edgedyn.backends.tflite.ops.fusion import NONE, fused, fused_activation, hardswish_end
from edgedyn.backends.tflite.ops.integers import cast

aten = torch.ops.aten


def operand_layout(operands: Sequence[Any], rank: int) -> layout.Perm:
    """The layout to compute in: that of a computed full-rank operand stored other than torch's (say NHWC),
    so chains of convolutions and elementwise ops never leave NHWC; the torch layout otherwise."""
    for value in operands:
        if isinstance(value, Value) and not value.is_constant and value.rank == rank:
            if value.perm != layout.identity(rank):
                return value.perm
    return layout.identity(rank)


def binary(ctx: Lowering, op: str, a: Any, b: Any, shape: Sequence[int], options: Optional[str] = None,
           dtype: Any = np.float32) -> Value:
    """`a op b` broadcast to torch shape `shape`; python numbers become scalar constants."""
    return elementwise(ctx, op, (a, b), shape, options, dtype)


def elementwise(ctx: Lowering, op: str, operands: Sequence[Any], shape: Sequence[int], options: Optional[str] = None,
                dtype: Any = np.float32, **fields: Any) -> Value:
    """`op` over broadcast operands (two, or three for SELECT_V2) giving torch shape `shape` of `dtype`; python
    numbers become scalar constants of the operands' type. TFLite wants one input type where torch promotes
    (int + float, int32 + int64): tensors of another type are cast to it first."""
    rank = len(shape)
    perm = operand_layout(operands, rank)
    flip = operand_flip(operands, rank)
    tensors = [v for v in operands if isinstance(v, Value) and v.dtype != np.bool_]
    common = np.result_type(*[v.dtype for v in tensors]) if tensors else np.dtype(np.float32)
    if np.dtype(dtype) != np.bool_:
        common = np.dtype(dtype)  # arithmetic: the result's own type
    operands = [cast(ctx, v, common) if isinstance(v, Value) and v.dtype not in (np.bool_, common) else v
                for v in operands]
    inputs = [_operand(ctx, v, rank, perm, common, flip) for v in operands]
    return ctx.emit(op, inputs, shape, perm, options, dtype, flip=flip, **fields)


def operand_flip(operands: Sequence[Any], rank: int) -> List[int]:
    """The torch dims to compute back to front: those of the first computed full-rank operand that has any
    (mirrored coordinates, ../mirror.py); the others are read the same way."""
    for value in operands:
        if isinstance(value, Value) and not value.is_constant and value.rank == rank and value.flip:
            return sorted(value.flip)
    return []


def _operand(ctx: Lowering, value: Any, rank: int, perm: layout.Perm, number_dtype: Any,
             flip: Sequence[int] = ()) -> int:
    if not isinstance(value, Value):
        return ctx.scalar(value, np.bool_ if isinstance(value, bool) else number_dtype)
    if value.rank == 0:
        return ctx.tensor(value)
    if perm == layout.identity(rank):
        # numpy and TFLite broadcast alike when both are in torch layout: no lifting needed
        lead = rank - value.rank  # broadcasting aligns the last dims
        return ctx.tensor(value, layout.identity(value.rank), [d - lead for d in flip if d >= lead])
    return ctx.tensor(ctx.lift(value, rank), perm, flip)


def _shape(node: Any) -> List[int]:
    return list(node.meta["val"].shape)


def _dtype(node: Any) -> np.dtype:
    return np.dtype(str(node.meta["val"].dtype).replace("torch.", ""))


def _scaled(ctx: Lowering, node: Any, value: Any, alpha: float) -> Any:
    if alpha == 1:
        return value
    if not isinstance(value, Value):
        return value * alpha
    if value.is_constant:
        return constant(value.data * np.asarray(alpha, value.data.dtype))
    return binary(ctx, "MUL", value, float(alpha), value.shape, "MulOptions")


def _with_activation(ctx: Lowering, node: Any, op: str, a: Any, b: Any, options: str) -> Value:
    """A float ADD, SUB or MUL with a ReLU/ReLU6 that follows it fused (a residual block's add + relu)."""
    dtype = _dtype(node)
    activation, produced = fused_activation(node) if dtype == np.float32 else (NONE, node)
    fields = {"fused_activation_function": activation} if activation != NONE else {}
    out = elementwise(ctx, op, (a, b), _shape(node), options, dtype, **fields)
    return fused(ctx, produced, node, out)


@mirrors
def add(ctx: Lowering, node: Any, a: Any, b: Any, alpha: float = 1) -> Value:
    """ADD; or, at the start of core ATen's hard-swish (x + 3, clamps, a product and a division), HARD_SWISH: one
    operator where the decomposition writes five (MobileNetV3-Large: 21 of them, each over a whole activation)."""
    end = hardswish_end(node) if alpha == 1 and isinstance(a, Value) and not a.is_constant else None
    if end is not None and _dtype(end) == np.float32:
        return fused(ctx, end, node, ctx.unary("HARD_SWISH", a))
    return _with_activation(ctx, node, "ADD", a, _scaled(ctx, node, b, alpha), "AddOptions")


@mirrors
def sub(ctx: Lowering, node: Any, a: Any, b: Any, alpha: float = 1) -> Value:
    return _with_activation(ctx, node, "SUB", a, _scaled(ctx, node, b, alpha), "SubOptions")


@mirrors
def rsub(ctx: Lowering, node: Any, a: Any, b: Any, alpha: float = 1) -> Value:
    return binary(ctx, "SUB", b, _scaled(ctx, node, a, alpha), _shape(node), "SubOptions", _dtype(node))


@mirrors
def mul(ctx: Lowering, node: Any, a: Any, b: Any) -> Value:
    return _with_activation(ctx, node, "MUL", a, b, "MulOptions")


@mirrors
def div(ctx: Lowering, node: Any, a: Any, b: Any, rounding_mode: Optional[str] = None) -> Value:
    dtype = np.dtype(str(node.meta["val"].dtype).replace("torch.", ""))
    if rounding_mode == "floor" and dtype.kind in "iu":
        # transformers' audio models count frames as `(n - kernel) // stride`: FLOOR_DIV, in int32 since LiteRT has
        # no int64 kernel for it (exact for the lengths and counts it computes, below 2**31)
        narrow = [cast(ctx, v, np.int32) if isinstance(v, Value) else int(v) for v in (a, b)]
        return cast(ctx, binary(ctx, "FLOOR_DIV", narrow[0], narrow[1], _shape(node), "FloorDivOptions", np.int32),
                    dtype)
    if rounding_mode is not None:
        raise Unsupported("division with rounding_mode={!r}".format(rounding_mode))
    if not isinstance(b, Value):
        return binary(ctx, "MUL", a, 1.0 / b, _shape(node), "MulOptions")  # XNNPACK multiplies faster
    return binary(ctx, "DIV", a, b, _shape(node), "DivOptions")


@mirrors
def maximum(ctx: Lowering, node: Any, a: Any, b: Any) -> Value:
    return binary(ctx, "MAXIMUM", a, b, _shape(node))


@mirrors
def minimum(ctx: Lowering, node: Any, a: Any, b: Any) -> Value:
    return binary(ctx, "MINIMUM", a, b, _shape(node))


@mirrors
def pow_scalar(ctx: Lowering, node: Any, x: Value, exponent: float) -> Value:
    if exponent == 2:
        return binary(ctx, "MUL", x, x, _shape(node), "MulOptions")
    if exponent == 0.5:
        return ctx.unary("SQRT", x)
    return binary(ctx, "POW", x, float(exponent), _shape(node))


CONVERTERS = {
    aten.add.Tensor: add, aten.add.Scalar: add,
    aten.sub.Tensor: sub, aten.sub.Scalar: sub, aten.rsub.Scalar: rsub,
    aten.mul.Tensor: mul, aten.mul.Scalar: mul,
    aten.div.Tensor: div, aten.div.Scalar: div, aten.div.Tensor_mode: div,
    aten.maximum.default: maximum, aten.minimum.default: minimum,
    aten.pow.Tensor_Scalar: pow_scalar,
}
