"""A small image classifier with batch norm (folded into the convolutions by edgedyn's passes).

    edgedyn export examples/tiny_cnn.py:TinyCNN --board x86-64 --input x=1x3x64x64 -o tiny.edgedyn
"""
import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)  # an example: the same weights on every run, so two exports give identical bundles
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),  # depthwise
            nn.BatchNorm2d(32),
            nn.ReLU6(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32, num_classes)
        _randomize_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _randomize_batchnorm(model: nn.Module) -> None:
    # Fresh batch norms are the identity; give them trained-looking statistics so folding is really exercised.
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            channels = module.num_features
            module.running_mean.copy_(torch.randn(channels, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(channels, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(channels, generator=generator) + 0.5)
            module.bias.data.copy_(torch.randn(channels, generator=generator) * 0.1)


def example_inputs():
    return (torch.randn(1, 3, 64, 64),)
