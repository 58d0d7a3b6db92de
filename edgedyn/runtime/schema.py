"""The one place that says what a bundle's JSON may contain: the manifest and the portable `graph.json`.

Everything a bundle says is checked here before any array is built from it: types, ranges, the dtype allow-list,
member names, and (for portable graphs) every view's extent within the arena or its weight array. A bundle may
arrive over a network: a value that would make numpy read outside a buffer, allocate without bound or build an
object array is refused with a BundleError naming the member and the field.
Over 400 lines because every rule a bundle's bytes must meet lives here, in one place, rather than scattered beside
each reader. Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.precision import PRECISIONS

# Note: numeric dtypes only. An object dtype would make numpy treat raw bytes as pointers; structured and string
# dtypes are never written by edgedyn.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")
GUARD_KINDS = ("tensor", "dtype", "rank", "dim", "constant")
SCALAR_TYPES = ("int", "float", "bool")
OUTPUT_KINDS = ("tensor", "none", "constant", "tuple", "list", "dict")
MAX_RANK = 16
MAX_NAME = 1024  # characters in any name or string field
MAX_DEPTH = 32  # nesting of output trees and step arguments
LISTED = 4  # items a message lists before "and N more"
HINT = "copy the bundle again or export it again; never edit a bundle by hand"


def bounded(items: Iterable[Any], limit: int = LISTED) -> str:
    """A few items, then how many more: messages stay short whatever a bundle holds."""
    items = [str(item) for item in items]
    shown = ", ".join(short(item) for item in items[:limit])
    return shown + (" and {} more".format(len(items) - limit) if len(items) > limit else "")


def short(value: Any, limit: int = 80) -> str:
    """repr() cut to `limit` characters, for values that come from a bundle or a caller."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "...({} characters)".format(len(text))


class Checker:
    """Checks one JSON document; every failure names the bundle, the member and the field path."""

    def __init__(self, bundle: Any, member: str) -> None:
        self.bundle = bundle
        self.member = member  # the member checked, for messages

    def fail(self, where: str, what: str) -> BundleError:
        return BundleError("bundle {}: {} is invalid at {}: {}".format(self.bundle, self.member, where, what),
                           hint=HINT)

    def obj(self, value: Any, where: str, required: Sequence[str] = ()) -> Dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "expected an object, got {}".format(type(value).__name__))
        missing = [key for key in required if key not in value]
        if missing:
            raise self.fail(where, "lacks {}".format(bounded(missing)))
        return value

    def items(self, value: Any, where: str, length: Optional[int] = None) -> List[Any]:
        if not isinstance(value, list):
            raise self.fail(where, "expected a list, got {}".format(type(value).__name__))
        if length is not None and len(value) != length:
            raise self.fail(where, "expected {} items, got {}".format(length, len(value)))
        return value

    def integer(self, value: Any, where: str, low: int = 0, high: Optional[int] = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, "expected an integer, got {}".format(short(value)))
        if value < low or (high is not None and value > high):
            raise self.fail(where, "{} is outside [{}, {}]".format(value, low, "inf" if high is None else high))
        return value

    def number(self, value: Any, where: str, low: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
            raise self.fail(where, "expected a number >= {}, got {}".format(low, short(value)))
        return float(value)

    def text(self, value: Any, where: str, choices: Optional[Sequence[str]] = None) -> str:
        if not isinstance(value, str) or len(value) > MAX_NAME:
            raise self.fail(where, "expected a string, got {}".format(short(value)))
        if choices is not None and value not in choices:
            raise self.fail(where, "{} is not one of {}".format(short(repr(value)), ", ".join(choices)))
        return value

    def dtype(self, value: Any, where: str) -> np.dtype:
        return np.dtype(self.text(value, where, DTYPES))

    def shape(self, value: Any, where: str) -> List[int]:
        dims = self.items(value, where)
        if len(dims) > MAX_RANK:
            raise self.fail(where, "rank {} is above {}".format(len(dims), MAX_RANK))
        return [self.integer(size, "{}[{}]".format(where, i)) for i, size in enumerate(dims)]

    def member_name(self, value: Any, where: str, members: Dict[str, Any]) -> str:
        name = self.text(value, where)
        if name not in members:
            raise self.fail(where, "names member {}, which the manifest does not list".format(short(name)))
        return name


# --- the manifest ---

def check_manifest(manifest: Any, bundle: Any, member: str) -> Dict[str, Any]:
    """Raises BundleError unless every manifest field the runtime reads has the type and range it needs."""
    c = Checker(bundle, member)
    c.obj(manifest, "the top level", ("members", "specializations", "signature", "board", "model"))
    members = c.obj(manifest["members"], "members")
    for name, record in members.items():
        where = "members[{}]".format(short(name))
        check_member_name(c.text(name, where), bundle)
        c.obj(record, where, ("sha256", "size"))
        digest = c.text(record["sha256"], where + ".sha256")
        if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
            raise c.fail(where + ".sha256", "expected 64 lowercase hex digits, got {}".format(short(digest)))
        c.integer(record["size"], where + ".size")
    c.text(c.obj(manifest["model"], "model", ("name",))["name"], "model.name")
    c.obj(manifest["board"], "board")
    names = _check_signature(c, manifest["signature"])
    specs = c.items(manifest["specializations"], "specializations")
    if not specs:
        raise c.fail("specializations", "the list is empty")
    for index, spec in enumerate(specs):
        _check_specialization(c, spec, "specializations[{}]".format(index), names, members)
    return manifest


def _check_signature(c: Checker, signature: Any) -> List[str]:
    names = []
    for index, param in enumerate(c.items(signature, "signature")):
        where = "signature[{}]".format(index)
        c.obj(param, where, ("name", "kind"))
        names.append(c.text(param["name"], where + ".name"))
        c.text(param["kind"], where + ".kind")
    if len(set(names)) != len(names):
        raise c.fail("signature", "argument names repeat")
    return names


def declared_tensor_bytes(spec: Dict[str, Any]) -> Optional[int]:
    """What the manifest says one call's tensors take (every intermediate, unplanned), when it says."""
    memory = spec.get("memory")
    value = memory.get("naive_bytes") if isinstance(memory, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _check_specialization(c: Checker, spec: Any, where: str, names: List[str], members: Dict[str, Any]) -> None:
    c.obj(spec, where, ("name", "guards", "inputs", "outputs", "output_tree", "artifacts", "constants", "reference"))
    c.text(spec["name"], where + ".name")
    for index, guard in enumerate(c.items(spec["guards"], where + ".guards")):
        check_guard(c, guard, "{}.guards[{}]".format(where, index), names)
    for key in ("inputs", "outputs"):
        for index, record in enumerate(c.items(spec[key], "{}.{}".format(where, key))):
            at = "{}.{}[{}]".format(where, key, index)
            c.obj(record, at, ("name", "dtype", "shape"))
            c.text(record["name"], at + ".name")
            c.dtype(record["dtype"], at + ".dtype")
            c.shape(record["shape"], at + ".shape")
    unknown = [name for name in (r["name"] for r in spec["inputs"]) if name not in names]
    if unknown:
        raise c.fail(where + ".inputs", "names arguments the signature lacks: {}".format(bounded(unknown)))
    c.obj(spec["constants"], where + ".constants")
    c.member_name(spec["reference"], where + ".reference", members)
    _check_output_tree(c, spec["output_tree"], where + ".output_tree", len(spec["outputs"]), 0)
    artifacts = c.items(spec["artifacts"], where + ".artifacts")
    if not artifacts:
        raise c.fail(where + ".artifacts", "the list is empty")
    for index, artifact in enumerate(artifacts):
        _check_artifact(c, artifact, "{}.artifacts[{}]".format(where, index), members)


def check_guard(c: Checker, guard: Any, where: str, names: List[str]) -> None:
    c.obj(guard, where, ("kind", "input"))
    kind = c.text(guard["kind"], where + ".kind", GUARD_KINDS)
    c.text(guard["input"], where + ".input", names)
    if kind in ("dtype", "rank", "dim", "constant") and "expected" not in guard:
        raise c.fail(where, "lacks 'expected'")
    if kind == "dtype":
        c.dtype(guard["expected"], where + ".expected")
    elif kind == "rank":
        c.integer(guard["expected"], where + ".expected", 0, MAX_RANK)
    elif kind == "dim":
        c.integer(guard.get("index"), where + ".index", 0, MAX_RANK - 1)
        c.integer(guard["expected"], where + ".expected")
    elif kind == "constant":
        type_name = c.text(guard.get("type"), where + ".type", SCALAR_TYPES)
        expected = guard["expected"]
        ok = isinstance(expected, bool) if type_name == "bool" else (
            isinstance(expected, (int, float) if type_name == "float" else int) and not isinstance(expected, bool))
        if not ok:
            raise c.fail(where + ".expected", "expected a {}, got {}".format(type_name, short(expected)))


def _check_output_tree(c: Checker, tree: Any, where: str, outputs: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise c.fail(where, "nested deeper than {}".format(MAX_DEPTH))
    kind = c.text(c.obj(tree, where, ("kind",))["kind"], where + ".kind", OUTPUT_KINDS)
    if kind == "tensor":
        c.integer(tree.get("index"), where + ".index", 0, outputs - 1)
    elif kind in ("tuple", "list", "dict"):
        items = c.items(tree.get("items"), where + ".items")
        if kind == "dict":
            keys = c.items(tree.get("keys"), where + ".keys", len(items))
            for index, key in enumerate(keys):
                c.text(key, "{}.keys[{}]".format(where, index))
        for index, item in enumerate(items):
            _check_output_tree(c, item, "{}.items[{}]".format(where, index), outputs, depth + 1)


MAX_ARTIFACT_THREADS = 256


def _check_artifact(c: Checker, artifact: Any, where: str, members: Dict[str, Any]) -> None:
    c.obj(artifact, where, ("backend", "executor", "files", "device"))
    c.text(artifact["backend"], where + ".backend")
    c.text(artifact["executor"], where + ".executor")
    c.text(artifact["device"], where + ".device")
    if artifact.get("arch") is not None:
        c.text(artifact["arch"], where + ".arch")
    for key, name in c.obj(artifact["files"], where + ".files").items():
        c.member_name(name, "{}.files.{}".format(where, key), members)
    if "threads" in artifact:  # what `auto` measured faster than every core (edgedyn/selection.py)
        c.integer(artifact["threads"], where + ".threads", 1, MAX_ARTIFACT_THREADS)
    if "tolerance" in artifact:
        tolerance = c.obj(artifact["tolerance"], where + ".tolerance", ("rtol", "atol"))
        c.number(tolerance["rtol"], where + ".tolerance.rtol")
        c.number(tolerance["atol"], where + ".tolerance.atol")
    for key in ("input_names", "output_names", "execution_providers", "weight_order"):
        if key in artifact:
            for index, item in enumerate(c.items(artifact[key], "{}.{}".format(where, key))):
                c.text(item, "{}.{}[{}]".format(where, key, index))
    for key in ("gpu", "requires", "accuracy", "openvino"):
        if key in artifact:
            c.obj(artifact[key], "{}.{}".format(where, key))
    if "precision" in artifact:  # what the artifact computes in (runtime/precision.py)
        c.text(artifact["precision"], where + ".precision", PRECISIONS)


def check_member_name(name: str, bundle: Any) -> None:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise BundleError("bundle {}: member name {} is not a plain relative path; refusing to read it".format(
            bundle, short(name)), hint=HINT)


# --- the portable graph ---

PORTABLE_FORMAT = "edgedyn-portable-graph"
PORTABLE_VERSION = 1


def check_portable_graph(graph: Any, bundle: Any, member: str, weights: Dict[str, np.ndarray], kernels: Any,
                         arena_limit: int) -> Dict[str, Any]:
    """Raises BundleError unless every view lies inside the arena (or its weight array) and every step names a
    kernel, value indices in range, and geometry a kernel can index safely."""
    c = Checker(bundle, member)
    c.obj(graph, "the top level", ("format", "format_version", "arena_bytes", "values", "inputs", "outputs", "steps"))
    if graph["format"] != PORTABLE_FORMAT or graph["format_version"] != PORTABLE_VERSION:
        raise BundleError("bundle {}: portable graph has format {} version {}, this runtime reads {} {}".format(
            bundle, short(graph["format"]), short(graph["format_version"]), PORTABLE_FORMAT, PORTABLE_VERSION),
            hint="install the edgedyn version that made the bundle on the board")
    arena = c.integer(graph["arena_bytes"], "arena_bytes", 0, arena_limit)
    alignment = c.integer(graph.get("alignment", 64), "alignment", 1, 4096)
    if alignment & (alignment - 1):
        raise c.fail("alignment", "{} is not a power of two".format(alignment))
    values = c.items(graph["values"], "values")
    dtypes = [_check_value(c, record, "values[{}]".format(i), arena, weights) for i, record in enumerate(values)]
    in_arena = [i for i, record in enumerate(values) if "weight" not in record]
    for key in ("inputs", "outputs"):
        for index, value in enumerate(c.items(graph[key], key)):
            c.integer(value, "{}[{}]".format(key, index), 0, len(values) - 1)
            if key == "inputs" and value not in in_arena:
                raise c.fail("inputs[{}]".format(index), "an input must live in the arena, not in a weight")
    for index, step in enumerate(c.items(graph["steps"], "steps")):
        _check_step(c, step, "steps[{}]".format(index), dtypes, arena, kernels)
    return graph


def _extent(shape: Sequence[int], strides: Sequence[int]) -> Optional[range]:
    """The element offsets a strided view reaches, relative to its start; None for an empty view."""
    if any(size == 0 for size in shape):
        return None
    low = sum(stride * (size - 1) for size, stride in zip(shape, strides) if stride < 0)
    high = sum(stride * (size - 1) for size, stride in zip(shape, strides) if stride > 0)
    return range(low, high + 1)


def _check_value(c: Checker, record: Any, where: str, arena: int, weights: Dict[str, np.ndarray]) -> np.dtype:
    c.obj(record, where, ("dtype", "shape", "strides"))
    dtype = c.dtype(record["dtype"], where + ".dtype")
    shape = c.shape(record["shape"], where + ".shape")
    strides = c.items(record["strides"], where + ".strides", len(shape))
    strides = [c.integer(s, "{}.strides[{}]".format(where, i), -(1 << 40), 1 << 40) for i, s in enumerate(strides)]
    reach = _extent(shape, strides)
    if "weight" in record:
        name = c.text(record["weight"], where + ".weight")
        if name not in weights:
            raise c.fail(where + ".weight", "no weight array {} in the weights member".format(short(name)))
        base = weights[name]
        if base.dtype != dtype:
            raise c.fail(where + ".dtype", "{} views a {} weight".format(dtype, base.dtype))
        start, limit = c.integer(record.get("offset"), where + ".offset"), base.size
    else:
        offset = c.integer(record.get("offset_bytes"), where + ".offset_bytes")
        if offset % dtype.itemsize:
            raise c.fail(where + ".offset_bytes", "{} is not a multiple of the {} item size".format(offset, dtype))
        start, limit = offset // dtype.itemsize, arena // dtype.itemsize
    if reach is not None and (start + reach.start < 0 or start + reach.stop > limit):
        raise c.fail(where, "shape {} with strides {} from offset {} reaches outside its buffer of {} items".format(
            shape, strides, start, limit))
    return dtype


def _check_step(c: Checker, step: Any, where: str, dtypes: List[np.dtype], arena: int, kernels: Any) -> None:
    c.obj(step, where, ("op", "args", "kwargs", "outputs", "scratch"))
    op = c.text(step["op"], where + ".op")
    if op not in kernels.KERNELS:
        raise c.fail(where + ".op", "no kernel for {} in this runtime".format(short(op)))
    outputs = c.items(step["outputs"], where + ".outputs")
    present = [c.integer(i, "{}.outputs[{}]".format(where, n), 0, len(dtypes) - 1)
               for n, i in enumerate(outputs) if i is not None]
    if not present:
        raise c.fail(where + ".outputs", "a step needs at least one output")
    _check_argument(c, c.items(step["args"], where + ".args"), where + ".args", len(dtypes), 0)
    # kwargs is a plain name -> argument table: its entries are checked, not the table as an encoded value (a step
    # whose only keyword is `dtype` would otherwise read as a {"dtype": ...} reference).
    for name, item in c.obj(step["kwargs"], where + ".kwargs").items():
        _check_argument(c, item, "{}.kwargs.{}".format(where, short(name)), len(dtypes), 1)
    _check_geometry(c, op, step["args"], where + ".args")
    itemsize = dtypes[present[0]].itemsize
    for index, record in enumerate(c.items(step["scratch"], where + ".scratch")):
        at = "{}.scratch[{}]".format(where, index)
        c.obj(record, at, ("shape", "offset_bytes"))
        count = _product(c.shape(record["shape"], at + ".shape"))
        offset = c.integer(record["offset_bytes"], at + ".offset_bytes")
        if offset % itemsize or offset + count * itemsize > arena:
            raise c.fail(at, "{} items from byte {} do not fit the {}-byte arena".format(count, offset, arena))


def _product(dims: Sequence[int]) -> int:
    """The element count of a shape in Python integers: no overflow, and no object-dtype numpy reduction (numpy 1.19
    has no object loop for prod's `dtype=object`)."""
    count = 1
    for size in dims:
        count *= int(size)
    return count


def _check_argument(c: Checker, value: Any, where: str, values: int, depth: int) -> None:
    """Arguments are JSON scalars, lists, and {"value": i} / {"dtype": d} / {"enum": s} references."""
    if depth > MAX_DEPTH:
        raise c.fail(where, "nested deeper than {}".format(MAX_DEPTH))
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_argument(c, item, "{}[{}]".format(where, index), values, depth + 1)
    elif isinstance(value, dict):
        if set(value) == {"value"}:
            c.integer(value["value"], where + ".value", 0, values - 1)
        elif set(value) == {"dtype"}:
            c.dtype(value["dtype"], where + ".dtype")
        elif set(value) == {"enum"}:
            c.text(value["enum"], where + ".enum")
        else:
            for key, item in value.items():
                _check_argument(c, item, "{}.{}".format(where, short(key)), values, depth + 1)
    elif isinstance(value, str):
        c.text(value, where)
    elif isinstance(value, float) and not np.isfinite(value) and value == value:
        return  # +-inf is a legitimate clamp bound
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise c.fail(where, "unexpected {}".format(type(value).__name__))


# Positional arguments of the ops whose kernels build strided windows from them: (position, smallest value).
# Note: a dilation or stride below 1, or a negative padding, makes as_strided read outside the arena.
_GEOMETRY = {
    "aten.convolution.default": ((3, 1), (4, 0), (5, 1), (7, 0), (8, 1)),
    "aten.max_pool2d_with_indices.default": ((1, 1), (2, 1), (3, 0), (4, 1)),
    "aten.max_pool2d.default": ((1, 1), (2, 1), (3, 0), (4, 1)),
    "aten.avg_pool2d.default": ((1, 1), (2, 1), (3, 0)),
    "aten._adaptive_avg_pool2d.default": ((1, 1),),
}


def _check_geometry(c: Checker, op: str, args: List[Any], where: str) -> None:
    for position, low in _GEOMETRY.get(op, ()):
        if position >= len(args):
            continue
        value = args[position]
        if (op.startswith("aten.max_pool2d") or op.startswith("aten.avg_pool2d")) and position == 2 and value == []:
            continue  # an empty stride means "the kernel size"
        items = value if isinstance(value, list) else [value]
        if not items or len(items) > 3:
            raise c.fail("{}[{}]".format(where, position), "expected 1 to 3 integers, got {}".format(short(value)))
        for index, item in enumerate(items):
            c.integer(item, "{}[{}][{}]".format(where, position, index), low, 1 << 20)


def check_step_views(c: Checker, where: str, op: str, outs: List[Any], args: List[Any], kwargs: Dict[str, Any],
                     scratch: List[Any], kernels: Any) -> None:
    """Once the views exist: the scratch the graph planned is exactly what the kernel asks for (a kernel reshapes it
    to the padded input and windows over it), and a pooling output matches its input's leading dims."""
    try:
        wanted = kernels.scratch_shapes(op, outs, args, kwargs)
    except Exception as error:  # Unsupported, or arguments of the wrong kind for this op
        raise c.fail(where, "{} cannot run with these arguments ({})".format(op, short(str(error), 200)))
    planned = [tuple(record["shape"]) for record in scratch]
    if planned != [tuple(shape) for shape in wanted]:
        raise c.fail(where + ".scratch", "planned {}, the {} kernel needs {}".format(
            bounded(planned), op, bounded(wanted)))
    x = args[0] if args else None
    if op.startswith("aten._adaptive_avg_pool2d") and not (
            isinstance(x, np.ndarray) and x.ndim == outs[0].ndim >= 2 and x.shape[:-2] == outs[0].shape[:-2]):
        raise c.fail(where, "the pooled output's leading dims differ from its input's")


# --- the TFLite flatbuffer: what its tensors will allocate, read before LiteRT sees the file ---

# Bytes per element of each TFLite TensorType (schema.fbs order); unknown types count as 16 bytes.
_TFLITE_ITEM = (4, 2, 4, 1, 8, 1, 1, 2, 8, 1, 8, 16, 8, 1, 1, 4, 2, 1)


def tflite_tensor_bytes(data: bytes) -> int:
    """The bytes every tensor of every subgraph declares (shape x type), read straight from the flatbuffer with each
    offset bounds-checked; raises ValueError for a file whose tables point outside it."""
    import struct

    def u32(position: int) -> int:
        return struct.unpack_from("<I", data, position)[0]

    def field(table: int, index: int) -> int:
        vtable = table - struct.unpack_from("<i", data, table)[0]
        length = struct.unpack_from("<H", data, vtable)[0]
        if 4 + 2 * index >= length:
            return 0
        offset = struct.unpack_from("<H", data, vtable + 4 + 2 * index)[0]
        return table + offset if offset else 0

    def vector(position: int) -> Tuple[int, int]:
        start = position + u32(position)
        count = u32(start)
        if start + 4 + 4 * count > len(data):
            raise ValueError("a vector runs past the end of the file")
        return start + 4, count

    def tables(table: int, index: int) -> List[int]:
        position = field(table, index)
        if not position:
            return []
        start, count = vector(position)
        return [start + 4 * i + u32(start + 4 * i) for i in range(count)]

    total = 0
    for subgraph in tables(u32(0), 2):  # Model.subgraphs
        for tensor in tables(subgraph, 0):  # SubGraph.tensors
            shape, kind = field(tensor, 0), field(tensor, 1)
            count = 1
            if shape:
                start, rank = vector(shape)
                if rank > MAX_RANK:
                    raise ValueError("a tensor of rank {}".format(rank))
                for i in range(rank):
                    count *= max(struct.unpack_from("<i", data, start + 4 * i)[0], 1)
            item = data[kind] if kind else 0
            total += count * (_TFLITE_ITEM[item] if item < len(_TFLITE_ITEM) else 16)
    return total
