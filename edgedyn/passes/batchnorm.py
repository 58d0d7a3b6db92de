import operator
from typing import Optional

import torch
from torch import fx

from edgedyn.passes.graph import add_constant, attribute

_BATCH_NORM = torch.ops.aten._native_batch_norm_legit_no_training.default
_CONVOLUTION = torch.ops.aten.convolution.default


def fold_batchnorm(gm: fx.GraphModule) -> fx.GraphModule:
    """Folds inference batch norm into the convolution before it: w' = w * g/s, b' = (b - mean) * g/s + beta."""
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not _BATCH_NORM:
            continue
        conv = bn.args[0]
        if not _foldable(conv, bn):
            continue
        weight, bias = _folded(gm, conv, bn)
        new_weight = add_constant(gm, weight, "conv_weight", conv)
        new_bias = add_constant(gm, bias, "conv_bias", conv)
        with gm.graph.inserting_before(conv):
            folded = gm.graph.call_function(_CONVOLUTION, (conv.args[0], new_weight, new_bias) + tuple(conv.args[3:]))
        folded.meta = dict(conv.meta)
        for user in list(bn.users):  # getitem(bn, 0) is the normalized tensor; 1 and 2 are unused statistics
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(folded)
    return gm


def _foldable(conv: fx.Node, bn: fx.Node) -> bool:
    if not isinstance(conv, fx.Node) or conv.target is not _CONVOLUTION or conv.args[6]:  # args[6]: transposed
        return False
    if len(conv.users) != 1:  # the unnormalized output is used elsewhere too
        return False
    constant_args = [conv.args[1], conv.args[2]] + list(bn.args[1:5])
    return all(a is None or (isinstance(a, fx.Node) and a.op == "get_attr") for a in constant_args) \
        and conv.args[1] is not None and bn.args[3] is not None and bn.args[4] is not None


def _folded(gm: fx.GraphModule, conv: fx.Node, bn: fx.Node) -> "tuple[torch.Tensor, torch.Tensor]":
    def read(node: Optional[fx.Node]) -> Optional[torch.Tensor]:
        return None if node is None else attribute(gm, node.target).detach().double()

    weight, bias = read(conv.args[1]), read(conv.args[2])
    gamma, beta, mean, var = (read(a) for a in bn.args[1:5])
    eps = float(bn.args[6])
    scale = torch.rsqrt(var + eps)
    if gamma is not None:
        scale = scale * gamma
    shift = -mean * scale if bias is None else (bias - mean) * scale
    if beta is not None:
        shift = shift + beta
    dtype = attribute(gm, conv.args[1].target).dtype
    folded_weight = weight * scale.reshape([-1] + [1] * (weight.dim() - 1))
    return folded_weight.to(dtype), shift.to(dtype)
