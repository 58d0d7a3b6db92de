"""Integer arithmetic on ids at run time: casts, cumsum, and gather along the last dim (RoBERTa's position ids
from the token ids, its token-type lookup)."""
from typing import Any, List

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value, constant
from edgedyn.backends.tflite.writer import TENSOR_TYPES

aten = torch.ops.aten


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(str(dtype).replace("torch.", ""))


def cast(ctx: Lowering, x: Value, dtype: Any) -> Value:
    """x as `dtype` (CAST keeps the layout; constants are converted here)."""
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if dtype not in TENSOR_TYPES:
        raise Unsupported("conversion to {}".format(dtype))
    if x.is_constant:
        return constant(x.data.astype(dtype))
    return ctx.emit("CAST", [ctx.tensor(x)], x.shape, x.perm, "CastOptions", dtype,
                    in_data_type=TENSOR_TYPES[x.dtype], out_data_type=TENSOR_TYPES[dtype])


def to_copy(ctx: Lowering, node: Any, x: Value, *args: Any, **kwargs: Any) -> Value:
    """_to_copy, clone and friends: the value itself, or a CAST when the traced dtype differs."""
    return cast(ctx, x, _np_dtype(node.meta["val"].dtype))


def cumsum(ctx: Lowering, node: Any, x: Value, dim: int, dtype: Any = None) -> Value:
    """CUMSUM along torch dim `dim` as stored; torch sums integers as int64, so the input is cast first."""
    source = cast(ctx, x, _np_dtype(node.meta["val"].dtype))
    axis = source.perm.index(dim % source.rank)
    return ctx.emit("CUMSUM", [ctx.tensor(source), ctx.writer.constant(np.asarray(axis, np.int32))], source.shape,
                    source.perm, "CumsumOptions", source.dtype, exclusive=False, reverse=False)


def gather(ctx: Lowering, node: Any, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    """torch.gather along the last dim with the index sharing x's leading dims: GATHER with batch_dims."""
    dim = dim % x.rank
    shape = list(node.meta["val"].shape)  # type: List[int]
    if dim != x.rank - 1 or index.rank != x.rank or list(index.shape[:-1]) != list(x.shape[:-1]):
        raise Unsupported("gather along dim {} of a {}-d tensor (only the last, same leading dims)".format(
            dim, x.rank))
    inputs = [ctx.torch_order(x) if not x.is_constant else ctx.tensor(x), ctx.torch_order(index)]
    return ctx.emit("GATHER", inputs, shape, None, "GatherOptions", x.dtype, axis=dim, batch_dims=dim)


def flip(ctx: Lowering, node: Any, x: Value, dims: Any) -> Value:
    """x stored with `dims` back to front in its own layout: Lowering.tensor writes the REVERSE_V2s, as many as the
    board's LiteRT needs, and none where no dim of more than one element is flipped."""
    return Value(x.shape, x.dtype, x.perm, tensor=ctx.tensor(x, x.perm, [int(d) % x.rank for d in dims]),
                 quant=x.quant)


def repeat(ctx: Lowering, node: Any, x: Value, repeats: Any) -> Value:
    """TILE in torch order (leading size-1 dims added first, as torch does for extra repeats)."""
    shape = list(node.meta["val"].shape)
    source = ctx.lift(x, len(repeats))
    return ctx.emit("TILE", [ctx.torch_order(source), ctx.writer.constant(np.asarray(repeats, np.int32))], shape,
                    None, "TileOptions", x.dtype)


CONVERTERS = {
    aten.flip.default: flip,
    aten.repeat.default: repeat,
    aten._to_copy.default: to_copy,
    aten.cumsum.default: cumsum,
    aten.gather.default: gather,
}
