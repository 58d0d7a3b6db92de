"""Non-maximum suppression at a fixed output size: the semantics of the `edgedyn::nms` op, and its portable kernel.

`nms(boxes, scores, labels, iou_threshold, max_out)` is greedy NMS as torchvision computes it: candidates are the
boxes whose score is above -inf (callers mark the others -inf), visited by descending score with ties in index
order (torchvision sorts stably); a candidate is dropped when its IoU with a box already kept (of the same label,
when labels are given) is above `iou_threshold` (compared in float64, as torchvision's kernel does). The result
is `keep`, the first `max_out` kept indices in that order padded with 0, and `count`, how many of them are real.
The export-time op (edgedyn/frontend/nms.py) runs this function in torch eager; the backends lower the same
semantics (ONNX NonMaxSuppression, LiteRT, TVM) and the tests hold them to it.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime.kernels.base import Run, array, check, number


# Candidates are decided in blocks of this many: each block against the boxes kept before it in one matrix, then
# within itself in order (Python steps of a few vector ops each, instead of one numpy pass per kept box).
BLOCK = 64


def nms(boxes: np.ndarray, scores: np.ndarray, labels: Optional[np.ndarray], iou_threshold: float,
        max_out: int) -> Tuple[np.ndarray, int]:
    """(keep: int64[max_out], count): see the module docstring. Allocates O(len(scores) + BLOCK * max_out)."""
    keep = np.zeros(max_out, np.int64)
    candidates = np.flatnonzero(scores > -np.inf)  # NaN and -inf are never candidates
    if candidates.size == 0 or max_out == 0:
        return keep, 0
    order = candidates[np.argsort(-scores[candidates].astype(np.float64), kind="stable")]
    corners = boxes[order].astype(np.float32)
    areas = (corners[:, 2] - corners[:, 0]) * (corners[:, 3] - corners[:, 1])
    group = labels[order] if labels is not None else None
    kept = []  # type: List[int]  # positions in `order`
    for start in range(0, order.size, BLOCK):
        block = np.arange(start, min(start + BLOCK, order.size))
        alive = np.ones(block.size, bool)
        if kept:
            alive &= ~np.any(_suppresses(corners, areas, group, np.asarray(kept), block, iou_threshold), axis=0)
        within = _suppresses(corners, areas, group, block, block, iou_threshold)
        for row in range(block.size):
            if not alive[row]:
                continue
            kept.append(int(block[row]))
            if len(kept) == max_out:
                break
            alive[row + 1:] &= ~within[row, row + 1:]
        if len(kept) == max_out:
            break
    keep[:len(kept)] = order[kept]
    return keep, len(kept)


def _suppresses(corners: np.ndarray, areas: np.ndarray, group: Optional[np.ndarray], first: np.ndarray,
                then: np.ndarray, iou_threshold: float) -> np.ndarray:
    """bool [len(first), len(then)]: whether box `first[i]`, visited earlier, suppresses box `then[j]` (IoU in
    float32 with torchvision's operation order, compared in float64; same label when labels are given)."""
    a, b = corners[first][:, None, :], corners[then][None, :, :]
    width = np.maximum(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), np.float32(0))
    height = np.maximum(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), np.float32(0))
    inter = width * height
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / (areas[first][:, None] + areas[then][None, :] - inter)
    suppressed = iou.astype(np.float64) > iou_threshold
    if group is not None:
        suppressed &= group[first][:, None] == group[then][None, :]
    return suppressed


def _nms_kernel(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    check(len(args) == 5, "nms", "takes boxes, scores, labels, iou_threshold and max_out")
    boxes, scores = array(args[0], "nms", "boxes"), array(args[1], "nms", "scores")
    labels = None if args[2] is None else array(args[2], "nms", "labels")
    threshold, max_out = number(args[3], "nms", "iou_threshold"), args[4]
    keep, count = outs
    check(boxes.ndim == 2 and boxes.shape[1] == 4 and scores.shape == boxes.shape[:1], "nms",
          "needs boxes [N, 4] and scores [N]")
    check(labels is None or labels.shape == scores.shape, "nms", "labels must match the scores")
    check(isinstance(max_out, int) and keep is not None and keep.shape == (max_out,) and keep.dtype == np.int64,
          "nms", "keep must be int64 [max_out]")
    check(count is None or (count.shape == () and count.dtype == np.int64), "nms", "count must be an int64 scalar")

    def run() -> None:
        kept, n = nms(boxes, scores, labels, threshold, max_out)
        keep[...] = kept
        if count is not None:
            count[...] = n
    return run


KERNELS = {
    "edgedyn.nms.default": _nms_kernel,
}
