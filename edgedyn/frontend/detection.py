"""`--nms`: non-maximum suppression appended to a model that ends in raw boxes and class scores (YOLO).

The model's first output is read as ultralytics lays it out: [batch, 4 + classes + extra, anchors], boxes as
(center x, center y, width, height) in input pixels, class scores after a sigmoid, then extra channels (mask
coefficients of a segmentation head, keypoints of a pose head). What follows is ultralytics'
`non_max_suppression` (best class per box, `score > conf`, boxes offset by class so classes never suppress each
other, torchvision's NMS, the first `max_det` kept), written at fixed shapes with `edgedyn::nms`: the outputs are
`boxes` [batch, max_det, 4] (x1, y1, x2, y2), `scores` [batch, max_det], `labels` [batch, max_det] (int64),
`count` [batch] and the extras, rows past `count` zero. The thresholds become arguments of the bundle with those
values as their only ones: captured as constants and guarded (`model(x, conf=0.5)` is refused with the export
to make), and `--input conf=0.5` adds a specialization.
"""
import inspect
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

import torch

from edgedyn.errors import CaptureError
from edgedyn.frontend.nms import masked_rows, note_detections, valid_rows

# ultralytics' class offset (its `max_wh`): boxes of class c move by c * 7680 pixels, so NMS over all of them
# never compares two classes. The same arithmetic here gives the same float32 coordinates, hence the same IoUs.
MAX_WH = 7680
# ultralytics sorts and cuts the candidates to `max_nms` before NMS; an export with more anchors would have to
# do the same.
MAX_NMS = 30000


@dataclass(frozen=True)
class NmsOptions:
    """What `--nms iou=0.45,conf=0.25,max_det=300` asks for; `classes` counts the class channels (default: the
    model's head says, else every channel after the box), `agnostic` lets any class suppress any other."""

    iou: float = 0.45
    conf: float = 0.25
    max_det: int = 300
    classes: Optional[int] = None
    agnostic: bool = False

    def __post_init__(self) -> None:
        for name in ("iou", "conf"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise CaptureError("--nms {}={!r}: give a number from 0 to 1".format(name, value),
                                   hint="e.g. --nms iou=0.45,conf=0.25,max_det=300")
        if not isinstance(self.max_det, int) or isinstance(self.max_det, bool) or not 1 <= self.max_det <= 100000:
            raise CaptureError("--nms max_det={!r}: give a whole number from 1 to 100000".format(self.max_det),
                               hint="e.g. --nms max_det=300 (ultralytics' default)")
        if self.classes is not None and (not isinstance(self.classes, int) or self.classes < 1):
            raise CaptureError("--nms classes={!r}: give the number of class channels (1 or more)".format(
                self.classes))


def parse_nms(text: str) -> NmsOptions:
    """`iou=0.45,conf=0.25,max_det=300[,classes=80][,agnostic]` (any subset; the rest keep ultralytics'
    defaults), or an empty string for all defaults."""
    known = {f.name: f.type for f in fields(NmsOptions)}
    values = {}  # type: Dict[str, Any]
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, separator, value = item.partition("=")
        key = key.strip()
        if key not in known:
            raise CaptureError("--nms: unknown setting {!r}; choose from: {}".format(key, ", ".join(known)),
                               hint="e.g. --nms iou=0.45,conf=0.25,max_det=300")
        if key == "agnostic":
            values[key] = value.strip().lower() in ("", "1", "true", "yes") if separator else True
            continue
        try:
            values[key] = int(value) if key in ("max_det", "classes") else float(value)
        except ValueError:
            raise CaptureError("--nms {}={!r} is not a number".format(key, value),
                               hint="e.g. --nms iou=0.45,conf=0.25,max_det=300") from None
    return NmsOptions(**values)


def head_layout(model: Any, channels: int, options: NmsOptions) -> Tuple[int, str, Optional[Tuple[int, ...]]]:
    """(class channels, name of the extra channels, their shape per box) of the model's raw output: classes from
    `classes=`, else from the ultralytics head (the last module with an integer `nc`), else every channel after
    the box is a class."""
    head = None
    if isinstance(model, torch.nn.Module):
        heads = [m for m in model.modules() if isinstance(getattr(m, "nc", None), int) and hasattr(m, "stride")]
        head = heads[-1] if heads else None
    if head is not None and type(head).__name__.startswith("OBB"):
        raise CaptureError("--nms handles axis-aligned boxes; {} predicts rotated ones".format(type(head).__name__),
                           hint="export without --nms and apply ultralytics' rotated NMS to the raw output")
    classes = options.classes or (head.nc if head is not None else channels - 4)
    extra = channels - 4 - classes
    if extra < 0:
        raise CaptureError("--nms: the model's first output has {} channels, fewer than 4 box channels and {} "
                           "classes".format(channels, classes),
                           hint="--nms reads [batch, 4 + classes (+ extra), anchors]; give classes=N if the head "
                                "has another count")
    if hasattr(head, "kpt_shape"):
        return classes, "keypoints", tuple(int(n) for n in head.kpt_shape)
    if hasattr(head, "nm"):
        return classes, "mask_coefficients", None
    return classes, "extra", None


class WithNms(torch.nn.Module):
    """The user's model followed by ultralytics' NMS at fixed shapes (see the module docstring)."""

    def __init__(self, model: Any, options: NmsOptions, input_name: str) -> None:
        super().__init__()
        self.model = model
        self.options = options
        self.input_name = input_name
        self.layout = None  # type: Optional[Tuple[int, str, Optional[Tuple[int, ...]]]]

    def forward(self, *args: Any, **kwargs: Any) -> Dict[str, torch.Tensor]:
        image = args[0] if args else kwargs.pop(self.input_name)
        iou, conf, max_det = kwargs.get("iou", self.options.iou), kwargs.get("conf", self.options.conf), \
            kwargs.get("max_det", self.options.max_det)
        output = self.model(image)
        prediction, rest = _first_tensor(output)
        if prediction.dim() != 3:
            raise CaptureError("--nms reads the model's first output as [batch, 4 + classes, anchors]; it has "
                               "shape {}".format(tuple(prediction.shape)),
                               hint="export the raw head (e.g. an ultralytics DetectionModel) or drop --nms")
        if prediction.shape[-1] > MAX_NMS:
            raise CaptureError("--nms: {} anchors, more than ultralytics' max_nms ({})".format(
                prediction.shape[-1], MAX_NMS), hint="export at a smaller input size")
        if self.layout is None:
            self.layout = head_layout(self.model, prediction.shape[1], self.options)
        classes, extra_name, extra_shape = self.layout
        result = detections(prediction, classes, float(iou), float(conf), int(max_det),
                            0 if self.options.agnostic else MAX_WH)
        if prediction.shape[1] > 4 + classes:
            extra = result.pop("extra")
            result[extra_name] = extra.unflatten(-1, extra_shape) if extra_shape else extra
        else:
            result.pop("extra")
        for index, tensor in enumerate(rest):
            result["proto" if extra_name == "mask_coefficients" and index == 0 else "output_{}".format(index + 1)] = \
                tensor
        return result


def _first_tensor(output: Any) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """The raw prediction (the first tensor, depth first) and, for a segmentation head's ((pred, proto), raw)
    output, the tensors that came with it in the same tuple."""
    if isinstance(output, torch.Tensor):
        return output, []
    if isinstance(output, (tuple, list)) and output:
        first = output[0]
        if isinstance(first, (tuple, list)) and first and isinstance(first[0], torch.Tensor):
            return first[0], [t for t in first[1:] if isinstance(t, torch.Tensor)]
        return _first_tensor(first)
    if isinstance(output, dict) and output:
        return _first_tensor(next(iter(output.values())))
    raise CaptureError("--nms: the model returns no tensor to read boxes from ({})".format(type(output).__name__))


def detections(prediction: torch.Tensor, classes: int, iou: float, conf: float, max_det: int,
               class_offset: float) -> Dict[str, torch.Tensor]:
    """ultralytics' non_max_suppression (best class, no multi-label) at fixed shapes, per image of the batch."""
    note_detections(conf, max_det)
    rows = {"boxes": [], "scores": [], "labels": [], "count": [], "extra": []}  # type: Dict[str, List[Any]]
    for image in prediction:
        x = image.transpose(0, 1)  # [anchors, channels]
        score, label = x[:, 4:4 + classes].max(1)
        centers, half = x[:, :2], x[:, 2:4] / 2
        boxes = torch.cat([centers - half, centers + half], 1)
        candidates = torch.where(score > conf, score, score.new_full((), float("-inf")))
        offset = boxes + label.to(boxes.dtype)[:, None] * class_offset
        keep, count = torch.ops.edgedyn.nms(offset, candidates, None, iou, max_det)
        valid = valid_rows(count, max_det)
        rows["boxes"].append(masked_rows(boxes.index_select(0, keep), valid))
        rows["scores"].append(masked_rows(score.index_select(0, keep), valid))
        rows["labels"].append(masked_rows(label.index_select(0, keep), valid))
        rows["extra"].append(masked_rows(x[:, 4 + classes:].index_select(0, keep), valid))
        rows["count"].append(count)
    return {key: torch.stack(values) for key, values in rows.items()}


def with_nms(model: Any, options: NmsOptions) -> WithNms:
    """`model` followed by NMS; its input keeps the name of the model's first argument, and the thresholds
    follow as scalar arguments with the chosen values as defaults (capture reads forward's signature)."""
    function = model.forward if isinstance(model, torch.nn.Module) else model
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not parameters:
        raise CaptureError("--nms needs a model whose first argument is the image")
    name = parameters[0].name

    def forward(self: WithNms, *args: Any, **kwargs: Any) -> Dict[str, torch.Tensor]:
        return WithNms.forward(self, *args, **kwargs)

    keyword = inspect.Parameter.KEYWORD_ONLY
    forward.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("iou", keyword, default=float(options.iou)),
        inspect.Parameter("conf", keyword, default=float(options.conf)),
        inspect.Parameter("max_det", keyword, default=int(options.max_det))])
    named = type("WithNms", (WithNms,), {"forward": forward, "__module__": __name__})
    return named(model, options, name)
