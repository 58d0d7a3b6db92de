"""Detectors as users hold them: NMS inside the bundle, checked against torch eager's post-processed result.

The NMS op against torchvision on random boxes, on every backend; ultralytics' YOLO11n exported unmodified (its
`forward(self, x, *args, **kwargs)`, anchors cached on the first call) and with `--nms`, against ultralytics' own
`non_max_suppression`; torchvision's SSDlite exported unmodified, against torchvision's own post-processing; a
torchvision detector whose post-processing edgedyn does not capture, failing at torchvision's own line; and
`edgedyn run --draw`. Detections are compared row by row after matching (runtime/detections.py), on fresh inputs.
"""
import linecache
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest
import torch

import edgedyn
import edgedyn.runtime as rt
from conftest import require, require_module
from detection_reference import padded_detections as _detections
from detection_reference import torchvision_result, ultralytics_result
from edgedyn.errors import BackendError, CaptureError
from edgedyn.runtime.detections import KEYS, compare_group, groups
from edgedyn.runtime.errors import GuardError
from edgedyn.runtime.program import FP32_TOLERANCE, flatten_outputs

pytestmark = pytest.mark.requires("torchvision")

FRESH = (1234, 1235, 1236)  # not the seed the capture drew its example inputs with
# The backends that take each model (TFLite's NMS has no classes: torchvision's batched NMS is refused there).
YOLO_BACKENDS = [pytest.param("onnxruntime", marks=pytest.mark.requires("onnxruntime", "onnxscript")),
                 pytest.param("openvino", marks=pytest.mark.requires("openvino", "onnxscript")),
                 pytest.param("portable"),
                 pytest.param("tflite", marks=pytest.mark.requires("ai_edge_litert", "tflite")),
                 pytest.param("tvm", marks=(pytest.mark.requires("tvm"), pytest.mark.zoo_full))]
SSD_BACKENDS = [pytest.param("onnxruntime", marks=pytest.mark.requires("onnxruntime", "onnxscript")),
                pytest.param("openvino", marks=pytest.mark.requires("openvino", "onnxscript")),
                pytest.param("portable"),
                pytest.param("tvm", marks=(pytest.mark.requires("tvm"), pytest.mark.zoo_full))]
SMALL_BACKENDS = ["portable", pytest.param("onnxruntime", marks=pytest.mark.requires("onnxruntime", "onnxscript")),
                  pytest.param("openvino", marks=pytest.mark.requires("openvino", "onnxscript")),
                  pytest.param("tflite", marks=pytest.mark.requires("ai_edge_litert", "tflite")),
                  pytest.param("tvm", marks=pytest.mark.requires("tvm"))]


def _boxes(seed: int, count: int = 400, labels: int = 7) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boxes that overlap often (so NMS has work), distinct scores, labels in range."""
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * 300
    size = torch.rand(count, 2, generator=generator) * 80 + 5
    return (torch.cat([corner, corner + size], 1), torch.rand(count, generator=generator),
            torch.randint(0, labels, (count,), generator=generator))


def _torchvision_keep(boxes: torch.Tensor, scores: torch.Tensor, labels: Any, iou: float, max_out: int) -> Any:
    import torchvision

    kept = (torchvision.ops.nms(boxes, scores, iou) if labels is None else
            torchvision.ops.batched_nms(boxes, scores, labels, iou))
    return kept[:max_out].numpy()


# --- the op itself -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_label", [False, True], ids=["agnostic", "per-label"])
def test_nms_op_equals_torchvision_on_its_valid_rows(per_label: bool) -> None:
    from edgedyn.frontend.nms import decomposed
    from edgedyn.runtime.kernels.detection import nms

    for seed in range(6):
        boxes, scores, labels = _boxes(seed)
        labels = labels if per_label else None
        for max_out in (1, 40, 500):
            want = _torchvision_keep(boxes, scores, labels, 0.45, max_out)
            keep, count = torch.ops.edgedyn.nms(boxes, scores, labels, 0.45, max_out)
            assert keep.shape == (max_out,) and keep.dtype == torch.int64 and count.shape == ()
            assert int(count) == len(want) and np.array_equal(keep[:int(count)].numpy(), want)
            assert not keep[int(count):].any(), "padding rows are 0"
            kept, found = nms(boxes.numpy(), scores.numpy(), None if labels is None else labels.numpy(), 0.45,
                              max_out)
            assert found == len(want) and np.array_equal(kept, keep.numpy())
            if max_out <= 40:  # the plain-op form unrolls max_out rounds
                plain, plain_count = decomposed(boxes, scores, labels, 0.45, max_out)
                assert int(plain_count) == len(want) and np.array_equal(plain.numpy(), keep.numpy())


def test_nms_candidates_are_the_finite_scores_and_ties_keep_index_order() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 9.0]])
    scores = torch.tensor([0.5, 0.5, float("-inf"), float("nan")])
    keep, count = torch.ops.edgedyn.nms(boxes, scores, None, 0.5, 4)
    assert int(count) == 1 and keep.tolist() == [0, 0, 0, 0]  # the first of two equal boxes with equal scores
    keep, count = torch.ops.edgedyn.nms(boxes, torch.tensor([0.1, 0.9, 0.8, 0.7]), None, 0.5, 4)
    assert int(count) == 2 and keep.tolist()[:2] == [1, 2]


class _Agnostic(torch.nn.Module):
    def forward(self, boxes: torch.Tensor, scores: torch.Tensor) -> Dict[str, torch.Tensor]:
        keep, count = torch.ops.edgedyn.nms(boxes, scores, None, 0.45, 60)
        return {"keep": keep, "count": count, "picked": boxes.index_select(0, keep)}


class _PerLabel(torch.nn.Module):
    def forward(self, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return torch.ops.edgedyn.nms(boxes, scores, labels, 0.5, 60)


@pytest.mark.parametrize("backend", SMALL_BACKENDS)
def test_every_backend_runs_the_nms_op_as_torchvision_does(backend: str, tmp_path: Path) -> None:
    path = edgedyn.export(_Agnostic(), _boxes(0)[:2], backend=backend, output=tmp_path / "agnostic.edgedyn")
    program = rt.load(path)
    for seed in FRESH:
        boxes, scores, _ = _boxes(seed)
        out = program(boxes.numpy(), scores.numpy())
        want = _torchvision_keep(boxes, scores, None, 0.45, 60)
        assert int(out["count"]) == len(want) and np.array_equal(out["keep"][:len(want)], want)
        assert np.array_equal(out["picked"], boxes.numpy()[out["keep"]])
    if backend == "tflite":
        with pytest.raises(BackendError, match="NON_MAX_SUPPRESSION_V4 has no classes"):
            edgedyn.export(_PerLabel(), _boxes(0), backend=backend, output=tmp_path / "per-label.edgedyn")
        return
    if backend == "openvino":  # labels given as an input size the class axis by their values: a dynamic dim
        with pytest.raises(BackendError, match=r"NonMaxSuppression scores dim: -1 is negative"):
            edgedyn.export(_PerLabel(), _boxes(0), backend=backend, output=tmp_path / "per-label.edgedyn")
        return
    program = rt.load(edgedyn.export(_PerLabel(), _boxes(0), backend=backend, output=tmp_path / "label.edgedyn"))
    for seed in FRESH:
        boxes, scores, labels = _boxes(seed)
        keep, count = program(boxes.numpy(), scores.numpy(), labels.numpy())
        want = _torchvision_keep(boxes, scores, labels, 0.5, 60)
        assert int(count) == len(want) and np.array_equal(keep[:len(want)], want)


# --- comparing detections ----------------------------------------------------------------------------------------


def _compare(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray], decided: Any = None) -> Dict[str, Any]:
    order = list(KEYS)
    return compare_group({key: i for i, key in enumerate(order)}, [got[k] for k in order],
                         [want[k] for k in order], FP32_TOLERANCE, decided)


@pytest.mark.parametrize("got, ok, why", [
    ([[3, 0.9, 0, 0, 10, 10], [5, 0.8, 20, 20, 40, 40]], True, ""),  # the same rows, in another order
    ([[5, 0.8, 20, 20, 40, 40], [3, 0.9, 0, 0, 10, 10]], True, ""),
    ([[3, 0.9, 0, 0, 10, 11], [5, 0.8, 20, 20, 40, 40]], False, "IoU >= 0.99"),  # a box moved by a pixel
    ([[4, 0.9, 0, 0, 10, 10], [5, 0.8, 20, 20, 40, 40]], False, "label 3"),  # another label
    ([[3, 0.95, 0, 0, 10, 10], [5, 0.8, 20, 20, 40, 40]], False, "score"),  # another score
    ([[3, 0.9, 0, 0, 10, 10]], False, "row 1 (label 5"),  # a row missing that no tolerance explains
    ([[3, 0.9, 0, 0, 10, 10], [5, 0.8, 20, 20, 40, 40], [1, 0.7, 50, 50, 60, 60]], False, "returned row 2"),
])
def test_detections_match_row_by_row(got: Any, ok: bool, why: str) -> None:
    want = [[3, 0.9, 0, 0, 10, 10], [5, 0.8, 20, 20, 40, 40]]
    result = _compare(_detections(got), _detections(want))
    assert result["ok"] is ok, result
    assert why in result.get("error", "")


def test_rows_a_decision_within_the_score_tolerance_explains_are_borderline_not_wrong() -> None:
    """A row kept on one side only is accepted when its score is that close to the threshold, to the last row of
    two full results, or to an overlapping row of the same label left on the other side (NMS kept the other of
    two near-equal boxes); one that nothing explains is a disagreement."""
    want = _detections([[3, 0.9, 0, 0, 10, 10], [5, 0.5, 20, 20, 40, 40]], size=2)
    threshold = _detections([[3, 0.9, 0, 0, 10, 10], [2, 0.25002, 60, 60, 70, 70]], size=2)
    assert not _compare(threshold, want)["ok"]  # no threshold known: nothing explains the new row
    result = _compare(_detections([[3, 0.9, 0, 0, 10, 10]], size=2), want, {"score_threshold": 0.5, "max_out": 2})
    assert result["ok"] and result["rows_borderline"] == 1
    cut = _detections([[3, 0.9, 0, 0, 10, 10], [2, 0.50002, 60, 60, 70, 70]], size=2)
    assert _compare(cut, want, {"score_threshold": 0.1, "max_out": 2})["rows_borderline"] == 2
    assert not _compare(cut, want, {"score_threshold": 0.1, "max_out": 3})["ok"]  # not full: no cut
    swap = _detections([[3, 0.9, 0, 0, 10, 10], [5, 0.50003, 22, 20, 42, 40]], size=2)
    assert _compare(swap, want)["ok"]
    moved = _detections([[3, 0.9, 0, 0, 10, 10], [5, 0.5, 22, 20, 42, 40]], size=2)  # same score: not a swap
    assert not _compare(moved, want)["ok"]


def _gate_misses(got: Any, want: Any, bound: str = "") -> Any:
    """The float gate's record of one detection group (outputs in KEYS order, one sample) and what it misses."""
    from edgedyn.quantize.accuracy import detection_metrics, misses_of, parse_gate
    from edgedyn.quantize.precision import FLOAT_GATE

    order = list(KEYS)
    found = detection_metrics({key: i for i, key in enumerate(order)}, [[got[k] for k in order]],
                              [[want[k] for k in order]])
    records = [dict(found, name=key, group="boxes", compared="as detections", cosine=0.0) for key in order]
    return found, misses_of(parse_gate(bound) or FLOAT_GATE, records)


def test_the_float_gate_judges_detections_by_their_rows_not_by_the_cosine_of_padded_outputs() -> None:
    """A reduced precision of a detector with NMS inside is gated by matched rows (same label, IoU >= 0.5): rows
    in another order pass (the padded outputs' cosine would not), a box moved beyond IoU 0.5, a lost or an extra
    row among few do not; `top1=` of --max-accuracy-drop sets the share; no detections at all measure nothing."""
    rows = [[label % 3, 0.3 + 0.01 * label, 30 * label, 0, 30 * label + 20, 20] for label in range(20)]
    want = _detections(rows, size=30)
    found, misses = _gate_misses(_detections(rows[::-1], size=30), want)
    assert found["rows_matched"] == 20 and found["row_agreement"] == 1.0 and not misses
    shifted = [row[:2] + [row[2] + 3, row[3], row[4] + 3, row[5]] if i == 4 else row for i, row in enumerate(rows)]
    found, misses = _gate_misses(_detections(shifted, size=30), want)  # 3 px on a 20 px box: IoU 0.74, the same one
    assert found["rows_matched"] == 20 and abs(found["min_iou"] - 17 / 23) < 1e-6 and not misses
    moved = [row[:2] + [row[2] + 12, row[3], row[4] + 12, row[5]] if i == 4 else row for i, row in enumerate(rows)]
    found, misses = _gate_misses(_detections(moved, size=30), want)  # 12 px: IoU 0.25, another box
    assert found["rows_matched"] == 19 and misses == [
        "boxes: 19 of 20 expected detections matched (same label, IoU >= 0.5), 20 returned: 5.0% of rows differ, "
        "more than 2%"]
    assert not _gate_misses(_detections(moved, size=30), want, "top1=5%")[1]
    extra = rows + [[1, 0.26, 0, 100, 10, 110]]
    found, misses = _gate_misses(_detections(extra, size=30), want)
    assert (found["rows_returned"], found["rows_matched"]) == (21, 20) and "4.8% of rows differ" in misses[0]
    nothing = _detections([], size=30)
    assert "torch returns no detections on the gate's inputs" in _gate_misses(nothing, nothing)[1][0]
    broken = dict(want, count=np.asarray(np.nan))  # a broken candidate's count reads as no rows, not an exception
    found, misses = _gate_misses(broken, want)
    assert (found["rows_returned"], found["rows_matched"]) == (0, 0) and "100.0% of rows differ" in misses[0]


def test_the_int8_gate_judges_detections_by_their_rows_too() -> None:
    """--quantize's gate (default cosine=0.99) compares a detection group by its rows as the float gate does: the
    same rows in another order pass though their padded outputs' cosine is far below 0.99; a moved box fails, and
    the error gives the rows."""
    from edgedyn.errors import EdgedynError
    from edgedyn.quantize.accuracy import check, compare_outputs

    rows = [[label % 3, 0.3 + 0.01 * label, 30 * label, 0, 30 * label + 20, 20] for label in range(20)]
    want = _detections(rows, size=30)
    order = list(KEYS)

    def outputs(got: Any) -> Any:
        return compare_outputs(order, [[got[k][None] for k in order]], [[want[k][None] for k in order]])

    reordered = outputs(_detections(rows[::-1], size=30))
    assert reordered[0]["cosine"] < 0.99 and reordered[0]["rows_matched"] == 20
    check(None, reordered, "m (onnxruntime)")  # passes
    moved = [row[:2] + [row[2] + 12, row[3], row[4] + 12, row[5]] if i == 4 else row for i, row in enumerate(rows)]
    with pytest.raises(EdgedynError) as raised:
        check(None, outputs(_detections(moved, size=30)), "m (onnxruntime)")
    assert raised.value.message.startswith(
        "the quantized model misses the default accuracy gate of --quantize (cosine=0.99) on m (onnxruntime): boxes: "
        "19 of 20 expected detections matched (same label, IoU >= 0.5), 20 returned: 5.0% of rows differ")
    assert "boxes: 19 of 20 detections matched (same label, IoU >= 0.5; worst" in raised.value.message


def test_yolo_in_bf16_is_refused_by_its_detections(yolo: Any, tmp_path: Path) -> None:
    """bf16 rounds YOLO's pixel coordinates by 2-4 pixels inside NMS: its raw head passes cosine 0.999, its
    detections do not. The export asked for bf16 fails with the rows; auto keeps fp32."""
    from edgedyn.runtime import precision as precisions
    from edgedyn.zoo import detectors

    require(precisions.is_native("bf16", "x86_64", precisions.host_features()), "needs a CPU with AVX512_BF16 or AMX",
            "run it on such a CPU (Zen 4, Cooper Lake, Sapphire Rapids or newer)")
    require_module("openvino")
    from edgedyn.errors import EdgedynError

    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(yolo, detectors.example_inputs("yolo11n"), backend="openvino", precision="bf16",
                       nms=detectors.get("yolo11n").nms, output=tmp_path / "m.edgedyn")
    assert "openvino:bf16 in bf16 misses the float accuracy gate" in raised.value.message
    assert "expected detections matched (same label, IoU >= 0.5)" in raised.value.message
    assert not (tmp_path / "m.edgedyn").exists()


def test_detection_groups_are_found_by_name() -> None:
    names = ["0.boxes", "0.scores", "0.labels", "0.count", "boxes", "scores", "labels", "count", "keypoints",
             "proto.x", "logits"]
    found = groups(names)
    assert found[0] == {"boxes": 0, "scores": 1, "labels": 2, "count": 3}
    assert found[1] == {"boxes": 4, "scores": 5, "labels": 6, "count": 7, "keypoints": 8, "logits": 10}


# --- ultralytics YOLO11n -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def yolo() -> Any:
    require_module("ultralytics")
    from edgedyn.zoo import detectors

    return detectors.build("yolo11n")


@pytest.fixture(scope="module")
def yolo_bundle(yolo: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The zoo's YOLO11n exported with --nms for a backend, once per backend."""
    from edgedyn.zoo import detectors

    cache = {}  # type: Dict[str, Path]
    folder = tmp_path_factory.mktemp("yolo")

    def export(backend: str) -> Path:
        if backend not in cache:
            cache[backend] = edgedyn.export(yolo, detectors.example_inputs("yolo11n"), backend=backend,
                                            nms=detectors.get("yolo11n").nms,
                                            output=folder / "yolo11n-{}.edgedyn".format(backend))
        return cache[backend]
    return export


def assert_same_detections(program: Any, args: Tuple[np.ndarray, ...], want: Dict[str, np.ndarray],
                           prefix: str = "") -> Dict[str, Any]:
    """The bundle's detections on `args` match `want` row for row: count equal, no row left over."""
    spec = program.specializations[0]
    names = [record["name"] for record in spec.outputs]
    flat = flatten_outputs(spec.output_tree, program(*args))
    order = list(KEYS)
    result = compare_group({key: i for i, key in enumerate(order)},
                           [flat[names.index(prefix + key)] for key in order], [want[key] for key in order],
                           FP32_TOLERANCE)
    assert result["ok"] and result["rows_borderline"] == 0, result
    assert int(np.sum(want["count"])) == result["rows_matched"]
    return result


@pytest.mark.parametrize("backend", YOLO_BACKENDS)
def test_yolo_with_nms_matches_ultralytics_on_fresh_inputs(yolo: Any, yolo_bundle: Any, backend: str) -> None:
    from edgedyn.zoo import detectors

    program = rt.load(yolo_bundle(backend))
    assert [r["name"] for r in program.specializations[0].outputs] == ["boxes", "scores", "labels", "count"]
    matched = 0
    for seed in FRESH:
        image = detectors.example_inputs("yolo11n", seed=seed)["x"]
        matched += assert_same_detections(program, (image.numpy(),), ultralytics_result(yolo, image))["rows_matched"]
    assert matched >= 10  # boxes were found and compared, not only empty results


def test_nms_thresholds_are_specialized_and_guarded(yolo_bundle: Any) -> None:
    program = rt.load(yolo_bundle("portable"))
    constants = {p["name"]: p.get("default") for p in program.signature if p["kind"] == "constant"}
    assert constants == {"iou": 0.45, "conf": 0.25, "max_det": 300}
    image = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
    with pytest.raises(GuardError) as info:
        program(image, conf=0.5)
    assert "captured with conf == 0.25, got 0.5" in info.value.message
    assert '"conf=0.5"' in info.value.hint  # the export that adds it


def test_ultralytics_forward_with_args_is_captured_and_its_cached_anchors_follow_each_shape() -> None:
    """`forward(self, x, *args, **kwargs)`: x captured by name, *args left empty; the Detect head caches its
    anchors on the module at the first call, and each specialization (two sizes here) gets its own."""
    require_module("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", verbose=False).eval()  # never called before the capture
    captured = edgedyn.capture(model, inputs=["x=1x3x256x256", "x=1x3x320x320"])
    assert captured.signature == [{"name": "x", "kind": "tensor"}]
    for spec, anchors in zip(captured.specializations, (1344, 2100)):
        assert spec.reference_outputs[0].shape == (1, 84, anchors)
        fresh = torch.rand(spec.example_tensors[0].shape, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            want = model(fresh)[0]
        got = spec.program.module()(fresh)[0]
        np.testing.assert_allclose(got.detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-4)


def test_a_forward_of_only_args_is_refused() -> None:
    class Stacked(torch.nn.Module):
        def forward(self, *images: torch.Tensor) -> torch.Tensor:
            return torch.stack(images)

    with pytest.raises(CaptureError, match=r"Stacked takes only \*images; edgedyn needs named arguments"):
        edgedyn.capture(Stacked(), (torch.randn(2),))


def test_nms_options_are_checked() -> None:
    from edgedyn.frontend.detection import parse_nms

    assert parse_nms("iou=0.5,conf=0.3,max_det=100,agnostic").max_det == 100
    for text, message in (("iou=2", "iou=2.0: give a number from 0 to 1"), ("max_det=0", "max_det=0"),
                          ("thresh=0.5", "unknown setting 'thresh'"), ("conf=high", "is not a number")):
        with pytest.raises(CaptureError, match=message):
            parse_nms(text)


def test_run_draws_the_detections_on_the_photo(yolo_bundle: Any, run_cli: Any, tmp_path: Path) -> None:
    """`edgedyn run BUNDLE -i x=photo --draw out.png`: the table lists the boxes and the written image has each
    box's outline in its label's colour, scaled from the model's 320x320 input to the photo's size."""
    import json

    from PIL import Image

    from edgedyn.cli.detections import PALETTE

    photo = tmp_path / "photo.png"
    Image.fromarray(np.full((240, 480, 3), 128, np.uint8)).save(str(photo))  # grey: any box drawn shows
    bundle = yolo_bundle("onnxruntime")
    done = run_cli("run", str(bundle), "-i", "x={}".format(photo), "--draw", str(tmp_path / "out.png"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = report["detections"]
    assert report["drawn"]["boxes"] == len(rows) > 0
    drawn = np.asarray(Image.open(str(tmp_path / "out.png")).convert("RGB"))
    inside = [r for r in rows if min(r["box"]) >= 0 and max(r["box"]) < 319]
    assert inside, rows
    x1, y1, x2, y2 = inside[-1]["box"]
    edge = int(y2 * 240 / 320)  # the outline's bottom edge, at the box's middle
    colours = {tuple(drawn[line, int((x1 + x2) / 2 * 480 / 320)]) for line in (edge - 1, edge, edge + 1)}
    assert colours & set(PALETTE), colours
    assert np.count_nonzero(np.any(drawn != 128, axis=2)) > 100
    jpeg = run_cli("run", str(bundle), "-i", "x={}".format(photo), "--draw", str(tmp_path / "out.jpg"))
    assert jpeg.returncode == 0 and "label" in jpeg.stdout and "score" in jpeg.stdout, jpeg.stderr
    assert Image.open(str(tmp_path / "out.jpg")).size == (480, 240)


# --- torchvision -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssd() -> Any:
    from edgedyn.zoo import detectors

    return detectors.build("ssdlite320")


@pytest.mark.parametrize("backend", SSD_BACKENDS)
def test_ssdlite_exported_unmodified_matches_torchvision(ssd: Any, backend: str, tmp_path: Path) -> None:
    from edgedyn.zoo import detectors

    path = edgedyn.export(ssd, detectors.example_inputs("ssdlite320"), backend=backend,
                          output=tmp_path / "ssdlite.edgedyn")
    program = rt.load(path)
    assert [r["name"] for r in program.specializations[0].outputs] == ["0.boxes", "0.scores", "0.labels", "0.count"]
    for seed in FRESH[:2]:
        image = detectors.example_inputs("ssdlite320", seed=seed)["images"]
        assert_same_detections(program, (image.numpy(),), torchvision_result(ssd, image), prefix="0.")


@pytest.mark.requires("ai_edge_litert", "tflite")
def test_ssdlite_on_tflite_is_refused_naming_the_op_and_the_alternatives(ssd: Any, tmp_path: Path) -> None:
    from edgedyn.zoo import detectors

    with pytest.raises(BackendError) as info:
        edgedyn.export(ssd, detectors.example_inputs("ssdlite320"), backend="tflite", output=tmp_path / "s.edgedyn")
    assert "NMS per label" in info.value.message and "NON_MAX_SUPPRESSION_V4 has no classes" in info.value.message
    assert "onnxruntime" in info.value.hint


def test_a_capture_failure_inside_torchvision_names_torchvisions_line() -> None:
    """Faster R-CNN's proposals go through post-processing edgedyn does not rewrite: the error names the line of
    torchvision that branches on values (the innermost frame), shows it, and says the branch is not the user's."""
    import torchvision
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval()
    with pytest.raises(CaptureError) as info:
        edgedyn.capture(model, inputs=["images=1x3x320x320"])
    message = info.value.message
    assert message.startswith("FasterRCNN branches on tensor values at torchvision/"), message
    where = message.split(" at ", 1)[1].split(" ", 1)[0]  # torchvision/ops/boxes.py:103
    path, line = where.rsplit(":", 1)
    code = linecache.getline(str(Path(torchvision.__file__).parent.parent / path), int(line)).strip()
    assert code and "\n    {}".format(code) in message
    assert "in torchvision's " in message
    assert "the branch is in torchvision, not in your code" in info.value.hint


def test_a_users_own_branch_is_still_named_at_the_users_line() -> None:
    def branchy(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x

    with pytest.raises(CaptureError) as info:
        edgedyn.capture(branchy, (torch.randn(3),))
    assert "at {}:{}".format(__file__, branchy.__code__.co_firstlineno + 1) in info.value.message
    assert "in torchvision" not in info.value.hint
