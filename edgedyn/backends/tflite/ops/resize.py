"""Image resizing (interpolate): RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR in NHWC, to the traced size
(the scale arguments only say how torch computed that size)."""
from typing import Any, Optional, Sequence

import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten


def _resize(ctx: Lowering, node: Any, x: Value, op: str, options: str, align_corners: bool,
            half_pixel_centers: bool, scales: Sequence[Any]) -> Value:
    if x.rank != 4:
        raise Unsupported("{}-d resizing (only images, N C H W)".format(x.rank - 2))
    shape = list(node.meta["val"].shape)
    _check_scales(x.shape[2:], shape[2:], scales)
    return ctx.emit(op, [ctx.tensor(x, layout.NHWC), ctx.ints(shape[2:])], shape, layout.NHWC, options,
                    align_corners=align_corners, half_pixel_centers=half_pixel_centers)


def _check_scales(before: Sequence[int], after: Sequence[int], scales: Sequence[Any]) -> None:
    """torch samples with 1/scale_factor when one was given, TFLite with in/out: equal unless the scaled size was
    rounded down (say 2.5 x 5 -> 12), and then the two sample different points."""
    factors = [f for item in scales for f in (item if isinstance(item, (list, tuple)) else [item])
               if isinstance(f, (int, float))]
    for factor, size_in, size_out in zip(factors, before, after):
        if abs(factor * size_in - size_out) > 1e-6 * size_out:
            raise Unsupported("interpolate with scale_factor={} from {} to {} pixels (rounded: torch and TFLite "
                              "sample differently); pass size= instead".format(factor, size_in, size_out))


def bilinear(ctx: Lowering, node: Any, x: Value, output_size: Optional[Sequence[int]], align_corners: bool,
             *scales: Any) -> Value:
    # torch's align_corners=False samples at pixel centers, which is TFLite's half_pixel_centers
    return _resize(ctx, node, x, "RESIZE_BILINEAR", "ResizeBilinearOptions", bool(align_corners),
                   not align_corners, scales)


def nearest(ctx: Lowering, node: Any, x: Value, output_size: Optional[Sequence[int]], *scales: Any) -> Value:
    # torch's "nearest" picks floor(out_index * in / out): TFLite's default, without half-pixel centers
    return _resize(ctx, node, x, "RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", False, False, scales)


CONVERTERS = {
    aten.upsample_bilinear2d.vec: bilinear, aten.upsample_bilinear2d.default: bilinear,
    aten.upsample_nearest2d.vec: nearest, aten.upsample_nearest2d.default: nearest,
}
