"""constant_pad_nd as PAD (zeros) or PADV2 (any other value), in the layout the input is stored in."""
from typing import Any, Sequence

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value

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
    stored = stored_pads(x, pad)
    shape = list(node.meta["val"].shape)
    if value == 0:
        return ctx.emit("PAD", [ctx.tensor(x), ctx.writer.constant(stored)], shape, x.perm, "PadOptions")
    return ctx.emit("PADV2", [ctx.tensor(x), ctx.writer.constant(stored), ctx.scalar(value)], shape, x.perm,
                    "PadV2Options")


CONVERTERS = {aten.constant_pad_nd.default: constant_pad_nd}
