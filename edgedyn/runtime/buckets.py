"""Buckets on the board: a call whose length falls between two exported sizes is padded to the next one, run, and
its outputs sliced back to the valid part.

The manifest's `buckets` lists groups of specializations that differ only in one dimension of some inputs:
    {"inputs": {"input_ids": 1, "attention_mask": 1}, "sizes": [16, 32, 64], "specializations": [0, 1, 2],
     "source": "--input 'input_ids=1x{16,32,64}:int64' ...",
     "padding": {"side": "right", "values": {"input_ids": 0, "attention_mask": 0}, "min_length": 1,
                 "outputs": [{"name": "logits", "axes": []},
                             {"name": "last_hidden_state", "axes": [{"axis": 1, "scale": 1, "offset": 0, "divisor": 1}]}],
                 "source": "--pad input_ids=0,attention_mask=0", "proof": {...}}}
Without `padding` the buckets are exact shapes, dispatched by their guards like any specialization. With it, the
export proved (frontend/padding.py) that padding to the next size leaves each output's valid part unchanged; an
output's valid length along `axis` for a call of length L is (scale * L + offset) // divisor, and an output with no
axes is padding-invariant as a whole.

The group is itself a guard, checked in words: the largest bucket's guards with the bucketed dimensions relaxed to
`min_length..largest`, and every bucketed input of one call the same length. runtime/bucket_schema.py checks the
manifest's records before any of this reads them.
Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import guards as guard_checks
from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError, GuardError
from edgedyn.runtime.fastpath import call_key

_CACHED_CALLS = 64  # call shapes whose padded routing the fast path remembers
# A padded input up to this size is built from a copy of a remembered array already holding the pad value (one copy
# and one assignment: a third of a fresh array filled in two parts, measured on the zoo's 16-token buckets); larger
# ones are filled in place, so the fast path's memory stays bounded by _CACHED_CALLS x this.
_TEMPLATE_BYTES = 64 * 1024

Specialization = Any  # edgedyn.runtime.program.Specialization (which imports this module)
Finish = Callable[[List[np.ndarray]], List[np.ndarray]]
Routed = Tuple[Specialization, List[np.ndarray], Optional[Finish]]  # no Finish: no output to cut


# --- dispatch ---

class BucketGroup:
    """One group of the manifest, over the loaded specializations: pads a call to the next size and slices back."""

    def __init__(self, record: Dict[str, Any], specializations: Sequence[Specialization],
                 names: Sequence[str]) -> None:
        self.record = record
        # in the signature's order (the manifest's JSON keys are sorted)
        self.inputs = {name: record["inputs"][name] for name in names if name in record["inputs"]}  # type: Dict[str, int]
        self.sizes = list(record["sizes"])  # type: List[int]
        self.specs = [specializations[i] for i in record["specializations"]]
        self.padding = record.get("padding")  # type: Optional[Dict[str, Any]]
        self.source = record["source"]  # type: str
        # The group's guard: the largest bucket's guards, less the bucketed dims (checked against the sizes instead).
        self.relaxed = [g for g in self.specs[-1].guards
                        if not (g["kind"] == "dim" and self.inputs.get(g["input"]) == g["index"])]

    def holds(self, values: Dict[str, Any]) -> bool:
        """Whether the call is this group's but for the bucketed length: every other guard holds."""
        return guard_checks.first_failure(self.relaxed, values) is None

    def length(self, values: Dict[str, Any]) -> int:
        """The call's length along the bucketed dims; every bucketed input must agree."""
        lengths = {name: int(values[name].shape[axis]) for name, axis in self.inputs.items()}
        if len(set(lengths.values())) > 1:
            raise GuardError("the bucketed inputs must have one length, got {}".format(", ".join(
                "'{}' dim {} = {}".format(name, self.inputs[name], size) for name, size in lengths.items())),
                hint="pad or cut them together (a tokenizer gives input_ids and attention_mask the same length)")
        return next(iter(lengths.values()))

    def bucket(self, length: int) -> int:
        """The index of the smallest size that holds `length`; a GuardError in words when none does."""
        for index, size in enumerate(self.sizes):
            if length <= size:
                if self.padding is not None and length < self.padding["min_length"]:
                    raise GuardError("{} length {} is below {}, the shortest this model takes (its outputs would "
                                     "be empty)".format(self._named(), length, self.padding["min_length"]),
                                     hint="pass at least {} (pad on your side if needed)".format(
                                         self.padding["min_length"]))
                return index
        raise GuardError("{} length {} is above the largest bucket, {}".format(self._named(), length, self.sizes[-1]),
                         hint="cut the input to {}, or export again adding a bucket: {}".format(
                             self.sizes[-1], self.adding(length)))

    def _named(self) -> str:
        return ", ".join("'{}' dim {}".format(name, axis) for name, axis in self.inputs.items())

    def adding(self, length: int) -> str:
        """The --input options of this group with `length` added to the sizes."""
        sizes = ",".join(str(s) for s in sorted(set(self.sizes + [length])))
        shapes = {record["name"]: record for record in self.specs[-1].record["inputs"]}
        options = []
        for name, axis in self.inputs.items():
            shape = ["{" + sizes + "}" if i == axis else str(d) for i, d in enumerate(shapes[name]["shape"])]
            dtype = shapes[name]["dtype"]
            options.append("--input '{}={}{}'".format(name, "x".join(shape), "" if dtype == "float32" else ":" + dtype))
        return " ".join(options) + (" " + self.padding["source"] if self.padding is not None else "")

    def route(self, values: Dict[str, Any]) -> Optional[Routed]:
        """(the bucket's specialization, its padded executor inputs, how to slice its outputs back) for a call this
        group serves by padding; None when the call is not this group's or the group does not pad."""
        if self.padding is None or not self.holds(values):
            return None
        length = self.length(values)
        index = self.bucket(length)
        spec = self.specs[index]
        arrays = []
        for name in spec.inputs:
            value = values[name]
            arrays.append(self.pad(value, name, self.sizes[index]) if name in self.inputs else
                          np.asarray(value, order="C"))
        failure = guard_checks.first_failure(spec.guards, dict(values, **dict(zip(spec.inputs, arrays))))
        if failure is not None:  # the relaxed guards held, so this is an edited bundle or a bug: say what failed
            raise GuardError("{} padded to {} fails its own guards: {}".format(self._named(), self.sizes[index],
                                                                               failure))
        return spec, arrays, self.slicer(length, spec)

    def pad(self, value: np.ndarray, name: str, size: int) -> np.ndarray:
        """`value` with its bucketed dim filled up to `size` by the pad value (on the recorded side)."""
        axis = self.inputs[name]
        if value.shape[axis] == size:
            return np.asarray(value, order="C")
        shape = list(value.shape)
        shape[axis] = size
        valid, filler = self._parts(value.ndim, axis, value.shape[axis], size)
        padded = np.empty(shape, value.dtype)
        padded[valid] = value
        padded[filler] = self.padding["values"][name]
        return padded

    def _parts(self, ndim: int, axis: int, length: int, size: int) -> Tuple[Tuple[slice, ...], Tuple[slice, ...]]:
        """The index of the valid part and of the filler in a padded array."""
        valid = [slice(None)] * ndim
        filler = [slice(None)] * ndim
        if self.padding["side"] == "right":
            valid[axis], filler[axis] = slice(0, length), slice(length, size)
        else:
            valid[axis], filler[axis] = slice(size - length, size), slice(0, size - length)
        return tuple(valid), tuple(filler)

    def steps(self, spec: Specialization, names: Sequence[str], values: Dict[str, Any], length: int) -> List[Any]:
        """How the fast path builds a padded call's executor inputs again: per input of `spec`, its position among
        the arguments and, for a bucketed one, the padded shape, the two parts' indices, the pad value and, when
        small (_TEMPLATE_BYTES), an array of the padded shape already holding the pad value outside the valid part."""
        size = self.sizes[self.specs.index(spec)]
        steps = []  # type: List[Any]
        for name in spec.inputs:
            if name not in self.inputs:
                steps.append((list(names).index(name), None, None, None, None, None))
                continue
            shape = list(values[name].shape)
            shape[self.inputs[name]] = size
            valid, filler = self._parts(len(shape), self.inputs[name], length, size)
            fill = self.padding["values"][name]
            template = None
            if int(np.prod(shape)) * values[name].dtype.itemsize <= _TEMPLATE_BYTES:
                template = np.empty(shape, values[name].dtype)
                template[filler] = fill
            steps.append((list(names).index(name), tuple(shape), valid, filler, fill, template))
        return steps

    def slicer(self, length: int, spec: Specialization) -> Optional[Finish]:
        """Cuts each output of `spec` to the part a call of `length` would have given (outputs without axes stay
        whole; None when no output has one); the indices are computed here, once per call shape."""
        right = self.padding["side"] == "right"
        cuts = []  # type: List[Optional[Tuple[slice, ...]]]
        for record, output in zip(self.padding["outputs"], spec.outputs):
            if not record["axes"]:
                cuts.append(None)
                continue
            index = [slice(None)] * len(output["shape"])
            for rule in record["axes"]:
                extent = output["shape"][rule["axis"]]
                valid = min(extent, max(0, (rule["scale"] * length + rule["offset"]) // rule["divisor"]))
                index[rule["axis"]] = slice(0, valid) if right else slice(extent - valid, extent)
            cuts.append(tuple(index))

        if all(cut is None for cut in cuts):  # no output has the padded axis (a classifier's logits)
            return None

        def finish(outputs: List[np.ndarray]) -> List[np.ndarray]:
            # order positionally: a keyword costs 0.06 us; the slice itself when it is C-ordered already
            return [output if cut is None else np.asarray(output[cut], None, "C") for output, cut in zip(outputs, cuts)]
        return finish


class BucketDispatch:
    """Every bucket group of a program: the padded route of a call, fast for call shapes seen before.

    Note: the fast path remembers, per call shape (each argument's dtype and shape, or a constant's type and value:
    all the guards read), which group and bucket the general path chose, and repeats only the padding; a shape it
    has not seen takes the general path, which checks every guard. The memory is bounded and its updates are single
    dict operations, safe from several threads.
    """

    def __init__(self, records: Sequence[Dict[str, Any]], specializations: Sequence[Specialization],
                 names: Sequence[str]) -> None:
        self.groups = [BucketGroup(record, specializations, names) for record in records]
        self._names = list(names)
        self._padded = [group for group in self.groups if group.padding is not None]
        self._seen = {}  # type: Dict[Tuple[Any, ...], Tuple[Specialization, List[Any], Finish]]
        self._lock = threading.Lock()

    def fast(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Routed]:
        """The padded route of a call whose shapes were routed before; None otherwise (take the general path)."""
        if not self._padded or len(args) + len(kwargs) != len(self._names):
            return None
        values = args if not kwargs else self._values(args, kwargs)
        key = call_key(values) if values is not None else None
        return self.seen(key, values) if key is not None else None

    def seen(self, key: Tuple[Any, ...], values: Sequence[Any]) -> Optional[Routed]:
        """fast() for positional `values` whose call_key is `key`."""
        seen = self._seen.get(key)
        if seen is None:
            return None
        spec, steps, finish = seen
        arrays = []
        for position, shape, valid, filler, fill, template in steps:
            value = values[position]
            if shape is None:
                arrays.append(np.asarray(value, order="C"))
                continue
            if template is not None:  # a fresh array each call: an executor may keep or write its inputs
                padded = template.copy()
            else:
                padded = np.empty(shape, value.dtype)
                padded[filler] = fill
            padded[valid] = value
            arrays.append(padded)
        return spec, arrays, finish

    def route(self, values: Dict[str, Any]) -> Optional[Routed]:
        """The padded route of bound arguments that no specialization takes as they are (GuardError in words when
        a padding group holds the call but cannot serve its length); remembered for the fast path."""
        for group in self._padded:
            routed = group.route(values)
            if routed is None:
                continue
            key = call_key([values[name] for name in self._names])
            if key is not None:
                plan = (routed[0], group.steps(routed[0], self._names, values, group.length(values)), routed[2])
                with self._lock:
                    if len(self._seen) >= _CACHED_CALLS:
                        self._seen.clear()
                    self._seen[key] = plan
            return routed
        return None

    def references(self, bundle: Any, reference: Callable[[Specialization], Tuple[Dict[str, Any], Any]]
                   ) -> List[Tuple[str, Specialization, Dict[str, Any], List[np.ndarray]]]:
        """The padded calls proven at export, to run again (`verify`): (label, the bucket's specialization, the call's
        arguments, torch eager's outputs on the unpadded call). `reference(spec)` gives a bucket's exported
        arguments, which supply the inputs that are not bucketed."""
        calls = []
        for group in self._padded:
            member = group.padding.get("reference")
            if member is None:
                continue
            arrays = bundle.arrays(member)
            for index, length in enumerate(group.padding["reference_lengths"]):
                spec = group.specs[group.bucket(length)]
                values = dict(reference(spec)[0])
                wanted = ["{}.input.{}".format(index, name) for name in group.inputs] + [
                    "{}.output.{}".format(index, i) for i in range(len(spec.outputs))]
                missing = [name for name in wanted if name not in arrays]
                if missing:
                    raise BundleError("bundle member {} lacks arrays {}".format(member, schema.bounded(missing)),
                                      hint=schema.HINT)
                values.update({name: arrays["{}.input.{}".format(index, name)] for name in group.inputs})
                calls.append(("{} padded from {}".format(spec.name, length), spec, values,
                              [arrays["{}.output.{}".format(index, i)] for i in range(len(spec.outputs))]))
        return calls

    def example(self, length: int, reference: Callable[[Specialization], Tuple[Dict[str, Any], Any]],
                rng: Any) -> Dict[str, Any]:
        """Arguments of `length` on the first group's bucketed dims (random: floats normal, ids 1..9, masks ones),
        the rest as the largest bucket was exported, for timing a padded call."""
        if not self.groups:
            raise GuardError("this bundle has no buckets, so no length to choose",
                             hint="time it without --length, or export with sizes in braces: --input 'x=1x{16,32}'")
        group = self.groups[0]
        values = dict(reference(group.specs[-1])[0])
        shapes = {record["name"]: record for record in group.specs[-1].record["inputs"]}
        for name, axis in group.inputs.items():
            shape = list(shapes[name]["shape"])
            shape[axis] = length
            dtype = np.dtype(shapes[name]["dtype"])
            if "mask" in name.lower() and dtype.kind in "biu":
                values[name] = np.ones(shape, dtype)
            elif dtype.kind in "iu":
                values[name] = rng.integers(1, 10, size=shape).astype(dtype)
            elif dtype == np.bool_:
                values[name] = rng.integers(0, 2, size=shape).astype(np.bool_)
            else:
                values[name] = rng.standard_normal(size=shape).astype(dtype)
        return values

    def hint(self, values: Dict[str, Any]) -> Optional[str]:
        """For a call no specialization takes: what the bucket groups say about it (None when they do not hold it)."""
        for group in self.groups:
            if not group.holds(values):
                continue
            try:
                length = group.length(values)
            except GuardError as error:
                return error.message
            if length > group.sizes[-1]:
                return "export again adding a bucket: {}".format(group.adding(length))
            if group.padding is None:
                return ("its buckets {} are exact shapes (exported without --pad): pass one of those lengths, or "
                        "export again with --pad {} to pad the lengths between them".format(
                            group.sizes, ",".join("{}=0".format(name) for name in group.inputs)))
        return None

    def _values(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[List[Any]]:
        if len(args) + len(kwargs) != len(self._names) or len(args) > len(self._names):
            return None
        values = list(args)
        for name in self._names[len(args):]:
            if name not in kwargs:
                return None
            values.append(kwargs[name])
        return values


def load_order(specializations: List[Specialization]) -> List[Specialization]:
    """The order executors are opened in: largest declared arena first, so a pool shared by buckets
    (arena_pools) is allocated once at its final size."""
    def arena(spec: Specialization) -> int:
        memory = spec.record.get("memory")
        size = memory.get("arena_bytes") if isinstance(memory, dict) else None
        return size if isinstance(size, int) and not isinstance(size, bool) else 0
    return sorted(specializations, key=lambda spec: -arena(spec))


def arena_pools(manifest: Dict[str, Any]) -> Dict[int, Any]:
    """One ArenaPool per bucket group, keyed by the id of each member specialization's record: the executors that
    can (portable) run every bucket of a group in one arena per thread (calls in one thread never overlap)."""
    pools = {}  # type: Dict[int, Any]
    records = manifest["specializations"]
    for group in manifest.get("buckets", []):
        pool = ArenaPool()
        for index in group["specializations"]:
            pools[id(records[index])] = pool
    return pools


def typical_lengths(group: Dict[str, Any]) -> List[Tuple[int, int]]:
    """(bucket size, a length it serves) per bucket: halfway between the bucket below (or the shortest length) and
    it when the group pads, else the size itself."""
    padding = group.get("padding")
    below = padding["min_length"] - 1 if padding is not None else 0
    pairs = []
    for size in group["sizes"]:
        length = (below + 1 + size) // 2 if padding is not None and below + 1 < size else size
        pairs.append((size, max(length, 1)))
        below = size
    return pairs


class ArenaPool:
    """One arena buffer per thread, shared by the executors of a bucket group that plan one (portable): a thread
    runs one call at a time, so the buckets' intermediates never live at once, and the largest bucket's arena serves
    them all. Executors reserve their size when they load (largest first, program.load_order), so each thread
    allocates its buffer once, at the final size."""

    ALIGNMENT = 4096  # a multiple of any alignment a portable graph may ask for (runtime/schema.py)

    def __init__(self) -> None:
        self.capacity = 0
        self._local = threading.local()

    def reserve(self, nbytes: int) -> None:
        self.capacity = max(self.capacity, int(nbytes))

    def get(self, nbytes: int) -> np.ndarray:
        """This thread's buffer (at least `nbytes`, 4096-aligned); a larger one replaces it if a later executor
        reserved more (views over the old one keep it alive: correct, only not shared)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.nbytes < max(nbytes, self.capacity):
            size = max(nbytes, self.capacity)
            raw = np.zeros(size + self.ALIGNMENT, np.uint8)
            start = (-raw.ctypes.data) % self.ALIGNMENT
            buffer = raw[start:start + size]
            self._local.buffer = buffer
        return buffer
