"""Parallel convolutions of one input that are summed, written as the one convolution they add up to.

Networks built for structural reparameterization (timm's MobileOne, FastViT, RepVGG, RepGhost; ultralytics'
RepConv) train with several branches per layer: kxk convolutions, a 1x1 convolution and a batch-normed identity, all
reading the same input, their outputs added (and, in FastViT's RepMixer, subtracted and scaled per channel). In eval
mode every branch is linear in that input, so their sum is one convolution whose kernel is the branches' kernels,
each centred in the largest and added. The libraries ship a `reparameterize` call for it, which a user must know
to make before export; this pass does it for any graph (timm's FastViT-T8 as built: 68 convolutions to 52).

A node is merged when it is an add, a subtract or a per-output-channel scale of branches (a branch plus the number
0 is the branch: timm's MobileOne starts each sum at 0) that are all linear in
the same input node `x`: a convolution of `x` with constant weights, a batch norm in inference (of such a
convolution, or of `x` alone), `x` itself, or such a combination. Every branch must be read only by the node that
combines it (else its convolution would run anyway), have the same stride and groups, dilation 1, and kernels
whose padding centres them alike (a 3x3 with padding 1 and a 1x1 with padding 0); `x` itself and a batch norm of
it count as a 1x1 kernel with padding 0, for stride 1 and as many output as input channels. Works on the core-ATen
graph (`convolution`, `_native_batch_norm_legit_no_training`) and on the high-level one the ONNX backends take
(`conv2d`, `batch_norm`). The kernel is summed in float64 and stored in the weights' dtype.
"""
import operator
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import fx

from edgedyn.passes.graph import add_constant, attribute

aten = torch.ops.aten
_CONVOLUTIONS = (aten.convolution.default, aten.conv2d.default)
_BATCH_NORMS = (aten._native_batch_norm_legit_no_training.default, aten.batch_norm.default)
_COMBINE = {aten.add.Tensor: 1.0, aten.add_.Tensor: 1.0, aten.sub.Tensor: -1.0}
_SCALE = (aten.mul.Tensor, aten.mul_.Tensor)


@dataclass
class _Linear:
    """A branch linear in `x`: conv(x, weight, bias) with `stride`, `groups` and each spatial axis' `offset`
    (padding minus half the kernel); `form` is the convolution op to write (None: no convolution in it yet)."""

    x: fx.Node
    # (out, in / groups, kh, kw) and (out,): a convolution's own constants as they are (not copied: every
    # convolution of the graph is described, most never merge), float64 once combined
    weight: torch.Tensor
    bias: torch.Tensor
    stride: Tuple[int, int]
    groups: int
    offset: Tuple[int, int]
    form: Optional[Any]
    dtype: torch.dtype
    convolutions: int  # how many convolutions it stands for
    terms: int = 1  # how many branches (convolutions and identities) it sums


def merge_parallel_convolutions(gm: fx.GraphModule) -> fx.GraphModule:
    """Replaces each sum of parallel branches described in the module docstring by one convolution."""
    linear = {}  # type: Dict[fx.Node, Optional[_Linear]]
    for node in gm.graph.nodes:
        linear[node] = _describe(gm, node, linear)
    replaced = {}  # type: Dict[fx.Node, fx.Node]  # a sum already merged -> its convolution (the input of the next)
    for node in list(gm.graph.nodes):
        found = linear.get(node)
        if found is None or found.form is None or not (found.terms > 1 or node.target in _SCALE):
            continue  # not a sum of branches or a scaled branch (one convolution and its batch norm: fold_batchnorm)
        users = list(node.users)
        if len(users) == 1 and getattr(linear.get(users[0]), "x", None) is found.x:
            continue  # a larger sum of the same input's branches takes it in
        weight = add_constant(gm, found.weight.to(found.dtype), "merged_weight", node)
        bias = add_constant(gm, found.bias.to(found.dtype), "merged_bias", node)
        kernel = found.weight.shape[2:]
        padding = [found.offset[axis] + (kernel[axis] - 1) // 2 for axis in range(2)]
        stride = list(found.stride)
        x = found.x
        while x in replaced:
            x = replaced[x]
        with gm.graph.inserting_before(node):
            if found.form is aten.convolution.default:
                merged = gm.graph.call_function(found.form, (x, weight, bias, stride, padding, [1, 1], False, [0, 0],
                                                             found.groups))
            else:
                merged = gm.graph.call_function(found.form, (x, weight, bias, stride, padding, [1, 1], found.groups))
        merged.meta = dict(node.meta)
        node.replace_all_uses_with(merged)
        replaced[node] = merged
        _erase_unread(gm.graph, node)
    gm.recompile()
    return gm


def _erase_unread(graph: fx.Graph, node: fx.Node) -> None:
    """Erases `node` and, in turn, every node of the sum it ended that nothing else reads. Explicitly: dead-code
    elimination keeps in-place ops (`out += conv(x)`, as timm's MobileOne writes its sum), and they would keep their
    branches alive. Each of those was read by its sum alone (checked when it was described)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.users or current.op not in ("call_function", "get_attr"):
            continue
        inputs = list(current.all_input_nodes)
        graph.erase_node(current)
        pending.extend(inputs)


def _sole_reader(node: fx.Node, user: fx.Node) -> bool:
    return len(node.users) == 1 and next(iter(node.users)) is user


def _describe(gm: fx.GraphModule, node: fx.Node, linear: Dict[fx.Node, Optional[_Linear]]) -> Optional[_Linear]:
    """The branch `node` computes, when it is one (module docstring), else None."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target in _CONVOLUTIONS:
        return _convolution(gm, node)
    if node.target is operator.getitem and node.args[1] == 0 and node.args[0].target is _BATCH_NORMS[0]:
        return _batch_norm(gm, node.args[0], linear)
    if node.target is _BATCH_NORMS[1]:
        return _batch_norm(gm, node, linear)
    if node.target in _COMBINE and len(node.args) == 2 and _zero(node.args[1]):
        return _part(node.args[0], node, linear, identity=False)  # `branch + 0`: timm's MobileOne starts sums at 0
    if node.target in _COMBINE and len(node.args) == 2:
        parts = [_part(arg, node, linear) for arg in node.args]
        if node.target is aten.add_.Tensor and len(node.args[0].users) != 1:
            return None  # the in-place add writes into a tensor someone else reads
        if any(part is None for part in parts):
            return None
        return _sum(parts[0], parts[1], _COMBINE[node.target])
    if node.target is aten.dropout.default and len(node.args) == 3 and node.args[2] is False:  # eval: identity
        return _part(node.args[0], node, linear, identity=False)
    if node.target in _SCALE and len(node.args) == 2:
        branch, scale = (node.args[0], node.args[1]) if isinstance(node.args[0], fx.Node) and \
            linear.get(node.args[0]) is not None else (node.args[1], node.args[0])
        part = _part(branch, node, linear, identity=False)
        factor = _channel_scale(gm, scale, part.weight.shape[0]) if part is not None else None
        if part is None or factor is None or part.form is None:
            return None
        return _Linear(part.x, part.weight.double() * factor.reshape(-1, 1, 1, 1), part.bias.double() * factor,
                       part.stride, part.groups, part.offset, part.form, part.dtype, part.convolutions, part.terms)
    return None


def _part(arg: Any, user: fx.Node, linear: Dict[fx.Node, Optional[_Linear]], identity: bool = True) -> Optional[Any]:
    """`arg` as a term of `user`'s sum: its branch when only `user` reads it, else `arg` itself as the input of the
    branches (resolved by _sum), else None."""
    if not isinstance(arg, fx.Node):
        return None
    found = linear.get(arg)
    if found is not None and _sole_reader(arg, user):
        return found
    return arg if identity and _float4d(arg) else None


def _sum(a: Any, b: Any, sign: float) -> Optional[_Linear]:
    """a + sign * b, where each is a branch or the common input node itself (the identity)."""
    if isinstance(a, fx.Node) and isinstance(b, fx.Node):
        return None  # x + x: no convolution to merge into
    x = a.x if isinstance(a, _Linear) else b.x
    a, b = (_identity(x, a) if isinstance(a, fx.Node) else a), (_identity(x, b) if isinstance(b, fx.Node) else b)
    if a is None or b is None or a.x is not b.x or a.stride != b.stride or a.offset != b.offset:
        return None
    groups = a.groups if a.convolutions else b.groups
    if (a.convolutions and a.groups != groups) or (b.convolutions and b.groups != groups):
        return None
    wa, wb = _grouped(a, groups), _grouped(b, groups)
    if wa is None or wb is None or wa.shape[:2] != wb.shape[:2]:
        return None
    size = [max(wa.shape[axis], wb.shape[axis]) for axis in (2, 3)]
    weight = _centred(wa.double(), size) + sign * _centred(wb.double(), size)
    return _Linear(x, weight, a.bias.double() + sign * b.bias.double(), a.stride, groups, a.offset, a.form or b.form,
                   a.dtype, a.convolutions + b.convolutions, a.terms + b.terms)


def _identity(x: fx.Node, node: fx.Node) -> Optional[_Linear]:
    """`x` itself as a 1x1 branch of stride 1 (its channels known from its recorded shape); None for another node."""
    if node is not x:
        return None
    channels = int(x.meta["val"].shape[1])
    return _Linear(x, torch.ones(channels, 1, 1, 1, dtype=torch.float64), torch.zeros(channels, dtype=torch.float64),
                   (1, 1), channels, (0, 0), None, x.meta["val"].dtype, 0)


def _grouped(branch: _Linear, groups: int) -> Optional[torch.Tensor]:
    """The branch's kernel for a convolution of `groups` groups: an identity's (one weight per channel, groups =
    channels) spread to `groups`; a convolution's as it is (same groups, checked by the caller)."""
    if branch.convolutions or branch.groups == groups:
        return branch.weight
    channels = branch.weight.shape[0]
    if channels % groups:
        return None
    per_group = channels // groups
    weight = torch.zeros(channels, per_group, 1, 1, dtype=torch.float64)
    rows = torch.arange(channels)
    weight[rows, rows % per_group, 0, 0] = branch.weight[:, 0, 0, 0]
    return weight


def _centred(weight: torch.Tensor, size: List[int]) -> torch.Tensor:
    pad_h, pad_w = (size[0] - weight.shape[2]) // 2, (size[1] - weight.shape[3]) // 2
    return torch.nn.functional.pad(weight, [pad_w, size[1] - weight.shape[3] - pad_w,
                                            pad_h, size[0] - weight.shape[2] - pad_h])


def _convolution(gm: fx.GraphModule, node: fx.Node) -> Optional[_Linear]:
    args = list(node.args)
    if node.target is aten.convolution.default:
        if len(args) != 9 or args[6]:  # args[6]: transposed
            return None
        x, weight, bias, stride, padding, dilation, _, _, groups = args
    else:
        if not 2 <= len(args) <= 7:
            return None
        x, weight, bias, stride, padding, dilation, groups = (args + [None, [1, 1], [0, 0], [1, 1], 1][len(args) - 2:])
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if not _float4d(x) or None in (stride, padding, dilation) or not isinstance(groups, int):
        return None
    kernel = _constant(gm, weight)
    if kernel is None or kernel.dim() != 4 or dilation != (1, 1) or bias is not None and _constant(gm, bias) is None:
        return None
    if any(size % 2 == 0 for size in kernel.shape[2:]):
        return None  # an even kernel has no centre to align others on
    offset = tuple(padding[axis] - (kernel.shape[2 + axis] - 1) // 2 for axis in range(2))
    biases = torch.zeros(kernel.shape[0], dtype=kernel.dtype) if bias is None else _constant(gm, bias)
    return _Linear(x, kernel, biases, stride, int(groups), offset, node.target, kernel.dtype, 1)


def _pair(value: Any) -> Optional[Tuple[int, int]]:
    """A convolution's stride, padding or dilation as (height, width); None for a form this pass does not take."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) in (1, 2) and all(isinstance(v, int) for v in value):
        return (value[0], value[-1])
    return None


def _batch_norm(gm: fx.GraphModule, norm: fx.Node, linear: Dict[fx.Node, Optional[_Linear]]) -> Optional[_Linear]:
    """An inference batch norm of a sole-read branch, or of a 4-d input (an identity branch)."""
    if len(norm.args) != (7 if norm.target is _BATCH_NORMS[0] else 9):
        return None
    if norm.target is _BATCH_NORMS[0]:
        source, gamma, beta, mean, var, _, eps = norm.args
    else:
        source, gamma, beta, mean, var, training, _, eps, _ = norm.args
        if training:
            return None
    if not isinstance(source, fx.Node):
        return None
    statistics = [_constant(gm, a) if a is not None else None for a in (gamma, beta, mean, var)]
    if statistics[2] is None or statistics[3] is None or any(
            a is not None and s is None for a, s in zip((gamma, beta), statistics)):
        return None
    branch = linear.get(source)
    if branch is None or not _sole_reader(source, norm):
        branch = _identity(source, source) if _float4d(source) else None
    if branch is None:
        return None
    scale = torch.rsqrt(statistics[3].double() + float(eps))
    if statistics[0] is not None:
        scale = scale * statistics[0].double()
    shift = -statistics[2].double() * scale + (statistics[1].double() if statistics[1] is not None else 0.0)
    return _Linear(branch.x, branch.weight.double() * scale.reshape(-1, 1, 1, 1), branch.bias.double() * scale + shift,
                   branch.stride, branch.groups, branch.offset, branch.form, branch.dtype, branch.convolutions,
                   branch.terms)


def _channel_scale(gm: fx.GraphModule, scale: Any, channels: int) -> Optional[torch.Tensor]:
    """A constant that multiplies each output channel by one number ((C, 1, 1), (1, C, 1, 1), (C,) is not one:
    it scales the last axis), as float64 (C,); None otherwise."""
    value = torch.tensor(float(scale)) if isinstance(scale, (int, float)) else _constant(gm, scale)
    if value is None or not value.dtype.is_floating_point:
        return None
    if value.dim() == 0:
        return value.double().expand(channels)
    shape = list(value.shape)
    if len(shape) > 4 or any(size != 1 for size in shape[:-3]) or len(shape) < 3 or shape[-2:] != [1, 1] or \
            shape[-3] not in (1, channels):
        return None
    return value.double().reshape(-1).expand(channels)


def _constant(gm: fx.GraphModule, node: Any) -> Optional[torch.Tensor]:
    if isinstance(node, fx.Node) and node.op == "get_attr":
        value = attribute(gm, node.target)
        return value.detach() if isinstance(value, torch.Tensor) else None
    return None


def _zero(value: Any) -> bool:
    """The number 0 (a Python int or float: `x + 0` and `x - 0` are `x`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _float4d(node: Any) -> bool:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dim() == 4 and value.dtype in (torch.float32, torch.float64)
