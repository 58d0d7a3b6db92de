"""`edgedyn::nms` in ONNX: onnxruntime's own NonMaxSuppression kernel, padded back to the op's fixed size.

NonMaxSuppression returns one row (batch, class, box) per kept box, a count that depends on the values; the
translation takes the box column, pads it with 0 to `max_out` rows and slices, and returns the count beside it.
With labels (torchvision's batched_nms), each label becomes one ONNX class: scores [1, labels, N] hold a box's
score under its own label and -inf elsewhere, and the kept boxes of every class are merged by descending score
(TopK, ties in order) as greedy NMS over all of them would order them. onnxruntime's kernel computes IoU with the
same float32 arithmetic as torchvision's and suppresses above the threshold (its helper `SuppressByIOU`);
candidates are the scores above -inf, as the op defines.
"""
from typing import Any, Dict

import numpy as np

from edgedyn.frontend.nms import NMS_OP


def translations(opset: int) -> Dict[Any, Any]:
    """torch.onnx's custom_translation_table entries for edgedyn's ops, at `opset`."""
    import importlib

    op = getattr(importlib.import_module("onnxscript"), "opset{}".format(opset))  # type: Any
    from onnxscript import FLOAT, INT64  # noqa: F401  (type names for the traced function)

    def nms(boxes: Any, scores: Any, labels: Any, iou_threshold: float, max_out: int) -> Any:
        floor = op.Constant(value_float=float("-inf"))
        limit = op.Constant(value_ints=[max_out])
        if labels is None:
            class_scores = op.Unsqueeze(scores, [0, 1])
        else:
            count = op.Add(op.ReduceMax(labels, keepdims=0), op.Constant(value_int=1))
            classes = op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1))
            own = op.Equal(op.Unsqueeze(labels, [0]), op.Unsqueeze(classes, [1]))
            class_scores = op.Unsqueeze(op.Where(own, op.Unsqueeze(scores, [0]), floor), [0])
        selected = op.NonMaxSuppression(op.Unsqueeze(boxes, [0]), class_scores, limit,
                                        op.Constant(value_float=float(iou_threshold)), floor)
        kept = op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])
        found = op.Shape(kept)
        if labels is not None:
            # merge the classes by descending score; TopK puts equal scores in index order
            _, order = op.TopK(op.Gather(scores, kept), found, axis=0, largest=1, sorted=1)
            kept = op.Gather(kept, order)
        padded = op.Slice(op.Concat(kept, op.Constant(value=_zeros(max_out)), axis=0), [0], limit, [0])
        total = op.Min(op.Squeeze(found, [0]), op.Constant(value_int=max_out))
        return padded, total

    return {NMS_OP: nms}


def _zeros(size: int) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.zeros(size, np.int64))
