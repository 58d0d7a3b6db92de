"""Advanced indexing by constant aranges, rewritten as views: `x[arange(B)[:, None, None, None], arange(L)]`.

transformers builds its attention masks with `torch.vmap`-style index functions (`padding_mask_function`): the
user's `attention_mask` is read as `mask[batch_idx, kv_idx]` with broadcast aranges that constant folding turns
into constants. At fixed shapes that gather only inserts size-1 axes, so it becomes `select` and `unsqueeze` (views
every backend has) instead of `aten.index.Tensor` (a gather the portable and TFLite backends lack).
"""
from typing import List, Optional, Tuple

import torch
from torch import fx

from edgedyn.passes.graph import attribute

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
