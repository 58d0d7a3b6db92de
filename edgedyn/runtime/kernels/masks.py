"""Comparisons, boolean logic, where, any and full_like: the mask arithmetic of attention layers.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Callable, Dict, List

import numpy as np

from edgedyn.runtime.kernels.base import Run, _view, array, axis, check, number


def _operand(value: Any, step: str, what: str) -> Any:
    """A tensor, or a python number that numpy broadcasts as a scalar."""
    if isinstance(value, np.ndarray):
        return value
    return number(value, step, what)


def _compare(ufunc: Any) -> Callable[..., Run]:
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        name = ufunc.__name__
        check(len(args) == 2, name, "takes two arguments")
        out, a, b = outs[0], array(args[0], name, "input"), _operand(args[1], name, "other")
        check(out.dtype == np.bool_, name, "writes bool")
        return lambda: ufunc(a, b, out=out)
    return prepare


def _logical(ufunc: Any) -> Callable[..., Run]:
    """and/or/not of bool tensors (the bitwise ops on bools are the same; on integers they are not)."""
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        name = ufunc.__name__
        operands = [array(a, name, "operand") for a in args]
        check(all(a.dtype == np.bool_ for a in operands) and outs[0].dtype == np.bool_, name, "takes bool tensors")
        out = outs[0]
        return lambda: ufunc(*operands, out=out)
    return prepare


def _where(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    check(len(args) == 3, "where", "takes condition, self and other")
    out, condition = outs[0], array(args[0], "where", "condition")
    a, b = _operand(args[1], "where", "self"), _operand(args[2], "where", "other")
    check(condition.dtype == np.bool_, "where", "the condition is not bool")
    for value in (a, b, condition):
        check(not isinstance(value, np.ndarray) or not np.shares_memory(value, out), "where",
              "an operand overlaps the output")
    chosen = np.broadcast_to(condition, out.shape)

    def run() -> None:
        np.copyto(out, b)
        np.copyto(out, a, where=chosen)
    return run


def _any(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "any", "input"), outs[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if dims is None:
        axes = tuple(range(x.ndim))
    else:
        axes = tuple(sorted({axis(d, x.ndim, "any") for d in (dims if isinstance(dims, list) else [dims])}))
    target = out if keep else _view(out, tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return lambda: np.any(x, axis=axes, keepdims=True, out=target)


def _full_like(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    return _fill(outs[0], args[1])


def _fill(out: np.ndarray, value: Any) -> Run:
    """full / full_like: `out` filled with one number on every call (the arena under it holds other tensors in
    between)."""
    value = number(value, "full", "fill value")
    return lambda: out.fill(value)


KERNELS = {
    "aten.eq.Scalar": _compare(np.equal), "aten.eq.Tensor": _compare(np.equal),
    "aten.ne.Scalar": _compare(np.not_equal), "aten.ne.Tensor": _compare(np.not_equal),
    "aten.lt.Scalar": _compare(np.less), "aten.lt.Tensor": _compare(np.less),
    "aten.le.Scalar": _compare(np.less_equal), "aten.le.Tensor": _compare(np.less_equal),
    "aten.gt.Scalar": _compare(np.greater), "aten.gt.Tensor": _compare(np.greater),
    "aten.ge.Scalar": _compare(np.greater_equal), "aten.ge.Tensor": _compare(np.greater_equal),
    "aten.logical_not.default": _logical(np.logical_not), "aten.bitwise_not.default": _logical(np.logical_not),
    "aten.logical_and.default": _logical(np.logical_and), "aten.bitwise_and.Tensor": _logical(np.logical_and),
    "aten.logical_or.default": _logical(np.logical_or), "aten.bitwise_or.Tensor": _logical(np.logical_or),
    "aten.where.self": _where,
    "aten.any.dim": _any, "aten.any.dims": _any, "aten.any.default": _any,
    "aten.full_like.default": _full_like,
    "aten.full.default": lambda outs, args, kwargs, scratch: _fill(outs[0], args[1]),
}  # type: Dict[str, Callable[..., Run]]
