"""A MobileNetV2-style network written by hand: a small model with no dependency beyond torch.

Inverted residual blocks (expand 1x1 -> depthwise 3x3 -> project 1x1, ReLU6, batch norm), width 0.5, for
96x96 inputs by default: the shape of model people put on a Raspberry Pi or a Jetson Nano.

    edgedyn export examples/mobilenet_v2.py:MobileNetV2 --input x=1x3x96x96 -o mnv2.edgedyn
"""
from typing import List

import torch
from torch import nn


def _conv_bn(inputs: int, outputs: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(outputs)]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = inputs * expand
        layers = [] if expand == 1 else [_conv_bn(inputs, hidden, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, outputs, 1, act=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and inputs == outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, repeats, stride) as in Sandler et al. 2018
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes: int = 1000, width: float = 0.5) -> None:
        super().__init__()
        torch.manual_seed(0)  # an example: the same weights on every run, so two exports give identical bundles
        channels = _round(32 * width)
        layers: List[nn.Module] = [_conv_bn(3, channels, 3, stride=2)]
        for expand, base, repeats, stride in self.SETTINGS:
            outputs = _round(base * width)
            for index in range(repeats):
                layers.append(InvertedResidual(channels, outputs, stride if index == 0 else 1, expand))
                channels = outputs
        self.last = max(1280, _round(1280 * width))
        layers.append(_conv_bn(channels, self.last, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(self.last, num_classes)
        _trained_looking_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _round(value: float, divisor: int = 8) -> int:
    return max(divisor, int(value + divisor / 2) // divisor * divisor)


def _trained_looking_batchnorm(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.weight.data.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)


def example_inputs():
    return (torch.randn(1, 3, 96, 96),)
