"""The accuracy gate: a quantized artifact against the float reference (torch eager) on held-out inputs.

Per output: `max_abs_error`, `cosine` (mean over samples of the cosine similarity of each sample's flattened
output) and, for classifier-shaped outputs (2-d [batch, classes]), `top1_agreement` (the share of rows whose
argmax is the same). `--max-accuracy-drop` takes comma-separated bounds: `top1=1%` or `top1=1` (top-1 numbers
are always percent: at most 1% of rows change their top-1 class), `cosine=0.99` (mean cosine at least 0.99, a
plain number), `max_abs=0.05` (a plain number). Without it, every quantized export is held to DEFAULT_GATE: an
int8 model far from its float original is never shipped silently.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edgedyn.errors import EdgedynError, GateMissError
from edgedyn.runtime.detections import KEYS, pair_rows, valid_rows
from edgedyn.runtime.detections import groups as detection_groups

GATE_KEYS = ("top1", "cosine", "max_abs")
GATE_HINT = ("write bounds as top1=1% (allowed top-1 drop; top1=1 also means 1%), cosine=0.99 (minimum), "
             "max_abs=0.05, comma-separated")
# Held-out samples below which the accuracy numbers are too noisy to trust: the export warns.
MIN_EVAL_SAMPLES = 32
# Note: a quantized artifact on the board is verified against its own outputs recorded at export on the same
# reference inputs (the bundle member `expected`), not against torch eager: int8 rounding already differs from
# float by design (that is what the accuracy numbers measure), while a second CPU's int8 kernels may round an
# intermediate value one step differently. The bound below is relative to the largest output magnitude: one int8
# step of a wide activation, propagated through a small net, stays well below it, and a wrong kernel or layout
# is O(1). Used by edgedyn/runtime/program.py through the artifact's `tolerance`.
INT8_TOLERANCE = {"rtol": 0.02, "atol": 1e-5}
GATE_MISS_HINT = ("calibrate with more representative data, try --quantize int8-weights or another --backend, or "
                  "accept less with --max-accuracy-drop (e.g. cosine=0.95)")
# A candidate of `auto` is rejected as broken (not as inaccurate) below this cosine to the float reference.
SANITY_COSINE = 0.9


@dataclass(frozen=True)
class Gate:
    """Bounds from --max-accuracy-drop; None where not given."""

    top1_drop: Optional[float] = None
    min_cosine: Optional[float] = None
    max_abs: Optional[float] = None

    def __post_init__(self) -> None:
        if self.top1_drop is not None and not 0 <= self.top1_drop <= 1:
            raise EdgedynError("--max-accuracy-drop top1={:g}%: expected 0% to 100%".format(self.top1_drop * 100),
                               hint=GATE_HINT)
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise EdgedynError("--max-accuracy-drop cosine={:g}: expected -1 to 1".format(self.min_cosine),
                               hint=GATE_HINT)

    def to_dict(self) -> Dict[str, float]:
        named = {"top1_drop": self.top1_drop, "min_cosine": self.min_cosine, "max_abs_error": self.max_abs}
        return {k: v for k, v in named.items() if v is not None}


# Every --quantize export without --max-accuracy-drop: cosine >= 0.99 to torch eager on every output.
DEFAULT_GATE = Gate(min_cosine=0.99)

# A detection group (NMS inside the bundle: boxes, scores, labels, count) is gated by its rows, not by the cosine of
# its padded outputs (which a changed order or one extra row moves arbitrarily): a returned row matches an expected
# one of the same label at IoU >= DETECTION_IOU, and at most DETECTION_DROP of the rows may differ (`top1=` of
# --max-accuracy-drop replaces that share). bf16 rounds a 640-pixel box coordinate to 2-4 pixels: YOLO11n with NMS in
# OpenVINO bf16 matched 25 of 31 rows of torch at IoU 0.5 on a random input, while its raw head's cosine was 0.99999;
# the zoo's YOLO11n (random weights) 146 of 889 at IoU 0.9.
DETECTION_IOU = 0.5  # COCO's criterion for a detection of the same object
DETECTION_DROP = 0.02


def parse_gate(text: Optional[str]) -> Optional[Gate]:
    """`top1=1%,cosine=0.99` -> Gate; None for None or empty."""
    if not text:
        return None
    values = {}  # type: Dict[str, float]
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        key = key.strip().lower()
        if key not in GATE_KEYS or not value:
            raise EdgedynError("--max-accuracy-drop: cannot read '{}'; keys are {}".format(
                part.strip(), ", ".join(GATE_KEYS)), hint=GATE_HINT)
        try:
            number = float(value.strip().rstrip("%")) / (100.0 if value.strip().endswith("%") else 1.0)
        except ValueError:
            raise EdgedynError("--max-accuracy-drop {}: '{}' is not a number".format(key, value), hint=GATE_HINT)
        if key == "top1" and not value.strip().endswith("%"):
            number /= 100.0  # top-1 numbers are percent with or without the sign: top1=1 means 1%
        values[key] = number
    return Gate(top1_drop=values.get("top1"), min_cosine=values.get("cosine"), max_abs=values.get("max_abs"))


def output_metrics(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> Dict[str, Any]:
    """Metrics of one output over batches: lists of arrays of the same shapes."""
    a = np.concatenate([np.asarray(g, np.float64).reshape(np.shape(g)[0] if np.ndim(g) else 1, -1) for g in got])
    b = np.concatenate([np.asarray(w, np.float64).reshape(np.shape(w)[0] if np.ndim(w) else 1, -1) for w in want])
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = np.where(norms > 0, np.sum(a * b, axis=1) / np.where(norms > 0, norms, 1), 1.0)
    metrics = {"max_abs_error": float(np.max(np.abs(a - b))) if a.size else 0.0,
               "cosine": float(np.mean(cosines)), "cosine_min": float(np.min(cosines)),
               "reference_max_abs": float(np.max(np.abs(b))) if b.size else 0.0, "samples": int(a.shape[0])}
    if np.ndim(want[0]) == 2 and np.shape(want[0])[1] > 1:  # [batch, classes]
        metrics["top1_agreement"] = float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
    return metrics


def worst_cosine(got: Sequence[Sequence[np.ndarray]], want: Sequence[Sequence[np.ndarray]]) -> float:
    """The lowest, over outputs, of the mean per-sample cosine (output_metrics) of batches `got` to `want`: every
    output must keep its accuracy."""
    return min(output_metrics([g[i] for g in got], [w[i] for w in want])["cosine"] for i in range(len(want[0])))


def compare_outputs(names: Sequence[str], got: Sequence[Sequence[np.ndarray]],
                    want: Sequence[Sequence[np.ndarray]]) -> List[Dict[str, Any]]:
    """Per output (named `names`), over the batches: output_metrics, and for the outputs of a detection group
    (boxes, scores, labels, count: NMS inside the bundle) the group's rows compared (detection_metrics)."""
    records = [dict(output_metrics([g[i] for g in got], [w[i] for w in want]), name=names[i])
               for i in range(len(want[0]))]
    for group in detection_groups(list(names)):
        found = detection_metrics(group, got, want)
        for index in group.values():
            records[index].update(found, compared="as detections", group=names[group["boxes"]])
    return records


def detection_metrics(group: Dict[str, int], got: Sequence[Sequence[np.ndarray]],
                      want: Sequence[Sequence[np.ndarray]]) -> Dict[str, Any]:
    """One detection group over the batches: rows expected and returned, rows matched (same label, IoU >=
    DETECTION_IOU, each expected row in descending score taking the best-overlapping free row), the share that
    agrees (matched over the larger of the two counts), the worst IoU and score error of a matched pair."""
    expected = returned = matched = 0
    worst_iou, score_error = 1.0, 0.0
    for batch_got, batch_want in zip(got, want):
        counts = np.asarray(batch_want[group["count"]])
        for image in np.ndindex(*counts.shape):
            pick = lambda arrays, key: np.asarray(arrays[group[key]])[image]  # noqa: E731
            rows = (_rows(pick(batch_want, "count"), len(pick(batch_want, "scores"))),
                    _rows(pick(batch_got, "count"), len(pick(batch_got, "scores"))))
            wanted = valid_rows({key: pick(batch_want, key) for key in KEYS}, rows[0])
            returned_rows = valid_rows({key: pick(batch_got, key) for key in KEYS}, rows[1])
            for row, best, overlap in pair_rows(wanted, returned_rows, DETECTION_IOU,
                                                order=np.argsort(-wanted["scores"], kind="stable")):
                matched += 1
                worst_iou = min(worst_iou, overlap)
                score_error = max(score_error, abs(float(returned_rows["scores"][best] - wanted["scores"][row])))
            expected, returned = expected + rows[0], returned + rows[1]
    larger = max(expected, returned)
    return {"rows_expected": expected, "rows_returned": returned, "rows_matched": matched,
            "row_agreement": matched / larger if larger else 1.0, "min_iou": worst_iou,
            "max_score_error": score_error}


def _rows(count: Any, limit: int) -> int:
    """A returned count as a number of rows (a broken candidate's NaN or out-of-range count reads as 0 or all)."""
    value = float(count)
    return int(min(max(value, 0.0), float(limit))) if np.isfinite(value) else 0


def misses_of(gate: Gate, outputs: Sequence[Dict[str, Any]]) -> List[str]:
    """The bounds of `gate` that `outputs` miss, in words; top-1 applies to classifier-shaped outputs only, and a
    detection group is judged by its rows (DETECTION_DROP, or the gate's top1 share) instead of by cosine: its
    outputs are padded lists whose order and length a rounding may change."""
    misses = []
    for record in outputs:
        if record.get("compared") == "as detections":
            if record["name"] == record["group"]:
                misses.extend(_detection_misses(gate, record))
            continue
        name, agreement = record["name"], record.get("top1_agreement")
        if gate.min_cosine is not None and record["cosine"] < gate.min_cosine:
            misses.append("{} cosine {:.6f} < {:g}".format(name, record["cosine"], gate.min_cosine))
        if gate.top1_drop is not None and agreement is not None and 1.0 - agreement > gate.top1_drop + 1e-12:
            misses.append("{} top-1 agreement {:.2%} (drop {:.2%} > allowed {:.2%})".format(
                name, agreement, 1.0 - agreement, gate.top1_drop))
        if gate.max_abs is not None and record["max_abs_error"] > gate.max_abs:
            misses.append("{} max abs error {:.4g} > {:g}".format(name, record["max_abs_error"], gate.max_abs))
    return misses


def rows_differ(gate: Gate, outputs: Sequence[Dict[str, Any]]) -> bool:
    """Whether a detection group of `outputs` has more rows that differ than `gate` allows (DETECTION_DROP, or the
    gate's top1 share)."""
    drop = gate.top1_drop if gate.top1_drop is not None else DETECTION_DROP
    return any(record.get("compared") == "as detections" and record["rows_expected"] and
               1.0 - record["row_agreement"] > drop + 1e-12 for record in outputs)


def _detection_misses(gate: Gate, record: Dict[str, Any]) -> List[str]:
    if not record["rows_expected"]:
        return ["{}: torch returns no detections on the gate's inputs, so nothing measures what {} does to "
                "them (pass --eval-inputs with images that have objects)".format(record["name"], "this precision")]
    drop = gate.top1_drop if gate.top1_drop is not None else DETECTION_DROP
    if rows_differ(gate, [record]):
        return ["{}: {} of {} expected detections matched (same label, IoU >= {:g}), {} returned: {:.1%} of rows "
                "differ, more than {:.0%}".format(record["name"], record["rows_matched"], record["rows_expected"],
                                                  DETECTION_IOU, record["rows_returned"],
                                                  1.0 - record["row_agreement"], drop)]
    return []


def check(gate: Optional[Gate], outputs: List[Dict[str, Any]], where: str) -> None:
    """Fails the export with the measured numbers when an output misses a bound of the gate (DEFAULT_GATE when the
    user gave none); a detection group is judged by its rows (misses_of)."""
    given = gate is not None
    gate = gate if gate is not None else DEFAULT_GATE
    misses = misses_of(gate, outputs)
    if gate.top1_drop is not None and not any("top1_agreement" in r or r.get("compared") == "as detections"
                                              for r in outputs):
        misses.append("top1 bound given, but no output is classifier-shaped (2-d [batch, classes])")
    if misses:
        measured = "; ".join(
            detection_words(r) if r.get("compared") == "as detections" else "{}: max abs error {:.4g}, cosine "
            "{:.6f}{}".format(r["name"], r["max_abs_error"], r["cosine"], ", top-1 agreement {:.2%}".format(
                r["top1_agreement"]) if "top1_agreement" in r else "")
            for r in outputs if r.get("compared") != "as detections" or r["name"] == r["group"])
        bound = "--max-accuracy-drop" if given else "the default accuracy gate of --quantize (cosine=0.99)"
        raise GateMissError("the quantized model misses {} on {}: {} (measured on {} held-out sample(s): {}); no "
                           "bundle was written".format(bound, where, "; ".join(misses), outputs[0]["samples"],
                                                       measured),
                           hint=GATE_MISS_HINT)


def detection_words(record: Dict[str, Any]) -> str:
    """A detection group's accuracy record in words."""
    return "{}: {} of {} detections matched (same label, IoU >= {:g}; worst {:.3f}), {} returned, scores within " \
           "{:.3g}".format(record["name"], record["rows_matched"], record["rows_expected"], DETECTION_IOU,
                           record["min_iou"], record["rows_returned"], record["max_score_error"])
