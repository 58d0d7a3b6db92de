"""The portable backend: the graph as data (ATen ops, arguments, tensor views, arena offsets), weights as arrays.

`edgedyn.runtime.executors.portable` runs it with the numpy kernels of `edgedyn.runtime.kernels`, every tensor a
view of one arena laid out by `edgedyn.passes.memory_plan`. Needs only numpy >= 1.19 and Python >= 3.8 on the
board, so it runs where no compiled runtime installs (a Jetson Nano on its stock Python).
"""
import json
from typing import Any, Dict, List, Optional  # noqa: F401 (type comments)

import numpy as np
import torch
from torch import fx

from edgedyn.backends.artifact import Artifact, Build
from edgedyn.errors import BackendError
from edgedyn.passes.memory_plan import (MemoryPlan, extent_bytes, graph_tensors, is_step, op_name, storage_roots,
                                        tensor_args, tensor_meta)
from edgedyn.runtime import kernels
from edgedyn.runtime.executors.portable import GRAPH_FORMAT, GRAPH_FORMAT_VERSION
from edgedyn.runtime.format import pack_arrays
from edgedyn.runtime.program import FP32_TOLERANCE



def lower(build: Build) -> Artifact:
    """Writes the program as a JSON graph plus an `.npz` of weights, with its memory plan."""
    program = build.program
    from torch.export.graph_signature import InputKind

    signature = program.graph_signature
    user_inputs = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    weight_of = {s.arg.name: s.target for s in signature.input_specs if s.kind != InputKind.USER_INPUT}
    state = dict(program.state_dict)
    state.update(program.constants)
    weights = {}  # type: Dict[str, np.ndarray]
    for placeholder, name in weight_of.items():
        weights["w{:04d}".format(len(weights))] = state[name].detach().contiguous().numpy()
    weight_key = dict(zip(weight_of, weights))
    fakes = _FakeArrays()
    steps = _without_checks(program.graph)
    plan = graph_tensors(steps, user_inputs, workspace=lambda node: _scratch_bytes(node, fakes))
    graph = _graph_record(steps, plan, user_inputs, weight_key, fakes)
    return Artifact(
        backend="portable",
        executor="portable",
        device="cpu",
        arch=None,
        target="numpy",
        files={"graph": json.dumps(graph, sort_keys=True).encode("utf-8"), "weights": pack_arrays(weights),
               "plan": json.dumps(plan.to_dict(), sort_keys=True).encode("utf-8")},
        file_names={"graph": "graph.json", "weights": "weights.npz", "plan": "memory_plan.json"},
        meta={"tolerance": dict(FP32_TOLERANCE), "memory": plan.summary(), "requires": {"python": ["numpy>=1.19"]}},
    )


# Checks torch.export leaves in the graph (the dtype of a traced value): nothing to compute, no output to plan;
# the bundle's guards check the inputs on the board.
_CHECKS = ("aten._assert_tensor_metadata.default",)


def _without_checks(graph: fx.Graph) -> fx.Graph:
    """A copy of the graph without _CHECKS nodes (the program itself is shared with the other backends)."""
    copy = fx.Graph()
    values = {}  # type: Dict[fx.Node, fx.Node]
    copy.output(copy.graph_copy(graph, values))
    for node in list(copy.nodes):
        if node.op == "call_function" and op_name(node) in _CHECKS and not node.users:
            copy.erase_node(node)
    return copy


class _FakeArrays:
    """Arrays with the shape, dtype and strides of traced values, over one shared zero buffer: what kernels
    inspect when asked for their scratch (contiguity included), without holding each tensor's memory."""

    def __init__(self) -> None:
        self._buffer = np.zeros(64, np.uint8)

    def of(self, value: Any) -> np.ndarray:
        shape, strides, _, dtype, itemsize = tensor_meta(value)
        size = max(extent_bytes(shape, strides, itemsize), itemsize)
        if self._buffer.size < size:
            self._buffer = np.zeros(size, np.uint8)
        return np.ndarray(shape, np.dtype(dtype), buffer=self._buffer, strides=[s * itemsize for s in strides])


def _unsupported(node: fx.Node, reason: str) -> BackendError:
    where = node.meta.get("stack_trace", "").strip().splitlines()
    return BackendError(
        "the portable backend cannot run {} ({}): {}{}".format(
            node.name, op_name(node), reason, "\n  at " + where[-2].strip() if len(where) > 1 else ""),
        hint="supported ops: {}; try --backend tvm, or report the op".format(
            ", ".join(sorted(k.replace("aten.", "") for k in kernels.KERNELS))))


def _node_outputs(node: fx.Node) -> List[Optional[fx.Node]]:
    """The values a step writes: itself, or the getitem nodes reading its tuple (None where none reads)."""
    value = node.meta.get("val")
    if not isinstance(value, (tuple, list)):
        return [node]
    outputs = [None] * len(value)  # type: List[Optional[fx.Node]]
    for user in node.users:
        if op_name(user) == "getitem":
            outputs[user.args[1]] = user
    return outputs


def _scratch_bytes(node: fx.Node, fakes: _FakeArrays) -> List[int]:
    outs = [fakes.of(o.meta["val"]) if o is not None else None for o in _node_outputs(node)]
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: fakes.of(n.meta["val"]))
    try:
        shapes = kernels.scratch_shapes(op_name(node), outs, list(args), dict(kwargs))
    except kernels.Unsupported as error:
        raise _unsupported(node, str(error))
    itemsize = next(o for o in outs if o is not None).itemsize
    return [int(np.prod(shape)) * itemsize for shape in shapes]


def _graph_record(graph: fx.Graph, plan: MemoryPlan, user_inputs: List[str], weight_key: Dict[str, str],
                  fakes: _FakeArrays) -> Dict[str, Any]:
    """Values (each a view of the arena or of a weight), steps and the arena size, as JSON."""
    values = []  # type: List[Dict[str, Any]]
    index_of = {}  # type: Dict[fx.Node, int]
    offsets, placement = plan.offsets, plan.placement
    for node, storage in storage_roots(graph, user_inputs).items():
        value = node.meta.get("val")
        if storage is None or not isinstance(value, torch.Tensor):
            continue
        shape, strides, storage_offset, dtype, itemsize = tensor_meta(value)
        kind, root = storage
        record = {"name": node.name, "shape": list(shape), "strides": list(strides), "dtype": dtype}
        if kind == "weight":
            record.update(weight=weight_key[root], offset=storage_offset)
        else:
            tensor, within = placement[root]
            record.update(offset_bytes=offsets[tensor] + within + storage_offset * itemsize)
        index_of[node] = len(values)
        values.append(record)
    steps = []
    scratch_tensors = {t.name: i for i, t in enumerate(plan.tensors) if t.kind == "workspace"}
    for node in graph.nodes:
        if not is_step(node):
            continue
        outputs = [index_of[o] if o is not None and o in index_of else None for o in _node_outputs(node)]
        args, kwargs = _encode((node.args, node.kwargs), index_of)
        scratch = []
        fake_outs = [fakes.of(o.meta["val"]) if o is not None else None for o in _node_outputs(node)]
        fake_args, fake_kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: fakes.of(n.meta["val"]))
        for number, shape in enumerate(kernels.scratch_shapes(op_name(node), fake_outs, list(fake_args),
                                                              dict(fake_kwargs))):
            scratch.append({"shape": list(shape), "offset_bytes": offsets[scratch_tensors[
                "{}.scratch{}".format(node.name, number)]]})
        steps.append({"op": op_name(node), "name": node.name, "outputs": outputs, "args": args, "kwargs": kwargs,
                      "scratch": scratch})
    output = next(node for node in graph.nodes if node.op == "output")
    return {
        "format": GRAPH_FORMAT,
        "format_version": GRAPH_FORMAT_VERSION,
        "arena_bytes": plan.arena_bytes,
        "alignment": plan.alignment,
        "values": values,
        "inputs": [index_of[node] for node in graph.nodes if node.op == "placeholder" and node.name in user_inputs],
        "outputs": [index_of[node] for node in tensor_args(output)],
        "steps": steps,
    }


def _encode(value: Any, index_of: Dict[fx.Node, int]) -> Any:
    """ATen arguments as JSON: tensors as {"value": index}, dtypes and formats by name."""
    if isinstance(value, fx.Node):
        return {"value": index_of[value]}
    if isinstance(value, (list, tuple)):
        return [_encode(item, index_of) for item in value]
    if isinstance(value, dict):
        return {key: _encode(item, index_of) for key, item in value.items()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, (torch.memory_format, torch.layout, torch.device)):
        return {"enum": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise BackendError("the portable backend cannot store the argument {!r} ({})".format(value, type(value).__name__))
