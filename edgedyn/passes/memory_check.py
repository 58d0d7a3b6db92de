"""The memory plan's checker, kept apart from the planner (passes/memory_plan.py) so that it re-derives every rule
instead of trusting it: no two values live at the same step share arena bytes, unless the later one legally
overwrites the earlier in place (an op in INPLACE_OPS, on the same bytes, at the step of the earlier one's last
read); every value lies inside its buffer, every buffer inside the arena. Tests run it on every example's plan, and
every export runs it under EDGEDYN_DEBUG=1.
"""
import json
import os
from typing import Any, List, NamedTuple, Optional

from edgedyn.passes.memory_plan import INPLACE_OPS, MemoryPlan, plan_program


def check_plan(plan: MemoryPlan) -> None:
    """Raises AssertionError naming them when two values (or value-less buffers) live at one step share arena
    bytes, unless one overwrites the other in place exactly where the other's life ends; or when one lies outside."""
    for tensor, offset in zip(plan.tensors, plan.offsets):
        if tensor.size > 0 and (offset % plan.alignment or offset < 0 or offset + tensor.size > plan.arena_bytes):
            raise AssertionError("tensor {} at offset {} (+{} bytes) lies outside the {}-byte arena or is not "
                                 "{}-aligned".format(tensor.name, offset, tensor.size, plan.arena_bytes,
                                                     plan.alignment))
        if tensor.first > tensor.last:
            raise AssertionError("tensor {} dies (step {}) before it is made (step {})".format(
                tensor.name, tensor.last, tensor.first))
    _check_values_inside_their_tensors(plan)
    items = sorted(_live_items(plan), key=lambda item: item.start)
    # Sorted by offset: an item can only collide with those starting before its end.
    for position, a in enumerate(items):
        for b in items[position + 1:]:
            if b.start >= a.start + a.size:
                break
            message = _collision(plan, a, b) if a.first <= b.last and b.first <= a.last else None
            if message is not None:
                raise AssertionError(message)
    if plan.arena_bytes < plan.lower_bound_bytes:
        raise AssertionError("arena of {} bytes is below the lower bound {}".format(plan.arena_bytes,
                                                                                    plan.lower_bound_bytes))


class _Live(NamedTuple):
    """What check_plan sweeps: a value at its arena bytes, or a buffer that holds no value (scratch)."""

    kind: str  # "value" or "tensor"
    start: int  # arena offset
    size: int
    first: int
    last: int
    name: str
    inplace_of: Optional[str]

    def describe(self) -> str:
        return "{} (bytes {}-{}, steps {}-{})".format(self.name, self.start, self.start + self.size, self.first,
                                                      self.last)


def _live_items(plan: MemoryPlan) -> List[_Live]:
    """Every value at its arena bytes, plus the buffers that hold no value, with their lifetimes."""
    holding = {v.tensor for v in plan.values}
    items = [_Live("value", plan.offsets[v.tensor] + v.offset, v.size, v.first, v.last, v.name, v.inplace_of)
             for v in plan.values if v.size > 0]
    items += [_Live("tensor", offset, t.size, t.first, t.last, t.name, None)
              for index, (t, offset) in enumerate(zip(plan.tensors, plan.offsets))
              if index not in holding and t.size > 0]
    return items


def _check_values_inside_their_tensors(plan: MemoryPlan) -> None:
    names = {v.name for v in plan.values}
    for value in plan.values:
        if not 0 <= value.tensor < len(plan.tensors):
            raise AssertionError("value {} is placed in tensor {}, which the plan does not have".format(
                value.name, value.tensor))
        tensor = plan.tensors[value.tensor]
        if value.offset < 0 or value.offset + value.size > tensor.size:
            raise AssertionError("value {} (+{} bytes at {}) is placed outside its tensor {} ({} bytes)".format(
                value.name, value.size, value.offset, tensor.name, tensor.size))
        if not tensor.first <= value.first <= value.last <= tensor.last:
            raise AssertionError("value {} (steps {}-{}) outlives its tensor {} (steps {}-{})".format(
                value.name, value.first, value.last, tensor.name, tensor.first, tensor.last))
        if value.inplace_of is not None and value.inplace_of not in names:
            raise AssertionError("value {} overwrites {} in place, which the plan does not have".format(
                value.name, value.inplace_of))


def _inplace_fault(plan: MemoryPlan, host: _Live, writer: _Live) -> Optional[str]:
    """Why `writer` may not overwrite `host` in place (None when it may): the same bytes, an in-place op, and
    `host` read for the last time by the very step that writes `writer`."""
    op = plan.steps[writer.first] if 0 <= writer.first < len(plan.steps) else "no step"
    if host.last != writer.first:
        return "{} is read until step {}".format(host.name, host.last)
    if op not in INPLACE_OPS:
        return "{} is not an in-place op".format(op)
    if (host.start, host.size) != (writer.start, writer.size):
        return "they do not occupy the same bytes"
    return None


def _collision(plan: MemoryPlan, a: _Live, b: _Live) -> Optional[str]:
    """The message for two items live at one step on shared bytes; None when that is a legal in-place write."""
    for host, writer in ((a, b), (b, a)):
        if writer.inplace_of == host.name:
            fault = _inplace_fault(plan, host, writer)
            if fault is None:
                return None
            return "values {} and {} overlap while both are live: {} overwrites {} in place at step {}, but {}".format(
                host.describe(), writer.describe(), writer.name, host.name, writer.first, fault)
    if a.kind == b.kind:
        return "{}s {} and {} overlap while both are live".format(a.kind, a.describe(), b.describe())
    return "{} {} and {} {} overlap while both are live".format(a.kind, a.describe(), b.kind, b.describe())


def check_if_debug(program: Any, shipped_plan: Optional[bytes] = None) -> None:
    """Under EDGEDYN_DEBUG=1, checks the plan an export ships (a backend's own, as JSON) or else the graph's."""
    if not os.environ.get("EDGEDYN_DEBUG"):
        return
    if shipped_plan is not None:
        check_plan(MemoryPlan.from_dict(json.loads(shipped_plan.decode("utf-8"))))
    else:
        check_plan(plan_program(program))


# --- from an exported graph to tensors with lifetimes ---
