"""Memory planning: tensor lifetimes in execution order, then offsets in one arena (greedy by size).

Offsets follow "Greedy by Size for Offset Calculation" (Pisarchyk and Lee, 2020, arXiv:2001.03288): the largest
tensor is placed first, each at the lowest-waste gap between the tensors already placed whose lifetimes overlap
its own. Elementwise ops write over an input whose last use they are (in-place reuse): the two share one buffer.

A plan counts every tensor the executor writes: the graph inputs (copied into the arena on each call), the
intermediates, the outputs (live to the end) and per-op scratch (`workspace`, live during its op only). Weights
are not in the arena. `check_plan` verifies a plan without trusting the planner, value by value: each graph
value keeps its own lifetime, so a wrong in-place merge shows as two live values sharing bytes. The checker is
passes/memory_check.py, apart from the planner so that it trusts none of it.
"""
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import fx

ALIGNMENT = 64  # bytes: every offset is a multiple of this (SIMD loads, and numpy's own alignment)

# Ops whose result is a view of their first argument: no storage of their own (their strides and storage offset
# come from the traced metadata). getitem of such an op's tuple (split, unbind) is a view too.
ALIAS_OPS = frozenset([
    "aten.view.default", "aten._unsafe_view.default", "aten.alias.default", "aten.detach.default",
    "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default",
    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.expand.default",
    "aten.slice.Tensor", "aten.select.int", "aten.as_strided.default",
    "aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int",
])

# Elementwise ops that may write their output over one tensor argument (same shape, strides and dtype) when that
# argument is not read again. Note: every portable kernel for these ops must accept `out` being that argument.
INPLACE_OPS = frozenset([
    "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default", "aten.sigmoid.default",
    "aten.tanh.default", "aten.gelu.default", "aten.silu.default", "aten.hardswish.default",
    "aten.hardsigmoid.default", "aten.neg.default", "aten.exp.default", "aten.sqrt.default",
    "aten.rsqrt.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
    "aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar", "aten.div.Scalar", "aten.pow.Tensor_Scalar",
    "aten._softmax.default",
])

Workspace = Callable[[fx.Node], List[int]]  # an op's scratch sizes in bytes


@dataclass(frozen=True)
class Tensor:
    """One buffer of the arena: live from step `first` to step `last`, both included."""

    name: str
    size: int  # bytes
    first: int
    last: int
    kind: str  # "input", "intermediate", "output" or "workspace"
    values: Tuple[str, ...] = ()  # graph values stored here (more than one after in-place reuse)


@dataclass(frozen=True)
class Value:
    """One graph value stored in the arena: its own lifetime and where in which tensor it lives."""

    name: str
    size: int  # bytes
    first: int  # the step that writes it (0 for a graph input)
    last: int  # its last read (the last step for a graph output)
    tensor: int  # index of its buffer in MemoryPlan.tensors
    offset: int = 0  # bytes from the start of that buffer
    inplace_of: Optional[str] = None  # the value it overwrites in place; that value's last read is our `first`


@dataclass
class MemoryPlan:
    """Tensors with arena offsets, and the three numbers people compare."""

    tensors: List[Tensor]
    offsets: List[int]
    arena_bytes: int
    naive_bytes: int  # every value and scratch buffer in its own allocation, no reuse at all
    steps: List[str]  # op of each step, in execution order
    alignment: int = ALIGNMENT
    values: List[Value] = field(default_factory=list)  # graph values with their own lifetimes

    @property
    def placement(self) -> Dict[str, Tuple[int, int]]:
        """value -> (tensor index, byte offset within that tensor)."""
        return {v.name: (v.tensor, v.offset) for v in self.values}

    @property
    def lower_bound_bytes(self) -> int:
        return live_peak(self.tensors)[0]

    def summary(self) -> Dict[str, Any]:
        """The numbers the manifest records (`memory` per specialization)."""
        peak, step = live_peak(self.tensors)
        return {
            "naive_bytes": self.naive_bytes,
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": peak,
            "peak_step": step,
            "peak_op": self.steps[step] if 0 <= step < len(self.steps) else None,
            "tensors": len(self.tensors),
            "inplace": sum(len(t.values) - 1 for t in self.tensors if len(t.values) > 1),
            "workspace_bytes": sum(t.size for t in self.tensors if t.kind == "workspace"),
            "steps": len(self.steps),
            "alignment": self.alignment,
            "planner": "greedy-by-size",
        }

    def to_dict(self) -> Dict[str, Any]:
        """The whole plan as JSON (a bundle member; what `edgedyn inspect --memory` draws)."""
        return dict(self.summary(), step_ops=list(self.steps), tensors=[
            {"name": t.name, "kind": t.kind, "size": t.size, "first": t.first, "last": t.last, "offset": offset,
             "values": list(t.values)} for t, offset in zip(self.tensors, self.offsets)],
            values=[{"name": v.name, "size": v.size, "first": v.first, "last": v.last, "tensor": v.tensor,
                     "offset": v.offset, "inplace_of": v.inplace_of} for v in self.values])

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "MemoryPlan":
        """The plan `to_dict` wrote (a bundle's memory_plan.json), to check it again."""
        tensors = [Tensor(t["name"], t["size"], t["first"], t["last"], t["kind"], tuple(t["values"]))
                   for t in data["tensors"]]
        values = [Value(v["name"], v["size"], v["first"], v["last"], v["tensor"], v["offset"], v["inplace_of"])
                  for v in data.get("values", [])]
        return cls(tensors, [t["offset"] for t in data["tensors"]], data["arena_bytes"], data["naive_bytes"],
                   list(data["step_ops"]), data["alignment"], values)


def live_peak(tensors: Sequence[Tensor]) -> Tuple[int, int]:
    """The largest total size of tensors live at one step, and that step: no arena can be smaller."""
    events = {}  # type: Dict[int, int]
    for t in tensors:
        events[t.first] = events.get(t.first, 0) + t.size
        events[t.last + 1] = events.get(t.last + 1, 0) - t.size
    live, peak, peak_step = 0, 0, -1
    for step in sorted(events):
        live += events[step]
        if live > peak:
            peak, peak_step = live, step
    return peak, peak_step


def _aligned(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def _overlap(a: Tensor, b: Tensor) -> bool:
    return a.first <= b.last and b.first <= a.last


def greedy_by_size(tensors: Sequence[Tensor], alignment: int = ALIGNMENT) -> List[int]:
    """Arena offsets: largest first, each into the smallest gap (among time-overlapping tensors) it fits."""
    sizes = [_aligned(t.size, alignment) for t in tensors]
    offsets = [0] * len(tensors)
    placed = []  # type: List[Tuple[int, int]]  # (offset, index), sorted by offset
    for index in sorted(range(len(tensors)), key=lambda i: (-sizes[i], tensors[i].first, i)):
        if sizes[index] == 0:
            continue
        previous_end, best, best_gap = 0, None, None  # type: int, Optional[int], Optional[int]
        for offset, other in placed:
            if not _overlap(tensors[index], tensors[other]):
                continue
            gap = offset - previous_end
            if gap >= sizes[index] and (best_gap is None or gap < best_gap):
                best, best_gap = previous_end, gap
            previous_end = max(previous_end, offset + sizes[other])
        offsets[index] = previous_end if best is None else best
        placed.append((offsets[index], index))
        placed.sort()
    return offsets


def make_plan(tensors: Sequence[Tensor], steps: Sequence[str], naive_bytes: Optional[int] = None,
              values: Sequence[Value] = (), alignment: int = ALIGNMENT) -> MemoryPlan:
    """Places `tensors` with greedy_by_size and returns the plan."""
    tensors = list(tensors)
    offsets = greedy_by_size(tensors, alignment)
    arena = max([offset + _aligned(t.size, alignment) for t, offset in zip(tensors, offsets)] + [0])
    naive = sum(t.size for t in tensors) if naive_bytes is None else naive_bytes
    return MemoryPlan(tensors, offsets, arena, naive, list(steps), alignment, list(values))


def op_name(node: fx.Node) -> str:
    """`aten.convolution.default`, `getitem`: the name kernels and the op sets above use."""
    if node.target is operator.getitem:
        return "getitem"
    return str(node.target)


def tensor_meta(value: Any) -> Tuple[Tuple[int, ...], Tuple[int, ...], int, str, int]:
    """(shape, strides, storage offset, dtype, itemsize) of a traced tensor value."""
    dtype = str(value.dtype).replace("torch.", "")
    return (tuple(int(s) for s in value.shape), tuple(int(s) for s in value.stride()), int(value.storage_offset()),
            dtype, int(value.element_size()))


def extent_bytes(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes from a tensor's first element to one past its last (its numel for dense layouts)."""
    if any(s == 0 for s in shape):
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(shape, strides))) * itemsize


@dataclass
class _Root:
    name: str
    size: int
    kind: str
    first: int
    last: int
    meta: Tuple[Tuple[int, ...], Tuple[int, ...], int, str, int]


def tensor_args(node: fx.Node) -> List[fx.Node]:
    """The nodes a node reads, in argument order, including those inside lists (cat's tensors)."""
    found = []  # type: List[fx.Node]
    fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)
    return found


def is_step(node: fx.Node) -> bool:
    """Whether a node runs as a step: a call that is neither a view nor getitem."""
    return node.op == "call_function" and op_name(node) != "getitem" and op_name(node) not in ALIAS_OPS


Storage = Tuple[str, str]  # ("arena", stored value) or ("weight", placeholder name)


def storage_roots(graph: fx.Graph, user_inputs: Sequence[str]) -> Dict[fx.Node, Optional[Storage]]:
    """Where each node's elements live; None for values that are not tensors.

    Note: this is the one alias rule, read by the planner and by the portable backend. A view (ALIAS_OPS) and
    getitem of a view's tuple (split, unbind) live in their base's storage; getitem of a step's tuple is a stored
    value of its own, named `step.index`; a step's tensor result and a model input are stored values.
    """
    storage = {}  # type: Dict[fx.Node, Optional[Storage]]
    for node in graph.nodes:
        if node.op == "placeholder":
            storage[node] = ("arena", node.name) if node.name in user_inputs else ("weight", node.name)
        elif node.op == "call_function":
            base = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
            if op_name(node) in ALIAS_OPS or (op_name(node) == "getitem" and base is not None and not is_step(base)):
                storage[node] = storage.get(base) if base is not None else None
            elif not isinstance(node.meta.get("val"), torch.Tensor):
                storage[node] = None  # a tuple's used outputs are stored through their getitem nodes
            elif op_name(node) == "getitem":
                storage[node] = ("arena", "{}.{}".format(base.name, node.args[1]))
            else:
                storage[node] = ("arena", node.name)
    return storage


def graph_tensors(graph: fx.Graph, user_inputs: Sequence[str],
                  workspace: Optional[Workspace] = None, inplace: bool = True) -> MemoryPlan:
    """Lifetimes of every tensor the graph's steps write, with in-place reuse, placed by greedy_by_size.

    `user_inputs`: placeholder names that are model inputs (copied into the arena); other placeholders are weights.
    """
    nodes = list(graph.nodes)
    steps = [node for node in nodes if is_step(node)]
    step_of = {node: index for index, node in enumerate(steps)}
    last_step = max(len(steps) - 1, 0)
    roots = {}  # type: Dict[str, _Root]  # one per stored value
    root_of = {}  # type: Dict[fx.Node, Optional[str]]  # None for weights and non-tensors
    for node, where in storage_roots(graph, user_inputs).items():
        root_of[node] = where[1] if where is not None and where[0] == "arena" else None
        if root_of[node] is None or root_of[node] in roots:
            continue  # a weight, a non-tensor, or a view of a value already stored
        meta = tensor_meta(node.meta["val"])
        first = 0 if node.op == "placeholder" else step_of[node if is_step(node) else node.args[0]]
        roots[root_of[node]] = _Root(root_of[node], extent_bytes(meta[0], meta[1], meta[4]),
                                     "input" if node.op == "placeholder" else "intermediate", first, first, meta)
    for node in steps:
        for arg in tensor_args(node):
            name = root_of.get(arg)
            if name is not None:
                roots[name].last = max(roots[name].last, step_of[node])
    output = next(node for node in nodes if node.op == "output")
    outputs = {root_of.get(arg) for arg in tensor_args(output)} - {None}
    for name in outputs:
        roots[name].last = last_step
        if roots[name].kind == "intermediate":
            roots[name].kind = "output"
    lifetimes = {name: (root.first, root.last) for name, root in roots.items()}  # before merges extend them
    naive = sum(root.size for root in roots.values())
    buffer_of = {name: name for name in roots}  # root -> the root whose buffer it shares
    members = {name: [name] for name in roots}  # type: Dict[str, List[str]]
    overwrites = {}  # type: Dict[str, str]  # value -> the value it writes over in place
    workspaces = []  # type: List[Tensor]
    for node in steps:
        step = step_of[node]
        if inplace and op_name(node) in INPLACE_OPS and node.name in roots:
            victim = _inplace_victim(node, roots, root_of, buffer_of, outputs)
            if victim is not None:
                host = buffer_of[victim]
                buffer_of[node.name], overwrites[node.name] = host, victim
                members[host].append(node.name)
                roots[host].last = max(roots[host].last, roots[node.name].last)
                if roots[node.name].kind == "output":
                    roots[host].kind = "output"
        for index, size in enumerate(workspace(node) if workspace else []):
            workspaces.append(Tensor("{}.scratch{}".format(node.name, index), size, step, step, "workspace"))
            naive += size
    tensors, values = [], []  # type: List[Tensor], List[Value]
    for name, root in roots.items():
        if buffer_of[name] != name:
            continue
        for member in members[name]:
            first, last = lifetimes[member]
            values.append(Value(member, roots[member].size, first, last, len(tensors), 0, overwrites.get(member)))
        tensors.append(Tensor(name, root.size, root.first, root.last, root.kind, tuple(members[name])))
    return make_plan(tensors + workspaces, [op_name(node) for node in steps], naive, values)


def _inplace_victim(node: fx.Node, roots: Dict[str, _Root], root_of: Dict[fx.Node, Optional[str]],
                    buffer_of: Dict[str, str], outputs: Any) -> Optional[str]:
    """The stored value `node` may write over: an argument that is a whole buffer, read for the last time here."""
    out_meta = roots[node.name].meta
    candidates = [arg for arg in node.args if isinstance(arg, fx.Node)]
    for arg in candidates:
        name = root_of.get(arg)
        if name is None or name in outputs:
            continue
        host = buffer_of[name]
        meta = tensor_meta(arg.meta["val"])
        if meta != out_meta or roots[name].meta != meta or roots[host].last != roots[node.name].first:
            continue
        # Another argument viewing the same buffer differently would be overwritten while still read.
        others = [o for o in tensor_args(node) if o is not arg and root_of.get(o) is not None
                  and buffer_of[root_of[o]] == host]
        if any(tensor_meta(o.meta["val"]) != meta for o in others):
            continue
        return name
    return None


def plan_program(program: Any, workspace: Optional[Workspace] = None, inplace: bool = True) -> MemoryPlan:
    """The memory plan of an ExportedProgram (after the pass pipeline)."""
    from torch.export.graph_signature import InputKind

    user_inputs = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    return graph_tensors(program.graph, user_inputs, workspace=workspace, inplace=inplace)
