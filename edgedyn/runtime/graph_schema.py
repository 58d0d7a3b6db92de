"""What a portable bundle's `graph.json` may contain: every view inside the arena or its weight array, every step a
kernel of this runtime with arguments it can index safely.

Checked with schema.py's Checker (the same messages, limits and dtype allow-list as the manifest) before the
portable executor builds a single view. Standard library and numpy only, Python 3.8 syntax: this file runs on the
board.
"""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.schema import MAX_DEPTH, Checker, bounded, short

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
