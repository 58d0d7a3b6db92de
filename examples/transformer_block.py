"""A small transformer encoder block (pre-norm, multi-head self-attention + GELU MLP) over a token sequence.

    edgedyn export examples/transformer_block.py:TransformerBlock --input x=1x32x64 -o block.edgedyn
"""
import math

import torch
from torch import nn


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, mlp_ratio: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)  # an example: the same weights on every run, so two exports give identical bundles
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads), dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp(self.norm2(x))


def example_inputs():
    return (torch.randn(1, 32, 64),)
