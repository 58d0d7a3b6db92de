"""Rewrites of the exported ONNX graph that onnxruntime does not do itself: the attention torch's exporter writes.

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
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

MICROSOFT = "com.microsoft"
# onnxruntime's contrib-op domain version for MultiHeadAttention (its only one). Checked by hand on 2026-12-01: the
# fused hf-vit-tiny-4l and zoo:gpt2 files (the latter with an attention_bias) written with onnxruntime 1.32 run on
# onnxruntime 1.17.3, the backend's minimum, within 7e-7 of 1.32's outputs.
MICROSOFT_VERSION = 1
SDPA_PERM = [0, 2, 1, 3]  # (B, S, H, Dh) <-> (B, H, S, Dh)
KEY_PERM = [0, 1, 3, 2]   # k^T per head
SPLIT_KEY_PERM = [0, 2, 3, 1]  # k^T per head from k split into (B, S, H, Dh)


class _Graph:
    """Lookups over one ONNX graph: producers, consumers, constants, and shapes and types inferred once (the
    rewrites only remove nodes and re-point inputs, so no tensor changes its shape)."""

    def __init__(self, onnx: Any, model: Any) -> None:
        self.onnx = onnx
        self.model = model
        self.graph = model.graph
        self._initializers = {t.name: t for t in self.graph.initializer}
        self._arrays = {}  # type: Dict[str, np.ndarray]
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self.shapes = {}  # type: Dict[str, List[int]]
        self.types = {}  # type: Dict[str, int]
        for value in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
            tensor = value.type.tensor_type
            self.types[value.name] = tensor.elem_type
            if all(d.HasField("dim_value") for d in tensor.shape.dim):
                self.shapes[value.name] = [d.dim_value for d in tensor.shape.dim]
        for tensor in self.graph.initializer:
            self.shapes[tensor.name] = list(tensor.dims)
            self.types[tensor.name] = tensor.data_type
        self.refresh()

    def refresh(self) -> None:
        """Producers and consumers again, after an edit."""
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.consumers = {}  # type: Dict[str, List[Any]]
        for node in self.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def constant(self, name: str) -> Optional[np.ndarray]:
        """The initializer's values (read once, when a rewrite asks), or None for a computed tensor."""
        if name not in self._arrays and name in self._initializers:
            from onnx import numpy_helper

            self._arrays[name] = numpy_helper.to_array(self._initializers[name])
        return self._arrays.get(name)

    def made_by(self, name: str, op_type: str, perm: Optional[List[int]] = None) -> Optional[Any]:
        """The node producing `name` when it is that op (see is_op), else None."""
        node = self.producer.get(name)
        return node if self.is_op(node, op_type, perm) else None

    def is_output(self, name: str) -> bool:
        return any(output.name == name for output in self.graph.output)

    def only_consumer(self, name: str) -> Optional[Any]:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and not self.is_output(name) else None

    def is_op(self, node: Optional[Any], op_type: str, perm: Optional[List[int]] = None) -> bool:
        """Whether node is a standard-domain op_type (with this `perm`, for a Transpose)."""
        return (node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")
                and (perm is None or list(self.attribute(node, "perm", [])) == perm))

    def scalar(self, name: str) -> Optional[float]:
        array = self.constant(name)
        return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None

    def attribute(self, node: Any, name: str, default: Any = None) -> Any:
        for attribute in node.attribute:
            if attribute.name == name:
                return self.onnx.helper.get_attribute_value(attribute)
        return default


def rewrite(onnx: Any, model: Any) -> Tuple[Any, Dict[str, int]]:
    """The model with the rewrites above applied, and how often each applied (the manifest's `onnx_rewrites`)."""
    graph = _Graph(onnx, model)
    counts = {}  # type: Dict[str, int]
    for key, apply in (("boolean_masks_made_minus_inf", _boolean_masks_to_minus_inf),
                       ("zero_adds_removed", _drop_zero_adds), ("softmax_nan_guards_removed", _drop_softmax_nan_guards),
                       ("attention_fused", _fuse_attention)):
        counts[key] = apply(graph)
        _prune(graph)  # the next rewrite must not see the dead nodes as consumers
    if any(counts.values()):
        if counts["attention_fused"] and not any(o.domain == MICROSOFT for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(MICROSOFT, MICROSOFT_VERSION))
        onnx.checker.check_model(model)
    return model, counts


def _bypass(graph: _Graph, node: Any, kept_input: str) -> bool:
    """Every reader of node's output reads kept_input instead, which leaves node dead (for _prune); False, and
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


def _boolean_masks_to_minus_inf(graph: _Graph) -> int:
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
        node.input[2] = name
        count += 1
    graph.refresh()
    return count


def _feeds_a_guarded_softmax(graph: _Graph, add: Any) -> bool:
    """Whether `add` is an Add read only by a Softmax whose readers are exactly Where(IsNaN(p), 0, p)."""
    softmax = graph.only_consumer(add.output[0]) if graph.is_op(add, "Add") else None
    if not graph.is_op(softmax, "Softmax") or graph.is_output(softmax.output[0]):
        return False
    probabilities = softmax.output[0]
    readers = graph.consumers.get(probabilities, [])
    is_nan = [r for r in readers if graph.is_op(r, "IsNaN")]
    guards = [r for r in readers if graph.is_op(r, "Where") and len(r.input) == 3 and r.input[2] == probabilities
              and graph.scalar(r.input[1]) == 0.0 and is_nan and r.input[0] == is_nan[0].output[0]]
    return len(readers) == 2 and len(is_nan) == 1 and len(guards) == 1


def _drop_zero_adds(graph: _Graph) -> int:
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


def _drop_softmax_nan_guards(graph: _Graph) -> int:
    """Where(IsNaN(p), 0, p) with p = Softmax(MatMul(...) [+ finite constants])."""
    count = 0
    for node in list(graph.graph.node):
        if not graph.is_op(node, "Where") or len(node.input) != 3:
            continue
        condition, zero, probabilities = node.input
        is_nan = graph.made_by(condition, "IsNaN")
        softmax = graph.made_by(probabilities, "Softmax")
        if is_nan is None or softmax is None or is_nan.input[0] != probabilities or graph.scalar(zero) != 0.0:
            continue
        if _rows_cannot_be_all_minus_inf(graph, softmax.input[0]) and _bypass(graph, node, probabilities):
            count += 1
    return count


def _rows_cannot_be_all_minus_inf(graph: _Graph, scores: str) -> bool:
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


def _heads(graph: _Graph, name: str) -> Optional[Tuple[str, int, int]]:
    """(x, heads, head size) when name = Transpose[0,2,1,3](Reshape(x, [B, S, H, Dh])) with x of shape (B, S, H*Dh)."""
    transpose = graph.made_by(name, "Transpose", SDPA_PERM)
    if transpose is None:
        return None
    reshape = graph.made_by(transpose.input[0], "Reshape")
    target = None if reshape is None else graph.constant(reshape.input[1])
    if target is None:
        return None
    source, target = reshape.input[0], target.tolist()
    shape = graph.shapes.get(source)
    if shape is None or len(shape) != 3 or len(target) != 4 or target[3] <= 0 or shape[2] % target[3]:
        return None
    heads = shape[2] // target[3]
    if target[2] not in (-1, heads) or graph.shapes.get(transpose.output[0]) != [shape[0], heads, shape[1], target[3]]:
        return None
    return source, heads, target[3]


def _unscaled(graph: _Graph, name: str) -> Tuple[str, float]:
    """(x, s) for name = Mul(x, s) or Div(x, 1/s) with a scalar constant (MobileViT divides its scores by
    sqrt(head size)), else (name, 1)."""
    mul = graph.made_by(name, "Mul")
    if mul is not None:
        for data, factor in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
            value = graph.scalar(factor)
            if value is not None:
                return data, value
    div = graph.made_by(name, "Div")
    divisor = None if div is None else graph.scalar(div.input[1])
    if divisor:
        return div.input[0], 1.0 / divisor
    return name, 1.0


def _key_heads(graph: _Graph, name: str) -> Optional[Tuple[str, int, int]]:
    """_heads of k for name = k^T per head: Transpose[0,1,3,2](k per head), with or without a Reshape to the same
    shape between, or Transpose[0,2,3,1] of k split into (B, S, H, Dh) before its head transpose (how onnxruntime's
    transpose optimizer rewrites the first form where H is 1: the zoo's Swin and SegFormer single-head stages)."""
    transpose = graph.made_by(name, "Transpose", KEY_PERM)
    if transpose is not None:
        inner = transpose.input[0]
        reshape = graph.made_by(inner, "Reshape")
        if reshape is not None and graph.shapes.get(reshape.input[0]) == graph.shapes.get(inner):
            inner = reshape.input[0]
        return _heads(graph, inner)
    transpose = graph.made_by(name, "Transpose", SPLIT_KEY_PERM)
    split = None if transpose is None else graph.shapes.get(transpose.input[0])
    reshape = None if transpose is None else graph.made_by(transpose.input[0], "Reshape")
    if reshape is None or split is None or len(split) != 4:
        return None
    source = reshape.input[0]
    heads = _heads(graph, source)
    if heads is not None:
        # (B, H, S, Dh) reshaped to (B, S, H, Dh) keeps the element order only when H is 1
        return heads if split[2] == 1 and heads[1:] == (1, split[3]) else None
    shape = graph.shapes.get(source)
    if shape is None or len(shape) != 3 or shape[:2] != split[:2] or shape[2] != split[2] * split[3]:
        return None
    return source, split[2], split[3]


def _past_same_shape_reshape(graph: _Graph, node: Optional[Any]) -> Optional[Any]:
    """The only reader of node's output when node is a Reshape that keeps its input's shape (Whisper's attention
    writes one between the context MatMul and the head merge), else node."""
    if graph.is_op(node, "Reshape") and graph.shapes.get(node.input[0]) is not None \
            and graph.shapes.get(node.input[0]) == graph.shapes.get(node.output[0]):
        return graph.only_consumer(node.output[0])
    return node


def _fuse_attention(graph: _Graph) -> int:
    """Reshape(Transpose(MatMul(Softmax(MatMul(q*a, k^T*b) [* s] [+ c]), v))) between per-head reshapes (a, b, s
    scalar constants, each a Mul or a Div) -> Reshape(MultiHeadAttention(q, k, v, scale=a*b*s [, attention_bias=c]))."""
    count = 0
    for softmax in [n for n in graph.graph.node if graph.is_op(n, "Softmax")]:
        fused = _attention_at(graph, softmax)
        if fused is None:
            continue
        node, flatten = fused
        graph.graph.node.insert(list(graph.graph.node).index(flatten), node)
        # (B, S, D) holds the same values in the same order as the merged heads' (B, S, H, Dh): the Reshape that
        # flattened those (to (B, S, D) or (B*S, D)) reads the fused output instead; _prune drops the old chain.
        flatten.input[0] = node.output[0]
        graph.refresh()
        count += 1
    return count


def _attention_at(graph: _Graph, softmax: Any) -> Optional[Tuple[Any, Any]]:
    """(the MultiHeadAttention node, the Reshape after it) for the attention around this Softmax, if it matches."""
    axis = graph.attribute(softmax, "axis", -1)
    scores, bias, scores_scale = _scores_and_bias(graph, softmax.input[0])
    if scores is None or axis not in (-1, 3):
        return None
    query_heads, query_scale = _unscaled(graph, scores.input[0])
    key_heads, key_scale = _unscaled(graph, scores.input[1])
    query, key = _heads(graph, query_heads), _key_heads(graph, key_heads)
    context = graph.only_consumer(softmax.output[0])
    if query is None or key is None or not graph.is_op(context, "MatMul") or context.input[0] != softmax.output[0]:
        return None
    value = _heads(graph, context.input[1])
    merge = _past_same_shape_reshape(graph, graph.only_consumer(context.output[0]))
    if value is None or not graph.is_op(merge, "Transpose", SDPA_PERM):
        return None
    flatten = graph.only_consumer(merge.output[0])
    if not graph.is_op(flatten, "Reshape"):
        return None
    batch, length, hidden = graph.shapes[query[0]]
    same_heads = query[1:] == key[1:] == value[1:] and graph.shapes[key[0]][2] == graph.shapes[value[0]][2] == hidden
    if not same_heads or graph.shapes[key[0]][0] != batch:
        return None
    name = "edgedyn_attention_{}".format(sum(1 for n in graph.graph.node if n.op_type == "MultiHeadAttention"))
    inputs = [query[0], key[0], value[0]]
    if bias is not None:
        bias_name = _attention_bias(graph, bias, name, (batch, query[1], length, graph.shapes[key[0]][1]))
        if bias_name is None:
            return None
        inputs += ["", "", bias_name]  # MultiHeadAttention's inputs 3 and 4 (projection bias, padding mask) unused
    scale = query_scale * key_scale * scores_scale
    node = graph.onnx.helper.make_node("MultiHeadAttention", inputs, [name + "_output"], name=name,
                                       domain=MICROSOFT, num_heads=query[1], scale=scale)
    return node, flatten


def _scores_and_bias(graph: _Graph, name: str) -> Tuple[Optional[Any], Optional[str], float]:
    """(the q.k MatMul, c, s) for name = MatMul(...) [* s] [+ c], with s a scalar constant (1 without the Mul or Div:
    hand-written attention scales the scores, the exporter's SDPA scales q and k) and c a constant (a causal or
    other fixed mask; None without the Add); (None, None, 1) otherwise."""
    bias = None
    add = graph.made_by(name, "Add")
    if add is not None:
        for scores, constant in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
            if graph.constant(constant) is not None and graph.constant(scores) is None:
                name, bias = scores, constant
                break
        else:
            return None, None, 1.0
    scores, scale = _unscaled(graph, name)
    matmul = graph.made_by(scores, "MatMul")
    return (matmul, bias, scale) if matmul is not None else (None, None, 1.0)


# An attention bias is stored expanded to (1 or batch, heads, queries, keys), the one shape every onnxruntime
# release takes (later ones also broadcast over heads); past this many values the mask stays unfused.
MAX_BIAS_VALUES = 1 << 22


def _attention_bias(graph: _Graph, constant: str, name: str, scores: Tuple[int, int, int, int]) -> Optional[str]:
    """The name of a new initializer holding the mask `constant` as MultiHeadAttention's attention_bias, or None
    when it does not broadcast to the scores' (batch, heads, queries, keys) or would be too large."""
    from onnx import numpy_helper

    mask = graph.constant(constant)
    if mask.dtype != np.float32 or mask.ndim > 4:
        return None
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if any(size not in (1, full) for size, full in zip(mask.shape, scores)):
        return None
    target = (mask.shape[0],) + tuple(scores[1:])
    if int(np.prod(target)) > MAX_BIAS_VALUES:
        return None
    tensor = numpy_helper.from_array(np.ascontiguousarray(np.broadcast_to(mask, target)), name + "_bias")
    graph.graph.initializer.append(tensor)
    return tensor.name


def _prune(graph: _Graph) -> None:
    """Drops the nodes and initializers no graph output depends on any more."""
    needed = {output.name for output in graph.graph.output}
    kept = []
    for node in reversed(list(graph.graph.node)):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    del graph.graph.node[:]
    graph.graph.node.extend(reversed(kept))
    initializers = [t for t in graph.graph.initializer if t.name in needed]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(initializers)
    graph.refresh()
