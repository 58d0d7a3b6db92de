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
