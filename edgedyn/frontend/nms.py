"""`edgedyn::nms`: non-maximum suppression with a fixed output size, one node in the captured graph.

torchvision's `nms` returns as many indices as survive, a length that depends on values and that a capture at
fixed shapes cannot follow. This op returns the first `max_out` kept indices padded with 0, and `count`, how many
are real; its semantics (edgedyn/runtime/kernels/detection.py) are torchvision's greedy NMS, so the valid rows
equal torch's result. Each backend lowers the one node: ONNX NonMaxSuppression (onnxruntime), LiteRT's
NON_MAX_SUPPRESSION_V4, the portable numpy kernel; TVM takes `decomposed`, the same result in plain fixed-shape
tensor ops.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from edgedyn.runtime.kernels import detection

NAMESPACE = "edgedyn"


@torch.library.custom_op("edgedyn::nms", mutates_args=())
def nms(boxes: torch.Tensor, scores: torch.Tensor, labels: Optional[torch.Tensor], iou_threshold: float,
        max_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(keep int64[max_out], count int64[]): the first `max_out` indices greedy NMS keeps, by descending score,
    padded with 0. Boxes are (x1, y1, x2, y2); scores of -inf are not candidates; with `labels`, a box suppresses
    only boxes of its own label (torchvision's batched_nms)."""
    kept, count = detection.nms(boxes.detach().float().cpu().numpy(), scores.detach().float().cpu().numpy(),
                                None if labels is None else labels.detach().cpu().numpy(), float(iou_threshold),
                                int(max_out))
    return torch.from_numpy(kept), torch.tensor(count, dtype=torch.int64)


@nms.register_fake
def _nms_fake(boxes: torch.Tensor, scores: torch.Tensor, labels: Optional[torch.Tensor], iou_threshold: float,
              max_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return boxes.new_empty((max_out,), dtype=torch.int64), boxes.new_empty((), dtype=torch.int64)


def valid_rows(count: torch.Tensor, max_out: int) -> torch.Tensor:
    """bool[max_out]: which rows of a padded result are real."""
    return torch.arange(max_out, device=count.device) < count


def masked_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows past the count set to zero, so padded rows are the same on every backend (a 0-d zero, not a
    zeros_like: a full-size constant the passes would keep, and not every backend computes `full`)."""
    return torch.where(valid.reshape((-1,) + (1,) * (values.dim() - 1)), values, values.new_zeros(()))


def decomposed(boxes: torch.Tensor, scores: torch.Tensor, labels: Optional[torch.Tensor], iou_threshold: float,
               max_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The op in plain fixed-shape tensor ops (argmax, gather, compare, where): `max_out` rounds, each keeping the
    best remaining candidate and removing those it suppresses. Exactly the greedy result: round t keeps the t-th
    box greedy NMS keeps (the best candidate left is never suppressed by a box kept before it)."""
    boxes, scores = boxes.float(), scores.float()
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    size = scores.shape[0]
    # Ties keep index order, as the stable sort does: argmax returns the first of equal maxima.
    floor = scores.new_full((), float("-inf"))
    remaining = torch.where(scores > float("-inf"), scores, floor)
    positions = torch.arange(size)
    kept, found = [], []
    for _ in range(max_out):
        best = torch.argmax(remaining).reshape(1)
        alive = remaining.gather(0, best) > float("-inf")
        box = boxes.index_select(0, best)
        width = (torch.minimum(box[:, 2], x2) - torch.maximum(box[:, 0], x1)).clamp(min=0)
        height = (torch.minimum(box[:, 3], y2) - torch.maximum(box[:, 1], y1)).clamp(min=0)
        inter = width * height
        iou = inter / (areas.index_select(0, best) + areas - inter)
        suppressed = (iou > iou_threshold) | (positions == best)
        if labels is not None:
            suppressed = suppressed & (labels == labels.index_select(0, best))
            suppressed = suppressed | (positions == best)
        remaining = torch.where(suppressed & alive, floor, remaining)
        kept.append(torch.where(alive, best, best.new_zeros(())))
        found.append(alive)
    keep = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int64)
    count = torch.cat(found).to(torch.int64).sum() if found else torch.zeros((), dtype=torch.int64)
    return keep, count


NMS_OP = torch.ops.edgedyn.nms.default
_NOTES = []  # type: List[List[Dict[str, Any]]]


@contextlib.contextmanager
def noting_detections() -> Iterator[List[Dict[str, Any]]]:
    """Collects what each detection output's post-processing decided by (`note_detections`) during a call."""
    notes = []  # type: List[Dict[str, Any]]
    _NOTES.append(notes)
    try:
        yield notes
    finally:
        _NOTES.remove(notes)


def note_detections(score_threshold: Optional[float], max_out: int) -> None:
    """Records, for the capture running, that a detection output keeps scores above `score_threshold` and at most
    `max_out` rows: what a comparison needs to tell a decision within the tolerance from a wrong result
    (edgedyn/runtime/detections.py)."""
    if _NOTES:
        _NOTES[-1].append({"score_threshold": None if score_threshold is None else float(score_threshold),
                           "max_out": int(max_out)})


def is_nms(target: object) -> bool:
    return target is NMS_OP


def keep_numpy(boxes: np.ndarray, scores: np.ndarray, labels: Optional[np.ndarray], iou_threshold: float,
               max_out: int) -> Tuple[np.ndarray, int]:
    """The op's result on numpy arrays (what the portable kernel computes)."""
    return detection.nms(boxes, scores, labels, iou_threshold, max_out)
