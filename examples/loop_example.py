"""The classic TorchDynamo example: Python control flow is unrolled at capture time.

Exported with `--input x=2x3 --input n=4`, the graph holds four multiplications and the bundle a guard `n == 4`:

    edgedyn export examples/loop_example.py:loop_example --input x=2x3 --input n=4 -o loop.edgedyn
"""
import torch


def loop_example(x: torch.Tensor, n: int) -> torch.Tensor:
    for i in range(1, n + 1):
        x = x * i
    return x


def example_inputs():
    return (torch.randn(2, 3), 4)
