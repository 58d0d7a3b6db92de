"""Advanced indexing that fixed shapes make simple, rewritten into ops every backend has.

`index_to_views`: a read by constant broadcast aranges, `x[arange(B)[:, None, None, None], arange(L)]`, is a view.
transformers builds its attention masks with `torch.vmap`-style index functions (`padding_mask_function`): the
user's `attention_mask` is read as `mask[batch_idx, kv_idx]` with broadcast aranges that constant folding turns
into constants. At fixed shapes that gather only inserts size-1 axes, so it becomes `select` and `unsqueeze` (views
every backend has) instead of `aten.index.Tensor` (a gather the portable and TFLite backends lack).
"""
from typing import Any, List, Optional, Tuple

import torch
from torch import fx

from edgedyn.passes.graph import add_constant, attribute

aten = torch.ops.aten


def index_to_views(gm: fx.GraphModule) -> fx.GraphModule:
    """Replaces `aten.index.Tensor` whose indices are constant broadcast aranges by select and unsqueeze views."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index.Tensor:
            continue
        source, indices = node.args[0], node.args[1]
        value = source.meta.get("val") if isinstance(source, fx.Node) else None
        constants = [_constant(gm, index) for index in indices]
        if value is None or any(c is None for c in constants):  # a None index (x[:, i]) is a gather too
            continue
        placement = _arange_axes(tuple(int(s) for s in value.shape), constants)
        if placement is None:
            continue
        dropped, axes, shape = placement
        with gm.graph.inserting_before(node):
            view = source
            for dim in reversed(dropped):  # a size-1 dim read at 0: gone from the result
                view = gm.graph.call_function(aten.select.int, (view, dim, 0))
            for position in range(len(shape)):  # a size-1 axis for every broadcast position no arange runs along
                if position not in axes:
                    view = gm.graph.call_function(aten.unsqueeze.default, (view, position))
        if view is not source:
            view.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _constant(gm: fx.GraphModule, index: object) -> Optional[torch.Tensor]:
    if not isinstance(index, fx.Node) or index.op != "get_attr":
        return None
    value = attribute(gm, index.target)
    if not isinstance(value, torch.Tensor) or value.dtype not in (torch.int64, torch.int32):
        return None
    return value


def _arange_axes(sizes: Tuple[int, ...], indices: List[torch.Tensor]
                 ) -> Optional[Tuple[List[int], List[int], Tuple[int, ...]]]:
    """(the size-1 dims read at 0, the broadcast axis each other index runs along, the broadcast shape) when every
    index is either zeros on a size-1 dim or arange(size) along one axis of its own, in increasing order; None for
    any other gather."""
    if not indices or len(indices) > len(sizes):
        return None
    try:
        shape = tuple(torch.broadcast_shapes(*[tuple(i.shape) for i in indices]))
    except RuntimeError:
        return None
    dropped, axes = [], []  # type: List[int], List[int]
    for dim, (size, index) in enumerate(zip(sizes, indices)):
        padded = (1,) * (len(shape) - index.dim()) + tuple(index.shape)
        long = [axis for axis, extent in enumerate(padded) if extent != 1]
        if size == 1 and not long:
            if int(index.reshape(-1)[0]) != 0:
                return None
            dropped.append(dim)
        elif len(long) == 1 and padded[long[0]] == size and (not axes or long[0] > axes[-1]) and torch.equal(
                index.reshape(-1), torch.arange(size, dtype=index.dtype)):
            axes.append(long[0])
        else:
            return None
    return dropped, axes, shape


def index_put_to_where(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrites `x[mask] = v` and `x[arange(B), positions] = v` (one written position per row, v a single value)
    as `where`, so no backend needs a scatter.

    transformers' audio models (wav2vec2, HuBERT, WavLM) derive the frame mask from the sample mask that way:
    `mask[(arange(B), lengths - 1)] = 1`, then `hidden[~mask] = 0`. A position is wrapped as torch wraps a negative
    index; one past the end writes nothing here, where torch would raise.
    """
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index_put.default:
            continue
        x, indices, value = node.args[0], list(node.args[1]), node.args[2]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        written = _traced(gm, value)
        if accumulate or written is None or written.numel() != 1 or any(i is None for i in indices):
            continue
        traced = _traced(gm, x)
        index_values = [_traced(gm, index) for index in indices]
        if traced is None:
            continue
        shape = tuple(int(s) for s in traced.shape)
        with gm.graph.inserting_before(node):
            if len(indices) == 1 and index_values[0] is not None and index_values[0].dtype == torch.bool:
                condition = _mask_condition(gm, indices[0], tuple(index_values[0].shape), shape)
            else:
                condition = _positions_condition(gm, node, indices, index_values, shape)
            if condition is None:
                continue
            where = gm.graph.call_function(aten.where.self, (condition, value, x))
        where.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(where)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _traced(gm: fx.GraphModule, node: Any) -> Optional[torch.Tensor]:
    """A node's tensor: a weight's value, or the traced (fake) value of anything else; None for a non-tensor."""
    if not isinstance(node, fx.Node):
        return None
    value = attribute(gm, node.target) if node.op == "get_attr" else node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def _mask_condition(gm: fx.GraphModule, mask: fx.Node, mask_shape: Tuple[int, ...],
                    shape: Tuple[int, ...]) -> Optional[fx.Node]:
    """`x[mask] = v`: the mask, with a size-1 axis for each trailing dim of x it does not cover."""
    if mask_shape != shape[:len(mask_shape)]:
        return None
    condition = mask
    for _ in range(len(shape) - len(mask_shape)):
        condition = gm.graph.call_function(aten.unsqueeze.default, (condition, -1))
    return condition


def _positions_condition(gm: fx.GraphModule, node: fx.Node, indices: List[fx.Node], values: List[Any],
                         shape: Tuple[int, ...]) -> Optional[fx.Node]:
    """`x[arange(B), positions] = v`: arange(T) == positions[:, None], with negative positions wrapped."""
    constants = [_constant(gm, index) for index in indices[:-1]]
    last = values[-1]
    if len(indices) != len(shape) or any(c is None for c in constants) or last is None or last.dtype not in (
            torch.int64, torch.int32):
        return None
    rows = shape[:-1]
    try:
        broadcast = tuple(torch.broadcast_shapes(*[tuple(v.shape) for v in values]))
    except RuntimeError:
        return None
    if broadcast != rows or _arange_axes(rows, constants) is None:
        return None
    dropped, axes, _ = _arange_axes(rows, constants)
    if [a for a in range(len(rows)) if rows[a] != 1] != axes:  # each row dim read by its own arange, in place
        return None
    positions = indices[-1]
    if tuple(last.shape) != rows:
        positions = gm.graph.call_function(aten.expand.default, (positions, list(rows)))
    length = shape[-1]
    negative = gm.graph.call_function(aten.lt.Scalar, (positions, 0))
    shift = gm.graph.call_function(aten.mul.Scalar, (
        gm.graph.call_function(aten._to_copy.default, (negative,), {"dtype": last.dtype}), length))
    wrapped = gm.graph.call_function(aten.add.Tensor, (positions, shift))
    column = gm.graph.call_function(aten.unsqueeze.default, (wrapped, -1))
    every = add_constant(gm, torch.arange(length, dtype=last.dtype), "positions", node)
    return gm.graph.call_function(aten.eq.Tensor, (every, column))
