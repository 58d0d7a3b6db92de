"""Reductions (mean, sum, amax), softmax and normalization (layer norm, group norm, batch norm in inference)."""
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime.kernels.base import Run, Shapes, Unsupported, _view, check, number


def _dims(x: np.ndarray, dims: Any) -> Tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(int(d) % max(x.ndim, 1) for d in dims))


def _reduction(ufunc_name: str) -> Callable[..., Run]:
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        x, out = args[0], outs[0]
        axes = _dims(x, args[1] if len(args) > 1 else kwargs.get("dim"))
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        target = out if keep else _view(out, tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
        function = getattr(np, ufunc_name)
        return lambda: function(x, axis=axes, keepdims=True, out=target)
    return prepare


def _reduced_shape(x: np.ndarray, dim: int) -> Tuple[int, ...]:
    return tuple(1 if i == dim % x.ndim else n for i, n in enumerate(x.shape))


def _softmax_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    return [_reduced_shape(args[0], int(args[1]))]


def _softmax(log: bool) -> Callable[..., Run]:
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        x, out, dim = args[0], outs[0], int(args[1]) % args[0].ndim
        m = scratch[0].reshape(_reduced_shape(x, dim))

        def run() -> None:
            np.amax(x, axis=dim, keepdims=True, out=m)
            np.subtract(x, m, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=dim, keepdims=True, out=m)
            np.divide(out, m, out=out)

        def run_log() -> None:
            # log_softmax = (x - max) - log(sum(exp(x - max))), with out holding x - max throughout
            np.amax(x, axis=dim, keepdims=True, out=m)
            np.subtract(x, m, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=dim, keepdims=True, out=m)
            np.log(out, out=out)
            np.log(m, out=m)
            np.subtract(out, m, out=out)
        return run_log if log else run
    return prepare


def _layer_norm_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    x, normalized = args[0], list(args[1])
    stats = tuple(x.shape[:x.ndim - len(normalized)]) + (1,) * len(normalized)
    return [stats, stats, tuple(x.shape)]


def _layer_norm(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, normalized, weight, bias, eps = args[0], list(args[1]), args[2], args[3], float(args[4])
    out, mean_out, rstd_out = outs[0], outs[1] if len(outs) > 1 else None, outs[2] if len(outs) > 2 else None
    axes = tuple(range(x.ndim - len(normalized), x.ndim))
    stats_shape = _layer_norm_scratch(outs, args, kwargs)[0]
    mean, rstd, square = scratch[0].reshape(stats_shape), scratch[1].reshape(stats_shape), scratch[2].reshape(x.shape)

    def run() -> None:
        _standardize(x, out, axes, mean, rstd, square, eps)
        _scale_and_keep_statistics(out, weight, bias, mean, rstd, mean_out, rstd_out)
    return run


def _group_norm_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    x, groups = args[0], args[6]
    if not (x.flags.c_contiguous and outs[0].flags.c_contiguous):
        raise Unsupported("group norm of a non-contiguous tensor")
    grouped = (x.shape[0], int(groups), x.size // max(x.shape[0] * int(groups), 1))
    return [grouped[:2] + (1,), grouped[:2] + (1,), grouped]


def _group_norm(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    """native_group_norm(x, weight, bias, N, C, HxW, groups, eps): statistics per (sample, group of channels)."""
    x, weight, bias = args[0], args[1], args[2]
    check(len(args) == 8 and isinstance(args[6], int) and args[6] > 0 and x.ndim >= 2 and x.shape[1] % args[6] == 0,
          "native_group_norm", "groups must divide the channels")
    eps = float(number(args[7], "native_group_norm", "eps"))
    out, mean_out, rstd_out = outs[0], outs[1] if len(outs) > 1 else None, outs[2] if len(outs) > 2 else None
    mean_shape, _, grouped = _group_norm_scratch(outs, args, kwargs)
    mean, rstd, square = (s.reshape(shape) for s, shape in zip(scratch, (mean_shape, mean_shape, grouped)))
    x3, out3 = _view(x, grouped), _view(out, grouped)
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    weight = _view(weight, per_channel) if weight is not None else None
    bias = _view(bias, per_channel) if bias is not None else None

    def run() -> None:
        _standardize(x3, out3, 2, mean, rstd, square, eps)
        _scale_and_keep_statistics(out, weight, bias, mean, rstd, mean_out, rstd_out)
    return run


def _batch_norm_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    channels = args[0].shape[1] if getattr(args[0], "ndim", 0) >= 2 else 1
    return [(channels,), (channels,)]


def _batch_norm(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    """_native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps): per channel
    (dimension 1) x * scale + shift with scale = weight / sqrt(var + eps), shift = bias - mean * scale (a batch norm
    the passes could not fold: after a linear layer, as LeViT's). Its other two outputs are empty in inference."""
    x, weight, bias, mean, var = args[0], args[1], args[2], args[3], args[4]
    check(len(args) == 7 and x.ndim >= 2, "batch_norm", "expects (x, weight, bias, mean, var, momentum, eps)")
    channels = x.shape[1]
    for name, value in (("weight", weight), ("bias", bias), ("running_mean", mean), ("running_var", var)):
        check(value is None or (isinstance(value, np.ndarray) and value.shape == (channels,)), "batch_norm",
              "{} must hold one value per channel ({})".format(name, channels))
    check(mean is not None and var is not None, "batch_norm", "needs the running statistics")
    eps = float(number(args[6], "batch_norm", "eps"))
    per_channel = (channels,) + (1,) * (x.ndim - 2)
    scale, shift, out = scratch[0], scratch[1], outs[0]
    scale_view, shift_view = _view(scale, per_channel), _view(shift, per_channel)

    def run() -> None:
        np.add(var, eps, out=scale)
        np.sqrt(scale, out=scale)
        np.reciprocal(scale, out=scale)
        if weight is not None:
            np.multiply(scale, weight, out=scale)
        np.multiply(mean, scale, out=shift)
        np.negative(shift, out=shift)
        if bias is not None:
            np.add(shift, bias, out=shift)
        np.multiply(x, scale_view, out=out)
        np.add(out, shift_view, out=out)
    return run


def _standardize(x: np.ndarray, out: np.ndarray, axis: Any, mean: np.ndarray, rstd: np.ndarray,
                 square: np.ndarray, eps: float) -> None:
    """out = (x - mean) / sqrt(variance + eps) over `axis`, the statistics left in `mean` and `rstd` (scratch)."""
    np.mean(x, axis=axis, keepdims=True, out=mean)
    np.subtract(x, mean, out=out)
    np.multiply(out, out, out=square)
    np.mean(square, axis=axis, keepdims=True, out=rstd)
    np.add(rstd, eps, out=rstd)
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    np.multiply(out, rstd, out=out)


def _scale_and_keep_statistics(out: np.ndarray, weight: Optional[np.ndarray], bias: Optional[np.ndarray],
                               mean: np.ndarray, rstd: np.ndarray, mean_out: Optional[np.ndarray],
                               rstd_out: Optional[np.ndarray]) -> None:
    """The affine part of a normalization, and the mean / rstd outputs ATen's native_*_norm also returns."""
    if weight is not None:
        np.multiply(out, weight, out=out)
    if bias is not None:
        np.add(out, bias, out=out)
    if mean_out is not None:
        np.copyto(mean_out, mean.reshape(mean_out.shape))
    if rstd_out is not None:
        np.copyto(rstd_out, rstd.reshape(rstd_out.shape))


KERNELS = {
    "aten.mean.dim": _reduction("mean"),
    "aten.sum.dim_IntList": _reduction("sum"),
    "aten.amax.default": _reduction("amax"),
    "aten._softmax.default": _softmax(log=False),
    "aten._log_softmax.default": _softmax(log=True),
    "aten.native_layer_norm.default": _layer_norm,
    "aten.native_group_norm.default": _group_norm,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
}  # type: Dict[str, Callable[..., Run]]

# Scratch each kernel needs besides its outputs (shapes in the first output's dtype); absent means none.
SCRATCH = {
    "aten._softmax.default": _softmax_scratch,
    "aten._log_softmax.default": _softmax_scratch,
    "aten.native_layer_norm.default": _layer_norm_scratch,
    "aten.native_group_norm.default": _group_norm_scratch,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm_scratch,
}  # type: Dict[str, Callable[[List[Any], List[Any], Dict[str, Any]], Shapes]]
