"""`edgedyn bench --profile`: per-operator times from each executor's profiler, and the tables made of them.

Times are never asserted against bounds here (benchmarks/op_profile.py checks that the op totals add up to the
measured latency); these tests check what each profiler attributes, the arithmetic of the tables, and the output.
"""
import json
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.runtime.bench import BenchConfig, run_benchmark
from edgedyn.runtime.profiling import GUARDS, MAX_RUNS, UNATTRIBUTED, profile_ops, runs_to_profile, typical_runs
from edgedyn.runtime.executors.onnxruntime import node_times, profiler_floor_ms
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
    assert ops["runs"] == 3 and ops["typical_runs"] == 1 and ops["total_ms"] > 0 and ops["median_latency_ms"] > 0
    _check_shares(ops["nodes"])
    _check_shares(ops["by_type"])
    assert sum(entry["count"] for entry in ops["by_type"]) == len(ops["nodes"])
    types = {node["type"] for node in ops["nodes"]} - {GUARDS, UNATTRIBUTED}
    assert GUARDS in [node["name"] for node in ops["nodes"]]
    # Every run's time is in the table: the typical runs' mean wall time plus the guards.
    assert ops["table_ms"] == pytest.approx(ops["total_ms"] + max(0.0, ops["unattributed_ms"]))
    if backend == "onnxruntime":
        assert "Conv" in types and all(node["count"] == 1 for node in ops["nodes"])
    elif backend == "tvm":
        assert "fused_conv2d_add_relu" in types and "vm.builtin.alloc_storage" in types
    elif backend == "portable":
        assert "aten.convolution.default" in types and "copy" in types
        assert len([node for node in ops["nodes"] if node["type"].startswith("aten.")]) == 9
    else:  # LiteRT: no per-operator profiler in its Python API, and the report says so
        assert types == {"whole graph", "copy"} and "no per-operator profiler" in ops["note"]
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
    """Five runs of three ops; the second was preempted (40 ms), the first ran fastest; a plain call between each."""

    def profile(self, inputs: List[np.ndarray], runs: int, between: Any = None) -> Dict[str, Any]:
        for _ in range(5):
            if between is not None:
                between()
        return {"source": "fake", "unattributed": "between ops", "ops": [
            {"name": "a", "type": "Conv", "calls": 1}, {"name": "b", "type": "Relu", "calls": 1, "bytes": 64},
            {"name": "c", "type": "Conv", "calls": 2}],
            "wall_ms": [9.0, 40.0, 10.5, 11.0, 12.0],
            "samples_ms": [[5.0, 1.0, 2.0], [30.0, 1.0, 3.0], [6.0, 1.0, 3.0], [6.5, 1.0, 3.0], [7.0, 2.0, 3.0]]}


class _FakeSpec:
    executor = _FakeExecutor()
    inputs = ["x"]
    artifact = {"executor": "fake"}


def test_rows_average_the_typical_runs_and_add_up_to_them():
    ticks = iter(np.arange(0.0, 1.0, 0.011))  # each plain call between the profiled ones takes 11 ms
    calls = []
    ops = profile_ops(_FakeSpec(), {"x": np.ones(2, np.float32)}, runs=5, median_ms=12.5, guard_ms=0.5,
                      call=lambda: calls.append(1), clock=lambda: float(next(ticks)))
    # The middle fifth by wall time: the median run, 11 ms.
    assert ops["runs"] == 5 and ops["typical_runs"] == 1 and len(calls) == 5
    assert ops["interleaved_median_ms"] == pytest.approx(11.0)
    rows = {n["name"]: n for n in ops["nodes"]}
    assert [rows[name]["ms"] for name in ("a", "b", "c", GUARDS)] == [6.5, 1.0, 3.0, 0.5]
    assert rows[UNATTRIBUTED]["ms"] == pytest.approx(0.5) and rows[UNATTRIBUTED]["what"] == "between ops"
    assert ops["total_ms"] == 11.0 and ops["table_ms"] == pytest.approx(11.5)  # the typical run + guards
    assert ops["total_of_median"] == pytest.approx(11.0 / 12.5)
    assert ops["total_of_interleaved"] == pytest.approx(1.0)
    assert ops["profiled_median_ms"] == pytest.approx(11.0 + 0.5)
    assert [n["name"] for n in ops["nodes"]] == ["a", "c", "b", GUARDS, UNATTRIBUTED]  # by time; ties keep order
    assert ops["nodes"][-1]["cumulative_percent"] == pytest.approx(100.0)
    by_type = {t["type"]: t for t in ops["by_type"]}
    assert (by_type["Conv"]["count"], by_type["Conv"]["ms"], by_type["Relu"]["bytes"]) == (2, 9.5, 64)
    assert ops["notes"] == []


def test_ops_that_add_up_to_more_than_their_runs_say_so_without_a_negative_row():
    class Over(_FakeExecutor):
        def profile(self, inputs: List[np.ndarray], runs: int, between: Any = None) -> Dict[str, Any]:
            raw = super().profile(inputs, runs, between)
            return dict(raw, wall_ms=[8.0] * 5)

    spec = _FakeSpec()
    spec.executor = Over()
    ticks = iter(np.arange(0.0, 1.0, 0.002))  # plain calls of 2 ms between the profiled runs
    ops = profile_ops(spec, {"x": np.ones(2, np.float32)}, runs=5, median_ms=30.0, guard_ms=0.0,
                      call=lambda: None, clock=lambda: float(next(ticks)))
    assert UNATTRIBUTED not in [n["name"] for n in ops["nodes"]] and ops["unattributed_ms"] < 0
    assert "more than their runs took" in ops["notes"][0]
    assert "the profiled runs' median is 400% of the plain calls' timed between them" in ops["notes"][1]
    assert "plain calls timed between the profiled ones took 7% of the timing loop's median" in ops["notes"][2]


def test_profiled_runs_default_to_the_timed_count_capped():
    assert runs_to_profile(0, 37) == 37 and runs_to_profile(0, 10 ** 6) == MAX_RUNS and runs_to_profile(5, 37) == 5
    assert typical_runs([5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0, 8.0]) == [2, 0]  # 4 and 5 ms: the middle fifth
    assert typical_runs([3.0, 1.0, 2.0]) == [2] and typical_runs([2.0]) == [0]


def test_onnxruntime_events_give_kernel_times_per_run_without_warm_up_or_fences():
    def run(ts: int) -> Dict[str, Any]:
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 100}

    def node(name: str, ts: int, dur: int) -> Dict[str, Any]:
        return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": {"op_name": "Conv"}}

    events = [run(0), node("conv_kernel_time", 10, 500), run(200), node("conv_fence_before", 205, 1),
              node("conv_kernel_time", 210, 40), node("conv_kernel_time", 230, 20), run(400),
              node("conv_kernel_time", 410, 30), run(600), node("conv_kernel_time", 610, 90)]
    # Runs after the warm-up: 60 us (two calls), 30 us, 90 us.
    ops, samples = node_times(events, skip_runs=1)
    assert ops == [{"name": "conv", "type": "Conv", "calls": 2}]
    assert samples == [[0.06], [0.03], [0.09]]


def test_onnxruntime_profiler_floor_is_the_shortest_span_per_call():
    ops = [{"name": "conv", "type": "Conv", "calls": 2}, {"name": "reshape", "type": "Reshape", "calls": 1},
           {"name": "gemm", "type": "Gemm", "calls": 1}]
    # Per-call medians: conv 0.02 ms, reshape 0.003 ms, gemm 0.05 ms; the middle run is the median of each.
    samples = [[0.03, 0.002, 0.04], [0.04, 0.003, 0.05], [0.05, 0.009, 0.07]]
    assert profiler_floor_ms(ops, samples) == pytest.approx(0.003)
    # A single node is all there is to attribute: nothing is taken off it.
    assert profiler_floor_ms(ops[:1], [[0.04], [0.05]]) == 0.0
    assert profiler_floor_ms(ops, []) == 0.0


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
    assert "timed rows (operators, copies, guards) add up to" in result.stdout
    assert "of the median latency" in result.stdout and UNATTRIBUTED in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ops"]["source"].startswith("onnxruntime profiler") and report["ops"]["runs"] == 3
    assert "ops" not in json.loads(run_cli("bench", str(bundle), "--iterations", "2", "--duration", "0",
                                           "--json").stdout)


def test_litert_keeps_its_xnnpack_banner_out_of_edgedyn_output(run_cli, export_example, tmp_path):
    bundle = str(export_example("tiny_cnn", backend="tflite"))
    np.save(tmp_path / "x.npy", np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32))
    for command in (["verify", bundle], ["bench", bundle, "--iterations", "2", "--duration", "0", "--profile"],
                    ["run", bundle, "--input", "x={}".format(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz")]):
        result = run_cli(*command)
        assert result.returncode == 0, result.stderr
        assert "INFO: Created TensorFlow Lite XNNPACK delegate" not in result.stderr + result.stdout, command


def test_bench_profiles_as_many_runs_as_it_timed(export_example):
    report = run_benchmark(str(export_example("tiny_cnn", backend="portable")),
                           BenchConfig(warmup=0, iterations=7, duration_s=0.0, profile=True))
    assert report["iterations"] == 7 and report["ops"]["runs"] == 7
