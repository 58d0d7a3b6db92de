"""Embedding lookups: GATHER of weight rows by integer ids given at run time (token ids)."""
from typing import Any

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten
# GATHER's own bounds check rejects an id outside the table (LiteRT returns an error, as torch raises
# IndexError); ids are used as the int64 torch gives, never narrowed, so no large id can wrap into range.
INDEX_DTYPES = (np.dtype("int64"), np.dtype("int32"))


def embedding(ctx: Lowering, node: Any, weight: Value, indices: Value, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    if indices.dtype not in INDEX_DTYPES:
        raise Unsupported("embedding ids of type {}".format(indices.dtype))
    if not weight.is_constant or weight.rank != 2:
        raise Unsupported("an embedding table computed at run time")
    if indices.is_constant:
        raise Unsupported("constant ids (folded before this point)")
    shape = list(node.meta["val"].shape)
    ids = ctx.torch_order(indices)
    return ctx.emit("GATHER", [ctx.tensor(weight), ids], shape, None, "GatherOptions", axis=0, batch_dims=0)


CONVERTERS = {
    aten.embedding.default: embedding,
}
