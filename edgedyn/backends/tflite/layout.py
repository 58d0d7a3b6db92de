"""Layouts: which torch dim each stored dim holds, so convolutions run NHWC while the model's interface stays NCHW.

Note: every value the writer tracks has a torch (logical) shape and a `perm`: stored dim i holds torch dim
perm[i]. The torch layout is the identity; NHWC for a 4-d NCHW tensor is (0, 2, 3, 1). Convolutions and
pooling produce NHWC, elementwise ops keep their operands' layout, and ops that depend on memory order
(reshape, matmul, the graph's outputs) ask for the torch layout, which inserts one TRANSPOSE per value.
"""
from typing import Sequence, Tuple

Perm = Tuple[int, ...]
NHWC = (0, 2, 3, 1)


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def stored_shape(shape: Sequence[int], perm: Perm) -> Tuple[int, ...]:
    """The shape as stored in layout `perm`."""
    return tuple(int(shape[d]) for d in perm)


def transpose_perm(source: Perm, target: Perm) -> Tuple[int, ...]:
    """The TRANSPOSE permutation that turns a tensor stored in `source` into one stored in `target`."""
    return tuple(source.index(d) for d in target)


def same_memory_order(shape: Sequence[int], source: Perm, target: Perm) -> bool:
    """Whether the two layouts differ only in where size-1 dims sit: then a RESHAPE relayouts for free."""
    return [d for d in source if shape[d] != 1] == [d for d in target if shape[d] != 1]


def drop_dims(perm: Perm, dropped: Sequence[int]) -> Perm:
    """The layout left when torch dims `dropped` disappear (a reduction without keepdim, select, squeeze)."""
    kept = sorted(d for d in perm if d not in dropped)
    return tuple(kept.index(d) for d in perm if d not in dropped)


def move_to_last(perm: Perm, dim: int) -> Perm:
    """A layout with torch dim `dim` stored last and the others in their current order."""
    return tuple(d for d in perm if d != dim) + (dim,)
