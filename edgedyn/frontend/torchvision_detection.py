"""torchvision's SSD and RetinaNet detectors captured as they are: their post-processing at fixed shapes.

Their `postprocess_detections` filters candidates by score (`scores[scores > thresh]`), keeps the top k of what
is left and runs `batched_nms`: three lengths that depend on values. While edgedyn captures such a model (the
eager reference run and torch.export alike) those methods are replaced by the versions below, which compute the
same thing at fixed shapes: every candidate kept, those under the threshold scored -inf; top k over all of them
(the same boxes, in the same order); `edgedyn::nms` with the same IoU arithmetic (per label as torchvision's
per-class loop does for more than 1000 boxes, on class-offset boxes as its coordinate trick does for fewer), and
the first `detections_per_img` kept. Each image's dict then holds `boxes` [D, 4], `scores` [D], `labels` [D]
with D = detections_per_img, rows past `count` (a fourth key) zero. The equality holds except where scores tie
exactly at the top-k boundary, where torch's own order among equal values is unspecified.

Other torchvision detectors (Faster/Mask/Keypoint R-CNN, FCOS) are captured unchanged, and fail where their code
branches on values, the error naming torchvision's line.
"""
import contextlib
import sys
from typing import Any, Dict, Iterator, List, Tuple

import torch

from edgedyn.frontend.nms import masked_rows, note_detections, valid_rows

# torchvision.ops.batched_nms runs NMS per class above this many box coordinates on a CPU, and on class-offset
# boxes (one NMS) at or below it: the two differ in float32 rounding, so the capture follows the same rule.
_VANILLA_ABOVE = 4000
NEG_INF = float("-inf")


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, candidates: torch.Tensor,
                iou: float, max_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """torchvision.ops.batched_nms over the rows where `candidates` holds (the others scored -inf), first
    `max_out` kept: (keep, count). Which of torchvision's two methods applies depends on how many candidates
    there are, a value here: both are computed when either could apply, and the right one picked."""
    scored = torch.where(candidates, scores, scores.new_full((), NEG_INF))
    rows = scores.shape[0]
    if rows * 4 <= _VANILLA_ABOVE:
        return _coordinate_trick(boxes, scored, labels, candidates, iou, max_out)
    keep, count = torch.ops.edgedyn.nms(boxes, scored, labels, iou, max_out)
    trick_keep, trick_count = _coordinate_trick(boxes, scored, labels, candidates, iou, max_out)
    few = candidates.float().sum() * 4 <= _VANILLA_ABOVE  # counted in float32: exact, and every backend sums it
    return torch.where(few, trick_keep, keep), torch.where(few, trick_count, count)


def _coordinate_trick(boxes: torch.Tensor, scored: torch.Tensor, labels: torch.Tensor, candidates: torch.Tensor,
                      iou: float, max_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """torchvision's `_batched_nms_coordinate_trick`: boxes moved by label * (largest coordinate + 1)."""
    largest = torch.where(candidates[:, None], boxes, boxes.new_full((), NEG_INF)).max()
    offsets = labels.to(boxes) * (largest + torch.tensor(1).to(boxes))
    return torch.ops.edgedyn.nms(boxes + offsets[:, None], scored, None, iou, max_out)


def _padded(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor,
            count: torch.Tensor, max_out: int) -> Dict[str, torch.Tensor]:
    valid = valid_rows(count, max_out)
    return {"boxes": masked_rows(boxes.index_select(0, keep), valid),
            "scores": masked_rows(scores.index_select(0, keep), valid),
            "labels": masked_rows(labels.index_select(0, keep), valid), "count": count}


def ssd_postprocess(self: Any, head_outputs: Dict[str, torch.Tensor], image_anchors: List[torch.Tensor],
                    image_shapes: List[Tuple[int, int]]) -> List[Dict[str, torch.Tensor]]:
    """torchvision's SSD.postprocess_detections at fixed shapes (see the module docstring)."""
    from torchvision.ops import boxes as box_ops

    scores_all = torch.nn.functional.softmax(head_outputs["cls_logits"], dim=-1)
    classes = scores_all.size(-1)
    detections = []
    for boxes, scores, anchors, image_shape in zip(head_outputs["bbox_regression"], scores_all, image_anchors,
                                                   image_shapes):
        boxes = box_ops.clip_boxes_to_image(self.box_coder.decode_single(boxes, anchors), image_shape)
        per_class = scores[:, 1:].transpose(0, 1)  # [classes - 1, anchors], label = row + 1
        k = min(self.topk_candidates, per_class.shape[1])
        top, index = torch.where(per_class > self.score_thresh, per_class,
                                 per_class.new_full((), NEG_INF)).topk(k, dim=1)
        label = torch.arange(1, classes, device=boxes.device).repeat_interleave(k)
        box, score, index = boxes.index_select(0, index.flatten()), top.flatten(), index.flatten()
        keep, count = batched_nms(box, score, label, score > NEG_INF, self.nms_thresh, self.detections_per_img)
        detections.append(_padded(box, score, label, keep, count, self.detections_per_img))
        note_detections(self.score_thresh, self.detections_per_img)
    return detections


def retinanet_postprocess(self: Any, head_outputs: Dict[str, List[torch.Tensor]], anchors: List[List[torch.Tensor]],
                          image_shapes: List[Tuple[int, int]]) -> List[Dict[str, torch.Tensor]]:
    """torchvision's RetinaNet.postprocess_detections at fixed shapes (see the module docstring)."""
    from torchvision.ops import boxes as box_ops

    detections = []
    for index, image_shape in enumerate(image_shapes):
        image_boxes, image_scores, image_labels = [], [], []
        for regression, logits, level_anchors in zip([r[index] for r in head_outputs["bbox_regression"]],
                                                     [c[index] for c in head_outputs["cls_logits"]],
                                                     anchors[index]):
            classes = logits.shape[-1]
            scores = torch.sigmoid(logits).flatten()
            k = min(self.topk_candidates, scores.shape[0])
            top, top_index = torch.where(scores > self.score_thresh, scores, scores.new_full((), NEG_INF)).topk(k)
            anchor_index = torch.div(top_index, classes, rounding_mode="floor")
            boxes = self.box_coder.decode_single(regression.index_select(0, anchor_index),
                                                 level_anchors.index_select(0, anchor_index))
            image_boxes.append(box_ops.clip_boxes_to_image(boxes, image_shape))
            image_scores.append(top)
            image_labels.append(top_index % classes)
        boxes, scores, labels = torch.cat(image_boxes), torch.cat(image_scores), torch.cat(image_labels)
        keep, count = batched_nms(boxes, scores, labels, scores > NEG_INF, self.nms_thresh,
                                  self.detections_per_img)
        detections.append(_padded(boxes, scores, labels, keep, count, self.detections_per_img))
        note_detections(self.score_thresh, self.detections_per_img)
    return detections


def _rules() -> List[Tuple[Any, str, Any]]:
    """(class, method, replacement) for the torchvision detectors imported in this process."""
    rules = []
    ssd = sys.modules.get("torchvision.models.detection.ssd")
    if ssd is not None:
        rules.append((ssd.SSD, "postprocess_detections", ssd_postprocess))
    retinanet = sys.modules.get("torchvision.models.detection.retinanet")
    if retinanet is not None:
        rules.append((retinanet.RetinaNet, "postprocess_detections", retinanet_postprocess))
    return rules


@contextlib.contextmanager
def fixed_shape_postprocessing(model: Any) -> Iterator[List[str]]:
    """While capturing `model`, its torchvision SSD/RetinaNet post-processing runs at fixed shapes; yields the
    names of the replaced methods (empty when the model holds no such detector)."""
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    applied = []
    for cls, method, replacement in _rules():
        if any(isinstance(module, cls) for module in modules):
            applied.append((cls, method, cls.__dict__[method]))
            setattr(cls, method, replacement)
    try:
        yield ["{}.{}".format(cls.__name__, method) for cls, method, _ in applied]
    finally:
        for cls, method, original in applied:
            setattr(cls, method, original)
