"""A ReLU or ReLU6 folded into the op that produces its input (TFLite's fused_activation_function), as TFLite's own
converter writes them: one op and one tensor fewer, and the clamp happens while the result is still in registers."""
from typing import Any, Optional, Tuple

import torch

from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten
NONE, RELU, RELU6 = 0, 1, 3  # ActivationFunctionType


def fused_activation(node: Any) -> Tuple[int, Any]:
    """(ActivationFunctionType, node whose output the op then produces) for a lone ReLU/ReLU6 user of `node`: also
    core ATen's two-step ReLU6, clamp(clamp(x, 0), None, 6) (hard-swish and hard-sigmoid decompose to it)."""
    user = only_user(node)
    if user is None:
        return NONE, node
    if user.target == aten.relu.default:
        return RELU, user
    if user.target in (aten.hardtanh.default, aten.clamp.default) and tuple(user.args[1:3]) in ((0, 6), (0.0, 6.0)):
        return RELU6, user
    then = relu6_end(user)
    if then is not None:
        return RELU6, then
    return NONE, node


def relu6_end(node: Optional[Any]) -> Optional[Any]:
    """The second clamp of clamp(clamp(x, 0), None, 6) when `node` is the first and the second its only user."""
    if node is None or node.target != aten.clamp.default or tuple(node.args[1:]) not in ((0,), (0.0,)) or node.kwargs:
        return None
    then = only_user(node)
    if then is None or then.target != aten.clamp.default or tuple(then.args[1:]) not in ((None, 6), (None, 6.0)):
        return None
    return then


def fused(ctx: Lowering, produced: Any, node: Any, out: Value) -> Value:
    """Records that `produced` (the activation), and every step between `node` and it, is computed by the op that
    wrote `out` for `node` (each step's only reader is the next: fused_activation, hardswish_end)."""
    step = node
    while step is not produced:
        step = next(iter(step.users))
        ctx.fused[step] = out
    return out


def only_user(node: Any) -> Optional[Any]:
    return next(iter(node.users)) if len(node.users) == 1 else None


def hardswish_end(start: Any) -> Optional[Any]:
    """The last node of core ATen's hard-swish, x * clamp(clamp(x + 3, 0), None, 6) / 6, starting at `start`
    (the x + 3), when each step has one user; None for any other graph."""
    if start.args[1:] != (3,) or start.kwargs:
        return None
    x = start.args[0]
    second = relu6_end(only_user(start))
    product = only_user(second) if second is not None else None
    if product is None or product.target != aten.mul.Tensor or set(product.args) != {x, second}:
        return None
    end = only_user(product)
    if end is None or end.target != aten.div.Tensor or end.args[1:] != (6,):
        return None
    return end
