"""Detection post-processing: `edgedyn::nms` as LiteRT's NON_MAX_SUPPRESSION_V4, best class (max with its
index), top-k (TOPK_V2), rows picked by index (GATHER), and the image copy torchvision batches its inputs with.

NON_MAX_SUPPRESSION_V4 is LiteRT's greedy NMS with a fixed output size: candidates above the score threshold
(-inf here, so -inf scores are not candidates, as the op defines), visited by descending score, IoU computed in
float32 like torchvision's (its `ComputeIntersectionAndUnion`); it suppresses at IoU >= the threshold where
torchvision suppresses above it, which differs only for an IoU exactly equal to the threshold. It has no labels:
class-aware NMS (torchvision's batched_nms) is refused here, and the portable, onnxruntime and TVM backends take it.
"""
from typing import Any, Tuple

import numpy as np
import torch

from edgedyn.backends.tflite.diagnostics import Unsupported
from edgedyn.backends.tflite.lowering import Lowering, Value
from edgedyn.backends.tflite.ops.integers import cast
from edgedyn.backends.tflite.ops.pooling import reduce
from edgedyn.backends.tflite.ops.shapes import expand
from edgedyn.frontend.nms import NMS_OP

aten = torch.ops.aten


def nms(ctx: Lowering, node: Any, boxes: Value, scores: Value, labels: Any, iou_threshold: float,
        max_out: int) -> Tuple[Value, Value]:
    if labels is not None:
        raise Unsupported("NMS per label (torchvision's batched_nms): LiteRT's NON_MAX_SUPPRESSION_V4 has no "
                          "classes")
    scalar = lambda value: ctx.writer.constant(np.asarray(value))  # noqa: E731
    selected = ctx.new([max_out], np.int32, name="nms_selected")
    found = ctx.new([], np.int32, name="nms_count")
    ctx.writer.operator("NON_MAX_SUPPRESSION_V4", [
        ctx.torch_order(boxes) if not boxes.is_constant else ctx.tensor(boxes),
        ctx.torch_order(scores) if not scores.is_constant else ctx.tensor(scores),
        scalar(np.int32(max_out)), scalar(np.float32(iou_threshold)), scalar(np.float32("-inf"))],
        [selected.tensor, found.tensor], "NonMaxSuppressionV4Options")
    # past the count the kernel's output is not defined to be 0: the op's padding is made explicit
    valid = ctx.emit("LESS", [ctx.writer.constant(np.arange(max_out, dtype=np.int32)), found.tensor], [max_out],
                     dtype=np.bool_)
    padded = ctx.emit("SELECT_V2", [valid.tensor, selected.tensor, ctx.writer.constant(np.asarray(0, np.int32))],
                      [max_out], dtype=np.int32)
    return cast(ctx, padded, np.int64), cast(ctx, found, np.int64)


def max_dim(ctx: Lowering, node: Any, x: Value, dim: int, keepdim: bool = False) -> Tuple[Value, Value]:
    """(REDUCE_MAX, ARG_MAX) along `dim`: ARG_MAX returns the first maximum, as torch does."""
    if keepdim:
        raise Unsupported("max(dim, keepdim=True)")
    dim = dim % x.rank
    source = ctx.torch_order(x) if not x.is_constant else ctx.tensor(x)
    shape = [n for i, n in enumerate(x.shape) if i != dim]
    values = ctx.emit("REDUCE_MAX", [source, ctx.ints([dim])], shape, None, "ReducerOptions", x.dtype,
                      keep_dims=False)
    indices = ctx.emit("ARG_MAX", [source, ctx.writer.constant(np.asarray([dim], np.int32))], shape, None,
                       "ArgMaxOptions", np.int64, output_type=4)  # TensorType INT64
    return values, indices


def index_select(ctx: Lowering, node: Any, x: Value, dim: int, index: Value) -> Value:
    """GATHER along `dim`; LiteRT checks each index against the size, as torch raises for one out of range."""
    if index.rank > 1:
        raise Unsupported("index_select with a {}-d index".format(index.rank))
    dim = dim % x.rank
    shape = list(node.meta["val"].shape)
    source = ctx.torch_order(x) if not x.is_constant else ctx.tensor(x)
    indices = ctx.torch_order(index) if not index.is_constant else ctx.tensor(index)
    return ctx.emit("GATHER", [source, indices], shape, None, "GatherOptions", x.dtype, axis=dim, batch_dims=0)


def topk(ctx: Lowering, node: Any, x: Value, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True) -> Tuple[Value, Value]:
    """TOPK_V2 along the last dim, sorted: the k largest and their int64 indices (TOPK_V2 gives int32)."""
    if dim % x.rank != x.rank - 1 or not largest:
        raise Unsupported("topk along dim {} of a {}-d tensor{} (only the largest, along the last dim)".format(
            dim, x.rank, "" if largest else ", smallest"))
    shape = list(x.shape[:-1]) + [int(k)]
    values = ctx.new(shape, x.dtype, name="topk_values")
    indices = ctx.new(shape, np.int32, name="topk_indices")
    source = ctx.torch_order(x) if not x.is_constant else ctx.tensor(x)
    ctx.writer.operator("TOPK_V2", [source, ctx.writer.constant(np.asarray(int(k), np.int32))],
                        [values.tensor, indices.tensor])
    return values, cast(ctx, indices, np.int64)


def max_all(ctx: Lowering, node: Any, x: Value) -> Value:
    """The largest element, a 0-d tensor (REDUCE_MAX over every dim)."""
    return reduce(ctx, "REDUCE_MAX", x, None, False)


def copy(ctx: Lowering, node: Any, target: Value, source: Value, non_blocking: bool = False) -> Value:
    """aten.copy(self, src): src's values in self's shape (torchvision batching its detectors' images)."""
    if source.dtype != target.dtype:
        raise Unsupported("copy between dtypes {} and {}".format(source.dtype, target.dtype))
    return expand(ctx, node, source, list(target.shape))


CONVERTERS = {
    NMS_OP: nms,
    aten.max.dim: max_dim,
    aten.max.default: max_all,
    aten.topk.default: topk,
    aten.index_select.default: index_select,
    aten.copy.default: copy,
}
