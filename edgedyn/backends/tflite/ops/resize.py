"""Image resizing (interpolate): RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR in NHWC, to the traced size
(the scale arguments only say how torch computed that size)."""
from typing import Any, Optional, Sequence

import torch

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value

aten = torch.ops.aten


def _resize(ctx: Lowering, node: Any, x: Value, op: str, options: str, align_corners: bool,
            half_pixel_centers: bool) -> Value:
    if x.rank != 4:
        raise Unsupported("{}-d resizing (only images, N C H W)".format(x.rank - 2))
    shape = list(node.meta["val"].shape)
    return ctx.emit(op, [ctx.tensor(x, layout.NHWC), ctx.ints(shape[2:])], shape, layout.NHWC, options,
                    align_corners=align_corners, half_pixel_centers=half_pixel_centers)


def bilinear(ctx: Lowering, node: Any, x: Value, output_size: Optional[Sequence[int]], align_corners: bool,
             *scales: Any) -> Value:
    # torch's align_corners=False samples at pixel centers, which is TFLite's half_pixel_centers
    return _resize(ctx, node, x, "RESIZE_BILINEAR", "ResizeBilinearOptions", bool(align_corners),
                   not align_corners)


def nearest(ctx: Lowering, node: Any, x: Value, output_size: Optional[Sequence[int]], *scales: Any) -> Value:
    # torch's "nearest" picks floor(out_index * in / out): TFLite's default, without half-pixel centers
    return _resize(ctx, node, x, "RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", False, False)


CONVERTERS = {
    aten.upsample_bilinear2d.vec: bilinear, aten.upsample_bilinear2d.default: bilinear,
    aten.upsample_nearest2d.vec: nearest, aten.upsample_nearest2d.default: nearest,
}
