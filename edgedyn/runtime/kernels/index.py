"""Lookups by integer ids given at run time: embedding (token ids), gather, and the cumsum of position ids.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Callable, Dict, List

import numpy as np

from edgedyn.runtime.errors import EdgedynError
from edgedyn.runtime.kernels.base import Run, array, axis, check

_INTEGERS = (np.dtype("int64"), np.dtype("int32"))


def _ids_in_range(ids: np.ndarray, rows: int, step: str) -> None:
    """torch raises IndexError for an id outside the table; numpy would wrap a negative one silently."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise EdgedynError("{}: an id is outside the table of {} rows (got ids from {} to {})".format(
            step, rows, int(ids.min()), int(ids.max())),
            hint="pass ids from 0 to {} (the vocabulary the model was built with)".format(rows - 1))


def _embedding(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    weight, ids, out = array(args[0], "embedding", "weight"), array(args[1], "embedding", "indices"), outs[0]
    check(weight.ndim == 2 and ids.dtype in _INTEGERS, "embedding", "needs a 2-d table and integer ids")
    check(tuple(out.shape) == tuple(ids.shape) + (weight.shape[1],), "embedding", "output shape")
    rows = int(weight.shape[0])

    def run() -> None:
        _ids_in_range(ids, rows, "embedding")
        np.take(weight, ids, axis=0, out=out, mode="clip")  # in range (checked): clip only avoids a buffer
    return run


def _gather(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "gather", "input"), outs[0]
    dim = axis(args[1], x.ndim, "gather")
    index = array(args[2], "gather", "index")
    check(index.dtype in _INTEGERS and index.ndim == x.ndim, "gather", "needs an integer index of the input's rank")

    def run() -> None:
        _ids_in_range(index, int(x.shape[dim]), "gather")
        np.copyto(out, np.take_along_axis(x, index, dim))
    return run


def _cumsum(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "cumsum", "input"), outs[0]
    dim = axis(args[1], x.ndim, "cumsum")
    return lambda: np.cumsum(x, axis=dim, out=out)


KERNELS = {
    "aten.embedding.default": _embedding,
    "aten.gather.default": _gather,
    "aten.cumsum.default": _cumsum,
}  # type: Dict[str, Callable[..., Run]]
