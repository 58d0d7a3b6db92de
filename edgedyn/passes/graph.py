"""Helpers shared by the passes: moving between ExportedProgram and the unlifted GraphModule they rewrite.

Passes work on the unlifted form (`ep.module()`), where weights are module attributes read by `get_attr`
nodes: folding a weight is then replacing one attribute, with no graph-signature bookkeeping.
"""
import itertools
from collections import Counter
from typing import Any, Dict, Iterator, Tuple

import torch
from torch import fx


def call_nodes(gm: fx.GraphModule) -> Iterator[fx.Node]:
    return (node for node in gm.graph.nodes if node.op == "call_function")


def op_count(gm: fx.GraphModule) -> int:
    """How many operators the graph runs: what the passes are meant to shrink."""
    return sum(1 for node in call_nodes(gm) if not _is_getitem(node))


def op_histogram(gm: fx.GraphModule) -> Dict[str, int]:
    return dict(Counter(_op_name(node.target) for node in call_nodes(gm) if not _is_getitem(node)))


def _is_getitem(node: fx.Node) -> bool:
    return node.target.__name__ == "getitem" if hasattr(node.target, "__name__") else False


def _op_name(target: Any) -> str:
    return str(getattr(target, "_name", None) or getattr(target, "__name__", target))


def attribute(gm: fx.GraphModule, target: str) -> torch.Tensor:
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def add_constant(gm: fx.GraphModule, value: torch.Tensor, prefix: str, before: fx.Node) -> fx.Node:
    """Registers `value` as a new weight of the module and returns a get_attr node reading it."""
    # Names depend only on the graph (not on a process-wide counter), so two exports give identical bundles.
    name = next(n for n in ("_edgedyn_{}_{}".format(prefix, i) for i in itertools.count()) if not hasattr(gm, n))
    # A parameter, not a buffer: backends keep parameters as separate weights, buffers may be baked into code.
    gm.register_parameter(name, torch.nn.Parameter(value.detach().contiguous(), requires_grad=False))
    with gm.graph.inserting_before(before):
        return gm.graph.get_attr(name)


def remove_unused_attributes(gm: fx.GraphModule) -> int:
    """Deletes parameters and buffers no get_attr node reads any more; returns how many."""
    used = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    removed = 0
    for name, _ in list(itertools.chain(gm.named_parameters(), gm.named_buffers())):
        if name in used:
            continue
        owner_path, _, leaf = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        delattr(owner, leaf)
        removed += 1
    return removed


def example_args(gm: fx.GraphModule) -> Tuple[torch.Tensor, ...]:
    """Random tensors matching the graph's placeholders (their recorded fake values)."""
    args = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            raise ValueError("placeholder {} has no tensor metadata".format(node.name))
        shape = tuple(int(size) for size in fake.shape)
        if fake.dtype.is_floating_point:
            args.append(torch.randn(shape, dtype=fake.dtype))
        elif fake.dtype == torch.bool:
            args.append(torch.randint(0, 2, shape).bool())
        else:
            args.append(torch.randint(0, 10, shape, dtype=fake.dtype))
    return tuple(args)


def reexport(gm: fx.GraphModule, args: Tuple[torch.Tensor, ...]) -> "torch.export.ExportedProgram":
    """Back to an ExportedProgram in core ATen (what the backends take)."""
    from edgedyn.torch_quiet import quiet_torch

    with quiet_torch():
        return torch.export.export(gm, args, strict=False).run_decompositions()
