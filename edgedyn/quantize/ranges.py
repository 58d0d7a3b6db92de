"""Activation ranges for static int8: the min and max every node of the ATen graph takes on the calibration data.

Runs the (pass-optimized) ExportedProgram's graph with torch.fx's Interpreter, one calibration batch at a time, the
parameters fed to their placeholders; a quantizing backend turns a node's range into its int8 scale and zero point
(`qparams`), as TFLite's converter and onnxruntime's MinMax calibrator do.
"""
from typing import Any, Dict, List, Tuple

import numpy as np

Range = Tuple[float, float]
QMIN, QMAX = -128, 127


def observe(program: Any, batches: List[List[np.ndarray]]) -> Dict[str, Range]:
    """Node name -> (min, max) over all batches, for every float tensor the graph computes or takes as input."""
    import torch
    from torch import fx
    from torch.export.graph_signature import InputKind

    tensors = dict(program.state_dict)
    tensors.update(program.constants)
    ranges = {}  # type: Dict[str, Range]

    class Observer(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            if isinstance(result, torch.Tensor) and result.is_floating_point() and result.numel():
                low, high = float(result.min()), float(result.max())
                old = ranges.get(node.name, (low, high))
                ranges[node.name] = (min(old[0], low), max(old[1], high))
            return result

    observer = Observer(program.graph_module)
    with torch.no_grad():
        for batch in batches:
            user = iter(batch)
            args = [torch.from_numpy(np.asarray(next(user))) if spec.kind == InputKind.USER_INPUT
                    else tensors[spec.target] for spec in program.graph_signature.input_specs]
            observer.run(*args)
    return ranges


def qparams(low: float, high: float) -> Tuple[float, int]:
    """Asymmetric int8 (scale, zero point) covering [low, high] and exactly representing 0."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / float(QMAX - QMIN)
    if scale <= 0:
        return 1.0, 0
    zero_point = int(round(QMIN - low / scale))
    return float(scale), max(QMIN, min(QMAX, zero_point))


def per_channel_weights(weights: np.ndarray, axis: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights (zero point 0, -127..127) with one scale per slice along `axis`."""
    moved = np.moveaxis(weights.astype(np.float64), axis, 0)
    peak = np.max(np.abs(moved.reshape(moved.shape[0], -1)), axis=1)
    scales = np.where(peak > 0, peak / 127.0, 1.0)
    quantized = np.clip(np.round(moved / scales.reshape((-1,) + (1,) * (moved.ndim - 1))), -127, 127)
    return np.moveaxis(quantized, 0, axis).astype(np.int8), scales.astype(np.float32)
