"""The emulated board: `edgedyn verify --emulate` and `edgedyn bench --emulate` on a host of another architecture.

Host side only (nothing under edgedyn/runtime imports this). The board is a cached arm64 Debian root filesystem
(`rootfs.py`) run under qemu-user with the board's CPU; edgedyn reaches it as a wheel of the edgedyn running here
with the bundle's runtime extras (`wheels.py`); `board.py` ties a bundle to its board. The command itself runs
on the board (`python3 -m edgedyn verify ...`), so its table and JSON are those of a verify on the board.
"""
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from edgedyn.emulate.board import EmulatedBoard, prepare, run_command
from edgedyn.emulate.rootfs import EmulationError

__all__ = ["EmulatedBoard", "EmulationError", "MEANINGLESS", "bench_emulated", "prepare", "verify_emulated"]

# Note: every timing a bench under emulation reports is labelled with this, in the table and in --json.
MEANINGLESS = "under qemu emulation: meaningless"
# The timing fields of a bench report (runtime/bench.py).
TIMINGS = ("init_ms", "first_inference_ms", "duration_s", "latency_ms", "throughput_per_s", "guard_overhead_us", "cv")


def verify_emulated(bundle: Path, json_: bool = False, threads: Optional[int] = None, device: str = "auto") -> int:
    """`edgedyn verify` on the bundle's emulated board, reported as a verify there; returns its exit status."""
    board = prepare(bundle)
    options = (["--json"] if json_ else []) + _option("--threads", threads) + ["--device", device]
    result = run_command(board, "verify", bundle, options)
    sys.stderr.write(result.stderr)
    sys.stderr.write(board.banner() + "\n")
    if json_ and result.returncode in (0, 1):
        report = json.loads(result.stdout)
        report["emulation"] = board.describe()
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    else:
        sys.stdout.write(result.stdout)
    return result.returncode


def emulation_block(report: Dict[str, Any], described: Dict[str, Any]) -> Dict[str, Any]:
    """A bench report's `emulation` entry: the emulated board as `described`, and every timing it holds labelled
    MEANINGLESS (a profile's op times too). Benches on an emulated board here and through the fleet share it."""
    timed = list(TIMINGS) + (["ops"] if "ops" in report else [])
    return dict(described, timings=MEANINGLESS, timing_fields=timed)


def bench_emulated(bundle: Path, config: Any) -> Dict[str, Any]:
    """`edgedyn bench` on the bundle's emulated board: its report, with every timing labelled meaningless.

    `config` is the runtime's BenchConfig. A failure on the board is passed on as it was reported there.
    """
    board = prepare(bundle)
    result = run_command(board, "bench", bundle, bench_options(config) + ["--json", "-"])
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(result.returncode)
    sys.stderr.write(board.banner() + "\n")
    report = json.loads(result.stdout)  # type: Dict[str, Any]
    report["emulation"] = emulation_block(report, board.describe())
    report["warnings"] = list(report.get("warnings", [])) + [
        "timed on an emulated {} under qemu-user: the timings say nothing about the board; run "
        "`edgedyn bench` on the board itself".format(board.name)]
    return report


def bench_options(config: Any) -> List[str]:
    """The `edgedyn bench` options that ask the board for the benchmark `config` describes."""
    options = ["--warmup", str(config.warmup), "--iterations", str(config.iterations),
               "--duration", repr(config.duration_s), "--max-duration", repr(config.max_duration_s),
               "--device", config.device]
    options += _option("--threads", config.threads) + _option("--specialization", config.specialization)
    options += _option("--inputs", str(Path(config.inputs).resolve()) if config.inputs else None)
    options += _option("--length", getattr(config, "length", None))
    if config.profile or config.profile_runs:
        options += ["--profile"] + _option("--profile-runs", config.profile_runs or None)
    return options + (["--random-inputs"] if config.random_inputs else [])


def _option(name: str, value: Any) -> List[str]:
    return [] if value is None else [name, str(value)]
