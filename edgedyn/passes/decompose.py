import torch
from torch import fx

from edgedyn.passes.graph import example_args, reexport


def decompose_to_core_aten(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrites every operator into the core ATen opset (conv2d -> convolution, linear -> addmm, ...)."""
    return reexport(gm, example_args(gm)).module()


def is_core_aten(target: object) -> bool:
    """Whether an operator is in core ATen, the opset every backend lowers."""
    tags = getattr(target, "tags", ())
    return torch.Tag.core in tags or not isinstance(target, torch._ops.OpOverload)
