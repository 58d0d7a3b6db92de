"""Pre-processing in the bundle (`export --preprocess`, edgedyn/runtime/frames.py): a camera frame in, detections in
the frame's pixels out.

The resize and letterbox against ultralytics' own LetterBox and OpenCV's resize (within one grey level: OpenCV
interpolates in fixed point), the box and keypoint mapping against ultralytics' scale_boxes / scale_coords, and
YOLO11n exported with --nms and --preprocess against torch eager on the letterboxed frame, mapped back by
ultralytics. Then the errors: bad options at export, bad frames at call time, bad records in the manifest, and
threads calling with frames of different sizes at once.
"""
import json
import threading
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

import edgedyn
import edgedyn.runtime as rt
from conftest import require_module
from edgedyn.errors import EdgedynError
from edgedyn.runtime.errors import BundleError, GuardError
from edgedyn.runtime.frames import Frames, place, resize_bilinear

# (height, width): landscape, portrait, odd sizes, an upscale, one equal to the model's input
FRAME_SIZES = ((480, 640), (720, 1280), (333, 517), (640, 360), (150, 200), (320, 320), (7, 900))
FRESH_SEED = 4321
TINY_CNN = str(Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.py") + ":TinyCNN"  # 1x3x64x64 in


def _frame(height: int, width: int, seed: int = FRESH_SEED) -> np.ndarray:
    """A frame with structure at every scale (smooth gradients and noise), so resampling errors show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255.0 / max(width - 1, 1), y * 255.0 / max(height - 1, 1),
                       127.5 + 127.5 * np.sin(x / 9.0 + y / 13.0)], axis=2)
    return np.clip(smooth + rng.normal(0, 40, smooth.shape), 0, 255).astype(np.uint8)


def _frames(resize: str = "letterbox", normalize: str = "none", order: str = "rgb", size: Any = (320, 320),
            max_frame: Any = (4096, 4096)) -> Frames:
    record = {"input": "x", "resize": resize, "size": list(size), "pad": 114, "normalize": normalize, "order": order,
              "max_frame": list(max_frame)}
    return Frames(record, [{"name": "x", "kind": "tensor"}])


@pytest.mark.requires("ultralytics", "cv2")
@pytest.mark.parametrize("shape", FRAME_SIZES, ids=["x".join(map(str, s)) for s in FRAME_SIZES])
def test_letterbox_matches_ultralytics_within_one_grey_level(shape: Any) -> None:
    from ultralytics.data.augment import LetterBox

    frame = _frame(*shape)
    want = LetterBox((320, 320), auto=False)(image=frame).astype(np.float32)
    got, placement = _frames().prepare(frame)
    difference = np.abs(got[0].transpose(1, 2, 0) - want)
    assert difference.max() <= 1.0 and difference.mean() < 0.2, (difference.max(), difference.mean(), placement)


@pytest.mark.requires("cv2")
@pytest.mark.parametrize("to", [(320, 320), (224, 300), (640, 1280), (33, 17)])
def test_bilinear_resize_matches_opencv_within_one_grey_level(to: Any) -> None:
    import cv2

    for shape in ((480, 640), (101, 77)):
        frame = _frame(*shape)
        want = cv2.resize(frame, (to[1], to[0]), interpolation=cv2.INTER_LINEAR).astype(np.float32)
        got = resize_bilinear(frame, *to)
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.abs(got - want).max() <= 1.0, (shape, to, np.abs(got - want).max())


def test_stretch_bgr_and_normalizations_are_the_same_frame_transformed() -> None:
    """stretch resizes to the input exactly; order=bgr takes the frame's channels reversed; unit is /255 and
    imagenet is unit with ImageNet's mean and std: each checked against the plain 0-255 RGB result."""
    frame = _frame(480, 640)
    plain, placement = _frames(resize="stretch").prepare(frame)
    assert placement[:4] == (320 / 480, 320 / 640, 0, 0)
    assert np.array_equal(plain[0].transpose(1, 2, 0), resize_bilinear(frame, 320, 320))
    assert np.array_equal(_frames(resize="stretch", order="bgr").prepare(frame[:, :, ::-1].copy())[0], plain)
    unit = _frames(resize="stretch", normalize="unit").prepare(frame)[0]
    np.testing.assert_allclose(unit, plain / 255.0, rtol=1e-6)
    imagenet = _frames(resize="stretch", normalize="imagenet").prepare(frame)[0]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(imagenet, (plain / 255.0 - mean[None, :, None, None]) / std[None, :, None, None],
                               rtol=1e-5, atol=1e-5)
    assert plain.flags.c_contiguous and plain.dtype == np.float32 and plain.shape == (1, 3, 320, 320)


@pytest.mark.requires("ultralytics")
@pytest.mark.parametrize("shape", FRAME_SIZES, ids=["x".join(map(str, s)) for s in FRAME_SIZES])
def test_boxes_and_keypoints_map_back_as_ultralytics_does(shape: Any) -> None:
    """Valid rows only (rows past `count` stay as the model gave them), clipped to the frame; ultralytics computes
    its placement from the frame's shape alone, and it must agree with the letterbox's."""
    import torch
    from ultralytics.utils.ops import scale_boxes, scale_coords

    rng = np.random.default_rng(sum(shape))
    corners = rng.uniform(-20, 340, (1, 50, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + rng.uniform(1, 120, (1, 50, 2)).astype(np.float32)], axis=2)
    keypoints = rng.uniform(-20, 340, (1, 50, 17, 3)).astype(np.float32)
    outputs = [boxes, np.ones((1, 50), np.float32), np.zeros((1, 50), np.int64), np.array([37]), keypoints]
    names = ["boxes", "scores", "labels", "count", "keypoints"]
    placement = place(shape[0], shape[1], 320, 320, "letterbox")
    got = _frames().restore(names, outputs, placement)
    want_boxes = scale_boxes((320, 320), torch.from_numpy(boxes[0, :37].copy()), shape).numpy()
    want_points = scale_coords((320, 320), torch.from_numpy(keypoints[0, :37, :, :2].copy()), shape).numpy()
    np.testing.assert_allclose(got[0][0, :37], want_boxes, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(got[4][0, :37, :, :2], want_points, rtol=1e-5, atol=1e-3)
    assert np.array_equal(got[0][0, 37:], boxes[0, 37:]) and np.array_equal(got[4][0, :, :, 2], keypoints[0, :, :, 2])
    assert np.array_equal(outputs[0], boxes), "the executor's arrays are not changed in place"


@pytest.fixture(scope="module")
def yolo_frames(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """The zoo's YOLO11n (320) exported with --nms and --preprocess letterbox on onnxruntime."""
    require_module("ultralytics")
    require_module("onnxruntime")
    from edgedyn.zoo import detectors

    model = detectors.build("yolo11n")
    path = edgedyn.export(model, detectors.example_inputs("yolo11n"), backend="onnxruntime",
                          nms=detectors.get("yolo11n").nms, preprocess="letterbox,max=1280x720",
                          output=tmp_path_factory.mktemp("frames") / "yolo11n-frames.edgedyn")
    return {"model": model, "path": path}


@pytest.mark.requires("torchvision", "ultralytics", "onnxruntime")
@pytest.mark.requires("torchvision", "ultralytics", "onnxruntime")
def test_yolo_with_preprocess_matches_torch_eager_on_the_letterboxed_frame(yolo_frames: Dict[str, Any]) -> None:
    """bundle(frame) against torch eager: the model on the same letterboxed tensor, ultralytics' NMS, and
    ultralytics' scale_boxes back to the frame. A 300x320 frame of noise is padded, not resampled: resampling
    smooths noise, and the zoo's random weights then saturate hundreds of scores at 1.0, where NMS among ties is
    decided by float rounding (the next test covers resampled frames, bundle against bundle)."""
    import torch
    from ultralytics.utils.ops import scale_boxes

    from detection_reference import ultralytics_result
    from edgedyn.runtime.detections import KEYS, compare_group
    from edgedyn.runtime.program import FP32_TOLERANCE

    program = rt.load(str(yolo_frames["path"]))
    frame = np.random.default_rng(FRESH_SEED).integers(0, 256, (300, 320, 3), dtype=np.uint8)  # like the zoo's
    tensor, placement = program.frames.prepare(frame)
    assert placement[:4] == (1.0, 1.0, 10, 0), placement
    want = {key: value[0] for key, value in ultralytics_result(yolo_frames["model"], torch.from_numpy(tensor)).items()}
    count = int(want["count"])
    assert count > 0
    want["boxes"] = want["boxes"].copy()
    want["boxes"][:count] = scale_boxes((320, 320), torch.from_numpy(want["boxes"][:count].copy()), (300, 320)).numpy()
    got = program(frame)
    result = compare_group({key: i for i, key in enumerate(KEYS)}, [got[key][0] for key in KEYS],
                           [want[key] for key in KEYS], FP32_TOLERANCE)
    assert result["ok"] and result["rows_matched"] == count and result["rows_borderline"] == 0, result


@pytest.mark.requires("ultralytics", "onnxruntime")
@pytest.mark.parametrize("shape", [(310, 330), (330, 310), (480, 640), (720, 1280)],
                         ids=["landscape", "portrait", "vga", "hd"])
def test_a_frame_gives_the_detections_of_its_letterboxed_tensor_in_the_frames_pixels(yolo_frames: Dict[str, Any],
                                                                                     shape: Any) -> None:
    """bundle(frame) == bundle(letterboxed tensor) with ultralytics' scale_boxes applied: the same rows, in order.
    The model's own float input still works and is not mapped."""
    import torch
    from ultralytics.utils.ops import scale_boxes

    program = rt.load(str(yolo_frames["path"]))
    frame = _frame(*shape)
    tensor, placement = program.frames.prepare(frame)
    assert placement[0] < 1 or placement[0] > 1, placement
    on_tensor = program(tensor)
    got = program(frame)
    count = int(got["count"][0])
    assert count == int(on_tensor["count"][0]) > 0
    want = scale_boxes((320, 320), torch.from_numpy(on_tensor["boxes"][0, :count].copy()), shape).numpy()
    np.testing.assert_allclose(got["boxes"][0, :count], want, rtol=1e-5, atol=1e-3)
    for key in ("scores", "labels"):
        assert np.array_equal(got[key], on_tensor[key])
    assert got["boxes"][0, :count, 0::2].max() <= shape[1] and got["boxes"][0, :count, 1::2].max() <= shape[0]
    assert np.array_equal(program(x=frame, conf=0.25)["boxes"], got["boxes"]), "by name, beside other arguments"


@pytest.mark.requires("ultralytics", "onnxruntime")
def test_frames_outside_the_bundles_bounds_are_guard_errors(yolo_frames: Dict[str, Any]) -> None:
    program = rt.load(str(yolo_frames["path"]))
    with pytest.raises(GuardError, match=r"a 1281x720 frame \(width x height\) is larger than the bundle takes, "
                                         r"1280x720") as raised:
        program(np.zeros((720, 1281, 3), np.uint8))
    assert "max=1281x720" in raised.value.hint
    for bad in (np.zeros((100, 100, 4), np.uint8), np.zeros((100, 100), np.uint8), np.zeros((0, 5, 3), np.uint8)):
        with pytest.raises(GuardError, match="a frame is uint8 of shape|larger than the bundle takes"):
            program(bad)


@pytest.mark.requires("ultralytics", "onnxruntime")
def test_threads_calling_with_frames_of_different_sizes_get_their_own_detections(yolo_frames: Dict[str, Any]) -> None:
    program = rt.load(str(yolo_frames["path"]))
    frames = [_frame(*shape, seed=i) for i, shape in enumerate(((480, 640), (720, 1280), (333, 517), (640, 360)))]
    alone = [program(frame) for frame in frames]
    results = {}  # type: Dict[int, Any]
    errors = []

    def call(index: int) -> None:
        try:
            for _ in range(3):
                results[index] = program(frames[index % len(frames)])
                expected = alone[index % len(frames)]
                assert all(np.array_equal(results[index][k], expected[k]) for k in expected)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


@pytest.mark.requires("ultralytics", "onnxruntime", "PIL")
def test_run_on_a_photo_gives_boxes_in_its_pixels_and_draws_them(yolo_frames: Dict[str, Any], run_cli: Any,
                                                                  tmp_path: Path) -> None:
    from PIL import Image

    photo = tmp_path / "photo.png"
    frame = _frame(300, 500)
    Image.fromarray(frame).save(str(photo))
    done = run_cli("run", str(yolo_frames["path"]), "-i", "x={}".format(photo), "--draw", str(tmp_path / "out.png"),
                   "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["detections"]
    got = rt.load(str(yolo_frames["path"]))(frame)
    assert len(rows) == int(got["count"][0]) > 0
    np.testing.assert_allclose([row["box"] for row in rows], got["boxes"][0, :len(rows)], rtol=1e-6)
    assert Image.open(str(tmp_path / "out.png")).size == (500, 300)
    refused = run_cli("run", str(yolo_frames["path"]), "-i", "x={}".format(photo), "--preprocess", "unit")
    assert refused.returncode == 2 and "pre-processes images itself" in refused.stderr, refused.stderr
    shown = run_cli("inspect", str(yolo_frames["path"]))
    assert "letterboxed to 320x320" in shown.stdout and "up to 1280 wide and 720 high" in shown.stdout
    timed = run_cli("bench", str(yolo_frames["path"]), "--image", str(photo), "--iterations", "3", "--warmup", "1",
                    "--duration", "0", "--json", "-")
    assert timed.returncode == 0, timed.stderr
    pre = json.loads(timed.stdout)["pipeline"]["preprocess"]
    assert pre["preprocess"] == "in the bundle" and pre["steps"] == "decode 500x300, the bundle's letterbox to 320x320"


@pytest.mark.requires("ultralytics", "onnxruntime", "PIL")
def test_run_letterboxes_the_photo_once(yolo_frames: Dict[str, Any], tmp_path: Path, monkeypatch: Any) -> None:
    """`edgedyn run` names the specialization it ran: it routes the call once (it dispatched, then called: every
    frame was resized and padded twice)."""
    from PIL import Image
    from typer.testing import CliRunner

    from edgedyn.cli.main import app
    from edgedyn.runtime.frames import Frames

    photo = tmp_path / "photo.png"
    Image.fromarray(_frame(300, 500)).save(str(photo))
    prepared, original = [], Frames.prepare
    monkeypatch.setattr(Frames, "prepare", lambda self, frame: prepared.append(frame.shape) or original(self, frame))
    done = CliRunner().invoke(app, ["run", str(yolo_frames["path"]), "-i", "x={}".format(photo), "--json"])
    assert done.exit_code == 0, done.output
    assert prepared == [(300, 500, 3)]


@pytest.mark.parametrize("option, message", [
    ("resize", "name one resize first, letterbox or stretch"),
    ("letterbox,stretch", "name one resize first"),
    ("letterbox,normalize=imagenet2", "normalize=imagenet2: choose from unit, imagenet, none"),
    ("letterbox,max=1920", "max=1920: expected WIDTHxHEIGHT"),
    ("letterbox,pad=300", "pad=300: expected a whole number from 0 to 255"),
    ("letterbox,colour=rgb", "unknown option colour"),
    ("letterbox=640", "letterbox=640x640 but the model's input x is 1x3x64x64"),
    ("letterbox,input=y", "input=y: the model's tensor inputs are x"),
])
def test_bad_preprocess_options_fail_before_capture_work_with_a_hint(option: str, message: str) -> None:
    with pytest.raises(EdgedynError, match=message.replace("(", r"\(")) as raised:
        edgedyn.export(TINY_CNN, inputs=["x=1x3x64x64"], backend="portable", preprocess=option, verify=False)
    assert raised.value.hint


def test_preprocess_needs_one_image_input(run_cli: Any, tmp_path: Path) -> None:
    model = tmp_path / "two.py"
    model.write_text("import torch\nclass Two(torch.nn.Module):\n    def forward(self, a, b):\n"
                     "        return a.mean() + b.mean()\n")
    done = run_cli("export", "{}:Two".format(model), "--input", "a=1x3x8x8", "--input", "b=1x3x8x8",
                   "--backend", "portable", "--preprocess", "stretch", "-o", str(tmp_path / "two.edgedyn"))
    assert done.returncode == 2 and "error: --preprocess: the model has 2 inputs of shape 1x3xHxW" in done.stderr
    assert "hint: name the image with input=NAME" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def tiny_cnn() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("edgedyn_example_tiny_cnn", TINY_CNN.rpartition(":")[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyCNN().eval()


@pytest.fixture(scope="module")
def stretched(tiny_cnn: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_cnn (a classifier at 1x3x64x64) with stretch + ImageNet normalization, on the portable executor."""
    return edgedyn.export(tiny_cnn, inputs=["x=1x3x64x64"], backend="portable", preprocess="stretch,normalize=imagenet,order=bgr",
                          output=tmp_path_factory.mktemp("stretch") / "tiny.edgedyn")


def test_a_classifier_takes_frames_and_equals_the_model_on_the_prepared_tensor(stretched: Path, tiny_cnn: Any) -> None:
    import torch

    program = rt.load(str(stretched))
    frame = _frame(240, 320)
    tensor, _ = program.frames.prepare(frame)
    with torch.no_grad():
        want = tiny_cnn(torch.from_numpy(tensor))
    want = (want if isinstance(want, torch.Tensor) else next(iter(want.values()))).numpy()
    got = program(frame)
    got = got if isinstance(got, np.ndarray) else next(iter(got.values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert program.verify(), "verify still runs the stored float reference"


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(resize="crop"), "preprocess.resize"),
    (lambda r: r.update(size=[64, 65]), "not float32 1x3x64x65"),
    (lambda r: r.update(max_frame=[0, 10]), r"preprocess.max_frame\[0\]"),
    (lambda r: r.update(max_frame=[10, 10 ** 9]), r"preprocess.max_frame\[1\]"),
    (lambda r: r.update(input="nothing"), "preprocess.input"),
    (lambda r: r.pop("order"), "lacks"),
    (lambda r: r.update(pad=-1), "preprocess.pad"),
    (lambda r: r.update(size="64"), "preprocess.size"),
])
def test_a_bad_preprocess_record_is_refused_at_load(stretched: Path, tmp_path: Path, edit: Any, message: str) -> None:
    fuzz = _fuzz()
    members = fuzz.read_members(stretched.read_bytes())
    manifest = json.loads(dict(members)[fuzz.MANIFEST])
    edit(manifest["preprocess"])
    path = tmp_path / "edited.edgedyn"
    path.write_bytes(fuzz.write_members(fuzz.with_manifest(members, manifest)))
    with pytest.raises(BundleError, match=message):
        rt.load(str(path))


def test_random_edits_of_the_preprocess_record_load_or_are_refused_cleanly(stretched: Path, tmp_path: Path) -> None:
    """The fuzz harness's JSON edits aimed at the record: every one loads and runs a frame, or is a BundleError."""
    import random

    fuzz = _fuzz()
    members = fuzz.read_members(stretched.read_bytes())
    original = json.loads(dict(members)[fuzz.MANIFEST])
    rng = random.Random(7)
    outcomes = {"ok": 0, "refused": 0}
    for number in range(60):
        manifest = json.loads(json.dumps(original))
        manifest["preprocess"], _ = fuzz.edit_json(manifest["preprocess"], rng)
        path = tmp_path / "m{}.edgedyn".format(number)
        path.write_bytes(fuzz.write_members(fuzz.with_manifest(members, manifest)))
        try:
            program = rt.load(str(path))
            program(_frame(48, 80))
            outcomes["ok"] += 1
        except rt.EdgedynError:
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 20, outcomes


def _fuzz() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("edgedyn_fuzz", str(Path(__file__).parents[1] / "scripts" / "fuzz.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
