"""ncnn's per-channel layers, beside ncnn_shapes.py's rules for the rest: BatchNorm (a batch norm pnnx could not fold
into a convolution: timm's FastViT has them after its reparameterizable blocks), ShuffleChannel (torchvision's
ShuffleNetV2) and GroupNorm (PoolFormer's norms, transformers' and timm's). Their shape rules, written from ncnn's
src/layer/batchnorm.cpp, shufflechannel.cpp and groupnorm.cpp as the others are, and how BatchNorm's and
GroupNorm's weights lie in the .bin. Standard library only, Python 3.8.
"""
from typing import Callable, Dict, List, Tuple  # noqa: F401 (type comments)

from edgedyn.runtime.executors.ncnn_shapes import Get, Shape, need


def batch_norm(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """BatchNorm holds `channels` (parameter 0) of each weight array and indexes them along the input's first axis
    in numpy order (w of a 1-d blob, h of a 2-d one, c otherwise): that axis must be `channels` long."""
    (shape,) = shapes
    need(shape[0] == p(0, 0), "weights for {} channels, an input of shape {}".format(p(0, 0), list(shape)))
    return [shape]


def shuffle_channel(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """ShuffleChannel regroups the channels of a (c, h, w) blob: ncnn divides the channels by `group` (parameter 0,
    default 1), so it is at least 1 and divides them; `reverse` (1) is 0 or 1."""
    (shape,) = shapes
    group, reverse = p(0, 1), p(1, 0)
    need(len(shape) == 3 and group >= 1 and shape[0] % group == 0 and reverse in (0, 1),
         "{} groups (reverse {}) of a blob of shape {}".format(group, reverse, list(shape)))
    return [shape]


def group_norm(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """GroupNorm normalizes `group` (parameter 0, default 1) ranges of `channels` (1) along the input's first axis in
    numpy order, `channels / group` each, with `channels` weights when `affine` (3, default 1): that axis must be
    `channels` long and split evenly (ncnn truncates the division and would leave the rest unnormalized)."""
    (shape,) = shapes
    group, channels, affine, eps = p(0, 1), p(1, 0), p(3, 1), params.get(2, 0.001)
    need(group >= 1 and channels >= 1 and channels % group == 0 and affine in (0, 1) and isinstance(eps, (int, float)),
         "{} groups of {} channels (affine {}, eps {})".format(group, channels, affine, eps))
    need(shape[0] == channels, "{} channels, an input of shape {}".format(channels, list(shape)))
    return [shape]


RULES = {"BatchNorm": batch_norm, "ShuffleChannel": shuffle_channel,
         "GroupNorm": group_norm}  # type: Dict[str, Callable[..., List[Shape]]]
# BatchNorm's load_model reads four raw fp32 arrays of `channels` values (slope, mean, variance, bias), untagged;
# GroupNorm's two (gamma, beta) when affine.
WEIGHTS = {"BatchNorm": lambda p: [(p(0, 0), False)] * 4,
           "GroupNorm": lambda p: [(p(1, 0), False)] * 2 if p(3, 1) else [],
           }  # type: Dict[str, Callable[..., List[Tuple[int, bool]]]]
