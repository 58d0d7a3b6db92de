"""The fusion of torch's exported attention into com.microsoft.MultiHeadAttention (see onnx_rewrites for why and
what it keeps): the per-head Reshape/Transpose chains of q, k and v, the q.k MatMul with its scales and constant
mask, Softmax, the context MatMul and the head merge become one node."""
from typing import Any, Optional, Tuple

import numpy as np

from edgedyn.backends.onnx_graph import Graph

MICROSOFT = "com.microsoft"
# onnxruntime's contrib-op domain version for MultiHeadAttention (its only one). Checked by hand on 2026-12-01: the
# fused hf-vit-tiny-4l and zoo:gpt2 files (the latter with an attention_bias) written with onnxruntime 1.32 run on
# onnxruntime 1.17.3, the backend's minimum, within 7e-7 of 1.32's outputs.
MICROSOFT_VERSION = 1
SDPA_PERM = [0, 2, 1, 3]  # (B, S, H, Dh) <-> (B, H, S, Dh)
KEY_PERM = [0, 1, 3, 2]   # k^T per head
SPLIT_KEY_PERM = [0, 2, 3, 1]  # k^T per head from k split into (B, S, H, Dh)


def _heads(graph: Graph, name: str) -> Optional[Tuple[str, int, int]]:
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


def _unscaled(graph: Graph, name: str) -> Tuple[str, float]:
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


def _key_heads(graph: Graph, name: str) -> Optional[Tuple[str, int, int]]:
    """_heads of k for name = k^T per head: Transpose[0,1,3,2](k per head), with or without a Reshape to the same
    shape between, or Transpose[0,2,3,1] of k split into (B, S, H, Dh) before its head transpose (how onnxruntime's
    transpose optimizer rewrites the first form where H is 1: the zoo's Swin and SegFormer single-head stages)."""
    transpose = graph.made_by(name, "Transpose", KEY_PERM)
    if transpose is not None:
        inner = transpose.input[0]
        reshape = graph.producer.get(inner)
        return _heads(graph, reshape.input[0] if graph.keeps_shape(reshape) else inner)
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


def _past_same_shape_reshape(graph: Graph, node: Optional[Any]) -> Optional[Any]:
    """The only reader of node's output when node is a Reshape that keeps its input's shape (Whisper's attention
    writes one between the context MatMul and the head merge), else node."""
    return graph.only_consumer(node.output[0]) if graph.keeps_shape(node) else node


def fuse_attention(graph: Graph) -> int:
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
        # flattened those (to (B, S, D) or (B*S, D)) reads the fused output instead; prune drops the old chain.
        flatten.input[0] = node.output[0]
        graph.refresh()
        count += 1
    return count


def _attention_at(graph: Graph, softmax: Any) -> Optional[Tuple[Any, Any]]:
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


def _scores_and_bias(graph: Graph, name: str) -> Tuple[Optional[Any], Optional[str], float]:
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


def _attention_bias(graph: Graph, constant: str, name: str, scores: Tuple[int, int, int, int]) -> Optional[str]:
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
    tensor = numpy_helper.from_array(np.asarray(np.broadcast_to(mask, target), order="C"), name + "_bias")
    graph.graph.initializer.append(tensor)
    return tensor.name
