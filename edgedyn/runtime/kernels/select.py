"""Selections by value: max with its index, top-k, and rows picked by index (detection post-processing).

The ties follow torch on a CPU: max.dim returns the first maximum's index; top-k orders equal values by index
(a stable sort, which torch's own topk does not promise: equal scores may come out in another order there).
Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from edgedyn.runtime.kernels.base import Run, _view, array, axis, check
from edgedyn.runtime.kernels.index import _INTEGERS, _ids_in_range


def _max_dim(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x = array(args[0], "max.dim", "input")
    dim = axis(args[1], x.ndim, "max.dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    values, indices = outs
    reduced = tuple(1 if i == dim else n for i, n in enumerate(x.shape))
    values = None if values is None else (values if keep else _view(values, reduced))
    indices = None if indices is None else (indices if keep else _view(indices, reduced))
    check(indices is None or indices.dtype == np.int64, "max.dim", "indices must be int64")

    def run() -> None:
        if values is not None:
            np.amax(x, axis=dim, keepdims=True, out=values)
        if indices is not None:
            indices[...] = np.expand_dims(np.argmax(x, axis=dim), dim)
    return run


def _max_all(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "max", "input"), outs[0]
    check(x.size > 0, "max", "the max of an empty tensor")
    return lambda: np.copyto(out, np.amax(x))


def _topk(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x = array(args[0], "topk", "input")
    k = args[1]
    dim = axis(args[2] if len(args) > 2 else kwargs.get("dim", -1), x.ndim, "topk")
    largest = bool(args[3] if len(args) > 3 else kwargs.get("largest", True))
    check(isinstance(k, int) and 0 <= k <= x.shape[dim], "topk", "k {!r} is not in 0..{}".format(k, x.shape[dim]))
    values, indices = outs
    check(indices is None or indices.dtype == np.int64, "topk", "indices must be int64")

    def run() -> None:
        chosen, picked = topk(x, k, dim, largest)
        if values is not None:
            np.copyto(values, picked)
        if indices is not None:
            np.copyto(indices, chosen)
    return run


def topk(x: np.ndarray, k: int, dim: int, largest: bool) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the k largest (or smallest) along `dim`, equal values in index order."""
    order = np.argsort(-x if largest else x, axis=dim, kind="stable")
    chosen = order[(slice(None),) * dim + (slice(0, k),)]
    return chosen, np.take_along_axis(x, chosen, dim)


def _index_select(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "index_select", "input"), outs[0]
    dim = axis(args[1], x.ndim, "index_select")
    index = array(args[2], "index_select", "index")
    check(index.dtype in _INTEGERS and index.ndim <= 1, "index_select", "needs a 1-d integer index")
    rows = int(x.shape[dim])

    def run() -> None:
        _ids_in_range(index, rows, "index_select")
        np.take(x, index.reshape(-1), axis=dim, out=out, mode="clip")  # in range (checked): clip avoids a buffer
    return run


KERNELS = {
    "aten.max.dim": _max_dim,
    "aten.max.default": _max_all,
    "aten.topk.default": _topk,
    "aten.index_select.default": _index_select,
}  # type: Dict[str, Callable[..., Run]]
