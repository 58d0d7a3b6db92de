"""int8 against fp32 for the same backend, in one run: median latency ratio and bundle sizes.

    python benchmarks/int8.py                                  # tiny_cnn, mobilenet_v2, mlp; onnxruntime, tflite
    python benchmarks/int8.py --models mobilenet_v2 --backends tflite --threads 1
    python benchmarks/int8.py --models zoo:mobilenet_v2 --backends tflite --max-accuracy-drop cosine=0.9

Each (model, backend) is exported twice for this machine (fp32, and --quantize int8 calibrated on random normal
inputs of the model's shape, or a zoo model's own fresh example inputs: latency does not depend on the data,
accuracy does, so the accuracy columns are only the numbers recorded in the manifest). A model that misses the
default int8 gate (cosine 0.99) is a row saying so; `--max-accuracy-drop` times it anyway. Both bundles are
loaded with edgedyn.runtime, warmed up, then timed in interleaved rounds (fp32 and int8 alternate, order flipping
every round) so a noisy neighbour hurts both alike. The table is printed as Markdown; JSON goes to benchmarks/results/.
"""
import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"

from edgedyn.runtime.bench import StopRule, percentile, time_calls  # noqa: E402 (this checkout's edgedyn)

MODELS = {
    "tiny_cnn": ("examples/tiny_cnn.py:TinyCNN", (1, 3, 64, 64)),
    "mobilenet_v2": ("examples/mobilenet_v2.py:MobileNetV2", (1, 3, 96, 96)),
    "mlp": ("examples/mlp.py:MLP", (1, 64)),
}


def measure(model: str, backend: str, args: argparse.Namespace, workdir: Path) -> Dict[str, Any]:
    import edgedyn
    import edgedyn.runtime as rt

    reference, inputs, samples = _model(model, args.calibration)
    name = model.replace(":", "-")
    paths = {precision: edgedyn.export(reference, inputs=inputs, backend=backend,
                                       quantize=None if precision == "fp32" else "int8",
                                       calibration=None if precision == "fp32" else samples,
                                       max_accuracy_drop=None if precision == "fp32" else args.max_accuracy_drop,
                                       output=workdir / "{}-{}-{}.edgedyn".format(name, backend, precision))
             for precision in ("fp32", "int8")}
    programs = {p: rt.load(path, threads=args.threads) for p, path in paths.items()}
    x = samples[0]
    for program in programs.values():
        for _ in range(args.warmup):
            program(*x)
    times = {p: [] for p in programs}  # type: Dict[str, List[float]]
    block = StopRule(args.iterations, 0.0, math.inf, args.iterations)  # exactly `iterations` calls per round
    for round_ in range(args.rounds):
        order = ["fp32", "int8"] if round_ % 2 == 0 else ["int8", "fp32"]
        for precision in order:
            program = programs[precision]
            times[precision].extend(s * 1000.0 for s in time_calls(lambda: program(*x), block))
    medians = {p: percentile(t, 50) for p, t in times.items()}
    artifact = programs["int8"].manifest["specializations"][0]["artifacts"][-1]
    quantization = artifact["quantization"]
    output = quantization["accuracy"]["outputs"][0]
    return {"model": model, "backend": backend, "fp32_ms": medians["fp32"], "int8_ms": medians["int8"],
            "speedup": medians["fp32"] / medians["int8"],
            "fp32_bundle_bytes": paths["fp32"].stat().st_size, "int8_bundle_bytes": paths["int8"].stat().st_size,
            "fp32_weight_bytes": quantization["weights"]["fp32_bytes"],
            "int8_weight_bytes": quantization["weights"]["quantized_bytes"],
            "cosine": output["cosine"], "max_abs_error": output["max_abs_error"],
            "top1_agreement": output.get("top1_agreement")}


def _model(model: str, count: int) -> Tuple[Any, List[str], List[Tuple[np.ndarray, ...]]]:
    """(what edgedyn.export takes, --input strings, `count` calibration samples) for a MODELS name or zoo:NAME."""
    if model.startswith("zoo:"):
        from edgedyn import zoo

        name = model[4:]
        samples = [tuple(t.numpy() for t in zoo.example_inputs(name, seed=seed).values())
                   for seed in range(1, count + 1)]
        return zoo.build(name), zoo.input_options(name), samples
    reference, shape = MODELS[model]
    rng = np.random.default_rng(0)
    samples = [(rng.standard_normal(shape).astype(np.float32),) for _ in range(count)]
    return str(REPO / reference), ["x=" + "x".join(map(str, shape))], samples


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| model | backend | fp32 ms | int8 ms | int8 speed-up | bundle fp32 -> int8 | weights fp32 -> int8 | "
             "cosine | top-1 agreement |", "|---|---|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append("| {} | {} | skipped: {} |".format(r["model"], r["backend"], r["error"]))
            continue
        lines.append("| {} | {} | {:.3f} | {:.3f} | {:.2f}x | {:.1f} -> {:.1f} KiB | {:.1f} -> {:.1f} KiB | {:.5f} | {} |".format(
            r["model"], r["backend"], r["fp32_ms"], r["int8_ms"], r["speedup"], r["fp32_bundle_bytes"] / 1024,
            r["int8_bundle_bytes"] / 1024, r["fp32_weight_bytes"] / 1024, r["int8_weight_bytes"] / 1024, r["cosine"],
            "-" if r["top1_agreement"] is None else "{:.1%}".format(r["top1_agreement"])))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names, or zoo:NAME")
    parser.add_argument("--backends", default="onnxruntime,tflite")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--iterations", type=int, default=100, help="timed calls per variant and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--calibration", type=int, default=40, help="random calibration samples")
    parser.add_argument("--max-accuracy-drop", help="the int8 gate, e.g. cosine=0.9 (default: cosine 0.99)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgedyn-int8-") as workdir:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                print("{} {} ...".format(model, backend), file=sys.stderr)
                try:
                    rows.append(measure(model, backend, args, Path(workdir)))
                except Exception as error:  # one failure must not cost the other rows
                    rows.append({"model": model, "backend": backend, "error": "{}: {}".format(
                        type(error).__name__, str(error).splitlines()[0] if str(error) else "")})
    print(table(rows))
    from edgedyn.runtime import sysinfo

    cpu = sysinfo.environment().get("cpu_model") or platform.machine()
    print("{}, {} thread(s), load average {:.2f} at the end".format(cpu, args.threads, os.getloadavg()[0]),
          file=sys.stderr)
    result = {"date": datetime.date.today().isoformat(), "machine": cpu, "load_average": os.getloadavg(),
              "max_accuracy_drop": args.max_accuracy_drop, "threads": args.threads, "iterations": args.iterations,
              "rounds": args.rounds, "rows": rows}
    output = args.output or RESULTS / "{}-int8-{}t.json".format(result["date"], args.threads)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote {}".format(output), file=sys.stderr)


if __name__ == "__main__":
    main()
