"""Ops that move or reinterpret elements: reshape and its relatives, permute, slice, select, expand, cat, split."""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, constant, mirrors
from edgedyn.backends.tflite.ops.elementwise import operand_flip, operand_layout
from edgedyn.backends.tflite.writer import Quant

aten = torch.ops.aten


def _shape(node: Any) -> List[int]:
    return list(node.meta["val"].shape)


def reshape(ctx: Lowering, node: Any, x: Value, *args: Any, **kwargs: Any) -> Value:
    """view, reshape, squeeze, unsqueeze, flatten: a RESHAPE of torch's memory order to the traced shape."""
    shape = _shape(node)
    return x if list(x.shape) == shape else ctx.reshape(x, shape)


@mirrors
def same(ctx: Lowering, node: Any, x: Value, *args: Any, **kwargs: Any) -> Value:
    """clone, alias, detach, contiguous: the value itself (_to_copy, which may cast, is in integers.py)."""
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype != torch.float32:
        raise Unsupported("conversion to {}".format(dtype))
    return x


def no_op(ctx: Lowering, node: Any, *args: Any, **kwargs: Any) -> None:
    """Checks torch.export leaves in the graph (_assert_tensor_metadata): nothing to run."""
    return None


def permute(ctx: Lowering, node: Any, x: Value, dims: Sequence[int]) -> Value:
    """No operator: the result is x's tensor with a layout saying where each torch dim is stored.

    Consumers that need torch order transpose once; elementwise ops, slices and reductions need nothing.
    """
    dims = [d % x.rank for d in dims]
    if x.is_constant:
        return constant(np.transpose(x.data, dims))
    return Value(_shape(node), x.dtype, tuple(dims.index(d) for d in x.perm), tensor=x.tensor, quant=x.quant)


def transpose(ctx: Lowering, node: Any, x: Value, dim0: int = 0, dim1: int = 1) -> Value:
    dims = list(range(x.rank))
    dims[dim0 % x.rank], dims[dim1 % x.rank] = dims[dim1 % x.rank], dims[dim0 % x.rank]
    return permute(ctx, node, x, dims)


def slice_(ctx: Lowering, node: Any, x: Value, dim: int = 0, start: Optional[int] = None,
           end: Optional[int] = None, step: int = 1) -> Value:
    dim = dim % x.rank
    begin, stop, _ = slice(start, end, step).indices(x.shape[dim])
    if (begin, stop, step) == (0, x.shape[dim], 1):
        return x
    return _strided_slice(ctx, x, {dim: (begin, stop, step)}, _shape(node), x.perm, shrink=None)


def select(ctx: Lowering, node: Any, x: Value, dim: int, index: int) -> Value:
    dim = dim % x.rank
    index = index % x.shape[dim]
    return _strided_slice(ctx, x, {dim: (index, index + 1, 1)}, _shape(node), layout.drop_dims(x.perm, [dim]),
                          shrink=dim)


def _strided_slice(ctx: Lowering, x: Value, ranges: Any, shape: List[int], perm: layout.Perm,
                   shrink: Optional[int]) -> Value:
    """STRIDED_SLICE over x as stored: `ranges` maps torch dims to (begin, end, step)."""
    begin, end, strides = [], [], []
    for d in x.perm:
        b, e, s = ranges.get(d, (0, x.shape[d], 1))
        begin.append(b)
        end.append(e)
        strides.append(s)
    mask = 0 if shrink is None else 1 << x.perm.index(shrink)
    inputs = [ctx.tensor(x), ctx.ints(begin), ctx.ints(end), ctx.ints(strides)]
    return ctx.emit("STRIDED_SLICE", inputs, shape, perm, "StridedSliceOptions", x.dtype, shrink_axis_mask=mask)


def split(ctx: Lowering, node: Any, x: Value, sizes: Any, dim: int = 0) -> Any:
    dim = dim % x.rank
    if isinstance(sizes, int):
        sizes = [min(sizes, x.shape[dim] - s) for s in range(0, x.shape[dim], sizes)]
    parts, start = [], 0
    for size, val in zip(sizes, node.meta["val"]):
        parts.append(_strided_slice(ctx, x, {dim: (start, start + size, 1)}, list(val.shape), x.perm, None))
        start += size
    return tuple(parts)


def expand(ctx: Lowering, node: Any, x: Value, sizes: Sequence[int], implicit: bool = False) -> Value:
    shape = _shape(node)
    if list(x.shape) == shape:
        return x
    source = ctx.lift(x, len(shape))
    return ctx.emit("BROADCAST_TO", [ctx.tensor(source, layout.identity(len(shape))), ctx.ints(shape)], shape,
                    dtype=source.dtype)


def as_strided(ctx: Lowering, node: Any, x: Value, size: Sequence[int], stride: Sequence[int],
               storage_offset: Optional[int] = None) -> Value:
    """Only the no-op case torch.export leaves behind (Swin: the same shape, strides that differ only at size-1
    dims): any real striding reads memory TFLite tensors do not expose."""
    if list(size) != list(x.shape) or storage_offset or not _contiguous(size, stride):
        raise Unsupported("as_strided to size {} strides {} (only the same shape, contiguous)".format(
            list(size), list(stride)))
    return x


def _contiguous(size: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for n, s in reversed(list(zip(size, stride))):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


@mirrors
def cat(ctx: Lowering, node: Any, tensors: Sequence[Value], dim: int = 0, quant: Optional[Quant] = None) -> Value:
    """CONCATENATION; `quant` is the int8 scale every part already has (ops/int8.py), None for float. Mirrored
    parts (ctx.mirror) stay mirrored unless they are joined along a mirrored dim, whose parts would swap places."""
    shape = _shape(node)
    dim = dim % len(shape)
    parts = [t for t in tensors if t.shape[dim] != 0 or t.rank != len(shape)]
    perm = operand_layout(parts, len(shape))
    flip = operand_flip(parts, len(shape))
    flip = [] if dim in flip else flip
    inputs = [ctx.tensor(t, perm, flip) for t in parts]
    dtype = np.int8 if quant is not None else np.dtype(str(node.meta["val"].dtype).replace("torch.", ""))
    return ctx.emit("CONCATENATION", inputs, shape, perm, "ConcatenationOptions", dtype, quant, flip=flip,
                    axis=perm.index(dim))


CONVERTERS = {
    aten.view.default: reshape, aten._unsafe_view.default: reshape, aten.reshape.default: reshape,
    aten.squeeze.dims: reshape, aten.squeeze.dim: reshape, aten.squeeze.default: reshape,
    aten.unsqueeze.default: reshape, aten.flatten.using_ints: reshape,
    aten.clone.default: same, aten.alias.default: same, aten.detach.default: same,
    aten.contiguous.default: same, aten.lift_fresh_copy.default: same,
    aten.permute.default: permute, aten.transpose.int: transpose, aten.t.default: transpose,
    aten.slice.Tensor: slice_, aten.select.int: select,
    aten.split_with_sizes.default: split, aten.split.Tensor: split,
    aten.expand.default: expand,
    aten.cat.default: cat,
    aten.as_strided.default: as_strided,
    aten._assert_tensor_metadata.default: no_op,
}
