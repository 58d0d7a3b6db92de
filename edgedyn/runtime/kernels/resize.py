"""Image resizing (interpolate): bilinear and nearest, separable, with the source rows and columns and their
weights computed once when the bundle loads.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime.kernels.base import Run, Shapes, array, check


def _scales(x: np.ndarray, out: np.ndarray, factors: Optional[Sequence[Any]], step: str) -> Tuple[float, float]:
    """Source pixels per output pixel: torch uses 1/scale_factor when one was given, else in/out."""
    check(x.ndim == 4 and out.ndim == 4 and x.shape[:2] == out.shape[:2], step, "resizes N C H W images")
    if factors:
        check(len(factors) == 2 and all(isinstance(f, (int, float)) and f > 0 for f in factors), step,
              "scale factors {!r}".format(factors))
        return 1.0 / float(factors[0]), 1.0 / float(factors[1])
    return x.shape[2] / out.shape[2], x.shape[3] / out.shape[3]


def _linear_taps(size_in: int, size_out: int, scale: float, align_corners: bool) -> Tuple[np.ndarray, ...]:
    """(first source index, second source index, weight of the second) for each output index, as torch does."""
    dst = np.arange(size_out, dtype=np.float64)
    if align_corners:
        src = dst * ((size_in - 1) / (size_out - 1) if size_out > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    first = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
    second = np.minimum(first + 1, size_in - 1)
    return first, second, (src - first).astype(np.float32)


def _bilinear_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    x, out = args[0], outs[0]
    rows = (x.shape[0], x.shape[1], out.shape[2], x.shape[3])
    return [rows, rows, tuple(out.shape)]


def _bilinear(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "upsample_bilinear2d", "input"), outs[0]
    align_corners = args[2] if len(args) > 2 else kwargs.get("align_corners", False)
    check(isinstance(align_corners, bool), "upsample_bilinear2d", "align_corners is not a bool")
    factors = args[3] if len(args) > 3 and isinstance(args[3], list) else None
    scale_h, scale_w = _scales(x, out, factors, "upsample_bilinear2d")
    h0, h1, lh = _linear_taps(x.shape[2], out.shape[2], scale_h, align_corners)
    w0, w1, lw = _linear_taps(x.shape[3], out.shape[3], scale_w, align_corners)
    lh, keep_h = lh.reshape(-1, 1), (1.0 - lh).reshape(-1, 1)
    keep_w = 1.0 - lw
    rows, other, columns = (s.reshape(shape) for s, shape in zip(scratch, _bilinear_scratch(outs, args, kwargs)))

    def run() -> None:
        np.take(x, h0, axis=2, out=rows, mode="clip")  # every index is in range: clip avoids a buffered copy
        np.multiply(rows, keep_h, out=rows)
        np.take(x, h1, axis=2, out=other, mode="clip")
        np.multiply(other, lh, out=other)
        np.add(rows, other, out=rows)
        np.take(rows, w0, axis=3, out=out, mode="clip")
        np.multiply(out, keep_w, out=out)
        np.take(rows, w1, axis=3, out=columns, mode="clip")
        np.multiply(columns, lw, out=columns)
        np.add(out, columns, out=out)
    return run


def _nearest_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    x, out = args[0], outs[0]
    return [(x.shape[0], x.shape[1], out.shape[2], x.shape[3])]


def _nearest(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = array(args[0], "upsample_nearest2d", "input"), outs[0]
    factors = args[2] if len(args) > 2 and isinstance(args[2], list) else None
    scale_h, scale_w = _scales(x, out, factors, "upsample_nearest2d")
    # torch's "nearest": source = floor(destination * scale)
    h = np.minimum(np.floor(np.arange(out.shape[2]) * scale_h).astype(np.int64), x.shape[2] - 1)
    w = np.minimum(np.floor(np.arange(out.shape[3]) * scale_w).astype(np.int64), x.shape[3] - 1)
    rows = scratch[0].reshape(_nearest_scratch(outs, args, kwargs)[0])

    def run() -> None:
        np.take(x, h, axis=2, out=rows, mode="clip")
        np.take(rows, w, axis=3, out=out, mode="clip")
    return run


KERNELS = {
    "aten.upsample_bilinear2d.vec": _bilinear,
    "aten.upsample_nearest2d.vec": _nearest,
}  # type: Dict[str, Callable[..., Run]]

SCRATCH = {
    "aten.upsample_bilinear2d.vec": _bilinear_scratch,
    "aten.upsample_nearest2d.vec": _nearest_scratch,
}  # type: Dict[str, Callable[[List[Any], List[Any], Dict[str, Any]], Shapes]]
