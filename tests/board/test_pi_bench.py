"""`edgedyn bench` on the emulated Raspberry Pi 4: the command works there (its timings mean nothing)."""
import json
import re
from pathlib import Path

from .emulator import run_edgedyn


def test_bench_tiny_cnn_on_pi4(pi_rootfs: Path, export_example, tmp_path: Path) -> None:
    bundle = export_example("tiny_cnn", board="raspberry-pi-4")
    result = run_edgedyn(pi_rootfs, ["-m", "edgedyn", "bench", str(bundle), "--iterations", "5", "--warmup", "1",
                                     "--json", str(tmp_path / "out.json")],
                         cpu="cortex-a72",
                         # The extracted library goes to a temporary cache, not into the shared rootfs.
                         env={"EDGEDYN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["iterations"] >= 5 and report["warmup"] == 1
    assert (report["board"], report["backend"], report["model"]) == ("raspberry-pi-4", "tvm", "TinyCNN")
    assert set(report["latency_ms"]) == {"min", "mean", "median", "p90", "p95", "p99", "max", "std"}
    assert report["latency_ms"]["min"] > 0 and report["throughput_per_s"] > 0 and report["peak_rss_mb"] > 0
    assert report["guard_overhead_us"] > 0 and report["first_inference_ms"] > 0 and report["init_ms"] > 0
    env = report["env"]
    assert env["machine"] == "aarch64" and env["python"].startswith("3.11.")
    assert env["cpu_model"] == "Cortex-A72"  # from the board's /proc/cpuinfo
    # Only the TVM runtime library was loaded: the board needs no compiler.
    assert env["executor"]["runtime_only"] is True and env["runtime_versions"]["tvm"].startswith("0.27")
    assert re.fullmatch(r"[0-9a-f]{64}", report["bundle_sha256"])
    assert "latency min / mean / median" in result.stdout and "Cortex-A72" in result.stdout
