"""The padding proof: for a bucket group exported with `--pad`, is padding a call up to the next bucket exact?

At export, per group (frontend/buckets.py), torch side only:
1. Length rules. The model is captured once more with the bucketed dimension dynamic (torch.export, Dim.AUTO).
   Each output dimension is then an expression of the length L; those that vary become a rule
   `(scale * L + offset) // divisor` (a chain of convolutions and strided slices folds into one such floor), checked
   against every bucket's traced output shape. The lower end of torch.export's range for L is the shortest length.
2. Probes. For each bucket, torch eager runs on unpadded random inputs of lengths that bucket serves (the shortest,
   padded the most, and one halfway) and on their padded forms; every output's valid part (its rule's slice, or the
   whole output when it has no rule) must match the unpadded output within the fp32 tolerance.
3. A miss refuses padding, with the numbers, the first module whose valid output changes while its valid input did
   not (forward hooks over a second pair of runs) and what would fix it. Without --pad the buckets stay exact shapes.

The record is the manifest's `buckets[i].padding` (runtime/buckets.py reads it on the board).
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from edgedyn.errors import CaptureError
from edgedyn.frontend.buckets import BucketGroup, Padding, check_padding
from edgedyn.frontend.outputs import flatten_output
from edgedyn.runtime.program import FP32_TOLERANCE, compare
from edgedyn.torch_quiet import quiet_torch

Tensors = Dict[str, torch.Tensor]


class PaddingRefused(CaptureError):
    """Padding to a bucket would change an output's valid part (or edgedyn cannot tell how to slice it back)."""


def prove_padding(captured: Any, padding: Optional[Padding], progress: Any = None, seed: int = 0) -> None:
    """Proves `padding` for every bucket group of `captured` and records it on the group (group.padding); raises
    PaddingRefused with the measured difference and what would fix it when an output is not padding-invariant."""
    if padding is None:
        return
    step = progress or (lambda message: None)
    specs = captured.specializations
    dtypes = {name: str(t.dtype).replace("torch.", "") for s in specs for name, t in zip(s.tensor_inputs,
                                                                                           s.example_tensors)}
    check_padding(padding, captured.buckets, dtypes)
    for group in captured.buckets:
        step("proving that padding {} to {{{}}} leaves every output exact".format(
            ", ".join(group.inputs), ",".join(map(str, group.sizes))))
        group.padding = _prove_group(captured, group, padding, seed)


def _prove_group(captured: Any, group: BucketGroup, padding: Padding, seed: int) -> Dict[str, Any]:
    specs = [captured.specializations[i] for i in group.specializations]
    rules, lowest = _length_rules(captured, group, specs)
    generator = torch.Generator().manual_seed(seed)
    probes = []  # type: List[Dict[str, Any]]
    min_length = lowest
    if group.sizes[0] == 1:
        min_length = 1  # length 1 is a bucket of its own
    elif lowest == 2:  # torch.export's range starts at 2 (it treats sizes 0 and 1 apart): run length 1 to see
        probe = _probe(captured, group, specs[0], group.sizes[0], padding, rules, 1, generator, strict=False)
        if probe is not None:
            min_length = 1
            probes.append(probe[0])
    previous = min_length - 1
    group.references = []
    for spec, size in zip(specs, group.sizes):
        for length in sorted({previous + 1, (previous + 1 + size) // 2}):
            if min_length <= length < size and not any(p["length"] == length for p in probes):
                record, inputs, outputs = _probe(captured, group, spec, size, padding, rules, length, generator,
                                                 strict=True)
                probes.append(record)
                if not group.references or group.references[-1][0] < previous + 1:  # the most padded per bucket
                    group.references.append((length, inputs, outputs))
        previous = size
    names = specs[0].output_names
    return {
        "side": padding.side, "values": dict(padding.values), "min_length": min_length, "source": padding.source,
        "outputs": [{"name": name, "axes": rules[index]} for index, name in enumerate(names)],
        "proof": {"tolerance": dict(FP32_TOLERANCE), "probes": probes,
                  "rules": "torch.export with the bucketed dimension dynamic; each rule checked at every bucket",
                  "inputs": "floats normal, integer ids uniform in [0, 10), inputs named *mask* ones over the valid "
                            "part; padded with the --pad values"},
    }


# --- 1. how each output's length follows the input's ---

def _length_rules(captured: Any, group: BucketGroup, specs: List[Any]) -> Tuple[List[List[Dict[str, int]]], int]:
    """Per output, the rules of its dims that follow the bucketed length; and the shortest length torch.export
    allows. Refuses padding when the model pins the length or an output's size is not such a rule."""
    from torch.export import Dim

    from edgedyn.frontend import _Specialized

    largest = specs[-1]
    wrapper = _Specialized(captured.model, largest.tensor_inputs, largest.constants, captured.order)
    wrapper.training = False
    dims = tuple({group.inputs[name]: Dim.AUTO} if name in group.inputs else None for name in largest.tensor_inputs)
    try:
        with quiet_torch():
            program = torch.export.export(wrapper, tuple(largest.example_tensors), dynamic_shapes=(dims,),
                                          strict=False)
    except Exception as error:
        raise _refuse(captured.name, "torch.export cannot capture it with {} of variable length ({}: {})".format(
            _dims(group), type(error).__name__, _first_line(error)))
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"][-len(largest.tensor_inputs):]
    symbols = set()
    for name, node in zip(largest.tensor_inputs, placeholders):
        if name in group.inputs:
            size = node.meta["val"].shape[group.inputs[name]]
            if isinstance(size, int):
                raise _refuse(captured.name, "the model fixes input '{}' dim {} at {}: torch.export found code "
                                             "that holds only for that size".format(name, group.inputs[name], size))
            symbols.add(size.node.expr)
    lowest = 1
    for symbol, bounds in program.range_constraints.items():
        if symbol in symbols:
            lowest = max(lowest, int(bounds.lower))
    outputs = [n for n in program.graph.nodes if n.op == "output"][0].args[0]
    rules = []  # type: List[List[Dict[str, int]]]
    for index, (output, name) in enumerate(zip(outputs, largest.output_names)):
        shape = output.meta["val"].shape if isinstance(output, torch.fx.Node) else ()
        axes = []
        for axis, size in enumerate(shape):
            if isinstance(size, int):
                continue
            rule = _affine(size.node.expr, symbols)
            if rule is None:
                raise _refuse(captured.name, "output '{}' dim {} has size {} for a length L, which is not a rule "
                                             "of the form (a*L + b) // c that edgedyn can slice by".format(
                                                 name, axis, size.node.expr))
            axes.append(dict(rule, axis=axis))
        for spec, length in zip(specs, group.sizes):  # the rule must give every bucket's traced shape
            traced = spec.reference_outputs[index].shape
            for rule in axes:
                if valid_length(rule, length) != traced[rule["axis"]]:
                    raise _refuse(captured.name, "output '{}' dim {}: the length rule gives {} at {}, the capture "
                                                 "traced {}".format(name, rule["axis"], valid_length(rule, length),
                                                                    length, traced[rule["axis"]]))
        rules.append(axes)
    return rules, lowest


def valid_length(rule: Dict[str, int], length: int) -> int:
    """How many entries of an output axis a call of `length` fills (runtime/buckets.py computes the same)."""
    return max(0, (rule["scale"] * length + rule["offset"]) // rule["divisor"])


def _affine(expr: Any, symbols: set) -> Optional[Dict[str, int]]:
    """`expr` (sympy, in the length symbols) as {"scale", "offset", "divisor"}: floor((scale*L + offset) / divisor);
    None when it is not of that form. floor((floor(x / a) + c) / b) == floor((x + c*a) / (a*b)) folds nested floors."""
    import sympy

    name = type(expr).__name__
    if expr in symbols:
        return {"scale": 1, "offset": 0, "divisor": 1}
    if isinstance(expr, sympy.Integer):
        return {"scale": 0, "offset": int(expr), "divisor": 1}
    parts = [_affine(arg, symbols) for arg in expr.args]
    if any(part is None for part in parts):
        return None
    if isinstance(expr, sympy.Add):
        total = parts[0]
        for part in parts[1:]:
            if part["scale"] == 0 and part["divisor"] == 1:  # + a constant
                total = dict(total, offset=total["offset"] + part["offset"] * total["divisor"])
            elif total["scale"] == 0 and total["divisor"] == 1:
                total = dict(part, offset=part["offset"] + total["offset"] * part["divisor"])
            elif total["divisor"] == part["divisor"] == 1:
                total = {"scale": total["scale"] + part["scale"], "offset": total["offset"] + part["offset"],
                         "divisor": 1}
            else:
                return None
        return total
    if isinstance(expr, sympy.Mul):
        total = parts[0]
        for part in parts[1:]:
            constant, other = (part, total) if part["scale"] == 0 and part["divisor"] == 1 else (total, part)
            if constant["scale"] != 0 or constant["divisor"] != 1 or other["divisor"] != 1:
                return None
            total = {"scale": other["scale"] * constant["offset"], "offset": other["offset"] * constant["offset"],
                     "divisor": 1}
        return total if total["scale"] >= 0 else None
    if name in ("FloorDiv", "CleanDiv") and len(parts) == 2:
        numerator, denominator = parts
        if denominator["scale"] != 0 or denominator["divisor"] != 1 or denominator["offset"] <= 0:
            return None
        return dict(numerator, divisor=numerator["divisor"] * denominator["offset"])
    return None


# --- 2. the probes ---

def _probe(captured: Any, group: BucketGroup, spec: Any, size: int, padding: Padding,
           rules: List[List[Dict[str, int]]], length: int, generator: torch.Generator,
           strict: bool) -> Optional[Tuple[Dict[str, Any], Dict[str, np.ndarray], List[np.ndarray]]]:
    """Runs eager at `length` and padded to `size`, the bucket of `spec`: (the per-output differences, the unpadded
    inputs, eager's outputs on them). A miss raises PaddingRefused when `strict`, else gives None (length 1, which
    torch.export leaves unproven)."""
    unpadded = _inputs(spec, group, length, generator)
    padded = {name: _pad(value, group.inputs[name], size, padding.values[name], padding.side)
              if name in group.inputs else value for name, value in unpadded.items()}
    try:
        want = _eager(captured, spec, unpadded)
        got = _eager(captured, spec, padded)
    except Exception as error:
        if not strict:
            return None
        raise _refuse(captured.name, "the model raised {} on {} of length {} ({})".format(
            type(error).__name__, _dims(group), length, _first_line(error)))
    results = []
    worst = None  # type: Optional[Tuple[str, Dict[str, Any]]]
    for index, (name, expected, actual) in enumerate(zip(spec.output_names, want, got)):
        valid = _valid(actual, rules[index], length, padding.side)
        result = compare(valid, expected, FP32_TOLERANCE)
        results.append({"name": name, "max_abs": result["max_abs"], "max_rel": result["max_rel"]})
        if not result["ok"] and (worst is None or result["max_rel"] > worst[1]["max_rel"]):
            worst = (name, dict(result, shapes=(tuple(valid.shape), tuple(expected.shape))))
    if worst is not None:
        if not strict:
            return None
        raise _not_invariant(captured, group, spec, padding, length, size, worst, unpadded, padded)
    record = {"size": int(size), "length": int(length), "outputs": results}
    return record, {name: value.numpy() for name, value in unpadded.items() if name in group.inputs}, want


def _inputs(spec: Any, group: BucketGroup, length: int, generator: torch.Generator) -> Tensors:
    """The call at `length`: bucketed inputs drawn fresh (a mask as a tokenizer makes it: ones), others as traced."""
    from edgedyn.frontend import is_mask

    values = {}
    for name, example in zip(spec.tensor_inputs, spec.example_tensors):
        if name not in group.inputs:
            values[name] = example
            continue
        shape = list(example.shape)
        shape[group.inputs[name]] = length
        if is_mask(name, example.dtype):
            values[name] = torch.ones(shape, dtype=example.dtype)
        elif example.dtype.is_floating_point:
            values[name] = torch.randn(shape, generator=generator).to(example.dtype)
        elif example.dtype == torch.bool:
            values[name] = torch.randint(0, 2, shape, generator=generator).bool()
        else:
            values[name] = torch.randint(0, 10, shape, generator=generator, dtype=example.dtype)
    return values


def _pad(value: torch.Tensor, axis: int, size: int, fill: Any, side: str) -> torch.Tensor:
    shape = list(value.shape)
    shape[axis] = size - value.shape[axis]
    filler = torch.full(shape, fill, dtype=value.dtype)
    return torch.cat([value, filler] if side == "right" else [filler, value], axis)


def _eager(captured: Any, spec: Any, tensors: Tensors) -> List[np.ndarray]:
    from edgedyn.frontend import _call

    with torch.no_grad():
        result = _call(captured.model, captured.order, dict(tensors, **spec.constants))
    return [t.detach().cpu().numpy() for t in flatten_output(result)[1]]


def _valid(output: np.ndarray, rules: List[Dict[str, int]], length: int, side: str) -> np.ndarray:
    index = [slice(None)] * output.ndim
    for rule in rules:
        keep = min(valid_length(rule, length), output.shape[rule["axis"]])
        extent = output.shape[rule["axis"]]
        index[rule["axis"]] = slice(0, keep) if side == "right" else slice(extent - keep, extent)
    return output[tuple(index)]


# --- 3. the refusal, in words ---

def _not_invariant(captured: Any, group: BucketGroup, spec: Any, padding: Padding, length: int, size: int,
                   worst: Tuple[str, Dict[str, Any]], unpadded: Tensors, padded: Tensors) -> PaddingRefused:
    name, result = worst
    culprit = _first_changed_module(captured, spec, unpadded, padded, padding.side)
    where = "; the first module whose output's valid part changes while its input's does not: {}".format(
        culprit) if culprit else ""
    message = ("padding is not exact for {}: output '{}' changes when {} {} padded from {} to {} (max abs error "
               "{:.3g}, {:.3g} of its largest value; the fp32 tolerance is {:g}){}".format(
                   captured.name, name, _dims(group), "is" if len(group.inputs) == 1 else "are", length, size,
                   result["max_abs"], result["max_rel"], FP32_TOLERANCE["rtol"], where))
    return PaddingRefused(message, hint=_fix(captured, group, culprit))


def _fix(captured: Any, group: BucketGroup, culprit: Optional[str]) -> str:
    """What would make the model padding-invariant, from the culprit's kind and the model's own arguments."""
    import inspect

    ideas = []
    try:
        target = captured.model.forward if isinstance(captured.model, torch.nn.Module) else captured.model
        parameters = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        parameters = []
    masks = [p for p in parameters if "mask" in p.lower() and p not in group.inputs]
    kind = (culprit or "").lower()
    if masks:
        first = next(iter(group.inputs))
        shape = _braced(captured, group, first)
        ideas.append("pass the model its {} as an input, bucketed and padded with 0 (--input '{}={}:int64' --pad "
                     "{},{}=0), so the padded positions are masked".format(masks[0], masks[0], shape, ",".join(
                         "{}={}".format(n, 0) for n in group.inputs), masks[0]))
    elif "attention" in kind:
        ideas.append("give the attention a mask over the padded positions (an attention_mask input)")
    if "norm" in kind:
        ideas.append("normalize per position, or over the valid part only: a norm over the padded dimension (such "
                     "as GroupNorm over time) counts the padding in its statistics")
    if "pool" in kind or not ideas:
        ideas.append("pool over the valid positions only (masked pooling: sum(x * mask) / sum(mask)) instead of "
                     "over the whole padded dimension")
    ideas.append("or leave --pad out: the buckets still work as exact shapes")
    return "; ".join(ideas)


def _braced(captured: Any, group: BucketGroup, name: str) -> str:
    spec = captured.specializations[group.specializations[0]]
    shape = [str(s) for s in spec.example_tensors[spec.tensor_inputs.index(name)].shape]
    shape[group.inputs[name]] = "{" + ",".join(map(str, group.sizes)) + "}"
    return "x".join(shape)


def _first_changed_module(captured: Any, spec: Any, unpadded: Tensors, padded: Tensors, side: str) -> Optional[str]:
    """`name (Class)` of the first module, in the order calls finish, whose inputs' valid parts match between the
    two runs but whose outputs' do not: where padding first leaks into the valid positions."""
    model = captured.model
    if not isinstance(model, torch.nn.Module):
        return None
    runs = []
    for tensors in (unpadded, padded):
        calls = []  # type: List[Tuple[str, List[torch.Tensor], List[torch.Tensor]]]

        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any, name: str = "") -> None:
            if len(calls) < 20000:
                calls.append((name, _flat(args) + _flat(kwargs), _flat(output)))
        handles = [m.register_forward_hook(lambda mod, a, k, o, n=n: hook(mod, a, k, o, n), with_kwargs=True)
                   for n, m in model.named_modules()]
        try:
            _eager(captured, spec, tensors)
        except Exception:
            return None
        finally:
            for handle in handles:
                handle.remove()
        runs.append(calls)
    classes = {n: type(m).__name__ for n, m in model.named_modules()}
    for (name, inputs_a, outputs_a), (other, inputs_b, outputs_b) in zip(*runs):
        if name != other:
            return None  # the two runs took different paths: no call-by-call comparison
        if _same(inputs_a, inputs_b, side) and not _same(outputs_a, outputs_b, side):
            if not name:  # the model itself: an op in its own forward, between its submodules
                return "{}.forward itself, outside its submodules".format(type(model).__name__)
            return "{} ({})".format(name, classes.get(name, "?"))
    return None


def _flat(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach()]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _flat(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat(item)]
    return [t for item in getattr(value, "values", lambda: [])() for t in _flat(item)] if hasattr(
        value, "to_tuple") else []


def _same(short: List[torch.Tensor], long: List[torch.Tensor], side: str) -> bool:
    """Whether each tensor of the unpadded run equals the matching part of the padded run's (fp32 tolerance)."""
    if len(short) != len(long):
        return False
    for a, b in zip(short, long):
        if a.dim() != b.dim() or any(x > y for x, y in zip(a.shape, b.shape)):
            return False
        index = tuple(slice(0, x) if side == "right" else slice(y - x, y) for x, y in zip(a.shape, b.shape))
        part = b[index]
        if a.dtype.is_floating_point:
            if not compare(part.float().numpy(), a.float().numpy(), FP32_TOLERANCE)["ok"]:
                return False
        elif not torch.equal(part, a):
            return False
    return True


def _refuse(model: str, why: str) -> PaddingRefused:
    return PaddingRefused("padding cannot be proven for {}: {}".format(model, why),
                          hint="leave --pad out: the buckets still work as exact shapes")


def _dims(group: BucketGroup) -> str:
    return ", ".join("'{}' dim {}".format(name, axis) for name, axis in group.inputs.items())


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
