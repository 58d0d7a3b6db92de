"""Full-size models from libraries edgedyn did not write, as their users build them, with random weights.

Each builder returns (module in eval mode, example inputs, kind); speed.py, instructions.py and the Arm benchmark
read them by name (`tv-resnet18`, `timm-mobilenetv4_conv_small`, `yolo11n`, ...). Nothing is downloaded: torchvision
and timm build the architecture with `weights=None` / `pretrained=False`, ultralytics from its bundled yaml, and
transformers from a config. They need `pip install 'edgedyn[zoo]'` (torchvision, timm, ultralytics,
transformers).

Random weights, as a trained net would hold them: a freshly initialised CNN's batch norms hold mean 0 and variance 1
whatever its activations are, so its outputs are dominated by biases and barely depend on its input (torchvision's
MobileNetV2: logits of 1e-9 whose cosine between two inputs is 0.996). `realistic` gives every batch norm random
affine parameters and then the running statistics of the activations it really sees on random inputs (the norms
alone in train mode, cumulative averages), as training leaves them: outputs of order 1 that move with the input
(cosine between two inputs' logits 0.36-0.97), so accuracy numbers (cosine, top-1) mean something and fp16 does not
overflow.
"""
from typing import Any, Callable, Dict, Tuple  # noqa: F401 (type comments)

Built = Tuple[Any, tuple, str]


def realistic(model: Any, size: int, seed: int = 0, batches: int = 4, batch: int = 8) -> Any:
    """`model` in eval mode with batch norms as described in the module docstring, measured on `batches` random
    batches of `batch` images of `size` x `size` (edgedyn.zoo.weights.measure_batchnorm, as the zoo's detectors)."""
    import torch

    from edgedyn.zoo.weights import measure_batchnorm

    generator = torch.Generator().manual_seed(seed)
    return measure_batchnorm(model, ((torch.randn(batch, 3, size, size, generator=generator),)
                                     for _ in range(batches)), spread=generator)


def _first(inner: Any, key: Any = 0) -> Any:
    """`inner` returning only `out[key]`: its main tensor, which the benchmark times and compares."""
    import torch

    class First(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            out = self.inner(x)
            return out[key]

    return First().eval()


def _image(size: int, batch: int = 1) -> tuple:
    import torch

    torch.manual_seed(0)
    return (torch.randn(batch, 3, size, size),)


def _torchvision(name: str, size: int = 224, kind: str = "cnn") -> Callable[[], Built]:
    def build() -> Built:
        import torch
        import torchvision

        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None)
        return realistic(model, size), _image(size), kind
    return build


def _deeplabv3() -> Built:
    import torch
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    torch.manual_seed(0)
    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, aux_loss=False)
    return _first(realistic(model, 256, batch=4), "out"), _image(256), "cnn"


def _timm(name: str, size: int = 224, kind: str = "cnn") -> Callable[[], Built]:
    def build() -> Built:
        import timm
        import torch

        torch.manual_seed(0)
        return realistic(timm.create_model(name, pretrained=False), size), _image(size), kind
    return build


def _yolo(config: str, size: int = 640) -> Callable[[], Built]:
    def build() -> Built:
        import torch
        from ultralytics.nn.tasks import DetectionModel

        torch.manual_seed(0)
        model = realistic(DetectionModel(config, verbose=False), size, batches=2, batch=2)
        # In eval mode the Detect head returns (decoded predictions [1, 4 + classes, anchors], raw feature maps).
        return _first(model.eval(), 0), _image(size), "detector"
    return build


def _distilbert(sequence: int = 128) -> Built:
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    class Hidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(inputs_embeds=x).last_hidden_state

    torch.manual_seed(0)
    model = DistilBertModel(DistilBertConfig()).eval()  # the full-size config: 6 layers, hidden 768, 12 heads
    # Embeddings as the input (float), as speed.py's other encoders: the accuracy numbers need inputs that vary.
    return Hidden(model).eval(), (torch.randn(1, sequence, 768),), "encoder"


def _hf_mobilenet_v2(size: int = 224) -> Built:
    """transformers' MobileNetV2 at the config of google/mobilenet_v2_1.0_224: TensorFlow's padding written as an
    explicit pad before each convolution (`tf_padding`), as that checkpoint was trained with."""
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    model = MobileNetV2ForImageClassification(MobileNetV2Config(image_size=size, num_labels=1001))
    return _first(realistic(model, size), "logits"), _image(size), "cnn"


MODELS = {
    "tv-resnet18": _torchvision("resnet18"),
    "tv-mobilenet_v2": _torchvision("mobilenet_v2"),
    "tv-mobilenet_v3_large": _torchvision("mobilenet_v3_large"),
    "tv-efficientnet_b0": _torchvision("efficientnet_b0"),
    "tv-deeplabv3_mobilenet_v3_large": _deeplabv3,
    "timm-mobilenetv4_conv_small": _timm("mobilenetv4_conv_small"),
    "timm-levit_128s": _timm("levit_128s", kind="encoder"),
    "yolo11n": _yolo("yolo11n.yaml"),
    "hf-distilbert-base-128": _distilbert,
    "hf-mobilenet_v2": _hf_mobilenet_v2,
    # More architectures, checked against OpenVINO's default by versus_openvino.py (2026-12-06): channel shuffles,
    # unfolded batch norms, ghost modules, attention and LayerNorm-heavy blocks.
    "tv-shufflenet_v2_x1_0": _torchvision("shufflenet_v2_x1_0"),
    "timm-convnext_tiny": _timm("convnext_tiny"),
    "timm-vit_small_patch16_224": _timm("vit_small_patch16_224", kind="encoder"),
    "timm-efficientvit_b0": _timm("efficientvit_b0"),
    "timm-regnety_004": _timm("regnety_004"),
    "timm-fastvit_t8": _timm("fastvit_t8"),
    "timm-ghostnet_100": _timm("ghostnet_100"),
    # Structural reparameterization's training-time form, as timm builds them (each layer's parallel branches:
    # kxk and 1x1 convolutions and a batch-normed identity), which edgedyn merges (passes/branches.py).
    "timm-mobileone_s1": _timm("mobileone_s1"),
    "timm-repvgg_a1": _timm("repvgg_a1"),
}  # type: Dict[str, Callable[[], Built]]
