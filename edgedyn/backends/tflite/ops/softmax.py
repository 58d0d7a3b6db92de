"""Softmax over any dim: TFLite's SOFTMAX reduces the stored last axis, so the dim is stored last first."""
from typing import Any

import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten


def _softmax(op: str, options: str, **fields: Any) -> Any:
    def convert(ctx: Lowering, node: Any, x: Value, dim: int, half_to_float: bool = False) -> Value:
        perm = x.perm if x.perm[-1] == dim % x.rank else layout.move_to_last(x.perm, dim % x.rank)
        return ctx.emit(op, [ctx.tensor(x, perm)], x.shape, perm, options, **fields)

    return convert


CONVERTERS = {
    aten._softmax.default: _softmax("SOFTMAX", "SoftmaxOptions", beta=1.0),
    aten._log_softmax.default: _softmax("LOG_SOFTMAX", "LogSoftmaxOptions"),
}
