"""Mirrored coordinates: a CNN's rows and columns stored back to front, so that torch's padding is TFLite's SAME.

Torch pads every side of a convolution alike; TFLite's SAME pads what it must, the odd row after. At stride 2 on an
even size (every downsampling 3x3 and 5x5 of the MobileNets, EfficientNets and ResNets' stems) torch's windows
start one row earlier than SAME's, so each needs its zero borders written: a PAD, which XNNPACK folds into the
convolution in fp32 but not under LiteRT's fp16 inference, or (ops/padding.py `zero_bordered`) two
CONCATENATIONs, each a copy of the whole activation. Read back to front, the same windows start where SAME's do:
the first window of the mirrored image is torch's last, which reads no padding at the end, and the last is torch's
first, which reads all of it (ops/padding.py `mirrored_padding`). Convolutions then need their kernels flipped,
and nothing else does: elementwise ops, activations and reductions over the image (a classifier's global average)
do not care which way the rows run. The input is reversed once (REVERSE_V2 on its rows and columns before the
TRANSPOSE into NHWC), and every op that does care (a reshape of the image, the graph's outputs) gets its input
reversed back (lowering.py `_convert`, Value.flip).

Whether that pays is a count of what each way copies: the lowering writes the file both ways and keeps the mirrored
one when its REVERSE_V2s cost less than the borders they save (`mirror_pays`), with costs per element measured on
the emulated Cortex-A76 (LiteRT 2.x, fp16 inference, one thread; benchmarks/README.md): about 1.0 instruction per
element for a REVERSE_V2 of one axis and 1.3 for one of both (TFLite's own kernel, on the fp32 input before XNNPACK's
partition), and 0.25 per element of a zero-bordered tensor (torchvision's MobileNetV2 at 224: borders of 4.24M
elements cost 1.08M instructions per call, reversing its 150K-element input 0.30M one axis at a time, 0.20M both at
once). Both at once needs LiteRT: tflite-runtime, which Python < 3.10 boards run, reverses only the first of the
axes it is given (lowering.py `reverse_at_once`; the executor refuses such a file there). A REVERSE_V2 anywhere but
on a graph input would split XNNPACK's partition, with conversions around TFLite's kernel: such a file is never
kept (an image-shaped output, transformers' TensorFlow-style explicit pads, a channel shuffle). A window op whose
windows leave rows at the end unread (a ResNet's 1x1 stride-2 shortcut) skips them at the start with a
STRIDED_SLICE, counted as a border.
"""
from typing import Any, Tuple

import numpy as np

REVERSE_COST = {1: 1.0, 2: 1.3}  # instructions per element a REVERSE_V2 of that many axes writes
BORDER_COST = 0.25  # instructions per element a zero border's CONCATENATION writes (a PAD: more)


def copies(ctx: Any) -> Tuple[float, bool]:
    """(the instructions a lowered file spends on reversals and zero borders, by the costs above; whether every
    REVERSE_V2 reads a graph input)."""
    cost, inputs_only = 0.0, True
    reversed_inputs = set(ctx.inputs)
    for op in ctx.writer.operators:
        if op.op == "REVERSE_V2":
            cost += REVERSE_COST[min(_axes(ctx, op), 2)] * _elements(ctx, op.outputs[0])
            inputs_only = inputs_only and op.inputs[0] in reversed_inputs
            reversed_inputs.add(op.outputs[0])  # the second axis' reversal reads the first's
        elif op.op in ("PAD", "PADV2") or _writes(ctx, op, ("bordered_", "cropped_")):
            cost += BORDER_COST * _elements(ctx, op.outputs[0])
    return cost, inputs_only


def mirror_pays(plain: Any, mirrored: Any) -> bool:
    """Whether the mirrored lowering copies less than the plain one and keeps XNNPACK's partition whole."""
    cost, inputs_only = copies(mirrored)
    return inputs_only and cost < copies(plain)[0]


def reverses_axes_at_once(ctx: Any) -> bool:
    """Whether a lowered file has a REVERSE_V2 of more than one axis."""
    return any(op.op == "REVERSE_V2" and _axes(ctx, op) > 1 for op in ctx.writer.operators)


def _axes(ctx: Any, op: Any) -> int:
    return _elements(ctx, op.inputs[1])


def _elements(ctx: Any, tensor: int) -> int:
    return int(np.prod(ctx.writer.shape(tensor)))


def _writes(ctx: Any, op: Any, names: Tuple[str, ...]) -> bool:
    """Whether `op` writes a tensor named as ops/padding.py names a zero border (`zero_bordered`: a CONCATENATION
    with zeros) or the rows a mirrored window skips (`cropped`: a STRIDED_SLICE), each a copy of the activation."""
    return ctx.writer.tensors[op.outputs[0]][0].startswith(names)
