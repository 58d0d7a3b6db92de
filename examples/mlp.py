"""A multi-layer perceptron, exported at batch 1 and batch 8 in one bundle:

    edgedyn export examples/mlp.py:MLP --input x=1x64 --input x=8x64 -o mlp.edgedyn
"""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)  # an example: the same weights on every run, so two exports give identical bundles
        self.layers = nn.Sequential(
            nn.Linear(features, hidden),
            nn.GELU(),
            nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.layers(x), dim=-1)


def example_inputs():
    return [(torch.randn(1, 64),), (torch.randn(8, 64),)]
