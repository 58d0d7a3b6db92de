"""Seeded random weights that make a random-init model's outputs depend on its input.

`transformers` initializes classification heads at zero and batch-norm statistics at (0, 1) with unit scales, so
a freshly built CNN gives nearly the same logits for every image and an accuracy check against torch compares
constants. Kaiming-normal conv and linear weights, random biases, and spread batch-norm and layer-norm statistics
fix that while keeping activations of order one. Batch-norm statistics are then measured on random inputs
(`calibrate_batchnorm`): statistics that do not match the activations let the signal fade through deep stacks
without residuals (EfficientNet's output moved by 1e-6 between images with merely random statistics).
"""
from typing import Any, Dict, Iterable, Optional

import torch


def randomize(model: Any, seed: int) -> None:
    """Re-draws conv/linear weights (Kaiming, fan-in), norm scales/shifts and batch-norm statistics, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)):
                _kaiming(module.weight, generator)
                if module.bias is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
            elif isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                _spread_norm(module, generator)
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
            elif isinstance(module, (torch.nn.LayerNorm, torch.nn.GroupNorm)) and module.weight is not None:
                _spread_norm(module, generator)


def _kaiming(weight: torch.Tensor, generator: torch.Generator) -> None:
    # fan-in with gain 1 (not ReLU's sqrt 2): residual stacks stay bounded without normalization in between.
    fan_in = weight[0].numel()
    weight.copy_(torch.randn(weight.shape, generator=generator) / fan_in ** 0.5)


def _spread_norm(module: Any, generator: torch.Generator) -> None:
    module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=generator))
    if module.bias is not None:
        module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))


def calibrate_batchnorm(model: Any, inputs: Dict[str, torch.Tensor]) -> None:
    """Sets every batch norm's running statistics to those of `inputs` (a batch of random examples)."""
    measure_batchnorm(model, [inputs])


def measure_batchnorm(model: Any, batches: Iterable[Any], spread: Optional[torch.Generator] = None) -> Any:
    """Every batch norm's running statistics measured on `batches` (dicts of keyword arguments or tuples of
    positional ones; a cumulative average over them, as training leaves statistics), with the affine parameters
    first drawn spread (scales in [0.5, 1.5], shifts N(0, 0.1)) from `spread` when given; the model in eval mode.

    Only the batch norms train: dropout stays off, so the statistics (and the model) are the same in every process;
    with the whole model in train mode, unseeded dropout masks made each build differ. One torch thread: a
    reduction's order, hence its last bits, depends on the thread count, which differs between machines and changes
    within a process (some libraries set it). The zoo must be the same everywhere."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.running_mean is not None]
    if not norms:
        return model.eval()
    momenta = [norm.momentum for norm in norms]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for norm in norms:
                norm.reset_running_stats()
                norm.momentum = None  # a cumulative average over the batches
                if spread is not None and norm.affine:
                    _spread_norm(norm, spread)
            model.eval()
            for norm in norms:
                norm.train()
            for batch in batches:
                if isinstance(batch, dict):
                    model(**batch)
                else:
                    model(*batch)
    finally:
        torch.set_num_threads(threads)
        model.eval()
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
    return model
