"""numpy kernels for the portable executor: each writes into preallocated arrays (views of one arena).

A kernel is `prepare(outs, args, kwargs, scratch) -> run`: `prepare` runs once when a bundle is loaded and builds
every view it needs; `run()` runs on each call and allocates no array (ufuncs with `out=`, matmul with `out=`).
`outs` are the op's outputs (None where the graph never reads one), `args`/`kwargs` the ATen arguments with
tensors as arrays, `scratch` the buffers that `SCRATCH[op](outs, args, kwargs)` asked for (shapes, in the dtype
of the first output), planned in the arena like any tensor and live during this op only.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Callable, Dict, List, Sequence  # noqa: F401 (type comments)

from edgedyn.runtime.kernels import conv, detection, index, masks, pointwise, reduce, resize, select
from edgedyn.runtime.kernels.base import Run, Shapes, Unsupported  # noqa: F401 (Run: type comments)

__all__ = ["KERNELS", "SCRATCH", "Unsupported", "scratch_shapes"]

# Every kernel by ATen op name; each module registers the ops it implements.
KERNELS = dict(pointwise.KERNELS, **reduce.KERNELS, **conv.KERNELS, **masks.KERNELS, **index.KERNELS,
               **resize.KERNELS, **select.KERNELS, **detection.KERNELS)  # type: Dict[str, Callable[..., Run]]
SCRATCH = dict(pointwise.SCRATCH, **reduce.SCRATCH, **conv.SCRATCH, **resize.SCRATCH)  # type: Dict[str, Callable[[List[Any], List[Any], Dict[str, Any]], Shapes]]


def scratch_shapes(op: str, outs: Sequence[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    """The scratch buffers `op` needs for these arguments (raises Unsupported for what no kernel handles)."""
    if op not in KERNELS:
        raise Unsupported("no kernel for {}".format(op))
    function = SCRATCH.get(op)
    return [tuple(int(n) for n in shape) for shape in function(list(outs), args, kwargs)] if function else []
