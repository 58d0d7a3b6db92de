"""Op converters, one idea per module, merged into the table the lowering looks ATen ops up in.

A converter is `fn(ctx, node, *args, **kwargs) -> Value` (a tuple for multi-output ops), called with the node's
arguments where graph nodes are replaced by their Values; it raises `Unsupported(reason)` for a case it cannot
express.
"""
from typing import Any, Callable, Dict

from edgedyn.backends.tflite.ops import (activations, conv, detection, elementwise, gather, integers, linear, logical,
                                        norm, pad, pooling, resize, shapes, softmax)

CONVERTERS = {}  # type: Dict[Any, Callable[..., Any]]
for _module in (activations, conv, detection, elementwise, gather, integers, linear, logical, norm, pad, pooling, resize,
                shapes, softmax):
    CONVERTERS.update(_module.CONVERTERS)
