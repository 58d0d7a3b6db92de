"""Constant folding: evaluates at export time every op whose result does not depend on the user's input values.

At fixed shapes that covers more than weight-only arithmetic: ops with no tensor input at all (`arange`, `full`,
`scalar_tensor`) and ops that read only the shape of their input (`full_like`, `zeros_like`), and everything
computed from those. transformers models build their attention masks that way (arange -> compare -> where), so
the mask becomes one constant instead of a chain of boolean ops that some backends (TFLite) lack.
"""
from typing import Dict

import torch
from torch import fx

from edgedyn.passes.graph import add_constant, attribute

aten = torch.ops.aten

# A folded result may be bigger than what it was computed from (an expand, a broadcast add); past this factor and
# size the bundle would grow more than the graph shrinks, so the op stays in the graph.
_GROWTH_LIMIT = 2.0
_SMALL_BYTES = 1 << 16

# Ops whose first argument contributes only its shape, dtype and device: at fixed shapes they are constants.
_SHAPE_ONLY = {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.new_full.default,
               aten.new_zeros.default, aten.new_ones.default}
# Uninitialized memory is not a value: folding it would bake whatever bytes were there into the bundle.
_UNINITIALIZED = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                  aten.empty_strided.default}


def fold_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """Evaluates operators whose inputs are all weights, literals or shapes at export time (e.g. a transposed
    weight, an attention mask built from arange)."""
    values = {}  # type: Dict[fx.Node, torch.Tensor]
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            value = attribute(gm, node.target)
            if isinstance(value, torch.Tensor):
                values[node] = value
            continue
        if node.op != "call_function" or not _pure(node) or not _inputs_known(node, values):
            continue
        result = _evaluate(node, values)
        if not isinstance(result, torch.Tensor) or _grows_too_much(node, result, values):
            continue
        values[node] = result
    for node, value in values.items():
        if node.op == "call_function" and any(user not in values for user in node.users):
            node.replace_all_uses_with(add_constant(gm, value, "folded", node))
    return gm


def _pure(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target in _UNINITIALIZED:
        return False
    schema = target._schema
    return not schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags


def _inputs_known(node: fx.Node, values: Dict[fx.Node, torch.Tensor]) -> bool:
    """Whether every input the result depends on is a constant (none at all counts: arange(17))."""
    inputs = node.all_input_nodes
    if node.target in _SHAPE_ONLY:
        inputs = [n for n in inputs if n is not node.args[0]]
    return all(n in values for n in inputs)


def _evaluate(node: fx.Node, values: Dict[fx.Node, torch.Tensor]) -> object:
    def known(n: fx.Node) -> torch.Tensor:
        if n in values:
            return values[n]
        # only the shape-only argument of a _SHAPE_ONLY op gets here: its traced shape and dtype are all it gives
        fake = n.meta["val"]
        return torch.empty(tuple(int(d) for d in fake.shape), dtype=fake.dtype)

    args, kwargs = fx.node.map_arg((node.args, node.kwargs), known)
    with torch.no_grad():
        return node.target(*args, **kwargs)


def _grows_too_much(node: fx.Node, result: torch.Tensor, values: Dict[fx.Node, torch.Tensor]) -> bool:
    before = sum(values[n].numel() * values[n].element_size() for n in node.all_input_nodes if n in values)
    after = result.numel() * result.element_size()
    return after > _SMALL_BYTES and after > _GROWTH_LIMIT * before
