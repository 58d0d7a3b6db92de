"""The manifest's `buckets`, checked before the runtime builds anything from them, and put in words for `inspect`.

runtime/buckets.py describes the record and dispatches with it. Standard library and numpy only, Python 3.8 syntax:
this file runs on the board.
"""
from typing import Any, Dict, List

import numpy as np

from edgedyn.runtime import schema

PAD_SIDES = ("right", "left")
MAX_BUCKETS = 64
MAX_RULE = 1 << 40  # any scale, offset or divisor a real length rule needs is far below this


def check_buckets(c: schema.Checker, manifest: Dict[str, Any]) -> None:
    """Raises BundleError unless every bucket group names real tensor inputs and specializations whose shapes hold
    its sizes, and its padding rules are numbers in range."""
    groups = c.items(manifest.get("buckets", []), "buckets")
    specs = manifest["specializations"]
    tensors = [p["name"] for p in manifest["signature"] if p.get("kind") == "tensor"]
    claimed = set()  # type: set
    for number, group in enumerate(groups):
        where = "buckets[{}]".format(number)
        c.obj(group, where, ("inputs", "sizes", "specializations", "source"))
        c.text(group["source"], where + ".source")
        inputs = c.obj(group["inputs"], where + ".inputs")
        if not inputs:
            raise c.fail(where + ".inputs", "no input is bucketed")
        for name, axis in inputs.items():
            c.text(name, where + ".inputs", tensors)
            c.integer(axis, "{}.inputs.{}".format(where, schema.short(name)), 0, schema.MAX_RANK - 1)
        sizes = [c.integer(s, "{}.sizes[{}]".format(where, i), 1) for i, s in enumerate(
            c.items(group["sizes"], where + ".sizes"))]
        if not sizes or len(sizes) > MAX_BUCKETS or sizes != sorted(set(sizes)):
            raise c.fail(where + ".sizes", "expected 1 to {} increasing sizes, got {}".format(
                MAX_BUCKETS, schema.bounded(sizes)))
        indices = c.items(group["specializations"], where + ".specializations", len(sizes))
        for i, (index, size) in enumerate(zip(indices, sizes)):
            at = "{}.specializations[{}]".format(where, i)
            c.integer(index, at, 0, len(specs) - 1)
            if index in claimed:
                raise c.fail(at, "specialization {} is in two bucket groups, or twice in one".format(index))
            claimed.add(index)
            shapes = {record["name"]: record["shape"] for record in specs[index]["inputs"]}
            for name, axis in inputs.items():
                if name not in shapes or axis >= len(shapes[name]) or shapes[name][axis] != size:
                    raise c.fail(at, "specialization {} does not take input '{}' with dim {} of size {}".format(
                        index, schema.short(name), axis, size))
        if "padding" in group:
            # Each bucket's outputs are cut by the same rules (buckets.slicer), so they must agree in number and rank
            ranks = [len(record["shape"]) for record in specs[indices[-1]]["outputs"]]
            for index in indices:
                mine = [len(record["shape"]) for record in specs[index]["outputs"]]
                if mine != ranks:
                    raise c.fail(where + ".padding", "specialization {} has outputs of ranks {}, the group's last "
                                 "{}".format(index, schema.bounded(mine), schema.bounded(ranks)))
            _check_padding(c, group["padding"], where + ".padding", inputs, sizes, ranks, manifest["members"])


def _check_padding(c: schema.Checker, padding: Any, where: str, inputs: Dict[str, int], sizes: List[int],
                   ranks: List[int], members: Dict[str, Any]) -> None:
    c.obj(padding, where, ("side", "values", "min_length", "outputs", "source"))
    c.text(padding["side"], where + ".side", PAD_SIDES)
    c.text(padding["source"], where + ".source")
    values = c.obj(padding["values"], where + ".values")
    if sorted(values) != sorted(inputs):
        raise c.fail(where + ".values", "pads {}, the group buckets {}".format(
            schema.bounded(sorted(values)), schema.bounded(sorted(inputs))))
    for name, value in values.items():
        if isinstance(value, float) and not np.isfinite(value) or not isinstance(value, (bool, int, float)):
            raise c.fail("{}.values.{}".format(where, schema.short(name)), "expected a finite number, got {}".format(
                schema.short(value)))
    c.integer(padding["min_length"], where + ".min_length", 1, sizes[-1])
    for index, record in enumerate(c.items(padding["outputs"], where + ".outputs", len(ranks))):
        at = "{}.outputs[{}]".format(where, index)
        c.obj(record, at, ("name", "axes"))
        c.text(record["name"], at + ".name")
        axes = c.items(record["axes"], at + ".axes")
        for number, rule in enumerate(axes):
            rule_at = "{}.axes[{}]".format(at, number)
            c.obj(rule, rule_at, ("axis", "scale", "offset", "divisor"))
            if not ranks[index]:
                raise c.fail(rule_at, "output {} is a scalar: it has no axis to cut".format(index))
            c.integer(rule["axis"], rule_at + ".axis", 0, ranks[index] - 1)
            c.integer(rule["scale"], rule_at + ".scale", 0, MAX_RULE)
            c.integer(rule["offset"], rule_at + ".offset", -MAX_RULE, MAX_RULE)
            c.integer(rule["divisor"], rule_at + ".divisor", 1, MAX_RULE)
        if len({rule["axis"] for rule in axes}) != len(axes):
            raise c.fail(at + ".axes", "an axis is listed twice")
    if "reference" in padding:  # proven padded calls that `verify` runs again
        c.member_name(padding["reference"], where + ".reference", members)
        lengths = c.items(padding.get("reference_lengths"), where + ".reference_lengths")
        if len(lengths) > len(sizes):
            raise c.fail(where + ".reference_lengths", "more calls than buckets")
        for index, length in enumerate(lengths):
            c.integer(length, "{}.reference_lengths[{}]".format(where, index), padding["min_length"], sizes[-1])
    if "proof" in padding:  # what inspect shows
        probes = c.items(c.obj(padding["proof"], where + ".proof", ("probes",))["probes"], where + ".proof.probes")
        for index, probe in enumerate(probes):
            at = "{}.proof.probes[{}]".format(where, index)
            c.obj(probe, at, ("size", "length", "outputs"))
            c.integer(probe["size"], at + ".size", 1)
            c.integer(probe["length"], at + ".length", 1)
            for number, result in enumerate(c.items(probe["outputs"], at + ".outputs")):
                result_at = "{}.outputs[{}]".format(at, number)
                c.obj(result, result_at, ("name", "max_abs", "max_rel"))
                c.text(result["name"], result_at + ".name")
                c.number(result["max_abs"], result_at + ".max_abs")
                c.number(result["max_rel"], result_at + ".max_rel")


# --- the words for inspect and the docs ---

def describe_rule(rule: Dict[str, Any]) -> str:
    """An output axis's valid length as a person reads it: `dim 1: L`, `dim 1: (L - 400) // 320`."""
    scale, offset, divisor = rule["scale"], rule["offset"], rule["divisor"]
    text = "L" if scale == 1 else "{}*L".format(scale)
    if offset:
        text = "{} {} {}".format(text, "+" if offset > 0 else "-", abs(offset))
    if divisor != 1:
        text = "({}) // {}".format(text, divisor) if offset else "{} // {}".format(text, divisor)
    return "dim {}: {}".format(rule["axis"], text)


def describe_outputs(padding: Dict[str, Any]) -> List[str]:
    """Per output, how a padded call's output is cut back: `logits: whole (padding-invariant)`."""
    lines = []
    for record in padding["outputs"]:
        if record["axes"]:
            lines.append("{}: sliced to {}".format(record["name"], ", ".join(describe_rule(r) for r in record["axes"])))
        else:
            lines.append("{}: whole (padding-invariant)".format(record["name"]))
    return lines
