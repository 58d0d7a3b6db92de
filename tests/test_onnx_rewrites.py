"""The onnxruntime backend's rewrites of torch's exported attention (edgedyn/backends/onnx_rewrites.py): what they
fuse on stock `transformers` encoders, what they must leave alone, and that the result still equals torch eager."""
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn
import edgedyn.runtime as rt

pytestmark = pytest.mark.requires("onnx", "onnxruntime", "transformers")

FRESH_SEED = 4321


def _graph(path: Path) -> Any:
    """The ONNX graph of the bundle's (last) onnxruntime artifact."""
    import onnx

    bundle = rt.Bundle(path)
    artifact = bundle.manifest["specializations"][0]["artifacts"][-1]
    return onnx.load_from_string(bundle.read(artifact["files"]["model"])).graph


def _graph_ops(path: Path) -> List[str]:
    return [n.op_type for n in _graph(path).node]


def _rewrites(path: Path) -> Dict[str, int]:
    return rt.read_manifest(path)["specializations"][0]["artifacts"][-1]["onnx_rewrites"]


def _counts(zero_adds: int, guards: int, fused: int, masks: int = 0) -> Dict[str, int]:
    """The manifest's `onnx_rewrites` counts."""
    return {"boolean_masks_made_minus_inf": masks, "zero_adds_removed": zero_adds,
            "softmax_nan_guards_removed": guards, "attention_fused": fused}


@pytest.mark.parametrize("name, expected", [
    # ViT: no mask (the exporter's all-zero one is dropped), so nothing feeds the softmax but q.k
    ("vit", _counts(zero_adds=2, guards=2, fused=2)),
    # GPT-2: a causal mask of float32's lowest value (finite), fused as the node's attention_bias
    ("gpt2", _counts(zero_adds=0, guards=2, fused=2)),
    # DistilBERT and Wav2Vec2: as ViT; their offline-optimized files once failed to load at the board's level (the
    # backend then shipped the unoptimized export, unfused) until onnxruntime's generated initializers were renamed
    ("distilbert", _counts(zero_adds=2, guards=2, fused=2)),
    ("wav2vec2", _counts(zero_adds=2, guards=2, fused=2)),
    # Whisper's encoder: q scaled before the head split, no NaN guard, a Reshape to the same shape after the context
    ("whisper_encoder", _counts(zero_adds=0, guards=0, fused=2)),
    # Swin and SegFormer: their single-head stages come out of onnxruntime's basic pass with k^T as a Transpose of
    # k's (B, S, 1, Dh) split; SegFormer's keys are a reduced sequence (64 keys for 256 queries)
    ("swin", _counts(zero_adds=2, guards=0, fused=2)),
    ("segformer", _counts(zero_adds=0, guards=0, fused=2)),
    # MobileViT: attention over patches (batch 4), the scores divided by sqrt(head size)
    ("mobilevit", _counts(zero_adds=0, guards=0, fused=9)),
])
def test_zoo_attention_becomes_one_node_per_layer_and_matches_torch(name: str, expected: Dict[str, int],
                                                                    tmp_path: Path) -> None:
    import torch

    from edgedyn import zoo

    model = zoo.build(name)
    path = edgedyn.export(model, zoo.example_inputs(name, seed=0), board="x86-64", backend="onnxruntime",
                          output=tmp_path / "{}.edgedyn".format(name))
    assert _rewrites(path) == expected
    ops = _graph_ops(path)
    assert ops.count("MultiHeadAttention") == expected["attention_fused"]
    assert "IsNaN" not in ops and "Softmax" not in ops  # the fused node holds the softmax
    if name == "gpt2":
        fused = [n for n in _graph(path).node if n.op_type == "MultiHeadAttention"]
        assert all(len(n.input) == 6 and n.input[5] for n in fused)  # the causal mask rides along
    fresh = zoo.example_inputs(name, seed=FRESH_SEED)
    actual = rt.load(path)(**{k: v.numpy() for k, v in fresh.items()})
    with torch.no_grad():
        reference = model(**fresh)
    for key in zoo.get(name).outputs:
        want = reference[key].numpy()
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(actual[key], want, rtol=1e-4, atol=1e-4 * scale, err_msg=key)


class _MaskedAttention:
    """Self-attention whose boolean mask is an input."""

    @staticmethod
    def build() -> Any:
        import torch

        class Attention(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = torch.nn.Linear(32, 96)

            def forward(self, x: Any, mask: Any) -> Any:
                q, k, v = self.qkv(x).view(1, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                return out.transpose(1, 2).reshape(1, 8, 32)

        torch.manual_seed(0)
        return Attention().eval()


def test_attention_with_a_mask_input_keeps_the_nan_guard_and_matches_torch(tmp_path: Path) -> None:
    """A mask given at run time could hide whole rows: the guard over its softmax stays, nothing is fused, and every
    row equals torch's, a row with every key hidden included (zeros in torch).

    torch 2.13's ONNX exporter turns the boolean mask into an additive one of float32's lowest value, where torch
    uses -inf; such a row then came out as the mean of the values until the backend made that value -inf."""
    import torch

    model = _MaskedAttention.build()
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    path = edgedyn.export(model, (torch.randn(1, 8, 32), mask), board="x86-64", backend="onnxruntime",
                          output=tmp_path / "masked.edgedyn")
    assert _rewrites(path) == _counts(zero_adds=0, guards=0, fused=0, masks=1)
    assert "IsNaN" in _graph_ops(path)
    rng = np.random.default_rng(FRESH_SEED)
    x = torch.from_numpy(rng.standard_normal((1, 8, 32)).astype(np.float32))
    partial = torch.from_numpy(rng.random((1, 1, 8, 8)) < 0.6)
    partial[..., 0] = True
    partial[0, 0, 5, :] = False  # query 5 sees no key
    with torch.no_grad():
        expected = model(x, partial).numpy()
    assert not expected[0, 5].any() and np.abs(expected[0, 4]).max() > 0.1
    actual = rt.load(path)(x.numpy(), partial.numpy())
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def test_a_lowest_value_mask_that_also_feeds_something_else_stays() -> None:
    """Where(mask, 0, lowest) read by anything but an Add into a guarded softmax keeps float32's lowest value:
    -inf could reach an output there."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgedyn.backends.onnx_rewrites import FLOAT32_LOWEST, rewrite

    constants = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                 numpy_helper.from_array(np.array(FLOAT32_LOWEST, np.float32), "lowest")]
    nodes = [helper.make_node("Where", ["mask", "zero", "lowest"], ["additive"]),
             helper.make_node("Add", ["scores", "additive"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["guarded"]),
             helper.make_node("Mul", ["additive", "scores"], ["elsewhere"])]
    inputs = [helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 4, 4]),
              helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 4])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, 4]) for name in ("guarded", "elsewhere")]
    model, counts = rewrite(onnx, _tiny_model(onnx, nodes, inputs, outputs, constants))
    assert counts["boolean_masks_made_minus_inf"] == 0
    assert [n.input[2] for n in model.graph.node if n.op_type == "Where"][0] == "lowest"


@pytest.mark.parametrize("heads", [1, 4])
def test_attention_written_by_hand_with_k_transposed_from_its_split_fuses_and_matches_torch(
        heads: int, tmp_path: Path) -> None:
    """q @ k^T with k^T = k.view(B, S, H, Dh).permute(0, 2, 3, 1), softmax, @ v: the form onnxruntime's transpose
    optimizer also gives a single-head SDPA (the zoo's Swin and SegFormer), fused as one MultiHeadAttention."""
    import torch

    class HandAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

        def forward(self, x: Any) -> Any:
            size = 32 // heads
            q = self.q(x).view(1, 8, heads, size).transpose(1, 2)
            k_t = self.k(x).view(1, 8, heads, size).permute(0, 2, 3, 1)
            v = self.v(x).view(1, 8, heads, size).transpose(1, 2)
            weights = torch.softmax(q @ k_t * size ** -0.5, dim=-1)
            return (weights @ v).transpose(1, 2).reshape(1, 8, 32)

    torch.manual_seed(0)
    model = HandAttention().eval()
    path = edgedyn.export(model, (torch.randn(1, 8, 32),), board="x86-64", backend="onnxruntime",
                          output=tmp_path / "hand.edgedyn")
    assert _rewrites(path)["attention_fused"] == 1
    assert "Softmax" not in _graph_ops(path)
    x = torch.from_numpy(np.random.default_rng(FRESH_SEED).standard_normal((1, 8, 32)).astype(np.float32))
    with torch.no_grad():
        expected = model(x).numpy()
    actual = rt.load(path)(x.numpy())
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


def _tiny_model(onnx: Any, nodes: List[Any], inputs: List[Any], outputs: List[Any], constants: List[Any]) -> Any:
    graph = onnx.helper.make_graph(nodes, "g", inputs, outputs, initializer=constants)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)])


def test_a_zero_add_that_widens_its_input_or_is_a_graph_output_stays() -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgedyn.backends.onnx_rewrites import rewrite

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    widened = helper.make_tensor_value_info("widened", TensorProto.FLOAT, [3, 4])
    same = helper.make_tensor_value_info("same", TensorProto.FLOAT, [1, 4])
    kept = helper.make_tensor_value_info("kept", TensorProto.FLOAT, [1, 4])
    zeros_wide = numpy_helper.from_array(np.zeros((3, 4), np.float32), "zeros_wide")
    zeros = numpy_helper.from_array(np.zeros((1, 4), np.float32), "zeros")
    nodes = [helper.make_node("Add", ["x", "zeros_wide"], ["widened"]),  # broadcasts x to 3x4: not the identity
             helper.make_node("Add", ["x", "zeros"], ["kept"]),           # a graph output keeps its name
             helper.make_node("Add", ["x", "zeros"], ["inner"]),          # the identity: removed
             helper.make_node("Relu", ["inner"], ["same"])]
    model, counts = rewrite(onnx, _tiny_model(onnx, nodes, [x], [widened, kept, same], [zeros_wide, zeros]))
    assert counts == _counts(zero_adds=1, guards=0, fused=0)
    assert [n.op_type for n in model.graph.node] == ["Add", "Add", "Relu"]
    assert model.graph.node[2].input[0] == "x"


def test_a_nan_guard_over_scores_plus_a_constant_holding_minus_inf_stays() -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgedyn.backends.onnx_rewrites import rewrite

    def guarded(mask: np.ndarray) -> Dict[str, int]:
        a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 4, 8])
        b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 2, 8, 4])
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 4, 4])
        constants = [numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(np.zeros((), np.float32), "zero")]
        nodes = [helper.make_node("MatMul", ["a", "b"], ["scores"]),
                 helper.make_node("Add", ["scores", "mask"], ["masked"]),
                 helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
                 helper.make_node("IsNaN", ["p"], ["nan"]),
                 helper.make_node("Where", ["nan", "zero", "p"], ["guarded"]),
                 helper.make_node("Relu", ["guarded"], ["out"])]
        return rewrite(onnx, _tiny_model(onnx, nodes, [a, b], [out], constants))[1]

    causal = np.triu(np.full((4, 4), np.finfo(np.float32).min, np.float32), 1)  # transformers' finite mask
    assert guarded(causal)["softmax_nan_guards_removed"] == 1
    causal_inf = np.triu(np.full((4, 4), -np.inf, np.float32), 1)
    assert guarded(causal_inf)["softmax_nan_guards_removed"] == 0


def _run_onnxruntime(model: Any, value: np.ndarray) -> List[np.ndarray]:
    """The outputs of `model` on input x = `value`, in onnxruntime's CPU provider."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": value})


def test_a_gather_of_every_index_in_order_becomes_a_reshape_and_others_stay() -> None:
    # torch's exporter writes an `as_strided` to a tensor's own shape (timm's ConvNeXt, its pooled features) as
    # Reshape(x, [-1]) and a Gather of 0..n-1: the same values as a Reshape, which pnnx converts and Gather it
    # does not. A Gather that reorders, repeats or takes part of its input is a real gather and stays.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgedyn.backends.onnx_rewrites import identity_gathers

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 1, 1])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
               for name, shape in (("same", [1, 6, 1, 1]), ("moved", [2, 3]), ("part", [4]))]
    constants = [numpy_helper.from_array(np.array([-1], np.int64), "flat"),
                 numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(1, 6, 1, 1), "in_order"),
                 numpy_helper.from_array(np.array([[1, 0, 2], [3, 5, 4]], np.int64), "reordered"),
                 numpy_helper.from_array(np.arange(4, dtype=np.int64), "first_four")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "flat"], ["flat_x"]),
             helper.make_node("Gather", ["flat_x", "in_order"], ["same"], axis=0),
             helper.make_node("Gather", ["flat_x", "reordered"], ["moved"], axis=0),
             helper.make_node("Gather", ["flat_x", "first_four"], ["part"], axis=0)]
    model = _tiny_model(onnx, nodes, [x], outputs, constants)
    value = np.random.default_rng(0).standard_normal((1, 6, 1, 1)).astype(np.float32)

    before = _run_onnxruntime(model, value)
    assert identity_gathers(onnx, model) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Reshape", "Reshape", "Gather", "Gather"]
    after = _run_onnxruntime(model, value)
    assert after[0].shape == (1, 6, 1, 1)
    for got, want in zip(after, before):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(after[1].ravel(), np.maximum(value, 0).ravel()[:6])  # a real gather: reordered


def test_an_average_pool_whose_window_covers_the_map_becomes_global_and_others_stay() -> None:
    # transformers' EfficientNet: AvgPool2d(320, ceil_mode=True) over a 2x2 map, one clipped window: the map's mean.
    # ncnn would not clip it (edgedyn's checker refused pnnx's Pooling); GlobalAveragePool is the same values.
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 2, 2])
    shapes = {"whole": [1, 8, 1, 1], "windows": [1, 8, 1, 1], "padded": [1, 8, 2, 2]}
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()]
    nodes = [helper.make_node("AveragePool", ["x"], ["whole"], kernel_shape=[320, 320], strides=[320, 320],
                              ceil_mode=1, count_include_pad=1, pads=[0, 0, 0, 0]),
             helper.make_node("AveragePool", ["x"], ["windows"], kernel_shape=[2, 1], strides=[2, 2]),
             helper.make_node("AveragePool", ["x"], ["padded"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    model = _tiny_model(onnx, nodes, [x], outputs, [])
    value = np.random.default_rng(1).standard_normal((1, 8, 2, 2)).astype(np.float32)

    from edgedyn.backends.onnx_rewrites import whole_map_pools

    before = _run_onnxruntime(model, value)
    assert whole_map_pools(onnx, model) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["GlobalAveragePool", "AveragePool", "AveragePool"]
    after = _run_onnxruntime(model, value)
    np.testing.assert_allclose(after[0], value.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    for got, want in zip(after, before):
        np.testing.assert_allclose(got, want, rtol=1e-6)
