"""The TFLite writer op by op: each small model exported with --backend tflite and run by LiteRT equals torch eager.

Inputs are fresh random normals (never the export's example inputs, never zeros). Tolerance: fp32 through XNNPACK,
max abs error <= 1e-4 * max |torch output| (+1e-6), the bundle's own tolerance.
"""
import zlib
from typing import Any, Callable, List, Sequence, Tuple

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import BackendError

pytestmark = pytest.mark.requires("ai_edge_litert", "tflite")
RTOL = 1e-4


class Fn(nn.Module):
    """A module around a function of the inputs, so each table row is one line."""

    def __init__(self, fn: Callable[..., torch.Tensor], *modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.layers = nn.ModuleList(modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.layers, x)


class Fn2(Fn):
    """The same for two inputs (edgedyn captures named arguments, not *args)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.fn(self.layers, x, y)


def conv(cin: int = 4, cout: int = 6, k: int = 3, **kw: int) -> nn.Conv2d:
    torch.manual_seed(0)
    return nn.Conv2d(cin, cout, k, **kw)


def seq(*modules: nn.Module) -> Fn:
    return Fn(lambda m, x: nn.Sequential(*m)(x), *modules)


IMG = (1, 4, 9, 11)  # odd, unequal sizes: SAME's uneven padding and H/W swaps show up
CASES = {
    # convolution: CONV_2D and DEPTHWISE_CONV_2D in NHWC, torch padding as SAME, VALID or an explicit PAD
    "conv3x3_same": (seq(conv(padding=1)), [IMG]),
    "conv3x3_stride2_pad1": (seq(conv(stride=2, padding=1)), [IMG]),
    "conv5x5_valid_no_bias": (seq(conv(k=5, bias=False)), [IMG]),
    "conv_dilated": (seq(conv(padding=2, dilation=2)), [IMG]),
    "conv_rect_kernel_stride": (seq(conv(k=(3, 1), stride=(2, 1), padding=(1, 0))), [IMG]),
    "conv1x1_batch2": (seq(conv(k=1)), [(2, 4, 5, 5)]),
    "depthwise": (seq(conv(4, 4, groups=4, padding=1)), [IMG]),
    "depthwise_stride2": (seq(conv(4, 4, groups=4, stride=2, padding=1)), [IMG]),
    "depthwise_multiplier2": (seq(conv(4, 8, groups=4, padding=1)), [IMG]),
    "grouped_conv": (seq(conv(4, 6, groups=2, padding=1)), [IMG]),
    "conv1d": (seq(nn.Conv1d(4, 6, 3, padding=1)), [(2, 4, 13)]),
    "conv1d_stride_dilation": (seq(nn.Conv1d(4, 6, 5, stride=2, dilation=2, padding=3)), [(1, 4, 21)]),
    "conv1d_grouped": (seq(nn.Conv1d(8, 8, 4, groups=4, padding=2)), [(1, 8, 11)]),
    # fully connected and matrix products
    "linear": (seq(nn.Linear(16, 7)), [(3, 16)]),
    "linear_3d": (seq(nn.Linear(16, 7)), [(2, 3, 16)]),
    "linear_no_bias": (seq(nn.Linear(16, 7, bias=False)), [(3, 16)]),
    "mm_computed": (Fn(lambda m, a, b: a @ b), [(5, 6), (6, 3)]),
    "bmm": (Fn(lambda m, a, b: torch.bmm(a, b)), [(2, 5, 6), (2, 6, 3)]),
    "matmul_4d_transposed": (Fn(lambda m, a, b: a @ b.transpose(-2, -1)), [(1, 2, 5, 6), (1, 2, 4, 6)]),
    # elementwise, with broadcasting across layouts
    "add_sub_mul_div": (Fn(lambda m, a, b: (a + b) * (a - b) / (b.abs() + 1.5)), [(2, 3, 4), (2, 3, 4)]),
    "broadcast_row": (Fn(lambda m, a, b: a * b - b), [(2, 3, 4), (4,)]),
    "scalars": (Fn(lambda m, x: (1.0 - x) * 3 + x / 4 - 2), [(3, 5)]),
    "add_alpha": (Fn(lambda m, a, b: torch.add(a, b, alpha=0.5)), [(3, 5), (3, 5)]),
    "nhwc_plus_nchw_input": (Fn(lambda m, x: m[0](x) + x), [IMG], conv(4, 4, padding=1)),
    "nhwc_times_channel_param": (Fn(lambda m, x: m[0](x) * m[0].bias.view(6, 1, 1) + 1), [IMG], conv()),
    "nhwc_plus_row_vector": (Fn(lambda m, x, r: m[0](x) + r), [IMG, (11,)], conv(padding=1)),
    "residual_nhwc": (Fn(lambda m, x: m[1](m[0](x)) + m[0](x)), [IMG], conv(4, 4, padding=1), conv(4, 4, padding=1)),
    "maximum_minimum_pow": (Fn(lambda m, a, b: torch.maximum(a, b) + torch.minimum(a, b) ** 2), [(4, 5), (4, 5)]),
    # activations; a lone ReLU/ReLU6 after a convolution, linear, add, sub or mul is fused into it
    "relu": (seq(nn.ReLU()), [(3, 8)]),
    "conv_relu": (seq(conv(padding=1), nn.ReLU()), [IMG]),
    "depthwise_relu6": (seq(conv(4, 4, groups=4, padding=1), nn.ReLU6()), [IMG]),
    "grouped_conv_relu": (seq(conv(4, 6, groups=2, padding=1), nn.ReLU()), [IMG]),
    "linear_relu": (seq(nn.Linear(16, 7), nn.ReLU()), [(3, 16)]),
    "residual_add_relu": (Fn(lambda m, x: torch.relu(m[0](x) + x)), [IMG], conv(4, 4, padding=1)),
    "sub_relu6_mul_relu": (Fn(lambda m, a, b: F.relu6(a - b) + torch.relu(a * b)), [(2, 3, 4), (2, 3, 4)]),
    "conv_output_also_read_unclamped": (Fn(lambda m, x: torch.relu(m[0](x)) * m[0](x)), [IMG], conv()),
    "relu6": (seq(conv(padding=1), nn.ReLU6()), [IMG]),
    "hardtanh_other_bounds": (seq(nn.Hardtanh(-0.5, 0.7)), [(3, 8)]),
    "hardtanh_minus1_1": (seq(nn.Hardtanh()), [(3, 8)]),
    "clamp_min": (Fn(lambda m, x: torch.clamp(x, min=0.25)), [(3, 8)]),
    "hardswish": (seq(nn.Hardswish()), [(3, 8)]),
    "hardsigmoid": (seq(nn.Hardsigmoid()), [(3, 8)]),
    "sigmoid": (seq(nn.Sigmoid()), [(3, 8)]),
    "tanh": (seq(nn.Tanh()), [(3, 8)]),
    "gelu": (seq(nn.GELU()), [(3, 8)]),
    "gelu_tanh": (seq(nn.GELU(approximate="tanh")), [(3, 8)]),
    "silu": (seq(nn.SiLU()), [(3, 8)]),
    "leaky_relu": (seq(nn.LeakyReLU(0.2)), [(3, 8)]),
    "exp_log_sqrt_rsqrt_neg": (Fn(lambda m, x: torch.exp(-x) + torch.log(x.abs() + 1) + torch.sqrt(x.abs())
                                  + torch.rsqrt(x.abs() + 1)), [(3, 8)]),
    # pooling and reductions
    "maxpool2": (seq(nn.MaxPool2d(2)), [(1, 3, 8, 10)]),
    "maxpool3_stride2_pad1": (seq(nn.MaxPool2d(3, 2, 1)), [IMG]),
    "avgpool2": (seq(nn.AvgPool2d(2)), [(1, 3, 8, 10)]),
    "avgpool3_pad1_count_pad": (seq(nn.AvgPool2d(3, 1, 1)), [IMG]),
    "avgpool3_pad1_exclude_pad": (seq(nn.AvgPool2d(3, 1, 1, count_include_pad=False)), [IMG]),
    # stride 2 on an even size: padding SAME cannot say, each border window divided by its real values
    "avgpool3_stride2_pad1_exclude_pad": (seq(nn.AvgPool2d(3, 2, 1, count_include_pad=False)), [(1, 3, 8, 10)]),
    "avgpool_window_past_image_ceil": (seq(nn.AvgPool2d(16, ceil_mode=True)), [IMG]),  # EfficientNet's head
    "adaptive_avgpool_1": (seq(conv(), nn.AdaptiveAvgPool2d(1)), [IMG]),
    "adaptive_avgpool_2": (seq(nn.AdaptiveAvgPool2d((2, 3))), [(1, 3, 8, 9)]),
    "mean_channels_of_nhwc": (Fn(lambda m, x: m[0](x).mean(1)), [IMG], conv()),
    "mean_hw_no_keepdim": (Fn(lambda m, x: m[0](x).mean((2, 3))), [IMG], conv()),
    "cumsum": (Fn(lambda m, x: torch.cumsum(x, 1)), [(3, 7)]),
    "cumsum_channels_of_nhwc": (Fn(lambda m, x: torch.cumsum(m[0](x), 1)), [IMG], conv()),
    "sum_and_amax": (Fn(lambda m, x: x.sum(-1) + x.amax(0)), [(4, 4)]),
    # wav2vec2's frame mask: frame counts by integer floor division, a reversed cumsum, a mask over channels
    "flip_of_nhwc_and_flat": (Fn(lambda m, x, y: torch.flip(m[0](x), [1, 3]).sum((2, 3)) + torch.flip(y, [0])),
                              [IMG, (1, 6)], conv()),
    "repeat": (Fn(lambda m, x: x.repeat(2, 1, 3) + 1.5), [(3, 4)]),
    "bool_where_repeat": (Fn(lambda m, x: torch.where((x > 0).unsqueeze(-1).repeat(1, 1, 3), 2.0, -1.0)), [(2, 5)]),
    "int_floor_div": (Fn(lambda m, x: torch.div((x * 10).long() - 3, 4, rounding_mode="floor").float() + x),
                      [(3, 5)]),
    # shapes and layout
    "flatten_nhwc": (Fn(lambda m, x: torch.flatten(m[0](x), 1)), [IMG], conv()),
    "view_permute_reshape": (Fn(lambda m, x: x.view(2, 3, 4).permute(2, 0, 1).reshape(4, 6)), [(6, 4)]),
    "permute_of_nhwc": (Fn(lambda m, x: m[0](x).permute(0, 2, 3, 1)), [IMG], conv()),
    "transpose_then_add": (Fn(lambda m, x, y: x.transpose(0, 1) + y), [(3, 5), (5, 3)]),
    "cat_channels_nhwc": (Fn(lambda m, x: torch.cat([m[0](x), m[1](x)], 1)), [IMG], conv(), conv(4, 3)),
    "cat_last_dim": (Fn(lambda m, a, b: torch.cat([a, b], -1)), [(2, 3), (2, 5)]),
    "slice_select": (Fn(lambda m, x: x[:, 1:4, ::2] + x[:, 0:3, 1::2] * x[:, 2, None, :4]), [(2, 5, 8)]),
    "slice_of_nhwc": (Fn(lambda m, x: m[0](x)[:, 2:5, 1:]), [IMG], conv()),
    "chunk": (Fn(lambda m, x: torch.stack(x.chunk(2, -1), 0).sum(0)), [(3, 8)]),
    "unsqueeze_squeeze_expand": (Fn(lambda m, x: x.unsqueeze(1).expand(3, 4, 5).squeeze(0) * 2), [(3, 5)]),
    # softmax over any dim
    "softmax_last": (Fn(lambda m, x: torch.softmax(x, -1)), [(3, 7)]),
    "softmax_dim0": (Fn(lambda m, x: torch.softmax(x, 0)), [(3, 7)]),
    "softmax_channels_nhwc": (Fn(lambda m, x: torch.softmax(m[0](x), 1)), [IMG], conv()),
    "log_softmax": (Fn(lambda m, x: F.log_softmax(x, -1)), [(3, 7)]),
    # padding
    "pad_zeros": (Fn(lambda m, x: F.pad(x, (1, 2, 0, 3))), [(2, 3, 4)]),
    "pad_value": (Fn(lambda m, x: F.pad(x, (2, 0), value=1.5)), [(3, 4)]),
    "pad_nhwc": (Fn(lambda m, x: F.pad(m[0](x), (1, 1, 2, 0))), [IMG], conv()),
    # comparisons, boolean masks and where (attention masks computed from the input)
    "compare_where": (Fn(lambda m, x, y: torch.where(x > 0.3, x, y * 2) + torch.where(x <= y, 1.5, x)),
                      [(4, 6), (4, 6)]),
    "logical_and_or_not": (Fn(lambda m, x, y: torch.where(((x > 0) & (y < 0.5)) | ~(x > -1), x, y)),
                           [(4, 6), (4, 6)]),
    "eq_ne_tensor": (Fn(lambda m, x: torch.where(x.eq(x.amax(-1, keepdim=True)), 2.0, x)
                        + torch.where(x.ne(x.amax(0)), x, -3.0)), [(5, 6)]),
    "any_row_safe_softmax": (Fn(lambda m, x: torch.where(torch.any(x > 1.2, -1, keepdim=True).logical_not(),
                                                         torch.full_like(x, 0.5), torch.softmax(x, -1))), [(8, 5)]),
    "where_on_nhwc": (Fn(lambda m, x: torch.where(m[0](x) > 0, m[0](x), 0.1 * m[0](x))), [IMG], conv()),
    "full_like_at_run_time": (Fn(lambda m, x: x * torch.full_like(x, 0.25) + torch.full_like(x, 1.5)),
                              [(1, 4, 64, 80)]),  # past the folding size limit: BROADCAST_TO at run time
    # resizing (interpolate)
    "bilinear_x2": (Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear")), [(1, 3, 5, 7)]),
    "bilinear_to_size_align_corners": (Fn(lambda m, x: F.interpolate(x, size=(9, 4), mode="bilinear",
                                                                      align_corners=True)), [(1, 3, 5, 7)]),
    "bilinear_of_nhwc_down": (Fn(lambda m, x: F.interpolate(m[0](x), size=(4, 5), mode="bilinear")), [IMG], conv()),
    "nearest_x2": (Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest")), [(1, 3, 5, 7)]),
    # normalization
    "layer_norm": (seq(nn.LayerNorm(16)), [(2, 5, 16)]),
    "layer_norm_2d": (seq(nn.LayerNorm((5, 16))), [(2, 5, 16)]),
    "group_norm": (seq(nn.GroupNorm(2, 4)), [IMG]),
    "group_norm_1d_one_group": (seq(nn.GroupNorm(1, 4)), [(2, 4, 13)]),
    "batch_norm_unfolded": (seq(nn.BatchNorm1d(6)), [(4, 6)]),
    "batch_norm_2d_on_input": (seq(nn.BatchNorm2d(4)), [IMG]),
}


def _randomize(model: nn.Module) -> nn.Module:
    generator = torch.Generator().manual_seed(7)
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator))
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            module.weight.data.copy_(torch.randn(n, generator=generator))
            module.bias.data.copy_(torch.randn(n, generator=generator))
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
            module.weight.data.copy_(torch.randn(module.weight.shape, generator=generator))
            module.bias.data.copy_(torch.randn(module.bias.shape, generator=generator))
    return model.eval()


def _case(name: str) -> Tuple[nn.Module, Sequence[Tuple[int, ...]]]:
    entry = CASES[name]
    model, shapes = entry[0], entry[1]
    cls = Fn2 if len(shapes) == 2 else Fn
    model = cls(model.fn, *(list(model.layers) + list(entry[2:])))
    return _randomize(model), shapes


def test_a_rounded_scale_factor_is_refused_with_the_fix(tmp_path) -> None:
    model = Fn(lambda m, x: F.interpolate(x, scale_factor=2.5, mode="bilinear")).eval()
    with pytest.raises(BackendError, match="scale_factor=2.5 from 5 to 12 pixels") as raised:
        edgedyn.export(model, (torch.randn(1, 3, 5, 6),), backend="tflite", output=tmp_path / "r.edgedyn",
                       verify=False)
    assert "pass size= instead" in str(raised.value)


def _lookup_model() -> nn.Module:
    torch.manual_seed(3)
    table = nn.Embedding(50, 8)
    position = nn.Embedding(7, 8)
    return Fn(lambda m, ids: m[0](ids) + m[1].weight * 0.5, table, position).eval()


def test_embedding_takes_int64_token_ids(tmp_path) -> None:
    model = _lookup_model()
    example = torch.randint(0, 50, (2, 7))
    bundle = edgedyn.export(model, (example,), backend="tflite", output=tmp_path / "ids.edgedyn", verify=False)
    program = rt.load(bundle, threads=1)
    for seed in (zlib.crc32(b"embedding"), 11):
        ids = np.random.default_rng(seed).integers(0, 50, (2, 7)).astype(np.int64)
        with torch.no_grad():
            expected = model(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(program(ids), expected, rtol=RTOL, atol=RTOL * float(np.abs(expected).max()))


def test_embedding_refuses_an_id_past_the_table(tmp_path) -> None:
    model = _lookup_model()
    bundle = edgedyn.export(model, (torch.randint(0, 50, (2, 7)),), backend="tflite",
                            output=tmp_path / "ids.edgedyn", verify=False)
    program = rt.load(bundle, threads=1)
    ids = np.random.default_rng(5).integers(0, 50, (2, 7)).astype(np.int64)
    ids[1, 3] = 50 + (1 << 32)  # narrowed to int32 this would wrap to 50; past the table either way
    with pytest.raises(Exception, match="(?i)gather|index|bound"):
        program(ids)


class _Positions(nn.Module):
    """RoBERTa's lookups: position ids computed from the token ids (ne, cast, cumsum, mul, add) and a gather."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.tokens, self.positions, self.types = nn.Embedding(50, 8), nn.Embedding(20, 8), nn.Embedding(2, 8)
        self.register_buffer("type_ids", torch.randint(0, 2, (1, 9)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask + 1
        types = torch.gather(self.type_ids, 1, positions.long() - 1)
        return self.tokens(ids) + self.positions(positions) + self.types(types)


def _token_ids(seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, 50, (1, 9)).astype(np.int64)
    ids[:, -3:] = 1  # padding: its position ids differ from an arange
    return ids


def test_position_ids_computed_from_token_ids(tmp_path) -> None:
    model = _Positions().eval()
    bundle = edgedyn.export(model, (torch.from_numpy(_token_ids(0)),), backend="tflite",
                            output=tmp_path / "pos.edgedyn", verify=False)
    program = rt.load(bundle, threads=1)
    for seed in (zlib.crc32(b"positions"), 2):
        ids = _token_ids(seed)
        with torch.no_grad():
            expected = model(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(program(ids), expected, rtol=RTOL, atol=RTOL * float(np.abs(expected).max()))


def test_integer_arithmetic_tflite_does_not_run_is_refused_in_words(tmp_path) -> None:
    model = Fn(lambda m, ids: m[0](ids.sum(-1, keepdim=True)), nn.Embedding(500, 4)).eval()
    with pytest.raises(BackendError, match="it has int64 tensors at run time; the TFLite writer handles float32 "
                                           "data, bool masks and integer ids"):
        edgedyn.export(model, (torch.randint(0, 50, (2, 7)),), backend="tflite", output=tmp_path / "s.edgedyn",
                       verify=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(name: str, tmp_path) -> None:
    model, shapes = _case(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # hash() is salted per process: not reproducible
    example = tuple(torch.randn(*shape) for shape in shapes)
    bundle = edgedyn.export(model, example, backend="tflite", output=tmp_path / "op.edgedyn", verify=False)
    program = rt.load(bundle, threads=1)
    fresh = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    with torch.no_grad():
        expected = model(*[torch.from_numpy(x) for x in fresh]).numpy()
    actual = program(*fresh)
    assert actual.shape == expected.shape
    scale = float(np.abs(expected).max())
    assert scale > 0, "a test whose output is all zeros cannot fail"
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * scale + 1e-6)


def _lowered(model: nn.Module, shape: Tuple[int, ...], fp16: bool, tensors: Any = None,
             mirror: Any = None, at_once: bool = False) -> Tuple[Sequence[str], "np.ndarray", "np.ndarray"]:
    """(operators in order, LiteRT's output, torch's) for `model` lowered as the tflite backend does, run on a fresh
    input (an fp16-marked model computes in fp32 on a CPU without fp16 arithmetic, as on this host); `tensors`, a
    list, gets the file's (name, shape) pairs; `mirror` True or False decides mirrored coordinates (mirror.py),
    `at_once` reverses their rows and columns in one REVERSE_V2."""
    from ai_edge_litert.interpreter import Interpreter

    from edgedyn.backends.tflite import FP16_INFERENCE, REDUCED_PRECISION_KEY
    from edgedyn.backends.tflite.lowering import lower_program
    from edgedyn.backends.tflite.ops import CONVERTERS
    from edgedyn.passes import run_pipeline
    from edgedyn.registry import general_backends

    (spec,) = edgedyn.capture(model, (torch.randn(*shape),)).specializations
    tflite, _ = lower_program(run_pipeline(spec.program, "default"), CONVERTERS, general_backends(),
                              metadata={REDUCED_PRECISION_KEY: FP16_INFERENCE} if fp16 else None, mirror=mirror,
                              reverse_at_once=at_once)
    interpreter = Interpreter(model_content=tflite, num_threads=1)
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    if tensors is not None:
        tensors.extend((t["name"], tuple(int(n) for n in t["shape"])) for t in interpreter.get_tensor_details())
    interpreter.allocate_tensors()
    x = torch.randn(*shape)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x.numpy())
    interpreter.invoke()
    with torch.no_grad():
        return ops, interpreter.get_tensor(interpreter.get_output_details()[0]["index"]), model(x).numpy()


@pytest.mark.parametrize("fp16", [False, True])
def test_hardswish_and_hardsigmoid_after_a_convolution_are_one_operator_each(fp16: bool) -> None:
    """Core ATen writes hard-swish as x * clamp(clamp(x + 3, 0), None, 6) / 6 (five operators) and hard-sigmoid
    as four: HARD_SWISH, and ADD with its ReLU6 fused plus one MUL, instead."""
    model = seq(conv(4, 8, padding=1), nn.Hardswish(), conv(8, 8, k=1), nn.Hardsigmoid()).eval()
    ops, got, want = _lowered(model, (1, 4, 12, 12), fp16)
    assert ops.count("HARD_SWISH") == 1 and "MINIMUM" not in ops and "RELU" not in ops, ops
    assert ops.count("ADD") == 1 and ops.count("MUL") == 1, ops  # hard-sigmoid: (x + 3, ReLU6 fused) * 1/6
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    two_clamps = Fn(lambda m, x: m[0](x).clamp(min=0).clamp(max=6), conv(4, 8, padding=1)).eval()
    ops, got, want = _lowered(two_clamps, (1, 4, 12, 12), fp16)
    assert [op for op in ops if op != "TRANSPOSE"] == ["CONV_2D"], ops  # the ReLU6 fused into the convolution
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("size, layer, bordered", [
    (16, lambda: conv(3, 8, stride=2, padding=1), 17),  # even: the last padded row and column are never read
    (15, lambda: conv(3, 8, k=5, stride=2, padding=1), 17),  # odd: both sides are
    (12, lambda: conv(3, 8, k=5, padding=1), 14),  # stride 1, neither VALID nor SAME
    (12, lambda: nn.AvgPool2d(3, stride=2, padding=1), 13),  # count_include_pad: zeros averaged in
    (12, lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), 13),  # and scaled out
])
def test_padding_that_is_neither_same_nor_valid(fp16: bool, size: int, layer: Any, bordered: int) -> None:
    """Torch's padding that TFLite's SAME cannot say is a PAD before a VALID op in fp32 (XNNPACK folds it into the
    convolution); in a model marked for fp16 inference, where XNNPACK folds no PAD, it is zero borders written as
    CONCATENATIONs, only those the windows read."""
    model = seq(conv(3, 3, k=1), nn.ReLU(), layer()).eval()
    tensors: List[Tuple[str, Tuple[int, ...]]] = []
    ops, got, want = _lowered(model, (1, 3, size, size), fp16, tensors)
    window = ops[ops.index("CONV_2D") + 1:]
    if fp16:
        assert "PAD" not in window and window.count("CONCATENATION") == 2, ops
        assert [shape for name, shape in tensors if name.startswith("bordered")][-1][1:3] == (bordered, bordered)
    else:
        assert "PAD" in window and "CONCATENATION" not in window, ops
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("size, stride, pad, folded", [
    (16, 2, (0, 1, 0, 1), True),  # TensorFlow's SAME at stride 2 on an even size: after only
    (15, 2, (1, 1, 1, 1), True),  # on an odd size: both sides
    (12, 1, (1, 1, 1, 1), True),
    (16, 2, (1, 1, 1, 1), False),  # torch's own padding 1 at stride 2 on an even size is not SAME
    (12, 1, (0, 1, 0, 1), False),
])
def test_tensorflow_style_padding_before_a_convolution_is_its_same(fp16: bool, size: int, stride: int,
                                                                    pad: Tuple[int, ...], folded: bool) -> None:
    """transformers' MobileNets (`tf_padding`) and timm's Conv2dSame pad explicitly, then convolve unpadded: where
    the pad is TFLite's SAME for that convolution no PAD is written (XNNPACK's fp16 inference would run it)."""
    model = Fn(lambda m, x: m[1](F.pad(m[0](x).relu(), pad)), conv(3, 4, k=1), conv(4, 6, stride=stride)).eval()
    ops, got, want = _lowered(model, (1, 3, size, size), fp16)
    assert ("PAD" not in ops and "CONCATENATION" not in ops) if folded else ("PAD" in ops), ops
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def _conv_and_crop(m: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    padded = F.pad(x, (1, 1, 1, 1))  # SAME for the convolution, but a second reader needs it padded
    return m[0](padded) + padded[:, :1, 1:-1, 1:-1]


def test_a_pad_read_twice_stays_a_pad() -> None:
    model = Fn(_conv_and_crop, conv(3, 6)).eval()
    ops, got, want = _lowered(model, (1, 3, 10, 10), False)
    assert ops.count("PAD") == 1, ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


class Shifted(nn.Module):
    """A convolution whose output gets a constant image added: a parameter that varies over rows and columns."""

    def __init__(self, size: Tuple[int, int]) -> None:
        super().__init__()
        self.conv = conv(3, 8, stride=2, padding=1)
        self.image = nn.Parameter(torch.randn(1, 8, *size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv(x) + self.image).relu()


def _excite(m: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """A MobileNetV3-like tail: stride-2 stem, a 5x5 stride-2 depthwise, squeeze-excite, a residual, a classifier."""
    x = F.hardswish(m[0](x))
    x = F.relu(m[1](x))
    scale = F.hardsigmoid(m[3](F.relu(m[2](x.mean((2, 3), keepdim=True)))))
    x = x * scale + m[4](x)
    return m[5](x.mean((2, 3)))


def _shortcut(m: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """A ResNet downsampling block: its 1x1 stride-2 shortcut leaves the last row and column unread."""
    x = F.relu(m[0](x))
    return F.relu(m[3](F.relu(m[1](x))) + m[2](x)).mean((2, 3))


MIRRORED_CASES = {
    "shortcut_block": (Fn(_shortcut, conv(3, 96, stride=2, padding=1), conv(96, 96, stride=2, padding=1),
                          conv(96, 96, k=1, stride=2), conv(96, 96, padding=1)), (1, 3, 32, 32)),
    "excite_classifier": (Fn(_excite, conv(3, 32, stride=2, padding=1), conv(32, 32, k=5, stride=2, padding=2,
                                                                            groups=32),
                             conv(32, 8, k=1), conv(8, 32, k=1), conv(32, 32, groups=32, padding=1), nn.Linear(32, 5)),
                          (1, 3, 32, 24)),
    "downsampling_image_out": (seq(conv(3, 8, stride=2, padding=1), nn.ReLU6(),
                                   conv(8, 8, k=5, stride=2, padding=2, groups=8)), (1, 3, 20, 26)),
    "resnet_stem": (seq(conv(3, 8, k=7, stride=2, padding=3), nn.ReLU(), nn.MaxPool2d(3, 2, 1)), (1, 3, 30, 28)),
    "max_pool_of_negatives": (seq(conv(3, 8, stride=2, padding=1), nn.MaxPool2d(3, 2, 1)), (1, 3, 22, 20)),
    "strided_1x1_leaves_a_row": (seq(conv(3, 8, stride=2, padding=1), nn.ReLU(), conv(8, 8, k=1, stride=2)),
                                 (1, 3, 16, 16)),
    "average_without_padding": (seq(conv(3, 8, stride=2, padding=1), nn.ReLU(),
                                    nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)), (1, 3, 24, 24)),
    "average_with_padding": (seq(conv(3, 8, k=1), nn.AvgPool2d(3, stride=2, padding=1)), (1, 3, 12, 14)),
    "flatten_classifier": (Fn(lambda m, x: m[1](m[0](x).flatten(1)), conv(3, 4, stride=2, padding=1),
                              nn.Linear(4 * 6 * 5, 7)), (1, 3, 12, 10)),
    "constant_image_added": (Shifted((8, 7)), (1, 3, 16, 13)),
    "channel_reductions": (Fn(lambda m, x: m[0](x).mean(1) + m[0](x).amax(1), conv(3, 8, stride=2, padding=1)),
                           (1, 3, 14, 18)),
    "reduced_map_broadcast_back": (Fn(lambda m, x: m[0](x) * m[0](x).mean(1).sigmoid(),
                                      conv(3, 8, stride=2, padding=1)), (1, 3, 14, 18)),
    "channels_joined": (Fn(lambda m, x: torch.cat([m[0](x), m[1](m[0](x)).clone()], 1).relu(),
                           conv(3, 8, stride=2, padding=1), conv(8, 8, groups=8, padding=1)), (1, 3, 16, 12)),
    "rows_joined": (Fn(lambda m, x: torch.cat([m[0](x), m[1](m[0](x))], 2), conv(3, 8, stride=2, padding=1),
                       conv(8, 8, groups=8, padding=1)), (1, 3, 16, 12)),
    "dilated_grouped_strided": (seq(conv(4, 8, padding=2, dilation=2, stride=2, groups=2)), (1, 4, 17, 16)),
    "rectangular": (seq(conv(k=(3, 1), stride=(2, 1), padding=(1, 0)), nn.ReLU(), conv(6, 6, k=(1, 5), padding=(0, 2),
                                                                                      stride=2)), IMG),
}


@pytest.mark.parametrize("fp16,at_once", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("name", sorted(MIRRORED_CASES))
def test_mirrored_coordinates_match_torch(name: str, fp16: bool, at_once: bool) -> None:
    """Rows and columns back to front, kernels flipped (mirror.py): every window op, padding, reduction, constant
    and output a CNN has, read the right way round on a fresh input, one axis per REVERSE_V2 and both at once."""
    model, shape = MIRRORED_CASES[name]
    model.eval()
    ops, got, want = _lowered(model, shape, fp16, mirror=True, at_once=at_once)
    assert "REVERSE_V2" in ops, ops
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    assert scale > 0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * scale + 1e-6)


@pytest.mark.parametrize("at_once", [False, True])
def test_a_flip_of_several_axes_reverses_them_as_the_boards_litert_can(at_once: bool) -> None:
    """torch.flip over rows and columns: one REVERSE_V2 for a board whose LiteRT reverses several axes at once,
    one per axis otherwise (tflite-runtime reverses only the first axis it is given), the same values either way."""
    model = Fn(lambda m, x: torch.flip(m[0](x), [2, 3]) * m[0](x), conv(3, 6, padding=1))
    ops, got, want = _lowered(model.eval(), (1, 3, 9, 7), False, mirror=False, at_once=at_once)
    assert ops.count("REVERSE_V2") == (1 if at_once else 2), ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    # no dims: no REVERSE_V2 at all (LiteRT crashes the process on one without axes; the export's own check ran it)
    model = Fn(lambda m, x: torch.flip(m[0](x), []) + 1, conv(3, 6, padding=1))
    ops, got, want = _lowered(model.eval(), (1, 3, 9, 7), False, mirror=False, at_once=at_once)
    assert "REVERSE_V2" not in ops, ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def test_mirroring_is_kept_where_it_copies_less() -> None:
    """fp16 inference: a classifier whose stride-2 windows need zero borders computes mirrored, with its input
    reversed (a REVERSE_V2 per axis) and no border at all (a ResNet block's 1x1 stride-2 shortcut skips its first
    mirrored row and column instead); one whose image is its output does not (reversing the output would split
    XNNPACK's partition), nor does anything in fp32, where XNNPACK folds the PADs."""
    model, shape = MIRRORED_CASES["excite_classifier"]
    model.eval()
    plain, _, _ = _lowered(model, shape, True, mirror=False)
    assert plain.count("CONCATENATION") == 4 and "REVERSE_V2" not in plain, plain  # two layers, two borders each
    ops, got, want = _lowered(model, shape, True)
    assert ops[:2] == ["REVERSE_V2"] * 2 and ops.count("REVERSE_V2") == 2 and "CONCATENATION" not in ops, ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    ops, _, _ = _lowered(model, shape, False)
    assert "REVERSE_V2" not in ops and "PAD" in ops, ops
    shortcut, shape = MIRRORED_CASES["shortcut_block"]
    ops, got, want = _lowered(shortcut.eval(), shape, True)
    assert ops.count("REVERSE_V2") == 2 and ops.count("STRIDED_SLICE") == 1 and "CONCATENATION" not in ops, ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    ops, got, want = _lowered(model, shape, True, at_once=True)  # LiteRT: one REVERSE_V2 of both axes
    assert ops[0] == "REVERSE_V2" and ops.count("REVERSE_V2") == 1 and "CONCATENATION" not in ops, ops
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    image_out, shape = MIRRORED_CASES["downsampling_image_out"]
    ops, _, _ = _lowered(image_out.eval(), shape, True)
    assert "REVERSE_V2" not in ops and "CONCATENATION" in ops, ops
