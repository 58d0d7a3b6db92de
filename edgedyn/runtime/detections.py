"""Detection outputs: which outputs form one (boxes, scores, labels, count), and comparing them as detections.

A bundle whose NMS is inside (`--nms`, torchvision's SSD/RetinaNet) returns, per image, `boxes` [..., D, 4],
`scores` [..., D], `labels` [..., D] and `count` [...], rows past `count` zero; outputs named PREFIX + those four
keys (`boxes`, or `0.boxes` for the first image of a torchvision list) form one group, and outputs beside them
with the same leading shape (`keypoints`, `mask_coefficients`) are per-row extras. Two results agree when every
valid row of one matches a row of the other (same label, IoU >= MIN_IOU, score within the tolerance, extras within
the fp32 tolerance), but for the few rows a decision within the score tolerance explains (`match`). Rows are
matched, not compared in place: two boxes whose scores differ by less than the float32 rounding of two backends
may come out in either order.

Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

KEYS = ("boxes", "scores", "labels", "count")
MIN_IOU = 0.99
# Scores come out of a sigmoid or softmax of logits whose own float32 tolerance is 1e-4 of their largest magnitude
# (5-15 for detection heads): a score moves by up to a quarter of that, ~1e-3 of the largest score at worst.
SCORE_RTOL = 1e-3
# The share of rows that may differ within the score tolerance (see `match`).
BORDERLINE_SHARE = 0.02


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


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one (x1, y1, x2, y2) box with each row of `boxes`; identical boxes (zero-area ones too) give 1."""
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


def valid_rows(result: Dict[str, np.ndarray], count: int) -> Dict[str, np.ndarray]:
    """One image's first `count` rows: scores and boxes as float64, labels as they are."""
    return {"scores": result["scores"][:count].astype(np.float64), "labels": result["labels"][:count],
            "boxes": result["boxes"][:count].astype(np.float64)}


def pair_rows(want: Dict[str, np.ndarray], got: Dict[str, np.ndarray], min_iou: float,
              score_tolerance: Optional[float] = None, order: Optional[Sequence[int]] = None
              ) -> List[Tuple[int, int, float]]:
    """(want row, got row, IoU) of valid rows (`valid_rows`) paired greedily: each row of `want`, in `order` (as
    listed by default), takes the free row of `got` with its label (and a score within `score_tolerance`, when
    given) that overlaps it most, when that IoU is at least `min_iou`."""
    free = np.ones(len(got["labels"]), bool)
    pairs = []  # type: List[Tuple[int, int, float]]
    for row in range(len(want["labels"])) if order is None else order:
        candidates = free & (got["labels"] == want["labels"][row])
        if score_tolerance is not None:
            candidates &= np.abs(got["scores"] - want["scores"][row]) <= score_tolerance
        if not candidates.any():
            continue
        overlap = np.where(candidates, box_iou(want["boxes"][row], got["boxes"]), -1.0)
        best = int(np.argmax(overlap))
        if overlap[best] >= min_iou:
            pairs.append((int(row), best, float(overlap[best])))
            free[best] = False
    return pairs


class Match:
    """One image's rows matched: `pairs` (want row, got row), the rows left over on each side that lie within the
    tolerance of a decision (`borderline`), the worst IoU of a pair, and `error` when the two disagree."""

    def __init__(self) -> None:
        self.pairs = []  # type: List[Tuple[int, int]]
        self.borderline = 0
        self.worst_iou = 1.0
        self.error = ""


def match(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray], score_tolerance: float,
          decided: Optional[Dict[str, Any]] = None) -> Match:
    """Matches one image's valid rows (see the module docstring); `decided` is what the post-processing kept
    ({"score_threshold", "max_out"}, recorded at export), None when unknown.

    Note: a row on one side only is accepted when a decision within the score tolerance explains it: its score is
    that close to the score threshold (it passed on one side only); both sides are full (`max_out` rows) and its
    score is that close to the other side's last one (the cut fell between the two); or a row left on the other
    side has the same label, a different score within the tolerance and a box that overlaps (two overlapping
    boxes of nearly equal scores: NMS keeps the one it visits first). At most BORDERLINE_SHARE of the rows (and 2)
    may be explained so; anything else is a disagreement. Random weights make networks whose float32 rounding
    moves scores by 1e-4 (the zoo's SSDlite against float64), so such decisions do happen between backends.
    """
    result = Match()
    decided = decided or {}
    threshold, max_out = decided.get("score_threshold"), decided.get("max_out")
    counts = int(want["count"]), int(got["count"])
    rows = valid_rows(want, counts[0]), valid_rows(got, counts[1])
    scores = rows[0]["scores"], rows[1]["scores"]
    labels = rows[0]["labels"], rows[1]["labels"]
    boxes = rows[0]["boxes"], rows[1]["boxes"]
    free = np.ones(counts[1], bool)
    for row, best, overlap in pair_rows(rows[0], rows[1], MIN_IOU, score_tolerance):
        result.pairs.append((row, best))
        result.worst_iou = min(result.worst_iou, overlap)
        free[best] = False
    matched = {w for w, _ in result.pairs}
    left = ([r for r in range(counts[0]) if r not in matched], [int(r) for r in np.flatnonzero(free)])
    full = max_out is not None and counts[0] == counts[1] == int(max_out)
    unexplained = []
    for side in (0, 1):
        other = 1 - side
        for row in left[side]:
            score = scores[side][row]
            at_threshold = threshold is not None and abs(score - threshold) <= score_tolerance
            at_cut = full and scores[other].size > 0 and score <= float(scores[other].min()) + score_tolerance
            swapped = any(labels[other][o] == labels[side][row] and scores[other][o] != score and
                          abs(scores[other][o] - score) <= score_tolerance and
                          box_iou(boxes[side][row], boxes[other][o:o + 1])[0] > 0 for o in left[other])
            if at_threshold or at_cut or swapped:
                result.borderline += 1
            else:
                unexplained.append((side, row))
    allowed = max(2, int(BORDERLINE_SHARE * max(counts)))
    if unexplained:
        side, row = unexplained[0]
        result.error = "{} row {} (label {}, score {:.6g}) matches no row of the {} (same label, score within " \
                       "{:.3g}, IoU >= {}){}".format(
                           ("expected", "returned")[side], row, labels[side][row], scores[side][row],
                           ("result", "expected result")[side], score_tolerance, MIN_IOU,
                           "; counts {} and {}".format(counts[1], counts[0]) if counts[0] != counts[1] else "")
    elif result.borderline > allowed:
        result.error = "{} rows differ within the score tolerance, more than the {} a float32 rounding " \
                       "explains".format(result.borderline, allowed)
    return result


def compare_group(group: Dict[str, int], got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                  tolerance: Dict[str, float], decided: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One result for the whole group (see the module docstring): ok, rows matched, worst IoU, max errors;
    `decided` as `match` takes it."""
    for key, index in group.items():
        if np.shape(got[index]) != np.shape(want[index]):
            return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"), "error": "{}: shape {} != "
                    "expected {}".format(key, np.shape(got[index]), np.shape(want[index]))}
    images = list(np.ndindex(*np.shape(want[group["count"]])))
    scale = float(np.max(np.abs(want[group["scores"]]))) if want[group["scores"]].size else 0.0
    score_tolerance = tolerance["atol"] + max(tolerance["rtol"], SCORE_RTOL) * scale
    matched, borderline, worst_iou, max_abs, max_rel = 0, 0, 1.0, 0.0, 0.0
    for image in images:
        pick = lambda arrays, key: arrays[group[key]][image]  # noqa: E731
        found = match({key: pick(got, key) for key in KEYS}, {key: pick(want, key) for key in KEYS},
                      score_tolerance, decided)
        if found.error:
            return {"ok": False, "max_abs": float("inf"), "max_rel": float("inf"),
                    "error": "image {}: {}".format(image, found.error) if len(images) > 1 else found.error}
        matched, borderline = matched + len(found.pairs), borderline + found.borderline
        worst_iou = min(worst_iou, found.worst_iou)
        rows_want, rows_got = [w for w, _ in found.pairs], [g for _, g in found.pairs]
        for key, index in group.items():
            if key in ("labels", "count", "boxes") or not found.pairs:
                continue
            error = float(np.max(np.abs(got[index][image][rows_got].astype(np.float64)
                                        - want[index][image][rows_want].astype(np.float64))))
            extent = float(np.max(np.abs(want[index]))) or 1.0
            limit = score_tolerance if key == "scores" else tolerance["atol"] + tolerance["rtol"] * extent
            if error > limit:
                return {"ok": False, "max_abs": error, "max_rel": error / extent,
                        "error": "{}: matched rows differ by {:.3g}".format(key, error)}
            max_abs, max_rel = max(max_abs, error), max(max_rel, error / extent)
    return {"ok": True, "max_abs": max_abs, "max_rel": max_rel, "rtol": tolerance["rtol"],
            "atol": tolerance["atol"], "rows_matched": matched, "rows_borderline": borderline,
            "min_iou": worst_iou}


def compare_outputs(names: Sequence[str], got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                    tolerance: Dict[str, float], compare: Any, decided: Any = None) -> List[Dict[str, Any]]:
    """One result per output: detection groups compared as detections (each member gets the group's result),
    the other outputs with `compare(got, want, tolerance)`. `decided`: the specialization's `detections` record
    (what each group's post-processing kept, in group order), None when the bundle has none."""
    results = [None] * len(names)  # type: List[Any]
    notes = _decisions(decided)
    for number, group in enumerate(groups(names)):
        note = notes[min(number, len(notes) - 1)] if notes else None
        result = dict(compare_group(group, got, want, tolerance, note), compared="as detections")
        for index in group.values():
            results[index] = result
    return [result if result is not None else compare(np.asarray(g), w, tolerance)
            for result, g, w in zip(results, got, want)]


def _decisions(record: Any) -> List[Dict[str, Any]]:
    """A manifest's `detections` list, each entry checked (a bundle is data from outside); unusable ones dropped."""
    if not isinstance(record, list):
        return []
    notes = []
    for entry in record[:1024]:
        if not isinstance(entry, dict):
            continue
        threshold, max_out = entry.get("score_threshold"), entry.get("max_out")
        number = isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and np.isfinite(threshold)
        notes.append({"score_threshold": float(threshold) if number else None,
                      "max_out": max_out if isinstance(max_out, int) and not isinstance(max_out, bool) else None})
    return notes
