"""Detection outputs: which outputs form one (boxes, scores, labels, count), and comparing them as detections.

A bundle whose NMS is inside (`--nms`, torchvision's SSD/RetinaNet) returns, per image, `boxes` [..., D, 4],
`scores` [..., D], `labels` [..., D] and `count` [...], rows past `count` zero; outputs named PREFIX + those four
keys (`boxes`, or `0.boxes` for the first image of a torchvision list) form one group, and outputs beside them
with the same leading shape (`keypoints`, `mask_coefficients`) are per-row extras. Two results agree when the
counts are equal and every valid row of one matches a row of the other: same label, IoU >= MIN_IOU and score
within the tolerance. Rows are matched, not compared in place: two boxes whose scores differ by less than the
float32 rounding of two backends may come out in either order.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

KEYS = ("boxes", "scores", "labels", "count")
MIN_IOU = 0.99


def groups(names: Sequence[str]) -> List[Dict[str, int]]:
    """Each detection group among the outputs: {"boxes": i, "scores": j, "labels": k, "count": l, extras...}
    by output index, in output order."""
    index = {name: i for i, name in enumerate(names)}
    found = []
    for name in names:
        if not name.endswith("boxes"):
            continue
        prefix = name[:-len("boxes")]
        if prefix and not prefix.endswith("."):
            continue
        if all(prefix + key in index for key in KEYS):
            group = {key: index[prefix + key] for key in KEYS}
            for other in names:
                rest = other[len(prefix):]
                if other.startswith(prefix) and rest not in KEYS and "." not in rest:
                    group[rest] = index[other]
            found.append(group)
    return found


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    same = np.all(boxes == box, axis=1)  # identical boxes (zero-area ones too) match
    return np.where(same, 1.0, iou)


def match(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray], score_tolerance: float) -> Tuple[
        Optional[List[int]], str, float]:
    """For one image: (for each valid row of `want`, the row of `got` it matches; or None), why not, worst IoU."""
    count = int(want["count"])
    if int(got["count"]) != count:
        return None, "count {} != expected {}".format(int(got["count"]), count), 0.0
    free = np.ones(count, bool)
    pairs = []
    worst = 1.0
    boxes = got["boxes"][:count].astype(np.float64)
    for row in range(count):
        candidates = free & (got["labels"][:count] == want["labels"][row]) & (
            np.abs(got["scores"][:count].astype(np.float64) - float(want["scores"][row])) <= score_tolerance)
        if not candidates.any():
            return None, "row {} (label {}, score {:.6g}) has no row with its label and score".format(
                row, want["labels"][row], float(want["scores"][row])), 0.0
        overlap = np.where(candidates, _iou(want["boxes"][row].astype(np.float64), boxes), -1.0)
        best = int(np.argmax(overlap))
        if overlap[best] < MIN_IOU:
            return None, "row {} (label {}): best IoU {:.4f} < {}".format(row, want["labels"][row],
                                                                          overlap[best], MIN_IOU), 0.0
        worst = min(worst, float(overlap[best]))
        free[best] = False
        pairs.append(best)
    return pairs, "", worst


def compare_group(group: Dict[str, int], got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                  tolerance: Dict[str, float]) -> Dict[str, Any]:
    """One result for the whole group (see the module docstring): ok, rows matched, worst IoU, max errors."""
    for key, index in group.items():
        if np.shape(got[index]) != np.shape(want[index]):
            return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"), "error": "{}: shape {} != "
                    "expected {}".format(key, np.shape(got[index]), np.shape(want[index]))}
    images = list(np.ndindex(*np.shape(want[group["count"]])))
    scale = float(np.max(np.abs(want[group["scores"]]))) if want[group["scores"]].size else 0.0
    score_tolerance = tolerance["atol"] + tolerance["rtol"] * scale
    matched, worst_iou, max_abs, max_rel = 0, 1.0, 0.0, 0.0
    for image in images:
        pick = lambda arrays, key: arrays[group[key]][image]  # noqa: E731
        pairs, why, worst = match({key: pick(got, key) for key in KEYS}, {key: pick(want, key) for key in KEYS},
                                  score_tolerance)
        if pairs is None:
            return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"),
                    "error": "image {}: {}".format(image, why) if len(images) > 1 else why}
        matched += len(pairs)
        worst_iou = min(worst_iou, worst)
        for key, index in group.items():
            if key in ("labels", "count", "boxes") or not pairs:
                continue
            rows, expected = got[index][image][pairs], want[index][image][:len(pairs)]
            error = float(np.max(np.abs(rows.astype(np.float64) - expected.astype(np.float64))))
            extent = float(np.max(np.abs(want[index]))) or 1.0
            if error > tolerance["atol"] + tolerance["rtol"] * extent:
                return {"ok": False, "max_abs": error, "max_rel": error / extent,
                        "error": "{}: matched rows differ by {:.3g}".format(key, error)}
            max_abs, max_rel = max(max_abs, error), max(max_rel, error / extent)
    return {"ok": True, "max_abs": max_abs, "max_rel": max_rel, "rtol": tolerance["rtol"],
            "atol": tolerance["atol"], "rows_matched": matched, "min_iou": worst_iou}


def compare_outputs(names: Sequence[str], got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                    tolerance: Dict[str, float], compare: Any) -> List[Dict[str, Any]]:
    """One result per output: detection groups compared as detections (each member gets the group's result),
    the other outputs with `compare(got, want, tolerance)`."""
    results = [None] * len(names)  # type: List[Any]
    for group in groups(names):
        result = dict(compare_group(group, got, want, tolerance), compared="as detections")
        for index in group.values():
            results[index] = result
    return [result if result is not None else compare(np.asarray(g), w, tolerance)
            for result, g, w in zip(results, got, want)]
