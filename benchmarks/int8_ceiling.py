"""How fast int8 could make each model at most: the share of its fp32 time in operators int8 speeds up (Amdahl).

    python benchmarks/int8_ceiling.py                                   # every zoo CNN and encoder
    python benchmarks/int8_ceiling.py --models zoo:resnet,hf-resnet18 --speed results/speed-DATE.json

int8 makes convolutions and matrix products faster (integer dot products: at most 4x the multiply-adds of fp32 per
AVX-512 instruction, VPDPBUSD against VFMADD); what stays float (normalizations, activations, softmax, pooling,
residual adds, layout changes, the call itself) does not get faster, and int8 adds conversions at its edges. So
with `s` the share of the fp32 time spent in those operators, int8 can be at most 1 / ((1 - s) + s / k) times as
fast as fp32 with int8 kernels k times faster, 1 / (1 - s) with free ones. A model whose bound is under a speed bar
cannot reach it on any int8 scheme; one whose bound is over it can, in principle.

Per model: edgedyn's onnxruntime fp32 bundle, profiled by `edgedyn bench --profile --json` in its own process
(benchmarks/op_profile.py's `profile`). The share is the int8-capable nodes' kernel time over the median of plain
calls timed between the profiled ones. onnxruntime's profiler lengthens every node's span (by 1.8-2.2x a run in
all; the shortest node's span is already taken off each), so the share reads high and the bound generous: it is an
upper bound, not an estimate, and a measured speed-up may sit anywhere under it. Counted as
int8-capable: Conv, MatMul, Gemm (plain or fused with their bias and activation, and the NCHWc Conv), and the fused
Attention and MultiHeadAttention (whose softmax stays float: counting them whole makes the bound generous). The bars
are issue 12's: 2x for CNNs, 1.3x for encoders. `--speed` adds the int8 speed-up over edgedyn's own fp32 that a
`speed.py` run measured. Table as Markdown, JSON with the CPU model to benchmarks/results/DATE-int8-ceiling.json.
"""
import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

RESULTS = REPO / "benchmarks" / "results"
INT8_CAPABLE = ("Conv", "FusedConv", "MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Attention", "MultiHeadAttention")
KERNEL_SPEEDUP = 4.0  # int8 against fp32 multiply-adds per instruction (VPDPBUSD: 64, VFMADD231PS: 16 on AVX-512)
BARS = {"cnn": 2.0, "encoder": 1.3}
UNATTRIBUTED = "(unattributed)"  # edgedyn.runtime.profiling's row for what no node accounts for


def bound(share: float, kernel_speedup: Optional[float]) -> float:
    """Amdahl: the most int8 can speed up a model whose int8-capable share of the time is `share`."""
    rest = 1.0 - share
    if kernel_speedup is None:
        return float("inf") if rest <= 0 else 1.0 / rest
    return 1.0 / (rest + share / kernel_speedup)


def measured_speedups(path: Optional[str]) -> Dict[str, float]:
    """edgedyn int8's speed-up over edgedyn's own fp32 per model in a speed.py results file (medians of rounds)."""
    if not path:
        return {}
    results = json.loads(Path(path).read_text())
    speedups = {}
    for name, record in results["models"].items():
        variants = record.get("variants", {})
        fp32, int8 = variants.get("edgedyn-fp32", {}), variants.get("edgedyn-int8", {})
        if fp32.get("median_ms") and int8.get("median_ms"):
            speedups[name] = fp32["median_ms"] / int8["median_ms"]
    return speedups


def one_model(name: str, threads: int, runs: int, workdir: Path) -> Dict[str, Any]:
    import edgedyn
    from op_profile import profile
    from speed import build_model

    model, inputs, kind = build_model(name)
    bundle = edgedyn.export(model, inputs, board="x86-64", backend="onnxruntime",
                            output=str(workdir / "{}.edgedyn".format(name.replace(":", "-"))))
    report = profile(Path(bundle), threads, runs)
    ops = report["ops"]
    rows = [row for row in ops["by_type"] if row["type"] != UNATTRIBUTED]
    plain_ms = ops["interleaved_median_ms"]  # calls without the profiler, timed between the profiled ones
    capable_ms = sum(row["ms"] for row in rows if row["type"] in INT8_CAPABLE)
    share = min(1.0, capable_ms / plain_ms) if plain_ms > 0 else 0.0
    others = sorted((row for row in rows if row["type"] not in INT8_CAPABLE), key=lambda row: -row["ms"])
    return {"kind": kind, "plain_ms": plain_ms, "profiled_ms": ops["profiled_median_ms"], "int8_capable_ms": capable_ms,
            "int8_capable_share": share, "bound_at_4x_kernels": bound(share, KERNEL_SPEEDUP),
            "bound_free_kernels": bound(share, None),
            "float_types": [{"type": row["type"], "share": row["ms"] / plain_ms} for row in others[:4]],
            "by_type": ops["by_type"], "notes": ops.get("notes", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="", help="comma-separated speed.py names (default: every zoo CNN and "
                                                     "encoder)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=300, help="profiled runs per model")
    parser.add_argument("--speed", default="", help="a speed.py results file: adds the measured int8 speed-up")
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    from edgedyn import zoo
    from edgedyn.runtime import sysinfo

    names = [n for n in args.models.split(",") if n] or [
        "zoo:" + record.name for record in zoo.MODELS.values() if record.family in BARS]
    measured = measured_speedups(args.speed)
    results = {}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-int8-ceiling-") as workdir:
        for name in names:
            try:
                results[name] = one_model(name, args.threads, args.runs, Path(workdir))
            except Exception as error:  # one model's failure is a row, not the end of the run
                results[name] = {"failed": "{}: {}".format(type(error).__name__, str(error).splitlines()[0][:200])}
            if name in measured and "failed" not in results[name]:
                results[name]["measured_int8_speedup"] = measured[name]
            print("[{}] {}".format(name, {k: v for k, v in results[name].items() if k != "by_type"}),
                  file=sys.stderr, flush=True)
    lines = ["| model | fp32 ms | int8-capable share | bound, 4x kernels | bound, free kernels | bar | "
             "measured int8 | largest float parts |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, row in results.items():
        if "failed" in row:
            lines.append("| {} | failed: {} |".format(name, row["failed"]))
            continue
        bar = BARS.get(row["kind"])
        floats = ", ".join("{} {:.0f}%".format(part["type"], 100 * part["share"]) for part in row["float_types"])
        lines.append("| {} | {:.4g} | {:.0f}% | {:.2f}x | {:.2f}x | {} | {} | {} |".format(
            name, row["plain_ms"], 100 * row["int8_capable_share"], row["bound_at_4x_kernels"],
            row["bound_free_kernels"], "{:g}x".format(bar) if bar else "-",
            "{:.2f}x".format(row["measured_int8_speedup"]) if "measured_int8_speedup" in row else "-", floats))
    environment = sysinfo.environment()
    print("{} ({} threads), onnxruntime fp32 profile per model; bounds are Amdahl's (see the script's docstring)"
          .format(environment.get("cpu_model"), args.threads))
    print("\n".join(lines))
    stamp = datetime.datetime.now(datetime.timezone.utc)
    output = Path(args.output) if args.output else RESULTS / "{}-int8-ceiling.json".format(stamp.strftime("%Y-%m-%d"))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"created": stamp.isoformat(), "threads": args.threads, "runs": args.runs,
                                  "int8_capable": INT8_CAPABLE, "kernel_speedup": KERNEL_SPEEDUP, "bars": BARS,
                                  "speed_results": args.speed or None, "environment": environment,
                                  "results": results}, indent=2, default=str))
    print("results: {}".format(output))


if __name__ == "__main__":
    main()
