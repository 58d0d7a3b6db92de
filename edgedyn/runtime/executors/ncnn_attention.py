"""ncnn's MultiHeadAttention layer, beside ncnn_shapes.py's rules for the rest: pnnx writes it for the attention of
transformers' MobileViT and SegFormer (self-attention on one blob; SegFormer's reduced keys and values as three).
Its shape rule, written from ncnn's src/layer/multiheadattention.cpp and its Arm and x86 versions, and how its
weights lie in the .bin. Standard library only, Python 3.8.

The layer reads rows of its inputs by their widths and multiplies them with weights sized by its parameters alone:
a query whose width is not `weight_data_size / embed_dim`, or keys and values wider or narrower than `kdim` and
`vdim`, are read past their ends. Only the form pnnx writes is taken: 1-3 inputs (query, keys, values; one blob
standing for those it leaves out), each 2-d (sequence, features), no attention mask, no key-value cache, float
weights; the output (query's sequence, query's width).
"""
from typing import Callable, Dict, List, Tuple  # noqa: F401 (type comments)

from edgedyn.runtime.executors.ncnn_shapes import Get, Shape, need


def _dims(p: Get) -> Tuple[int, int, int, int, int]:
    """(embed_dim, heads, query width, kdim, vdim) as ncnn reads them; query width -1 when embed_dim does not divide
    weight_data_size."""
    embed, heads, size = p(0, 0), p(1, 1), p(2, 0)
    query = size // embed if embed >= 1 and size >= 1 and size % embed == 0 else -1
    return embed, heads, query, p(3, embed), p(4, embed)


def multi_head_attention(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """The output (sequence, width) of the query: see the module docstring."""
    embed, heads, query, kdim, vdim = _dims(p)
    need(embed >= 1 and heads >= 1 and embed % heads == 0 and query >= 1 and kdim >= 1 and vdim >= 1,
         "embed_dim {}, {} heads, weight_data_size {}, kdim {}, vdim {}".format(embed, heads, p(2, 0), kdim, vdim))
    unsupported = [key for key, name in ((5, "attn_mask"), (7, "kv_cache"), (18, "quantize_term")) if p(key, 0) != 0]
    need(not unsupported, "parameter(s) {} set: an attention mask, a key-value cache or quantized weights".format(
        unsupported))
    scale = params.get(6, 1.0)
    need(isinstance(scale, (int, float)), "scale {}".format(scale))
    need(1 <= len(shapes) <= 3, "{} inputs".format(len(shapes)))
    q, k, v = (shapes * 3)[:3] if len(shapes) == 1 else (shapes[0], shapes[1], shapes[-1])
    need(all(len(s) == 2 for s in (q, k, v)), "inputs of shapes {}: each (sequence, features)".format(
        [list(s) for s in shapes]))
    need(q[1] == query and k[1] == kdim and v[1] == vdim and k[0] == v[0],
         "query {}, keys {}, values {} for widths {}, {}, {}".format(list(q), list(k), list(v), query, kdim, vdim))
    return [(q[0], query)]


def _weights(p: Get) -> List[Tuple[int, bool]]:
    """MultiHeadAttention's load_model: q, k, v and out weights (tagged), each followed by its raw bias."""
    embed, _, query, kdim, vdim = _dims(p)
    if query < 1:
        return [(-1, True)]  # refused by the walk, as ncnn would divide by zero or misread
    return [(embed * query, True), (embed, False), (embed * kdim, True), (embed, False), (embed * vdim, True),
            (embed, False), (query * embed, True), (query, False)]


RULES = {"MultiHeadAttention": multi_head_attention}  # type: Dict[str, Callable[..., List[Shape]]]
WEIGHTS = {"MultiHeadAttention": _weights}  # type: Dict[str, Callable[..., List[Tuple[int, bool]]]]
