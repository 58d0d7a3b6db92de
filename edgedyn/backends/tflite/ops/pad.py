"""constant_pad_nd as PAD (zeros) or PADV2 (any other value), in the layout the input is stored in."""
from typing import Any, Optional, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.fusion import only_user
from edgedyn.backends.tflite.ops.padding import pair, same_padding

aten = torch.ops.aten


def stored_pads(x: Value, pad: Sequence[int]) -> np.ndarray:
    """torch's pad list, which lists (before, after) pairs from the last dim backwards, as PAD's [rank, 2] table in
    the layout x is stored in."""
    pads = {x.rank - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)}
    return np.array([pads.get(d, (0, 0)) for d in x.perm], dtype=np.int32).reshape(x.rank, 2)


def constant_pad_nd(ctx: Lowering, node: Any, x: Value, pad: Sequence[int], value: float = 0.0) -> Value:
    if any(p < 0 for p in pad):
        raise Unsupported("negative padding (cropping)")
    if not any(pad):
        return x  # `transformers`' TF-style padding pads 1x1 convolutions by nothing: no copy
    if value == 0 and not ctx.quantize:
        convolution = same_convolution(node, x, pad)
        if convolution is not None:
            ctx.same.add(convolution)  # ops/conv.py pads it with SAME
            return x
    stored = stored_pads(x, pad)
    shape = list(node.meta["val"].shape)
    if value == 0:
        return ctx.emit("PAD", [ctx.tensor(x), ctx.writer.constant(stored)], shape, x.perm, "PadOptions")
    return ctx.emit("PADV2", [ctx.tensor(x), ctx.writer.constant(stored), ctx.scalar(value)], shape, x.perm,
                    "PadV2Options")


def same_convolution(node: Any, x: Value, pad: Sequence[int]) -> Optional[Any]:
    """The 2-d convolution that alone reads this zero padding of `x` when the padding is what TFLite's SAME adds
    for it: TensorFlow-style padding written as an explicit pad (transformers' MobileNets with `tf_padding`, timm's
    `Conv2dSame`). The convolution then pads with SAME and no PAD is written: XNNPACK's fp16 inference folds no PAD
    (ops/padding.py `zero_bordered`), and the file is one operator and one activation shorter in any precision."""
    user = only_user(node)
    if user is None or user.target != aten.convolution.default or x.rank != 4 or len(pad) != 4:
        return None
    _, weight, _, stride, padding, dilation, transposed = user.args[:7]
    if user.args[0] is not node or transposed or any(padding) or "val" not in getattr(weight, "meta", {}):
        return None
    kernel, stride, dilation = weight.meta["val"].shape[2:], pair(stride), pair(dilation)
    left, right, top, bottom = pad
    same = [same_padding(x.shape[2 + i], kernel[i], stride[i], dilation[i]) for i in range(2)]
    return user if same == [(top, bottom), (left, right)] else None


CONVERTERS = {aten.constant_pad_nd.default: constant_pad_nd}
