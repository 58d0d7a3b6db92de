"""What every kernel shares: the kernel types, the export-time error, and copy-free reshaping."""
from typing import Any, Callable, List, Sequence, Tuple

import numpy as np

Run = Callable[[], None]
Shapes = List[Tuple[int, ...]]


class Unsupported(Exception):
    """An op, or an argument of it, that no kernel here handles (raised at export, never on the board)."""


def _view(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """`array` reshaped without copying (numpy's reshape would silently copy, and copy on every call)."""
    view = array.view()
    view.shape = tuple(shape)
    return view


def _pair(value: Any) -> Tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return (int(value[0]), int(value[-1])) if value else (1, 1)
    return int(value), int(value)


def check(condition: bool, step: str, message: str) -> None:
    """A parameter read from graph.json is what the kernel needs, or the bundle is refused at load (never a
    numpy error deep in a call)."""
    if not condition:
        from edgedyn.runtime.errors import BundleError

        raise BundleError("portable graph: {}: {}".format(step, message),
                          hint="the bundle is damaged or was written by another edgedyn version; export it again")


def axis(value: Any, ndim: int, step: str) -> int:
    """An ATen dim argument (negative counts from the end) checked against the tensor's rank."""
    check(isinstance(value, int) and not isinstance(value, bool) and -max(ndim, 1) <= value < max(ndim, 1),
          step, "dim {!r} is not a dim of a {}-d tensor".format(value, ndim))
    return int(value) % max(ndim, 1)


def number(value: Any, step: str, what: str) -> float:
    check(isinstance(value, (int, float)), step, "{} {!r} is not a number".format(what, value))
    return value


def array(value: Any, step: str, what: str) -> np.ndarray:
    check(isinstance(value, np.ndarray), step, "{} is not a tensor".format(what))
    return value


def is_global_average(size: Sequence[int], out_size: Sequence[int], kernel: Sequence[int],
                      padding: Sequence[int]) -> bool:
    """Whether an average pool is the mean of each whole image: one output pixel, no padding, a window at least
    the image. torch then divides by the pixels inside (EfficientNet pools with a kernel past the image and
    ceil_mode=True, which clips the window to the image)."""
    return tuple(out_size) == (1, 1) and tuple(padding) == (0, 0) and all(k >= n for k, n in zip(kernel, size))
