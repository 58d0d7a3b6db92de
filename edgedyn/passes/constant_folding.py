from typing import Dict

import torch
from torch import fx

from edgedyn.passes.graph import add_constant, attribute

# A folded result may be bigger than what it was computed from (an expand, a broadcast add); past this factor and
# size the bundle would grow more than the graph shrinks, so the op stays in the graph.
_GROWTH_LIMIT = 2.0
_SMALL_BYTES = 1 << 16


def fold_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """Evaluates operators whose inputs are all weights or literals at export time (e.g. a transposed weight)."""
    values = {}  # type: Dict[fx.Node, torch.Tensor]
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            value = attribute(gm, node.target)
            if isinstance(value, torch.Tensor):
                values[node] = value
            continue
        if node.op != "call_function" or not _pure(node) or not _inputs_constant(node, values):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        if not isinstance(result, torch.Tensor) or _grows_too_much(node, result, values):
            continue
        values[node] = result
    for node, value in values.items():
        if node.op == "call_function" and any(user not in values for user in node.users):
            node.replace_all_uses_with(add_constant(gm, value, "folded", node))
    return gm


def _pure(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags


def _inputs_constant(node: fx.Node, values: Dict[fx.Node, torch.Tensor]) -> bool:
    inputs = node.all_input_nodes
    return bool(inputs) and all(n in values for n in inputs)


def _grows_too_much(node: fx.Node, result: torch.Tensor, values: Dict[fx.Node, torch.Tensor]) -> bool:
    before = sum(values[n].numel() * values[n].element_size() for n in node.all_input_nodes)
    after = result.numel() * result.element_size()
    return after > _SMALL_BYTES and after > _GROWTH_LIMIT * before
