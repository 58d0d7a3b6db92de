"""Do `edgedyn bench --profile`'s operator times add up to the latency `bench` measures? One check per backend.

    python benchmarks/op_profile.py                                  # mobilenet_v2 and tiny_cnn, every backend
    python benchmarks/op_profile.py --models tiny_cnn --backends onnxruntime,tvm --threads 1

Each model is exported once per backend, then `edgedyn bench BUNDLE --profile --json` runs in its own process
(onnxruntime's spinning threads would slow a neighbour in the same process; benchmarks/README.md), profiling as many runs as
it timed, with plain calls timed between them, ten after every ten (so both see the same machine at the same moments:
on a shared host the load changes between a timing loop and a profile that follows it). Per bundle: the timed
rows' total per run (operators, copies, guards) against the median of those plain calls (the issue's bound:
within 15%) and against the timing loop's median, the whole table (with the unattributed row) against it, and the
profiled runs' own median against the plain calls' (what the profiler costs). JSON goes to benchmarks/results/.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
MODELS = {
    "tiny_cnn": ("examples/tiny_cnn.py:TinyCNN", "x=1x3x64x64"),
    "mobilenet_v2": ("examples/mobilenet_v2.py:MobileNetV2", "x=1x3x96x96"),
}
BACKENDS = ("onnxruntime", "tflite", "tvm", "portable")
WITHIN = 0.15  # |op total - median| / median


def export(model: str, backend: str, directory: Path) -> Path:
    import edgedyn

    reference, spec = MODELS[model]
    return edgedyn.export(str(REPO / reference), inputs=[spec], board="x86-64", backend=backend,
                          output=directory / "{}-{}.edgedyn".format(model, backend))


def profile(bundle: Path, threads: int, runs: int) -> Dict[str, Any]:
    """`edgedyn bench --profile` in a fresh process; its JSON report."""
    command = [sys.executable, "-m", "edgedyn", "bench", str(bundle), "--threads", str(threads), "--warmup", "10",
               "--iterations", str(runs), "--duration", "1", "--profile", "--json"]
    # numpy's BLAS (the portable executor's matmuls) starts its own threads: hold it to the same count, or its
    # threads fight for the cores and the timing loop and the profile see different machines.
    environment = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                       MKL_NUM_THREADS=str(threads))
    result = subprocess.run(command, cwd=str(REPO), capture_output=True, text=True, timeout=600, env=environment)
    if result.returncode != 0:
        raise RuntimeError("{} failed:\n{}".format(" ".join(command), result.stderr))
    return json.loads(result.stdout)


def cpu_model() -> str:
    """The CPU's name as `edgedyn bench` reports it (edgedyn/runtime/sysinfo.py reads /proc/cpuinfo)."""
    from edgedyn.runtime import sysinfo

    return sysinfo.environment().get("cpu_model") or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=50, help="timed calls at least (and at least 1 s of them); "
                                                              "as many are profiled")
    args = parser.parse_args()
    rows = []  # type: List[Dict[str, Any]]
    with tempfile.TemporaryDirectory(prefix="edgedyn-profile-") as scratch:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                report = profile(export(model, backend, Path(scratch)), args.threads, args.runs)
                ops = report["ops"]
                error = abs(ops["total_of_interleaved"] - 1.0)
                rows.append({"model": model, "backend": backend, "median_ms": ops["median_latency_ms"],
                             "interleaved_median_ms": ops["interleaved_median_ms"],
                             "ratio_interleaved": ops["total_of_interleaved"],
                             "profiled_ratio_interleaved": ops["profiled_of_interleaved"],
                             "op_total_ms": ops["total_ms"], "ratio": ops["total_of_median"], "error": error,
                             "within": error <= WITHIN, "table_ms": ops["table_ms"],
                             "table_ratio": ops["table_of_median"], "unattributed_ms": ops["unattributed_ms"],
                             "guards_ms": ops["guards_ms"], "profiled_median_ms": ops["profiled_median_ms"],
                             "profiled_ratio": ops["profiled_of_median"], "profiled_runs": ops["runs"],
                             "timed_runs": report["iterations"], "cv": report["cv"],
                             "operators": len(ops["nodes"]), "source": ops["source"],
                             "top": [[n["name"], n["type"], n["ms"]] for n in ops["nodes"][:3]]})
                print("{:<13} {:<12} plain {:8.3f} ms (loop {:8.3f})  ops {:8.3f} ms {:6.1%} (of loop {:6.1%})  "
                      "table {:6.1%}  profiled/plain {:6.1%}  {:>4} runs  {}".format(
                          model, backend, ops["interleaved_median_ms"], ops["median_latency_ms"], ops["total_ms"],
                          ops["total_of_interleaved"], ops["total_of_median"], ops["table_of_median"],
                          ops["profiled_of_interleaved"], ops["runs"],
                                                "ok" if error <= WITHIN else "OFF BY {:.0%}".format(error)),
                      flush=True)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    path = RESULTS / "{}-profile-{}t.json".format(stamp.strftime("%Y-%m-%d"), args.threads)
    path.write_text(json.dumps({"created": stamp.isoformat(), "cpu": cpu_model(), "threads": args.threads,
                                "load_average": list(os.getloadavg()), "cores": os.cpu_count(),
                                "runs": args.runs, "within": WITHIN, "rows": rows}, indent=2) + "\n")
    print("wrote {}".format(path))
    if not all(row["within"] for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
