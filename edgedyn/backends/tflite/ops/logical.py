"""Comparisons, boolean logic, where and any: bool tensors at run time (attention masks computed from the input)."""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.elementwise import elementwise
from edgedyn.backends.tflite.ops.pooling import reduce

aten = torch.ops.aten


def _shape(node: Any) -> List[int]:
    return list(node.meta["val"].shape)


def _compare(op: str) -> Any:
    def convert(ctx: Lowering, node: Any, a: Any, b: Any) -> Value:
        return elementwise(ctx, op, (a, b), _shape(node), dtype=np.bool_)

    convert.__name__ = op.lower()
    return convert


def _logical(op: str) -> Any:
    """and/or of bool tensors (bitwise_and/or on bools is the same thing; on integers it is not)."""

    def convert(ctx: Lowering, node: Any, a: Any, b: Any) -> Value:
        for value in (a, b):
            if isinstance(value, Value) and value.dtype != np.bool_:
                raise Unsupported("{} of {} tensors (only bool)".format(op.lower(), value.dtype))
        return elementwise(ctx, op, (a, b), _shape(node), dtype=np.bool_)

    convert.__name__ = op.lower()
    return convert


def logical_not(ctx: Lowering, node: Any, x: Value) -> Value:
    if x.dtype != np.bool_:
        raise Unsupported("logical_not of a {} tensor (only bool)".format(x.dtype))
    return ctx.unary("LOGICAL_NOT", x)


def where(ctx: Lowering, node: Any, condition: Value, a: Any, b: Any) -> Value:
    """SELECT_V2, which broadcasts all three operands as torch.where does."""
    dtype = node.meta["val"].dtype
    if dtype not in (torch.float32, torch.int64, torch.int32):
        raise Unsupported("where choosing {} values".format(dtype))
    return elementwise(ctx, "SELECT_V2", (condition, a, b), _shape(node), dtype=str(dtype).replace("torch.", ""))


def any_dim(ctx: Lowering, node: Any, x: Value, dim: Optional[Any] = None, keepdim: bool = False) -> Value:
    if x.dtype != np.bool_:
        raise Unsupported("any() over a {} tensor (only bool)".format(x.dtype))
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))  # type: Optional[Sequence[int]]
    return reduce(ctx, "REDUCE_ANY", x, dims, keepdim)


def full_like(ctx: Lowering, node: Any, x: Value, fill_value: float, **kwargs: Any) -> Value:
    """A float tensor of one value shaped like x: BROADCAST_TO of a scalar (a constant would store every element)."""
    dtype = node.meta["val"].dtype
    if dtype != torch.float32:
        raise Unsupported("full_like of {}".format(dtype))
    shape = _shape(node)
    return ctx.emit("BROADCAST_TO", [ctx.scalar(float(fill_value)), ctx.ints(shape)], shape)


CONVERTERS = {
    aten.eq.Scalar: _compare("EQUAL"), aten.eq.Tensor: _compare("EQUAL"),
    aten.ne.Scalar: _compare("NOT_EQUAL"), aten.ne.Tensor: _compare("NOT_EQUAL"),
    aten.lt.Scalar: _compare("LESS"), aten.lt.Tensor: _compare("LESS"),
    aten.le.Scalar: _compare("LESS_EQUAL"), aten.le.Tensor: _compare("LESS_EQUAL"),
    aten.gt.Scalar: _compare("GREATER"), aten.gt.Tensor: _compare("GREATER"),
    aten.ge.Scalar: _compare("GREATER_EQUAL"), aten.ge.Tensor: _compare("GREATER_EQUAL"),
    aten.logical_and.default: _logical("LOGICAL_AND"), aten.bitwise_and.Tensor: _logical("LOGICAL_AND"),
    aten.logical_or.default: _logical("LOGICAL_OR"), aten.bitwise_or.Tensor: _logical("LOGICAL_OR"),
    aten.logical_not.default: logical_not, aten.bitwise_not.default: logical_not,
    aten.where.self: where,
    aten.any.dim: any_dim, aten.any.dims: any_dim, aten.any.default: any_dim,
    aten.full_like.default: full_like,
}
