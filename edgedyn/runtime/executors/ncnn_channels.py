"""ncnn's per-channel layers, beside ncnn_shapes.py's rules for the rest: BatchNorm (a batch norm pnnx could not fold
into a convolution: timm's FastViT has them after its reparameterizable blocks) and ShuffleChannel (torchvision's
ShuffleNetV2). Their shape rules, written from ncnn's src/layer/batchnorm.cpp and shufflechannel.cpp as the others
are, and how BatchNorm's weights lie in the .bin. Standard library only, Python 3.8.
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


RULES = {"BatchNorm": batch_norm, "ShuffleChannel": shuffle_channel}  # type: Dict[str, Callable[..., List[Shape]]]
# BatchNorm's load_model reads four raw fp32 arrays of `channels` values (slope, mean, variance, bias), untagged.
WEIGHTS = {"BatchNorm": lambda p: [(p(0, 0), False)] * 4}  # type: Dict[str, Callable[..., List[Tuple[int, bool]]]]
