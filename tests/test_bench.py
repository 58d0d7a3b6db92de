"""`edgedyn bench`: stop rules against a fake clock, statistics, the environment probe, and the command end to end."""
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

from edgedyn.runtime import sysinfo
from edgedyn.runtime.bench import BenchConfig, StopRule, latency_stats, peak_rss_mb, percentile, random_inputs, \
    run_benchmark, time_calls
from edgedyn.runtime.errors import EdgedynError

ANSI = re.compile(r"\x1b\[")


class FakeClock:
    """A clock that moves only when told: `advance` is what a timed call costs."""

    def __init__(self, per_read: float = 0.0) -> None:
        self.now = 1000.0
        self.per_read = per_read

    def __call__(self) -> float:
        self.now += self.per_read
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# Latencies are powers of two, so elapsed sums are exact and no case depends on rounding.
@pytest.mark.parametrize("min_iterations, min_seconds, max_seconds, max_iterations, latency, expected", [
    (5, 0.0, 60.0, None, 0.0625, 5),      # iterations dominate: 5 runs take 0.3 s
    (5, 1.0, 60.0, None, 0.125, 8),       # duration dominates: 8 runs reach 1 s
    (8, 1.0, 60.0, None, 0.125, 8),       # both met on the same run
    (100, 1.0, 2.0, None, 0.5, 4),        # capped by max_seconds before the iterations are reached
    (10, 10.0, 60.0, 20, 0.125, 20),      # capped by max_iterations before the duration is reached
    (1, 0.0, 60.0, None, 100.0, 1),       # one call longer than the cap still gives one sample
    (3, 0.0, 0.5, None, 1.0, 1),          # the cap wins over the minimum, after the first run
])
def test_stop_rules(min_iterations: int, min_seconds: float, max_seconds: float, max_iterations: Optional[int],
                    latency: float, expected: int) -> None:
    clock = FakeClock()
    rule = StopRule(min_iterations, min_seconds, max_seconds, max_iterations)
    samples = time_calls(lambda: clock.advance(latency), rule, clock)
    assert len(samples) == expected
    assert samples == [latency] * expected


def test_progress_is_reported_between_calls_about_every_tenth_of_a_second() -> None:
    clock = FakeClock()
    seen: List[int] = []
    time_calls(lambda: clock.advance(0.03125), StopRule(64, 0.0, 60.0), clock, lambda done, elapsed: seen.append(done))
    assert seen == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64]


@pytest.mark.parametrize("kwargs, message", [
    ({"min_iterations": 0}, "iterations: expected an integer >= 1, got 0"),
    ({"min_seconds": -1.0}, "duration: expected seconds >= 0, got -1.0"),
    ({"min_seconds": 5.0, "max_seconds": 2.0}, "max duration: expected seconds > 0 and >= the duration (5.0), got 2.0"),
    ({"min_iterations": 10, "max_iterations": 5}, "max iterations: expected at least the iterations (10), got 5"),
])
def test_stop_rule_rejects_bad_values_in_words(kwargs: dict, message: str) -> None:
    with pytest.raises(EdgedynError) as error:
        StopRule(**kwargs)
    assert error.value.message == message


def test_bench_config_rejects_inputs_and_random_inputs_together() -> None:
    with pytest.raises(EdgedynError, match="--inputs and --random-inputs both given; choose one"):
        BenchConfig(inputs="x.npz", random_inputs=True)
    with pytest.raises(EdgedynError, match="warmup: expected an integer >= 0, got -1"):
        BenchConfig(warmup=-1)


def test_latency_stats_in_milliseconds() -> None:
    samples = [i / 1000.0 for i in range(1, 101)]  # 1..100 ms
    stats = latency_stats(samples)
    assert stats["min"] == pytest.approx(1.0) and stats["max"] == pytest.approx(100.0)
    assert stats["mean"] == pytest.approx(50.5) and stats["median"] == pytest.approx(50.5)
    assert stats["p90"] == pytest.approx(90.1) and stats["p95"] == pytest.approx(95.05)
    assert stats["p99"] == pytest.approx(99.01)
    assert stats["std"] == pytest.approx(np.std(np.arange(1, 101)))
    with pytest.raises(ValueError):
        latency_stats([])


def test_one_percentile_definition_interpolates_between_samples() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # the median of an even count: between the middle two
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


def test_peak_rss_grows_with_a_big_allocation() -> None:
    # In a fresh interpreter: this test process's high-water mark may already sit far above its current use.
    code = ("import numpy as np; from edgedyn.runtime.bench import peak_rss_mb; before = peak_rss_mb(); "
            "block = np.ones(64 * 1024 * 1024, dtype=np.uint8); print(peak_rss_mb() - before, block[-1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown, last = done.stdout.split()
    assert float(grown) >= 60 and last == "1"
    assert peak_rss_mb() > 0


class _Spec:
    record = {"inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"},
                         {"name": "ids", "shape": [4, 5], "dtype": "int64"},
                         {"name": "mask", "shape": [64], "dtype": "bool"}]}


def test_random_inputs_have_the_guarded_shapes_and_are_never_zeros() -> None:
    arrays = random_inputs(_Spec(), np.random.default_rng(0))
    assert {k: (v.shape, str(v.dtype)) for k, v in arrays.items()} == {
        "x": ((2, 3), "float32"), "ids": ((4, 5), "int64"), "mask": ((64,), "bool")}
    assert np.all(arrays["x"] != 0) and np.all(arrays["ids"] >= 1) and arrays["mask"].any()


# --- the environment probe, against fake /proc and /sys trees ---

X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz\n"
PI4_CPUINFO = "processor\t: 0\nBogoMIPS\t: 108.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n\nModel\t: Raspberry Pi 4\n"
XAVIER_CPUINFO = "processor\t: 0\nCPU implementer\t: 0x4e\nCPU architecture: 8\nCPU part\t: 0x004\n"
UNKNOWN_ARM = "processor\t: 0\nCPU implementer\t: 0x51\nCPU part\t: 0x802\n"


@pytest.mark.parametrize("text, expected", [
    (X86_CPUINFO, "Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz"),
    (PI4_CPUINFO, "Cortex-A72"),
    (XAVIER_CPUINFO, "NVIDIA Carmel"),
    (UNKNOWN_ARM, "ARM implementer 0x51 part 0x802"),
    ("", None),
])
def test_cpu_model_from_cpuinfo(text: str, expected: Optional[str]) -> None:
    assert sysinfo.cpu_model(text) == expected


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_jetson_power_mode_and_clocks_from_sysfs(tmp_path: Path) -> None:
    _write(tmp_path, "etc/nv_tegra_release", "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref\n")
    _write(tmp_path, "proc/device-tree/model", "NVIDIA Jetson Nano Developer Kit\x00")
    _write(tmp_path, "var/lib/nvpmodel/status", "pmode:0001\n")
    _write(tmp_path, "sys/class/devfreq/57000000.gpu/cur_freq", "76800000\n")
    _write(tmp_path, "sys/class/devfreq/57000000.gpu/max_freq", "921600000\n")
    for cpu, mhz in ((0, 1479), (1, 921), (10, 102)):
        _write(tmp_path, "sys/devices/system/cpu/cpu{}/cpufreq/scaling_cur_freq".format(cpu), "{}000\n".format(mhz))
        _write(tmp_path, "sys/devices/system/cpu/cpu{}/cpufreq/cpuinfo_max_freq".format(cpu), "1479000\n")
        _write(tmp_path, "sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor".format(cpu), "schedutil\n")
    env = sysinfo.environment(None, root=str(tmp_path))
    assert env["board_model"] == "NVIDIA Jetson Nano Developer Kit"
    assert env["jetson"] == {"l4t": "R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref",
                             "power_mode": "mode 1", "gpu_clock_mhz": 76, "gpu_max_clock_mhz": 921}
    assert env["cpu_clocks"] == {"current_mhz": [1479, 921, 102], "max_mhz": [1479] * 3, "governor": "schedutil"}
    assert sysinfo.describe_clocks(env) == ["CPU clocks 102-1479 MHz of max 1479 MHz (schedutil)",
                                            "Jetson power mode mode 1", "GPU clock 76 MHz of max 921 MHz"]


@pytest.mark.parametrize("described, expected", [
    ({"executor": "tvm", "device": "cpu(0)", "tvm": "0.27.0", "runtime_only": True}, {"tvm": "0.27.0"}),
    ({"executor": "litert", "device": "cpu", "runtime": "ai-edge-litert", "version": "2.3.0", "threads": 2},
     {"ai-edge-litert": "2.3.0"}),
    ({"executor": "onnxruntime", "device": "cpu", "onnxruntime": "1.32.0", "providers": ["CPU"]},
     {"onnxruntime": "1.32.0"}),
    ({"executor": "portable", "device": "cpu", "numpy": "2.4.6", "steps": 9}, {}),
])
def test_runtime_versions_from_each_executor_describe(described: dict, expected: dict) -> None:
    assert sysinfo.runtime_versions(described) == expected


def test_no_jetson_and_no_cpufreq_are_left_out_quietly(tmp_path: Path) -> None:
    _write(tmp_path, "proc/device-tree/model", "Raspberry Pi 4 Model B Rev 1.4\x00")
    env = sysinfo.environment({"executor": "tvm", "device": "cpu:0", "tvm": "0.27.0"}, root=str(tmp_path))
    assert "jetson" not in env and "cpu_clocks" not in env and env["cpu_model"] is None
    assert env["board_model"] == "Raspberry Pi 4 Model B Rev 1.4"
    assert env["runtime_versions"] == {"tvm": "0.27.0"}
    assert sysinfo.describe_clocks(env) == []


def test_physical_cores_count_hyperthreads_once_and_only_usable_cpus(tmp_path: Path) -> None:
    # Two cores of two hyperthreads each (CPUs 0,2 and 1,3), as Linux lists them.
    for cpu, siblings in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        _write(tmp_path, "sys/devices/system/cpu/cpu{}/topology/thread_siblings_list".format(cpu), siblings + "\n")
    assert sysinfo.physical_cores(str(tmp_path), usable=range(4)) == 2
    assert sysinfo.physical_cores(str(tmp_path), usable=[0, 2]) == 1  # taskset -c 0,2: one core
    assert sysinfo.physical_cores(str(tmp_path), usable=[0, 1, 7]) == 3  # cpu7 has no topology: a core of its own


# --- the command, end to end ---

REQUIRED_NUMBERS = ("throughput_per_s", "init_ms", "first_inference_ms", "peak_rss_mb", "guard_overhead_us")


def test_bench_json_has_stable_keys_and_types(run_cli, export_example, tmp_path: Path) -> None:
    bundle = export_example("tiny_cnn")
    result = run_cli("bench", str(bundle), "--iterations", "5", "--warmup", "1", "--duration", "0",
                     "--json", str(tmp_path / "out.json"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out.json").read_text())
    assert set(report["latency_ms"]) == {"min", "mean", "median", "p90", "p95", "p99", "max", "std"}
    assert all(isinstance(v, float) for v in report["latency_ms"].values())
    lat = report["latency_ms"]
    assert 0 < lat["min"] <= lat["median"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    for key in REQUIRED_NUMBERS:
        assert isinstance(report[key], float) and report[key] > 0, key
    assert report["iterations"] == 5 and report["warmup"] == 1
    assert (report["backend"], report["board"], report["specialization"]) == ("tvm", "x86-64", "x=1x3x64x64")
    assert re.fullmatch(r"[0-9a-f]{64}", report["bundle_sha256"])
    env = report["env"]
    assert env["machine"] == "x86_64" and env["cpu_cores"] >= 1 and env["numpy"] == np.__version__
    assert env["runtime_versions"]["tvm"] and env["executor"]["runtime_only"] is True
    assert report["inputs"] == {"source": "reference", "arrays": {"x": {"shape": [1, 3, 64, 64], "dtype": "float32"}}}
    # A person's summary on stdout, plain because it is not a terminal; progress on stderr.
    assert "latency p90 / p95 / p99 / max" in result.stdout and "guard check" in result.stdout
    assert report["bundle_sha256"] in result.stdout
    assert not ANSI.search(result.stdout + result.stderr)
    assert "bench {}: timing".format(bundle.name) in result.stderr


def test_bench_json_to_stdout_prints_only_json(run_cli, export_example) -> None:
    result = run_cli("bench", str(export_example("mlp")), "--specialization", "x=8x64", "--iterations", "3",
                     "--duration", "0", "--json", "-")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["specialization"] == "x=8x64" and report["specializations"] == ["x=1x64", "x=8x64"]
    assert report["inputs"]["arrays"]["x"]["shape"] == [8, 64]


def test_bench_inputs_npz_choose_the_specialization(run_cli, export_example, tmp_path: Path) -> None:
    np.savez(tmp_path / "batch8.npz", x=np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    result = run_cli("bench", str(export_example("mlp")), "--inputs", str(tmp_path / "batch8.npz"),
                     "--iterations", "3", "--duration", "0", "--json", "-")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["specialization"] == "x=8x64"
    assert report["inputs"]["source"] == str(tmp_path / "batch8.npz")


def test_bench_random_inputs(run_cli, export_example) -> None:
    result = run_cli("bench", str(export_example("tiny_cnn")), "--random-inputs", "--iterations", "3",
                     "--duration", "0", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["source"] == "random (seed 0)"


def test_bench_wrong_shape_npz_gives_the_guard_error(run_cli, export_example, tmp_path: Path) -> None:
    np.savez(tmp_path / "small.npz", x=np.ones((1, 3, 32, 32), dtype=np.float32))
    result = run_cli("bench", str(export_example("tiny_cnn")), "--inputs", str(tmp_path / "small.npz"))
    assert result.returncode == 2
    assert "error: no specialization of TinyCNN matches these arguments:\n" \
           "  x=1x3x64x64: input 'x' dim 2: expected 64, got 32\n" in result.stderr
    assert "hint: pass arguments matching one specialization, or export again adding: --input x=1x3x32x32" \
        in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, error", [
    (("--specialization", "x=4x64"), "error: bundle has no specialization 'x=4x64'; choose from: x=1x64, x=8x64"),
    (("--inputs", "nowhere.npz"), "error: inputs file nowhere.npz does not exist"),
    (("--iterations", "0"), "error: iterations: expected an integer >= 1, got 0"),
    (("--duration", "90"), "error: max duration: expected seconds > 0 and >= the duration (90.0), got 60.0"),
])
def test_bench_user_errors(run_cli, export_example, args, error) -> None:
    result = run_cli("bench", str(export_example("mlp")), *args)
    assert result.returncode == 2 and error in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_bench_npz_with_unknown_or_missing_arrays(run_cli, export_example, tmp_path: Path) -> None:
    np.savez(tmp_path / "extra.npz", x=np.ones((1, 64), np.float32), y=np.ones(3))
    np.savez(tmp_path / "only_n.npz", n=np.array(4))
    result = run_cli("bench", str(export_example("mlp")), "--inputs", str(tmp_path / "extra.npz"))
    assert "error: inputs file {} has array(s) y that the model does not take; its arguments are: x".format(
        tmp_path / "extra.npz") in result.stderr
    result = run_cli("bench", str(export_example("loop_example")), "--inputs", str(tmp_path / "only_n.npz"))
    assert "error: inputs file {} lacks array(s) for input(s): x".format(tmp_path / "only_n.npz") in result.stderr


def test_max_duration_cap_is_reported(export_example) -> None:
    # Every clock read costs 1 s: after the cap of 10 s only a handful of the 1000 runs asked for are done.
    report = run_benchmark(str(export_example("tiny_cnn")),
                           BenchConfig(warmup=0, iterations=1000, duration_s=0.0, max_duration_s=10.0),
                           clock=FakeClock(per_read=1.0))
    assert report["iterations"] == 5 and report["latency_ms"]["median"] == pytest.approx(1000.0)
    assert "stopped after 5 of 1000 iterations: --max-duration 10 s reached" in report["warnings"]
    assert report["init_ms"] == pytest.approx(1000.0) and report["first_inference_ms"] == pytest.approx(1000.0)


def test_bench_times_positional_calls_which_take_the_fast_path(export_example, monkeypatch) -> None:
    """Users call `program(x)`: the timing loop and the guard row must time that call (the fast rules decide it
    without binding), not keyword binding, which costs a few microseconds a positional call never pays."""
    from edgedyn.runtime.program import Program

    bound = []
    real_dispatch = Program.dispatch

    def counting_dispatch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        bound.append(1)
        return real_dispatch(self, *args, **kwargs)

    monkeypatch.setattr(Program, "dispatch", counting_dispatch)
    report = run_benchmark(str(export_example("tiny_cnn")), BenchConfig(warmup=2, iterations=20, duration_s=0.0,
                                                                         random_inputs=True))
    assert report["iterations"] >= 20 and report["guard_overhead_us"] > 0
    assert bound == [], "{} calls were bound by keyword instead of taking the fast path".format(len(bound))


# --- benchmarks/compare.py: the parts that decide what is timed and how it is reported ---

def _compare_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare", str(Path(__file__).resolve().parents[1] /
                                                                 "benchmarks" / "compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_caps_slow_variants_by_time() -> None:
    compare = _compare_module()
    # 200 calls over 5 rounds, at most 6 s per variant: a 180 ms call gets 6 calls a round, a 0.1 ms one 40.
    assert compare.block_sizes({"edgedyn-tvm": 0.18, "onnxruntime-direct": 0.0001, "very-slow": 30.0},
                               iterations=200, rounds=5, seconds_per_variant=6.0) == \
        {"edgedyn-tvm": 6, "onnxruntime-direct": 40, "very-slow": 1}


def test_compare_ratios_against_eager_and_the_best_peer() -> None:
    compare = _compare_module()
    results = {"torch-eager": {"median_ms": 10.0}, "torch-compile": {"median_ms": 5.0},
               "onnxruntime-direct": {"skipped": "no onnxruntime"}, "edgedyn-tvm": {"median_ms": 2.5},
               "edgedyn-tflite": {"skipped": "TFLite writer has no rule for aten.gelu"}}
    compare.add_ratios(results)
    assert results["edgedyn-tvm"]["speedup_vs_eager"] == 4.0 and results["edgedyn-tvm"]["speedup_vs_best_peer"] == 2.0
    assert results["torch-compile"]["best_peer"] == "torch-compile" and "speedup_vs_eager" not in results["edgedyn-tflite"]


def test_compare_waits_until_the_worker_it_timed_stops_spinning() -> None:
    """A finished block's thread pool keeps a core busy (onnxruntime ~50 ms, OpenBLAS ~100 ms): the next worker's
    block waits for that worker's process to go idle, read from /proc, and not longer than needed."""
    import subprocess
    import sys
    import time

    compare = _compare_module()
    spin = "import time\nstart = time.time()\nwhile time.time() - start < 0.2: pass\ntime.sleep(30)"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.05)
        started = time.perf_counter()
        compare.wait_until_idle(spinner.pid)
        waited_on_spinner = time.perf_counter() - started
        time.sleep(0.3)  # the idle one has long finished starting
        started = time.perf_counter()
        compare.wait_until_idle(idle.pid)
        waited_on_idle = time.perf_counter() - started
    finally:
        spinner.kill()
        idle.kill()
    assert waited_on_spinner >= 0.1  # it spun for 0.2 s from its start, 0.05 s before the wait began
    assert waited_on_idle < 0.1


def test_int8_ceiling_is_amdahls_bound() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("int8_ceiling", str(Path(__file__).resolve().parents[1] /
                                                                      "benchmarks" / "int8_ceiling.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # half the time in int8-capable kernels: at most 1.6x with 4x kernels, 2x with free ones; all of it: 4x, unbounded
    assert module.bound(0.5, 4.0) == 1.6 and module.bound(0.5, None) == 2.0
    assert module.bound(1.0, 4.0) == 4.0 and module.bound(1.0, None) == float("inf") and module.bound(0.0, 4.0) == 1.0


def test_bench_reports_that_the_portable_executor_allocates_no_intermediates(export_example) -> None:
    """MobileNetV2's intermediates are megabytes; the portable executor's call allocates only its output."""
    report = run_benchmark(str(export_example("mobilenet_v2", backend="portable")),
                           BenchConfig(warmup=1, iterations=2, duration_s=0.0))
    allocations = report["per_call_allocations"]
    assert allocations["output_bytes"] == 1000 * 4  # the 1x1000 logits
    assert allocations["beyond_outputs_bytes"] < 256 * 1024  # numpy's iterator buffers; intermediates: ~1 MB arena


# --- benchmarks/speed_report.py: how speed.py judges the bars on a noisy machine ---

def _speed_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("speed_report", str(Path(__file__).resolve().parents[1] /
                                                                      "benchmarks" / "speed_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("edgedyn_rounds, verdict", [
    ([0.8, 0.9, 0.95], "met"),              # faster than the peer in every round
    ([0.9, 1.0, 1.1], "within noise"),      # faster in one round, slower in another: a tie at this noise
    ([1.05, 1.2, 1.1], "missed"),           # slower in every round
])
def test_speed_report_judges_a_bar_by_its_round_by_round_ratios(edgedyn_rounds, verdict) -> None:
    report = _speed_report()
    record = {"kind": "cnn", "variants": {
        "onnxruntime-direct": {"median_ms": 1.0, "rounds_ms": [1.0, 1.0, 1.0]},
        "edgedyn-fp32": {"median_ms": sorted(edgedyn_rounds)[1], "rounds_ms": edgedyn_rounds}}}
    compared = report.paired_ratio(record, "onnxruntime-direct", "edgedyn-fp32")
    assert compared["verdict"] == verdict
    assert compared["rounds"] == pytest.approx([1.0 / t for t in edgedyn_rounds])
    # the same ratios against a 1.3x bar are never met
    assert report.paired_ratio(record, "onnxruntime-direct", "edgedyn-fp32", 1.3)["verdict"] == "missed"


def test_speed_report_bars_follow_the_issue_and_skip_an_int8_that_was_not_kept() -> None:
    report = _speed_report()
    assert report.bar_for("default vs fastest peer", "yolo11n", "detector") == 1.0
    assert report.bar_for("fp32 vs fastest fp32 peer", "zoo:vit", "encoder") == 1.0
    assert report.bar_for("int8 vs own fp32", "tv-resnet18", "cnn") == 1.5
    assert report.bar_for("int8 vs own fp32", "yolo11n", "detector") == 1.5
    assert report.bar_for("int8 vs own fp32", "zoo:gpt2", "decoder") is None
    kept_fp32 = {"selection": {"precision": "fp32", "why": "fastest of 2 verified"}}
    results = {"models": {"tv-resnet18": {"kind": "cnn", "variants": {
        "onnxruntime-direct": {"median_ms": 1.0, "rounds_ms": [1.0, 1.0]},
        "openvino-f32": {"median_ms": 0.9, "rounds_ms": [0.9, 0.9]},
        "openvino-default": {"median_ms": 0.5, "rounds_ms": [0.5, 0.5]},
        "edgedyn-default": {"median_ms": 0.45, "rounds_ms": [0.45, 0.48], "recorded": {"precision": "bf16"}},
        "edgedyn-fp32": {"median_ms": 0.95, "rounds_ms": [0.85, 0.95]},
        "edgedyn-int8": {"median_ms": 0.5, "rounds_ms": [0.5, 0.5], "recorded": kept_fp32}}}}}
    text = report.against_the_bars(results)
    # the default against the fastest peer at any precision (OpenVINO's bf16), fp32 against the fastest fp32 one
    assert "| tv-resnet18 | 1.11x [1.04-1.11] openvino-default (bf16) **met** (1.0x) |" in text
    assert "0.95x [0.95-1.06] openvino-f32 **within noise** (1.0x)" in text
    assert "int8 not kept (not faster, or missed its gate, in the export)" in text
    assert "- int8 vs own fp32: met on 0" not in text  # nothing judged
    assert "- default vs fastest peer: met on 1, within the run's noise on 0, missed on 0" in text


def test_speed_report_joins_a_stopped_run_and_its_rest_only_when_measured_alike() -> None:
    report = _speed_report()
    run = {"cpu": "AMD EPYC", "cpu_features": ["avx2"], "cores": 2, "threads": 2, "rounds": 3,
           "seconds_per_worker": 2.0, "edgedyn_backend": "auto", "versions": {"onnxruntime": "1.32.0"}}
    first = dict(run, created="06:37", load_average=[1.0], models={"mlp": {"kind": "mlp", "variants": {}}})
    rest = dict(run, created="08:25", load_average=[1.2], models={"zoo:vit": {"kind": "encoder", "variants": {}}})
    both = report.joined([first, rest])
    assert list(both["models"]) == ["mlp", "zoo:vit"]
    assert both["created"] == "06:37, 08:25" and both["load_average"] == [[1.0], [1.2]]
    with pytest.raises(ValueError, match="threads differ"):
        report.joined([first, dict(rest, threads=1)])
    with pytest.raises(ValueError, match="cpu_features differ"):  # another CPU's kernels: not one run's ratios
        report.joined([first, dict(rest, cpu_features=["avx2", "avx512_vnni"])])
    with pytest.raises(ValueError, match="mlp timed in more than one file"):
        report.joined([first, dict(rest, models=first["models"])])


# --- benchmarks/detection.py: how a variant's detections are held against torch eager's ---

def _detection_module():
    """benchmarks/detection.py, which imports speed.py beside it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import detection
    finally:
        sys.path.pop(0)
    return detection


def test_detection_agreement_matches_rows_and_shows_a_variant_that_detects_differently() -> None:
    """ultralytics' NMS rows [n, 6], padded as a bundle returns them, matched against another variant's rows in
    any order; a moved box or a lost row is a disagreement, not a match."""
    detection = _detection_module()
    rng = np.random.default_rng(3)
    corners = rng.uniform(0, 200, (12, 2))
    rows = np.concatenate([corners, corners + rng.uniform(20, 100, (12, 2)), rng.uniform(0.3, 0.9, (12, 1)),
                           rng.integers(0, 80, (12, 1))], axis=1)
    want = detection.padded(rows, 300)
    assert want["boxes"].shape == (1, 300, 4) and int(want["count"][0]) == 12 and not want["scores"][0, 12:].any()
    same = detection.agreement(detection.padded(rows[::-1], 300), want)  # another order: rows are matched
    assert same["ok"] and same["rows_matched"] == 12 and same["count"] == same["reference_count"] == 12
    moved = rows.copy()
    moved[5, :4] += 10.0
    assert not detection.agreement(detection.padded(moved, 300), want)["ok"]
    lost = detection.agreement(detection.padded(rows[:11], 300), want)
    assert not lost["ok"] and (lost["count"], lost["reference_count"]) == (11, 12)


def test_detection_ratios_are_against_the_fastest_peer_per_column() -> None:
    detection = _detection_module()
    variants = {"torch-eager": {"pre_ms": 4.0, "model_ms": 40.0, "post_ms": 2.0, "end_to_end_ms": 46.0},
                "ultralytics-onnx": {"pre_ms": 4.0, "model_ms": 20.0, "post_ms": 2.0, "end_to_end_ms": 26.0},
                "ultralytics-ncnn": {"error": "no ncnn"},
                "edgedyn": {"pre_ms": 2.0, "model_ms": 25.0, "post_ms": 0.5, "end_to_end_ms": 27.5}}
    detection.add_ratios(variants)
    assert variants["edgedyn"]["vs_best_peer"] == {"pre_ms": 2.0, "model_ms": 0.8, "post_ms": 4.0,
                                                   "end_to_end_ms": 26.0 / 27.5}
    assert variants["torch-eager"]["vs_best_peer"]["model_ms"] == 0.5 and "vs_best_peer" not in variants["ultralytics-ncnn"]
    # NMS inside a call that no profiler splits (LiteRT): its post-processing is only scaling, no ratio to NMS
    inside = {"torch-eager": {"pre_ms": 4.0, "model_ms": 40.0, "post_ms": 2.0, "end_to_end_ms": 46.0},
              "edgedyn": {"pre_ms": 2.0, "model_ms": 25.0, "post_ms": 0.01, "end_to_end_ms": 27.0,
                          "nms_in_model_column": True}}
    detection.add_ratios(inside)
    assert "post_ms" not in inside["edgedyn"]["vs_best_peer"] and inside["edgedyn"]["vs_best_peer"]["model_ms"] == 1.6
