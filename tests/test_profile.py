"""`edgedyn bench --profile`: per-operator times from each executor's profiler, and the tables made of them.

Times are never asserted against bounds here (benchmarks/profile.py checks that the op totals add up to the
measured latency); these tests check what each profiler attributes, the arithmetic of the tables, and the output.
"""
import json
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.runtime.bench import BenchConfig, profile_ops, run_benchmark
from edgedyn.runtime.executors.onnxruntime import node_times
from edgedyn.runtime.executors.tvm import _op_type

BACKENDS = ["onnxruntime", "tflite", "tvm", "portable"]


def _profile(bundle: Any, runs: int = 3) -> Dict[str, Any]:
    report = run_benchmark(str(bundle), BenchConfig(warmup=0, iterations=3, duration_s=0.0, profile_runs=runs))
    return report["ops"]


def _check_shares(rows: List[Dict[str, Any]]) -> None:
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert sum(r["percent"] for r in rows) == pytest.approx(100.0)
    assert rows[-1]["cumulative_percent"] == pytest.approx(100.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_profiles_every_operator(export_example, backend):
    ops = _profile(export_example("tiny_cnn", backend=backend))
    assert ops["runs"] == 3 and ops["total_ms"] > 0 and ops["median_latency_ms"] > 0
    _check_shares(ops["nodes"])
    _check_shares(ops["by_type"])
    assert sum(entry["count"] for entry in ops["by_type"]) == len(ops["nodes"])
    types = {node["type"] for node in ops["nodes"]}
    if backend == "onnxruntime":
        assert "Conv" in types and all(node["count"] == 1 for node in ops["nodes"])
    elif backend == "tvm":
        assert "fused_conv2d_add_relu" in types and "vm.builtin.alloc_storage" in types
    elif backend == "portable":
        assert "aten.convolution.default" in types and len(ops["nodes"]) == 9
    else:  # LiteRT: no per-operator profiler in its Python API, and the report says so
        assert types == {"whole graph"} and "no per-operator profiler" in ops["note"]
        assert ops["graph_ops"]["CONV_2D"] == 2


def test_portable_bytes_are_the_arrays_each_step_reads_and_writes(export_example):
    bundle = export_example("tiny_cnn", backend="portable")
    nodes = {node["name"]: node for node in _profile(bundle)["nodes"]}
    # addmm: input 1x32, weight 32x10 (transposed view), bias 10, output 1x10, all float32, no scratch.
    assert nodes["addmm"]["bytes"] == 4 * (32 + 32 * 10 + 10 + 10)
    program = rt.load(bundle)
    executor = program.specializations[0].executor
    for step in executor.graph["steps"]:
        out_bytes = sum(executor.values[i].nbytes for i in step["outputs"] if i is not None)
        assert nodes[step["name"]]["bytes"] >= out_bytes


def test_the_profile_leaves_results_unchanged(export_example):
    """Profiling runs the real kernels (TVM replays them in place): the next call still matches the reference."""
    for backend in ("tvm", "portable"):
        program = rt.load(export_example("tiny_cnn", backend=backend))
        spec = program.specializations[0]
        values, expected = program.reference(spec)
        spec.executor.profile([values["x"]], 2)
        np.testing.assert_allclose(program(**values), expected[0], rtol=1e-4,
                                   atol=1e-4 * float(np.abs(expected[0]).max()))


class _FakeExecutor:
    def profile(self, inputs: List[np.ndarray], runs: int) -> Dict[str, Any]:
        return {"source": "fake", "runs": runs, "ops": [
            {"name": "a", "type": "Conv", "ms": 6.0, "calls": 1},
            {"name": "b", "type": "Relu", "ms": 1.0, "calls": 1, "bytes": 64},
            {"name": "c", "type": "Conv", "ms": 3.0, "calls": 2}]}


class _FakeSpec:
    executor = _FakeExecutor()
    inputs = ["x"]
    artifact = {"executor": "fake"}


def test_tables_sum_per_node_and_per_type():
    ops = profile_ops(_FakeSpec(), {"x": np.ones(2, np.float32)}, runs=4, median_ms=12.5)
    assert [(n["name"], n["ms"], n["count"]) for n in ops["nodes"]] == [("a", 6.0, 1), ("c", 3.0, 2), ("b", 1.0, 1)]
    assert [n["percent"] for n in ops["nodes"]] == [60.0, 30.0, 10.0]
    assert [n["cumulative_percent"] for n in ops["nodes"]] == pytest.approx([60.0, 90.0, 100.0])
    assert [(t["type"], t["count"], t["ms"], t["bytes"]) for t in ops["by_type"]] == [("Conv", 2, 9.0, None),
                                                                                       ("Relu", 1, 1.0, 64)]
    assert ops["total_ms"] == 10.0 and ops["total_of_median"] == pytest.approx(0.8)


def test_onnxruntime_events_give_medians_per_run_without_warm_up_or_fences():
    def run(ts: int) -> Dict[str, Any]:
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 100}

    def node(name: str, ts: int, dur: int) -> Dict[str, Any]:
        return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": {"op_name": "Conv"}}

    events = [run(0), node("conv_kernel_time", 10, 500), run(200), node("conv_fence_before", 205, 1),
              node("conv_kernel_time", 210, 40), node("conv_kernel_time", 230, 20), run(400),
              node("conv_kernel_time", 410, 30), run(600), node("conv_kernel_time", 610, 90)]
    # Runs after the warm-up: 60 us (two calls), 30 us, 90 us -> median 60 us, twice per run.
    assert node_times(events, skip_runs=1) == [{"name": "conv", "type": "Conv", "ms": 0.06, "calls": 2}]


@pytest.mark.parametrize("symbol, kind", [("fused_conv2d1_add1_relu1", "fused_conv2d_add_relu"),
                                          ("fused_conv2d_add_relu", "fused_conv2d_add_relu"),
                                          ("max_pool2d", "max_pool2d"), ("fused_matmul_add2", "fused_matmul_add"),
                                          ("vm.builtin.alloc_storage", "vm.builtin.alloc_storage")])
def test_tvm_kernel_copies_share_a_type(symbol, kind):
    assert _op_type(symbol) == kind


def test_bench_profile_prints_benchmark_model_tables(run_cli, export_example, tmp_path):
    bundle = export_example("tiny_cnn", backend="onnxruntime")
    result = run_cli("bench", str(bundle), "--iterations", "5", "--duration", "0", "--profile", "--profile-runs", "3",
                     "--json", str(tmp_path / "report.json"))
    assert result.returncode == 0, result.stderr
    for title in ("Operators by time", "Top by computation time", "Summary by op type", "cdf %", "Conv"):
        assert title in result.stdout
    assert "operators add up to" in result.stdout and "of the median latency" in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ops"]["source"].startswith("onnxruntime profiler") and report["ops"]["runs"] == 3
    assert "ops" not in json.loads(run_cli("bench", str(bundle), "--iterations", "2", "--duration", "0",
                                           "--json").stdout)


def test_litert_keeps_its_xnnpack_banner_out_of_edgedyn_output(run_cli, export_example):
    result = run_cli("verify", str(export_example("tiny_cnn", backend="tflite")))
    assert result.returncode == 0, result.stderr
    assert "XNNPACK delegate" not in result.stderr + result.stdout
