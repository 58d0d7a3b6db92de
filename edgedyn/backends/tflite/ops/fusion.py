"""A ReLU or ReLU6 folded into the op that produces its input (TFLite's fused_activation_function), as TFLite's own
converter writes them: one op and one tensor fewer, and the clamp happens while the result is still in registers."""
from typing import Any, Tuple

import torch

from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten
NONE, RELU, RELU6 = 0, 1, 3  # ActivationFunctionType


def fused_activation(node: Any) -> Tuple[int, Any]:
    """(ActivationFunctionType, node whose output the op then produces) for a lone ReLU/ReLU6 user of `node`."""
    users = list(node.users)
    if len(users) != 1:
        return NONE, node
    user = users[0]
    if user.target == aten.relu.default:
        return RELU, user
    if user.target in (aten.hardtanh.default, aten.clamp.default) and tuple(user.args[1:3]) in ((0, 6), (0.0, 6.0)):
        return RELU6, user
    return NONE, node


def fused(ctx: Lowering, produced: Any, node: Any, out: Value) -> Value:
    """Records that `produced` (the activation) is computed by the op that wrote `out` for `node`."""
    if produced is not node:
        ctx.fused[produced] = out
    return out
