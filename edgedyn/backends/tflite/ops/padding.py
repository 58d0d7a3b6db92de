"""Torch's explicit spatial padding in TFLite terms (SAME, VALID or a PAD before a VALID op), shared by the float
and int8 convolutions and by pooling."""
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.backends.tflite.lowering import Lowering


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> Tuple[int, int]:
    """The (before, after) padding TFLite's SAME adds to one spatial dim."""
    effective = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


# Note: XNNPACK's TFLite delegate takes PAD but not PADV2 (measured with LiteRT 2.x on ResNet-18: a PADV2 before the
# stem's max pooling split the graph into two delegated partitions with the PADV2 run by TFLite's own kernel in
# between). Max pooling pads with the lowest value, which is 0.0 whenever the input is never negative (after a
# ReLU: each window holds at least one real value, all >= 0) and, for int8, whenever the zero point is -128.
MAX_POOL_FILL = float(np.finfo(np.float32).min)


def explicit(shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> bool:
    """Whether torch's padding of an NCHW `shape` needs a PAD before the op (it is neither VALID nor SAME)."""
    same = [same_padding(shape[2 + i], kernel[i], stride[i], dilation[i]) for i in range(2)]
    return any(padding) and not all(same[i] == (padding[i], padding[i]) for i in range(2))


def read_padding(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> Tuple[int, int]:
    """The (before, after) part of torch's symmetric `padding` of one spatial dim that the windows read: past a
    stride of 1 the last padded rows may lie beyond the last window (stride 2, kernel 3, padding 1 on an even size
    reads none of them)."""
    windows = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    last = (windows - 1) * stride + dilation * (kernel - 1)  # the last index read, in the padded dim
    return padding, min(padding, max(0, last - (padding + size - 1)))


def mirrored_padding(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> Tuple[int, int]:
    """The (before, after) padding of one spatial dim in mirrored coordinates (the dim stored back to front, the
    kernel flipped: ../mirror.py), where the first window reads as many padded rows as torch's last and the last
    all of torch's first; a negative `before` is rows to skip, where torch's windows leave rows at the end unread
    (a 1x1 convolution at stride 2 on an even size: one)."""
    windows = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return (windows - 1) * stride + dilation * (kernel - 1) + 1 - size - padding, padding


MIRRORED = (2, 3)  # the torch dims a mirrored window op stores back to front: NCHW's rows and columns


def window_flip(ctx: Lowering, allowed: bool = True) -> Tuple[bool, Tuple[int, ...]]:
    """(whether a window op computes in mirrored coordinates: where the lowering mirrors (../mirror.py) and the op
    `allowed` it; the dims it then stores back to front, () otherwise)."""
    mirror = allowed and ctx.mirror
    return mirror, (MIRRORED if mirror else ())


def cropped(ctx: Lowering, x: int, shape: Sequence[int], skip: Sequence[int]) -> Tuple[int, List[int]]:
    """(NHWC `x` of NCHW `shape` without its first `skip` rows and columns, as a STRIDED_SLICE; its NCHW shape)."""
    size = [shape[0], shape[1], shape[2] - skip[0], shape[3] - skip[1]]
    out = ctx.writer.tensor("cropped", [size[0], size[2], size[3], size[1]], np.float32)
    ctx.writer.operator("STRIDED_SLICE", [x, ctx.ints([0, skip[0], skip[1], 0]),
                                          ctx.ints([shape[0], shape[2], shape[3], shape[1]]), ctx.ints([1, 1, 1, 1])],
                        [out], "StridedSliceOptions")
    return out, size


def zero_bordered(ctx: Lowering, x: int, shape: Sequence[int], pads: Sequence[Tuple[int, int]]) -> int:
    """NHWC `x` of `shape` with (before, after) rows and columns of zeros, as CONCATENATIONs with constant zeros:
    XNNPACK's fp16 inference (LiteRT 2.x) neither folds a PAD into the convolution after it, as it does in fp32,
    nor pads faster than about one instruction per byte, where a CONCATENATION is a memcpy of each row.
    torchvision's MobileNetV2 on the emulated Pi 5 in fp16: 67.5M instructions per call with PADs before its four
    strided depthwise convolutions and the stem, 65.7M with these (docs/precision.md)."""
    current = list(shape)
    for axis, (before, after) in zip((1, 2), pads):
        if not before and not after:
            continue
        zeros = [ctx.writer.constant(np.zeros(current[:axis] + [rows] + current[axis + 1:], np.float32), "zeros")
                 if rows else None for rows in (before, after)]
        parts = [part for part in (zeros[0], x, zeros[1]) if part is not None]
        current[axis] += before + after
        x = ctx.writer.tensor("bordered", list(current), np.float32)
        ctx.writer.operator("CONCATENATION", parts, [x], "ConcatenationOptions", axis=axis)
    return x


def spatial_padding(ctx: Lowering, x: int, shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], pad_value: float = 0.0,
                    same_ok: bool = True, quant: Optional[Any] = None, mirrored: bool = False) -> Tuple[int, int]:
    """Torch's symmetric padding as TFLite's SAME or VALID: returns (input tensor, Padding enum).

    SAME pads after more than before when the total is odd (stride-2 convolutions with padding 1 hit this), so
    any padding that differs from SAME becomes an explicit PAD before a VALID op (XNNPACK fuses it in), or in a
    model marked for fp16 inference zero borders of what the op reads (`zero_bordered`).
    `shape` is the NCHW torch shape of x; `same_ok` says whether the op's SAME means padding with `pad_value`
    (convolution pads zeros, max pooling ignores the padding as -inf would, average pooling excludes it).
    `mirrored`: x holds its rows and columns back to front (`mirrored_padding`; rows no window reads are cropped).
    """
    if mirrored:
        pairs = [mirrored_padding(shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(2)]
        skip = [max(0, -before) for before, _ in pairs]
        if any(skip):
            x, shape = cropped(ctx, x, shape, skip)
            pairs = [(max(0, before), after) for before, after in pairs]
    if all(p == 0 for p in padding):
        return x, 1  # Padding.VALID
    if mirrored:
        if same_ok and pairs == [same_padding(shape[2 + i], kernel[i], stride[i], dilation[i]) for i in range(2)]:
            return x, 0  # Padding.SAME: in mirrored coordinates torch's stride-2 padding often is
        read = pairs  # type: List[Any]
    else:
        if same_ok and not explicit(shape, kernel, stride, padding, dilation):
            return x, 0  # Padding.SAME
        pairs = [(p, p) for p in padding]
        read = [read_padding(shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(2)]
    if ctx.fp16 and pad_value == 0.0 and quant is None:
        return zero_bordered(ctx, x, [shape[0], shape[2], shape[3], shape[1]], read), 1
    pads = np.array([[0, 0], list(pairs[0]), list(pairs[1]), [0, 0]], dtype=np.int32)
    padded = [shape[0], shape[2] + sum(pairs[0]), shape[3] + sum(pairs[1]), shape[1]]
    out = ctx.writer.tensor("pad", padded, np.int8 if quant is not None else np.float32, quant)
    if pad_value == MAX_POOL_FILL and quant is not None and int(quant.zero_point.reshape(-1)[0]) == -128:
        pad_value = 0.0  # the lowest int8 is then the zero point, the fill PAD writes (see MAX_POOL_FILL)
    if pad_value == 0.0:
        if quant is not None:  # int8 PAD fills with the zero point, i.e. 0.0
            ctx.writer.require_version("PAD", 3)
        ctx.writer.operator("PAD", [x, ctx.writer.constant(pads)], [out], "PadOptions")
        return out, 1
    fill = ctx.scalar(pad_value)
    if quant is not None:  # max pooling's -inf: the lowest int8, on the input's own scale as PADV2 requires
        ctx.writer.require_version("PADV2", 2)
        fill = ctx.writer.constant(np.asarray([-128], np.int8), "fill", quant)
    ctx.writer.operator("PADV2", [x, ctx.writer.constant(pads), fill], [out], "PadV2Options")
    return out, 1


def pair(values: Sequence[int]) -> List[int]:
    values = list(values)
    return values * 2 if len(values) == 1 else values
