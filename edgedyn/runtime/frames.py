"""Pre-processing carried in the bundle (`edgedyn export --preprocess`): the bundle takes a camera frame as it comes
and maps its detections back onto it, so a camera loop on the board is `detections = program(frame)`.

The manifest's `preprocess` record names one image input of the model (shape 1x3xHxW in every specialization) and
says how a frame becomes that tensor:
- `resize`: "letterbox" (scaled to fit, aspect kept, centred on a `pad`-valued canvas: what YOLO models were trained
  with) or "stretch" (scaled to HxW, aspect not kept: torchvision's detectors and most classifiers);
- `normalize`: "unit" (pixel / 255), "imagenet" (then ImageNet's mean and std) or "none" (0-255 as float32);
- `order`: "rgb" or "bgr", the frame's channel order (OpenCV's frames are BGR; the model takes RGB);
- `max_frame`: [height, width], the largest frame accepted (a bigger one is a GuardError, not an allocation;
  written width x height in messages and in `--preprocess max=`, as camera resolutions are).
A frame is a uint8 array of shape (height, width, 3). Anything else passed for that input (the model's own float
tensor) goes to the model unchanged, so `verify` and callers who pre-process themselves work as before.

Resizing is bilinear with half-pixel centres, rounded to 0-255 like OpenCV's INTER_LINEAR on uint8 images, which
ultralytics' and most pipelines' pre-processing use (within one grey level: OpenCV interpolates in fixed point).
Detection outputs (runtime/detections.py) come back in the frame's pixels: each valid row's box, and keypoints'
x and y, are un-padded, un-scaled and clipped to the frame, as ultralytics' `scale_boxes` does. Other outputs
(segmentation prototypes, raw heads) stay in the model's coordinates.

Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import schema
from edgedyn.runtime.detections import groups
from edgedyn.runtime.errors import GuardError

RESIZES = ("letterbox", "stretch")
NORMALIZE = ("unit", "imagenet", "none")
ORDERS = ("rgb", "bgr")
MAX_SIDE = 16384  # pixels, of a frame or of the model's input
DEFAULT_MAX_FRAME = (4096, 4096)
DEFAULT_PAD = 114  # ultralytics' letterbox grey
# torchvision's ImageNet normalization, on the 0-1 scale.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
KEYS = ("input", "resize", "size", "pad", "normalize", "order", "max_frame")

Placement = Tuple[float, float, int, int, int, int]  # scale y, scale x, top, left, frame height, frame width


def check_preprocess(c: schema.Checker, manifest: Dict[str, Any]) -> None:
    """Raises BundleError unless the `preprocess` record (when there is one) is complete, in range, and names a
    tensor input of shape 1x3xHxW with HxW its `size` in every specialization."""
    if "preprocess" not in manifest:
        return
    record = c.obj(manifest["preprocess"], "preprocess", KEYS)
    tensors = [p["name"] for p in manifest["signature"] if p.get("kind") == "tensor"]
    name = c.text(record["input"], "preprocess.input", tensors)
    c.text(record["resize"], "preprocess.resize", RESIZES)
    c.text(record["normalize"], "preprocess.normalize", NORMALIZE)
    c.text(record["order"], "preprocess.order", ORDERS)
    c.integer(record["pad"], "preprocess.pad", 0, 255)
    size = [c.integer(v, "preprocess.size[{}]".format(i), 1, MAX_SIDE)
            for i, v in enumerate(c.items(record["size"], "preprocess.size", 2))]
    for i, v in enumerate(c.items(record["max_frame"], "preprocess.max_frame", 2)):
        c.integer(v, "preprocess.max_frame[{}]".format(i), 1, MAX_SIDE)
    for number, spec in enumerate(manifest["specializations"]):
        found = {r["name"]: r for r in spec["inputs"]}.get(name)
        if found is None or found["shape"] != [1, 3] + size or found["dtype"] != "float32":
            raise c.fail("preprocess.size", "{} is {} in specialization {}, not float32 1x3x{}x{}".format(
                schema.short(name), "absent" if found is None else "{} {}".format(
                    found["dtype"], schema.bounded(found["shape"])), number, size[0], size[1]))


class Frames:
    """Turns frames into the model's input and detections back into the frame's pixels (see the module docstring).
    Stateless: safe to use from any number of threads at once."""

    def __init__(self, record: Dict[str, Any], signature: Sequence[Dict[str, Any]]) -> None:
        self.record = record
        self.input = record["input"]
        self.position = [p["name"] for p in signature].index(self.input)
        self.size = (int(record["size"][0]), int(record["size"][1]))
        self.max_frame = (int(record["max_frame"][0]), int(record["max_frame"][1]))

    def take(self, args: Sequence[Any], kwargs: Dict[str, Any]
             ) -> Tuple[Sequence[Any], Dict[str, Any], Optional[Placement]]:
        """The call's arguments with a frame given for the image input replaced by the model's tensor, and where the
        frame went in it (None when the call passed no frame)."""
        if self.input in kwargs:
            value = kwargs[self.input]
        elif len(args) > self.position:
            value = args[self.position]
        else:
            return args, kwargs, None
        if not (isinstance(value, np.ndarray) and value.dtype == np.uint8):
            return args, kwargs, None
        tensor, placement = self.prepare(value)
        if self.input in kwargs:
            return args, dict(kwargs, **{self.input: tensor}), placement
        return tuple(args[:self.position]) + (tensor,) + tuple(args[self.position + 1:]), kwargs, placement

    def check(self, frame: np.ndarray) -> None:
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise GuardError("{}: a frame is uint8 of shape (height, width, 3); got shape {}".format(
                self.input, tuple(frame.shape)), hint="pass an RGB{} image as a numpy array".format(
                    " (or BGR, as exported)" if self.record["order"] == "bgr" else ""))
        height, width = frame.shape[:2]
        if not (1 <= height <= self.max_frame[0] and 1 <= width <= self.max_frame[1]):
            raise GuardError("{}: a {}x{} frame (width x height) is larger than the bundle takes, {}x{}".format(
                self.input, width, height, self.max_frame[1], self.max_frame[0]),
                hint="resize the frame first, or export again with --preprocess ...,max={}x{}".format(
                    max(width, self.max_frame[1]), max(height, self.max_frame[0])))

    def prepare(self, frame: np.ndarray) -> Tuple[np.ndarray, Placement]:
        """The model's 1x3xHxW float32 input for `frame`, and where the frame lies in it."""
        self.check(frame)
        height, width = self.size
        placement = place(frame.shape[0], frame.shape[1], height, width, self.record["resize"])
        _, _, top, left, _, _ = placement
        new_height, new_width = _scaled(placement)
        resized = resize_bilinear(frame, new_height, new_width)  # height x width x 3, 0-255
        scale = np.float32(1.0 if self.record["normalize"] == "none" else 1.0 / 255.0)
        result = np.empty((1, 3, height, width), np.float32)
        channels = (2, 1, 0) if self.record["order"] == "bgr" else (0, 1, 2)
        for channel, source in enumerate(channels):
            plane = result[0, channel]
            if new_height < height or new_width < width:
                plane.fill(self.record["pad"] * scale)
            inside = plane[top:top + new_height, left:left + new_width]
            np.multiply(resized[:, :, source], scale, out=inside)
            if self.record["normalize"] == "imagenet":
                plane -= IMAGENET_MEAN[channel]
                plane /= IMAGENET_STD[channel]
        return result, placement

    def restore(self, names: Sequence[str], outputs: List[np.ndarray], placement: Placement) -> List[np.ndarray]:
        """`outputs` with every detection group's valid boxes (and keypoints) in the frame's pixels."""
        outputs = list(outputs)
        for group in groups(names):
            counts = np.asarray(outputs[group["count"]])
            outputs[group["boxes"]] = to_frame(outputs[group["boxes"]], counts, placement, 4)
            if "keypoints" in group and np.ndim(outputs[group["keypoints"]]) == counts.ndim + 3:
                outputs[group["keypoints"]] = to_frame(outputs[group["keypoints"]], counts, placement, 2)
        return outputs

    def routed(self, routed: Tuple[Any, List[np.ndarray], Any], placement: Placement
               ) -> Tuple[Any, List[np.ndarray], Any]:
        """A routed call (Program.route_call) whose outputs are then restored to the frame."""
        spec, arrays, finish = routed
        names = [record["name"] for record in spec.outputs]
        return spec, arrays, lambda outputs: self.restore(
            names, finish(outputs) if finish is not None else outputs, placement)

    def describe(self) -> str:
        record = self.record
        return "{} uint8 frames (height x width x 3) up to {} wide and {} high, {} to {}x{} (height x width){}, {}".format(
            record["order"].upper(), self.max_frame[1], self.max_frame[0],
            "letterboxed" if record["resize"] == "letterbox" else "stretched", self.size[0], self.size[1],
            " on grey {}".format(record["pad"]) if record["resize"] == "letterbox" else "",
            {"unit": "scaled to 0-1", "imagenet": "scaled to 0-1 with ImageNet's mean and std",
             "none": "0-255 as float32"}[record["normalize"]])


def frames_of(manifest: Dict[str, Any]) -> Optional[Frames]:
    """The bundle's Frames, or None when it was exported without --preprocess."""
    record = manifest.get("preprocess")
    return None if record is None else Frames(record, manifest["signature"])


def place(height: int, width: int, to_height: int, to_width: int, resize: str) -> Placement:
    """Where a height x width frame goes in a to_height x to_width input: ultralytics' LetterBox arithmetic (one
    gain, each side rounded, the frame centred, odd padding's extra pixel below and right), or a stretch. The
    scales are each side's own (new / old), as ultralytics' `scale_boxes` inverts them."""
    if resize == "stretch":
        return to_height / height, to_width / width, 0, 0, height, width
    gain = min(to_height / height, to_width / width)
    new_height, new_width = max(int(round(height * gain)), 1), max(int(round(width * gain)), 1)
    top = int(round((to_height - new_height) / 2 - 0.1))
    left = int(round((to_width - new_width) / 2 - 0.1))
    return new_height / height, new_width / width, top, left, height, width


def _scaled(placement: Placement) -> Tuple[int, int]:
    """The resized frame's height and width in the input."""
    scale_y, scale_x, _, _, height, width = placement
    return int(round(height * scale_y)), int(round(width * scale_x))


def _axis(source: int, size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of `size` output pixels: the two source pixels and the weight of the second (half-pixel centres,
    edges clamped as OpenCV's INTER_LINEAR clamps them)."""
    position = (np.arange(size, dtype=np.float64) + 0.5) * (source / size) - 0.5
    low = np.floor(position)
    weight = position - low
    low = low.astype(np.int64)
    weight[low < 0] = 0.0
    low[low < 0] = 0
    last = low >= source - 1
    weight[last] = 0.0
    low[last] = source - 1
    return low, np.minimum(low + 1, source - 1), weight.astype(np.float32)


def resize_bilinear(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """`frame` (uint8, h x w x c) resized to height x width, as float32 values rounded to whole grey levels. The
    four neighbours of every output pixel are gathered as uint8 first, so the float work is on the output's size
    only (what a downscaled camera frame costs)."""
    if frame.shape[:2] == (height, width):
        return frame.astype(np.float32)
    channels = frame.shape[2]
    y0, y1, wy = _axis(frame.shape[0], height)
    x0, x1, wx = _axis(frame.shape[1], width)
    flat = frame.reshape(frame.shape[0], -1)
    step = np.arange(channels)
    left, right = (x0[:, None] * channels + step).ravel(), (x1[:, None] * channels + step).ravel()
    wx = np.repeat(wx, channels)[None, :]
    top, bottom = np.take(flat, y0, axis=0), np.take(flat, y1, axis=0)
    upper = _lerp(np.take(top, left, axis=1), np.take(top, right, axis=1), wx)
    lower = _lerp(np.take(bottom, left, axis=1), np.take(bottom, right, axis=1), wx)
    result = _lerp(upper, lower, wy[:, None])
    return np.rint(result, out=result).reshape(height, width, channels)


def _lerp(low: np.ndarray, high: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """low + (high - low) * weight in float32, in place on fresh arrays."""
    result = high.astype(np.float32)
    low = low.astype(np.float32, copy=False)
    result -= low
    result *= weight
    result += low
    return result


def to_frame(points: np.ndarray, counts: np.ndarray, placement: Placement, stride: int) -> np.ndarray:
    """Valid rows of `points` from the model's input pixels to the frame's, clipped to the frame: boxes
    ([..., rows, 4], x1 y1 x2 y2) with stride 4, keypoints ([..., rows, points, 2 or 3], x y first) with stride 2."""
    scale_y, scale_x, top, left, height, width = placement
    result = np.array(points, dtype=np.float32, copy=True)
    for index in np.ndindex(*counts.shape):
        valid = result[index][:int(counts[index])]
        x, y = (valid[..., 0::2], valid[..., 1::2]) if stride == 4 else (valid[..., 0], valid[..., 1])
        for values, offset, scale, bound in ((x, left, scale_x, width), (y, top, scale_y, height)):
            values -= offset
            values /= scale
            np.clip(values, 0, bound, out=values)
    return result
