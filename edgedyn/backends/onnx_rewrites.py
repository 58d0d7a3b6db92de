"""Rewrites of the exported ONNX graph that onnxruntime does not do itself: the attention torch's exporter writes
(`rewrite`); and two that keep every value and let converters take the graph: a Gather that only reshapes
(`identity_gathers`, for every backend reading the exporter's ONNX) and an AveragePool that covers its whole map
(`whole_map_pools`, for ncnn's pnnx).

torch's dynamo exporter writes `scaled_dot_product_attention` as Reshape/Transpose per head, a Mul by sqrt(scale) on
q and on k, MatMul, an Add of the attention mask (an all-zero constant when the model has none), Softmax, then
`Where(IsNaN(p), 0, p)` (a row masked entirely with -inf gives NaN: torch returns zeros there), MatMul, Transpose
and Reshape. onnxruntime fuses none of that (its transformer optimizer matches neither the two Muls nor the NaN
guard). Measured on a 4-layer ViT-tiny at 224 (2-core AMD EPYC, 2 threads, 2026-12-01): the zero Add and the NaN
guard alone cost 8-10% of the model, and the per-head Reshape/Transpose chains another ~9%, which
com.microsoft.MultiHeadAttention (one kernel, parallel over heads, on onnxruntime's CPU and CUDA providers; any
other provider leaves the node to them) runs without.

A boolean mask given as an input is written as an additive one of float32's lowest value instead of torch's -inf;
it is made -inf where only guarded softmaxes read it, which changes fully masked rows only, to torch's zeros.
Every other rewrite keeps the graph's results: an Add of exact zeros is the identity (up to the sign of a zero), the NaN
guard can only act when a softmax row is all -inf, which needs an additive mask holding -inf (the rewrite keeps
every guard whose softmax sees anything but a MatMul plus finite constants), and the fused node computes the same
products. The export verifies the rewritten file against torch eager like any other.
"""
from typing import Any, Dict, Tuple

import numpy as np

from edgedyn.backends.onnx_attention import MICROSOFT, MICROSOFT_VERSION, fuse_attention
from edgedyn.backends.onnx_graph import Graph, prune


def rewrite(onnx: Any, model: Any) -> Tuple[Any, Dict[str, int]]:
    """The model with the rewrites above applied, and how often each applied (the manifest's `onnx_rewrites`)."""
    graph = Graph(onnx, model)
    counts = {}  # type: Dict[str, int]
    for key, apply in (("boolean_masks_made_minus_inf", _boolean_masks_to_minus_inf),
                       ("zero_adds_removed", _drop_zero_adds), ("softmax_nan_guards_removed", _drop_softmax_nan_guards),
                       ("attention_fused", fuse_attention)):
        counts[key] = apply(graph)
        prune(graph)  # the next rewrite must not see the dead nodes as consumers
    if any(counts.values()):
        if counts["attention_fused"] and not any(o.domain == MICROSOFT for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(MICROSOFT, MICROSOFT_VERSION))
        onnx.checker.check_model(model)
    return model, counts


def _bypass(graph: Graph, node: Any, kept_input: str) -> bool:
    """Every reader of node's output reads kept_input instead, which leaves node dead (for prune); False, and
    nothing changed, when the output is one of the graph's (it keeps its name)."""
    output = node.output[0]
    if graph.is_output(output):
        return False
    for user in graph.consumers.get(output, []):
        for index, name in enumerate(user.input):
            if name == output:
                user.input[index] = kept_input
    graph.refresh()
    return True


FLOAT32_LOWEST = float(np.finfo(np.float32).min)


def _boolean_masks_to_minus_inf(graph: Graph) -> int:
    """Where(mask, 0, lowest) -> Where(mask, 0, -inf) when every reader adds it to scores whose softmax has the
    NaN guard.

    torch's exporter writes a boolean attention mask as an additive one of float32's lowest value, where torch
    uses -inf: a query whose keys are all masked then gets the mean of the values (a uniform softmax) instead of
    torch's zeros (its softmax is NaN there, and the guard the exporter also writes makes that 0). With -inf the
    guard acts as in torch; every other row is unchanged, exp(lowest - max) and exp(-inf) both being 0.
    """
    from onnx import numpy_helper

    count = 0
    for node in list(graph.graph.node):
        if not graph.is_op(node, "Where") or len(node.input) != 3 or graph.constant(node.input[0]) is not None:
            continue
        if graph.scalar(node.input[1]) != 0.0 or graph.scalar(node.input[2]) != FLOAT32_LOWEST:
            continue
        if graph.is_output(node.output[0]) or not all(
                _feeds_a_guarded_softmax(graph, user) for user in graph.consumers.get(node.output[0], [])):
            continue
        name = "{}_minus_inf".format(node.output[0])
        graph.graph.initializer.append(numpy_helper.from_array(np.array(-np.inf, np.float32), name))
        node.input[2] = name  # the old constant's readers change; prune, after each rewrite, refreshes them
        count += 1
    return count


def _feeds_a_guarded_softmax(graph: Graph, add: Any) -> bool:
    """Whether `add` is an Add read only by a Softmax whose readers are exactly its NaN guard and the guard's IsNaN."""
    softmax = graph.only_consumer(add.output[0]) if graph.is_op(add, "Add") else None
    if not graph.is_op(softmax, "Softmax") or graph.is_output(softmax.output[0]):
        return False
    readers = graph.consumers.get(softmax.output[0], [])
    guards = [reader for reader in readers if _guarded_softmax(graph, reader) is softmax]
    return len(readers) == 2 and len(guards) == 1  # the other reader is the guard's IsNaN


def _guarded_softmax(graph: Graph, node: Any) -> Any:
    """The Softmax whose NaN guard node is, for node = Where(IsNaN(p), 0, p) with p = Softmax(...), else None."""
    if not graph.is_op(node, "Where") or len(node.input) != 3:
        return None
    condition, zero, probabilities = node.input
    is_nan = graph.made_by(condition, "IsNaN")
    softmax = graph.made_by(probabilities, "Softmax")
    if is_nan is None or softmax is None or is_nan.input[0] != probabilities or graph.scalar(zero) != 0.0:
        return None
    return softmax


def _drop_zero_adds(graph: Graph) -> int:
    """Add(x, c) with c an all-zero constant that does not widen x's shape (torch's empty attention mask)."""
    count = 0
    for node in list(graph.graph.node):
        if not graph.is_op(node, "Add"):
            continue
        output = node.output[0]
        for data, other in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            zeros = graph.constant(other)
            if zeros is None or zeros.any() or graph.shapes.get(data) is None:
                continue
            widens = graph.shapes[data] != graph.shapes.get(output) or graph.types.get(data) != graph.types.get(output)
            if not widens and _bypass(graph, node, data):
                count += 1
                break
    return count


def _drop_softmax_nan_guards(graph: Graph) -> int:
    """Where(IsNaN(p), 0, p) with p = Softmax(MatMul(...) [+ finite constants])."""
    count = 0
    for node in list(graph.graph.node):
        softmax = _guarded_softmax(graph, node)
        if softmax is not None and _rows_cannot_be_all_minus_inf(graph, softmax.input[0]) \
                and _bypass(graph, node, softmax.output[0]):
            count += 1
    return count


def _rows_cannot_be_all_minus_inf(graph: Graph, scores: str) -> bool:
    """True when the scores are a MatMul plus only finite constants: -inf can then come only from inf inputs,
    where torch's own result is no number either."""
    while True:
        add = graph.made_by(scores, "Add")
        if add is None:
            return graph.made_by(scores, "MatMul") is not None
        constant = [name for name in add.input if graph.constant(name) is not None]
        if len(constant) != 1 or not np.isfinite(graph.constant(constant[0])).all():
            return False
        scores = add.input[0] if add.input[1] == constant[0] else add.input[1]


def identity_gathers(onnx: Any, model: Any) -> int:
    """Rewrites in place each Gather that only reshapes (returns how many): torch's exporter writes
    `aten.as_strided` to a tensor's own shape and contiguous strides (timm's ConvNeXt: its pooled features, re-strided
    after its channels-last stages) as Reshape(x, [-1]), then a Gather of the constant indices 0..n-1 shaped as the
    result. That is Reshape(x, the indices' shape), the same values: onnxruntime and OpenVINO skip a copy, and pnnx,
    which has no ncnn layer for a Gather, converts the model (the ncnn candidate was refused for ConvNeXt).
    Every backend that reads the exporter's ONNX (onnxruntime, OpenVINO, ncnn) gets it (onnxruntime.export_onnx)."""
    if not any(node.op_type == "Gather" for node in model.graph.node):
        return 0
    from onnx import numpy_helper

    graph = Graph(onnx, model)
    count = 0
    for node in list(graph.graph.node):
        if not graph.is_op(node, "Gather") or graph.attribute(node, "axis", 0) not in (0, -1):
            continue
        shape, index = graph.shapes.get(node.input[0]), graph.constant(node.input[1])
        if shape is None or len(shape) != 1 or not shape[0] or index is None or index.size != shape[0] \
                or not np.array_equal(index.reshape(-1), np.arange(shape[0])):
            continue
        target = "{}_as_reshape".format(node.output[0])
        graph.graph.initializer.append(numpy_helper.from_array(np.asarray(index.shape, np.int64), target))
        node.op_type = "Reshape"
        del node.attribute[:]
        node.input[1] = target
        count += 1
    if count:
        prune(graph)
    return count


def whole_map_pools(onnx: Any, model: Any) -> int:
    """Rewrites in place each AveragePool whose one window covers its whole (unpadded) input as the
    GlobalAveragePool it is (returns how many): transformers' EfficientNet pools its last (320, 2, 2) map with
    `AvgPool2d(320, ceil_mode=True)`, a 320-wide window that torch and onnxruntime clip to the 2x2 map. ncnn does not
    clip it (its full-padding arithmetic would make a 2x2 output of mostly padding), so edgedyn's checker refused
    pnnx's Pooling; as a global average pool ncnn computes the mean of the map, which is what torch does. Applied
    for ncnn only (backends/ncnn.py): the other runtimes clip the window themselves."""
    if not any(node.op_type == "AveragePool" for node in model.graph.node):
        return 0
    graph = Graph(onnx, model)
    count = 0
    for node in graph.graph.node:
        if not graph.is_op(node, "AveragePool"):
            continue
        shape, out = graph.shapes.get(node.input[0]), graph.shapes.get(node.output[0])
        kernel = list(graph.attribute(node, "kernel_shape", []))
        pads = list(graph.attribute(node, "pads", [0] * 2 * len(kernel)))
        if shape is None or out is None or len(shape) != 2 + len(kernel) or out != shape[:2] + [1] * len(kernel) \
                or any(k < n for k, n in zip(kernel, shape[2:])) or any(pads) \
                or graph.attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        node.op_type = "GlobalAveragePool"
        del node.attribute[:]
        count += 1
    return count
