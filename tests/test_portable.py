"""The portable backend: numpy kernels in one planned arena, equal to torch eager, allocating nothing per call."""
import json
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import BackendError
from edgedyn.passes.memory_check import check_plan
from edgedyn.passes.memory_plan import MemoryPlan, Tensor

from conftest import ALL_MODELS, RTOL, assert_matches_torch

# numpy's ufunc iterator buffers (8192 elements per operand, whatever the tensor sizes) and the Python objects of
# one call: transient, and bounded independently of the model.
CALL_OVERHEAD_BYTES = 128 * 1024


@pytest.fixture(scope="module")
def portable_bundle(export_example):
    """A model exported with --backend portable (once per session, through the shared fixture)."""
    return lambda model: export_example(model, backend="portable")


def _fresh(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("model", sorted(ALL_MODELS))
def test_matches_torch_eager_on_fresh_inputs(portable_bundle, model):
    # twice: the second call runs in an arena the first one dirtied
    assert_matches_torch(rt.load(portable_bundle(model)), model, seed=2000, calls=2)


@pytest.mark.parametrize("model", sorted(ALL_MODELS))
def test_bundle_is_portable_graph_data_with_a_checked_plan(portable_bundle, model):
    bundle = rt.Bundle(portable_bundle(model))
    for spec in bundle.manifest["specializations"]:
        (artifact,) = spec["artifacts"]
        assert artifact["arch"] is None and artifact["executor"] == "portable"
        graph = json.loads(bundle.read(artifact["files"]["graph"]))
        assert graph["steps"] and all(step["op"].startswith("aten.") for step in graph["steps"])
        weights = bundle.arrays(artifact["files"]["weights"])
        assert weights or model == "loop_example", model  # the one example without parameters
        assert all(array.dtype == np.float32 for array in weights.values())
        plan = json.loads(bundle.read(spec["memory"]["plan"]))
        assert plan["arena_bytes"] == graph["arena_bytes"] == spec["memory"]["arena_bytes"]
        tensors = [Tensor(t["name"], t["size"], t["first"], t["last"], t["kind"]) for t in plan["tensors"]]
        check_plan(MemoryPlan(tensors, [t["offset"] for t in plan["tensors"]], plan["arena_bytes"],
                              plan["naive_bytes"], plan["step_ops"]))


def test_mobilenet_v2_portable_arena_meets_the_targets(portable_bundle):
    (spec,) = rt.read_manifest(portable_bundle("mobilenet_v2"))["specializations"]
    memory = spec["memory"]  # the executor's own arena, kernel scratch included
    assert memory["arena_bytes"] <= 1.10 * memory["lower_bound_bytes"], memory
    assert memory["arena_bytes"] <= 0.5 * memory["naive_bytes"], memory


@pytest.mark.parametrize("model", sorted(ALL_MODELS))
def test_no_allocation_per_call_for_intermediates(portable_bundle, model):
    """After warm-up, one call's peak traced allocation is the outputs plus a bounded constant (numpy iterator
    buffers and call objects: CALL_OVERHEAD_BYTES): nothing scales with the intermediates."""
    program = rt.load(portable_bundle(model))
    for spec in program.specializations:
        executor = spec.executor
        inputs = [_fresh(r["shape"], seed=7) for r in spec.record["inputs"]]
        executor.run(inputs)
        tracemalloc.start()
        try:
            executor.run(inputs)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        outputs = sum(output.nbytes for output in executor.outputs)
        assert peak <= outputs + CALL_OVERHEAD_BYTES, (peak, outputs, spec.record["memory"])
        if model == "mobilenet_v2":  # the case where intermediates are large: far below the arena
            assert peak < 0.15 * spec.record["memory"]["arena_bytes"]
            assert peak < 0.02 * spec.record["memory"]["naive_bytes"]


class _Ops(nn.Module):
    """Ops the examples do not use, each checked against torch through a whole export."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
        self.norm = nn.LayerNorm([5, 5])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "grouped_dilated_conv":
            return self.conv(x)
        if self.kind == "pools":
            return torch.cat([nn.functional.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
                              nn.functional.avg_pool2d(x, 3, 1)], dim=1)
        if self.kind == "activations":
            return nn.functional.hardswish(x) + torch.tanh(x) * torch.sigmoid(x) - nn.functional.gelu(
                x, approximate="tanh") / (1.5 + nn.functional.relu6(x))
        if self.kind == "norms":
            return torch.log_softmax(self.norm(x), dim=1) + x.mean(dim=(2, 3), keepdim=True)
        if self.kind == "views":
            y = x.permute(0, 2, 3, 1).reshape(1, 25, 4)
            return torch.bmm(y.transpose(1, 2), y) + y[:, :4].sum(dim=1, keepdim=True)
        raise ValueError(self.kind)


@pytest.mark.parametrize("kind", ["grouped_dilated_conv", "pools", "activations", "norms", "views"])
def test_more_ops_match_torch(tmp_path, kind):
    module = _Ops(kind).eval()
    path = edgedyn.export(module, (torch.randn(1, 4, 5, 5),), backend="portable", output=tmp_path / "ops.edgedyn")
    x = _fresh((1, 4, 5, 5), seed=3)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    actual = rt.load(path)(x)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * float(np.abs(expected).max()))


class _Fn(nn.Module):
    """One table row: a function of the inputs and the layers it uses."""

    def __init__(self, fn, *layers: nn.Module) -> None:
        super().__init__()
        self.fn, self.layers = fn, nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.layers, x)


class _Fn2(_Fn):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.fn(self.layers, x, y)


def _seeded(layer: nn.Module) -> nn.Module:
    generator = torch.Generator().manual_seed(zlib.crc32(type(layer).__name__.encode()))
    for parameter in layer.parameters():
        parameter.data.copy_(torch.randn(parameter.shape, generator=generator))
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):  # statistics as training leaves them, not 0 and 1
        layer.running_mean.copy_(torch.randn(layer.running_mean.shape, generator=generator))
        layer.running_var.copy_(torch.rand(layer.running_var.shape, generator=generator) * 2 + 0.1)
    return layer


F = nn.functional
# Ops the zoo's transformers models need (attention masks, token ids, audio convolutions, segmentation heads).
ZOO_OPS = {
    "compare_where": (lambda m, x, y: torch.where(x > 0.3, x, y * 2) + torch.where(x <= y, 1.5, x), [(4, 6), (4, 6)]),
    "logical_and_or_not": (lambda m, x, y: torch.where(((x > 0) & (y < 0.5)) | ~(x > -1), x, y), [(4, 6), (4, 6)]),
    "eq_ne_tensor": (lambda m, x: torch.where(x.eq(x.amax(-1, keepdim=True)), 2.0, x)
                     + torch.where(x.ne(x.amax(0)), x, -3.0), [(5, 6)]),
    "any_row_safe_softmax": (lambda m, x: torch.where(torch.any(x > 1.2, -1, keepdim=True).logical_not(),
                                                      torch.full_like(x, 0.5), torch.softmax(x, -1)), [(8, 5)]),
    "full_like_at_run_time": (lambda m, x: x * torch.full_like(x, 0.25) + 1.5, [(1, 4, 64, 80)]),
    "conv1d": (lambda m, x: m[0](x), [(2, 4, 13)], nn.Conv1d(4, 6, 3, padding=1)),
    "conv1d_stride_dilation_grouped": (lambda m, x: m[0](x), [(1, 4, 21)],
                                       nn.Conv1d(4, 6, 5, stride=2, dilation=2, padding=3, groups=2)),
    "conv_channels_last_output": (lambda m, x: m[0](x.contiguous(memory_format=torch.channels_last)) * 2,
                                  [(1, 4, 7, 9)], nn.Conv2d(4, 6, 3, padding=1)),
    "group_norm": (lambda m, x: m[0](x), [(2, 4, 5, 6)], nn.GroupNorm(2, 4)),
    "group_norm_1d": (lambda m, x: m[0](x), [(2, 4, 13)], nn.GroupNorm(1, 4)),
    # a batch norm no convolution absorbs: LeViT's after a linear layer, over the flattened tokens
    "batch_norm_after_linear": (lambda m, x: m[1](m[0](x).flatten(0, 1)).reshape(2, 5, 6), [(2, 5, 4)],
                                nn.Linear(4, 6), nn.BatchNorm1d(6)),
    "batch_norm_1d_channels": (lambda m, x: m[0](x) * 2 + x, [(2, 4, 7)], nn.BatchNorm1d(4)),
    "avgpool_exclude_pad": (lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), [(1, 3, 6, 7)]),
    "avgpool_window_past_image_ceil": (lambda m, x: F.avg_pool2d(x, 16, ceil_mode=True), [(1, 3, 6, 7)]),
    "bilinear_x2": (lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"), [(1, 3, 5, 7)]),
    "bilinear_to_size_align_corners": (lambda m, x: F.interpolate(x, size=(9, 4), mode="bilinear",
                                                                  align_corners=True), [(1, 3, 5, 7)]),
    "bilinear_down": (lambda m, x: F.interpolate(x, size=(3, 4), mode="bilinear"), [(1, 3, 7, 9)]),
    "nearest_x2": (lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"), [(1, 3, 5, 7)]),
    # sizes rounded down: torch samples with 1/scale_factor, not in/out
    "bilinear_rounded_scale": (lambda m, x: F.interpolate(x, scale_factor=2.5, mode="bilinear"), [(1, 3, 5, 6)]),
    "nearest_rounded_scale": (lambda m, x: F.interpolate(x, scale_factor=1.7, mode="nearest"), [(1, 3, 5, 6)]),
    # wav2vec2's frame mask: frame counts by floor division, a reversed cumsum, a mask repeated over channels
    "flip": (lambda m, x: torch.flip(x, [0, -1]) * 2 + x, [(3, 4, 5)]),
    "repeat": (lambda m, x: x.repeat(2, 1, 3) + 1.5, [(3, 4)]),
    "div_rounding": (lambda m, x: torch.div((x * 10).long(), 3, rounding_mode="floor").float()
                     + torch.div(x * 7, 2.0, rounding_mode="floor") + torch.div(x * 5, 3.0, rounding_mode="trunc"),
                     [(4, 6)]),
}


@pytest.mark.parametrize("name", sorted(ZOO_OPS))
def test_zoo_ops_match_torch(tmp_path, name):
    fn, shapes, layers = ZOO_OPS[name][0], ZOO_OPS[name][1], ZOO_OPS[name][2:]
    model = (_Fn2 if len(shapes) == 2 else _Fn)(fn, *[_seeded(layer) for layer in layers]).eval()
    path = edgedyn.export(model, tuple(torch.randn(*shape) for shape in shapes), backend="portable",
                          output=tmp_path / "op.edgedyn")
    program = rt.load(path)
    for call in range(2):  # the second call runs in an arena the first one dirtied
        fresh = [_fresh(shape, seed=zlib.crc32(name.encode()) + call * 7 + i) for i, shape in enumerate(shapes)]
        with torch.no_grad():
            expected = model(*[torch.from_numpy(x) for x in fresh]).numpy()
        scale = float(np.abs(expected).max())
        assert scale > 0
        np.testing.assert_allclose(program(*fresh), expected, rtol=RTOL, atol=RTOL * scale)


class _Tokens(nn.Module):
    """Token and position lookups as RoBERTa computes them: position ids from a cumsum over the non-padding ids."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.tokens, self.positions = nn.Embedding(50, 8), nn.Embedding(20, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids.ne(1).int()
        positions = torch.cumsum(mask, dim=1).type_as(mask) * mask + 1
        picked = torch.gather(ids, 1, torch.zeros_like(ids[:, :1])).float()
        return self.tokens(ids) + self.positions(positions) + picked[..., None]


def _ids(seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, 50, (2, 9)).astype(np.int64)
    ids[:, -2:] = 1  # padding, so the position ids differ from a plain arange
    return ids


def test_token_ids_embedding_gather_and_cumsum_match_torch(tmp_path):
    model = _Tokens().eval()
    path = edgedyn.export(model, (torch.from_numpy(_ids(0)),), backend="portable", output=tmp_path / "ids.edgedyn")
    program = rt.load(path)
    for seed in (zlib.crc32(b"tokens"), 5):
        ids = _ids(seed)
        with torch.no_grad():
            expected = model(torch.from_numpy(ids)).numpy()
        np.testing.assert_allclose(program(ids), expected, rtol=RTOL, atol=RTOL * float(np.abs(expected).max()))


def test_a_token_id_past_the_table_is_refused_in_words(tmp_path):
    model = _Tokens().eval()
    program = rt.load(edgedyn.export(model, (torch.from_numpy(_ids(0)),), backend="portable",
                                     output=tmp_path / "ids.edgedyn"))
    ids = _ids(3)
    ids[0, 0] = 50
    with pytest.raises(rt.EdgedynError, match="outside the table of 50 rows") as raised:
        program(ids)
    assert "0 to 49" in raised.value.hint


def test_an_op_without_kernel_is_named_at_export(tmp_path):
    def products(x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, 0)

    with pytest.raises(BackendError, match=r"the portable backend cannot run cumprod \(aten\.cumprod\.default\): "
                                           r"no kernel for aten\.cumprod\.default") as raised:
        edgedyn.export(products, (torch.randn(3, 4),), backend="portable", output=tmp_path / "c.edgedyn")
    assert "try --backend tvm" in raised.value.hint and "convolution.default" in raised.value.hint


def test_runtime_modules_import_nothing_but_numpy():
    """The board side of the portable backend: standard library and numpy only, no torch, no edgedyn host code."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import edgedyn.runtime.executors.portable, edgedyn.runtime.kernels\n"
            "print(sorted(m for m in sys.modules if m.startswith('edgedyn') and not m.startswith('edgedyn.runtime')"
            " and m not in ('edgedyn', 'edgedyn.version')))")  # the package and its version string: no host code
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(Path(__file__).resolve().parents[1]))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
