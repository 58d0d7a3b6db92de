"""The portable backend: numpy kernels in one planned arena, equal to torch eager, allocating nothing per call."""
import json
import tracemalloc
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


def test_an_op_without_kernel_is_named_at_export(tmp_path):
    def cumulative(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=0)

    with pytest.raises(BackendError, match=r"the portable backend cannot run cumsum \(aten\.cumsum\.default\): "
                                           r"no kernel for aten\.cumsum\.default") as raised:
        edgedyn.export(cumulative, (torch.randn(3, 4),), backend="portable", output=tmp_path / "c.edgedyn")
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
