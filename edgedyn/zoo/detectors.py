"""The zoo's detection set: torchvision and ultralytics detectors as their users hold them, random weights.

Nothing is downloaded: torchvision builds with `weights=None`, ultralytics from its bundled yaml. A detector built
at random says nothing about NMS: freshly initialised, every box has the same near-zero score, or (after batch-norm
statistics alone) scores saturate at 1.0 and tie, so which of two tied boxes survives is up to each runtime's sort.
`spread_head_outputs` therefore sets the last layers' per-channel statistics to what a trained detector shows: class
logits of a few percent above the threshold, distinct and input-dependent; box outputs of moderate sizes. Boxes,
scores and the NMS decisions then move with the input.

Records (`Detector`) name how the model is called and what `--nms` a raw head needs; `build(name)` gives the eager
module, `example_inputs(name, seed)` random inputs. Needs `pip install 'edgedyn[zoo]'` on the host.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from edgedyn.errors import EdgedynError, MissingDependencyError
from edgedyn.zoo.records import InputSpec

Targets = Callable[[int], Tuple[float, float]]  # output channel -> (mean, std) it should have


@dataclass(frozen=True)
class Detector:
    """One detector: its library, factory, input, the `--nms` its raw head needs (None: NMS is inside)."""

    name: str
    library: str
    architecture: str
    factory: Callable[[], Any] = field(repr=False)
    inputs: Tuple[InputSpec, ...]
    nms: Optional[str]
    description: str
    fast: bool = False  # kept by the default test run


def _calibrate(model: Any, example: Callable[[Any], Any], heads: List[Tuple[Any, Targets]], seed: int,
               batches: int = 4) -> Any:
    """Batch norms with spread affine parameters and the statistics of `batches` random batches (a cumulative
    average, as training leaves them), then `heads` (final convolutions) set to their targets per output channel
    on another batch (see the module docstring); eval mode. Statistics measured on one batch alone fit that
    batch: on fresh images YOLO11n's class logits then spread 2-4x wider than measured."""
    import torch

    from edgedyn.zoo.weights import measure_batchnorm

    generator = torch.Generator().manual_seed(seed)
    measure_batchnorm(model, (example(generator) for _ in range(batches)), spread=generator)
    spread_head_outputs(model, example(generator), heads)
    return model.eval()


def spread_head_outputs(model: Any, batch: Dict[str, Any], heads: List[Tuple[Any, Targets]]) -> None:
    """Rescales each conv in `heads` so that, on `batch`, every output channel has its target mean and std."""
    import torch

    sums = {}  # type: Dict[int, List[Any]]

    def record(index: int) -> Callable[..., None]:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            flat = output.detach().transpose(0, 1).reshape(output.shape[1], -1).double()
            previous = sums.get(index)
            totals = [flat.sum(1), (flat ** 2).sum(1), flat.shape[1]]
            sums[index] = totals if previous is None else [a + b for a, b in zip(previous, totals)]
        return hook

    handles = [conv.register_forward_hook(record(i)) for i, (conv, _) in enumerate(heads)]
    with torch.no_grad():
        model.eval()
        model(**batch)
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        for index, (conv, targets) in enumerate(heads):
            total, squares, count = sums[index]
            mean = total / count
            std = (squares / count - mean ** 2).clamp(min=1e-12).sqrt()
            wanted = torch.tensor([targets(c) for c in range(conv.out_channels)], dtype=torch.float64)
            scale = wanted[:, 1] / std
            conv.weight.mul_(scale.to(conv.weight.dtype).reshape(-1, *([1] * (conv.weight.dim() - 1))))
            bias = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels)
            conv.bias = torch.nn.Parameter(((bias.double() - mean) * scale + wanted[:, 0]).to(conv.weight.dtype))


def _images(size: int, batch: int = 4, key: str = "x") -> Callable[[Any], Dict[str, Any]]:
    def draw(generator: Any) -> Dict[str, Any]:
        import torch

        return {key: torch.rand(batch, 3, size, size, generator=generator)}
    return draw


def _yolo(config: str, task: str, size: int) -> Callable[[], Any]:
    def build() -> Any:
        import os

        os.environ.setdefault("YOLO_OFFLINE", "1")
        import torch
        from ultralytics.nn import tasks

        torch.manual_seed(0)
        model = getattr(tasks, task)(config, verbose=False)
        return _calibrate(model, _images(size, batch=8), yolo_heads(model), seed=1)
    return build


def yolo_heads(model: Any) -> List[Tuple[Any, Targets]]:
    """The final convolutions of an ultralytics head with their targets, for `spread_head_outputs`: class logits
    of mean -5, std 1 (few anchor-class pairs above 0.25); box distributions (DFL bins) leaning to
    short distances, so boxes are a few strides across, not the whole image."""
    head = model.model[-1]
    bins = head.reg_max
    heads = [(branch[-1], lambda c: (-5.0, 1.0)) for branch in head.cv3]  # type: List[Tuple[Any, Targets]]
    heads += [(branch[-1], lambda c, n=bins: (-0.35 * (c % n), 1.5)) for branch in head.cv2]
    return heads


def _ssdlite() -> Any:
    import torch
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    torch.manual_seed(0)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    classes = model.head.classification_head.num_columns
    # softmax over 91 classes: background ahead, the others spread, so scores differ between boxes and images
    heads = [(block[-1], lambda c, k=classes: (2.0 if c % k == 0 else 0.0, 1.0))
             for block in model.head.classification_head.module_list]
    heads += [(block[-1], lambda c: (0.0, 1.0)) for block in model.head.regression_head.module_list]
    return _calibrate(model, _images(320, batch=4, key="images"), heads, seed=1, batches=2)


def _retinanet() -> Any:
    import torch
    from torchvision.models.detection import retinanet_resnet50_fpn

    torch.manual_seed(0)
    model = retinanet_resnet50_fpn(weights=None, weights_backbone=None, min_size=256, max_size=256)
    heads = [(model.head.classification_head.cls_logits, lambda c: (-5.0, 1.5)),
             (model.head.regression_head.bbox_reg, lambda c: (0.0, 0.5))]
    return _calibrate(model, _images(256, batch=2, key="images"), heads, seed=1)


def _image_input(name: str, size: int) -> Tuple[InputSpec, ...]:
    return (InputSpec(name, (1, 3, size, size)),)


_ENTRIES = (
    Detector("yolo11n", "ultralytics", "DetectionModel(yolo11n.yaml)", _yolo("yolo11n.yaml", "DetectionModel", 320),
             _image_input("x", 320), "iou=0.45,conf=0.25,max_det=300",
             "YOLO11n: raw head [1, 84, anchors] (boxes, 80 class scores); NMS from --nms", fast=True),
    Detector("yolov8n_seg", "ultralytics", "SegmentationModel(yolov8n-seg.yaml)",
             _yolo("yolov8n-seg.yaml", "SegmentationModel", 320), _image_input("x", 320),
             "iou=0.45,conf=0.25,max_det=300", "YOLOv8n-seg: boxes, classes, 32 mask coefficients per box, protos"),
    Detector("yolo11n_pose", "ultralytics", "PoseModel(yolo11n-pose.yaml)", _yolo("yolo11n-pose.yaml", "PoseModel", 320),
             _image_input("x", 320), "iou=0.45,conf=0.25,max_det=300", "YOLO11n-pose: boxes and 17 keypoints per box"),
    Detector("ssdlite320", "torchvision", "ssdlite320_mobilenet_v3_large", _ssdlite, _image_input("images", 320),
             None, "SSDlite 320, MobileNetV3-Large: softmax scores, per-class top 300, batched NMS inside",
             fast=True),
    Detector("retinanet", "torchvision", "retinanet_resnet50_fpn (min_size=max_size=256)", _retinanet,
             _image_input("images", 256), None,
             "RetinaNet, ResNet-50 FPN at 256: sigmoid scores, per-level top 1000, batched NMS inside"),
)
DETECTORS = {entry.name: entry for entry in _ENTRIES}  # type: Dict[str, Detector]


def get(name: str) -> Detector:
    if name not in DETECTORS:
        raise EdgedynError("unknown zoo detector '{}'; choose from: {}".format(name, ", ".join(DETECTORS)))
    return DETECTORS[name]


def build(name: str) -> Any:
    """The eager detector in eval mode with the weights described in the module docstring."""
    record = get(name)
    try:
        import importlib

        importlib.import_module(record.library)
    except ImportError as error:
        raise MissingDependencyError("zoo detector {} needs {} ({})".format(name, record.library, error),
                                     hint="pip install 'edgedyn[zoo]'") from error
    import torch

    with torch.random.fork_rng(devices=[]):
        return record.factory()


def example_inputs(name: str, seed: int = 0) -> Dict[str, Any]:
    """Random normal images at the detector's input size, as a dict."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {spec.name: torch.rand(spec.shape, generator=generator) for spec in get(name).inputs}
