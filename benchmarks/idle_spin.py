"""How long each executor's threads keep a core busy after its last call, and how long `auto` waits for that.

    python benchmarks/idle_spin.py                      # the example MobileNetV2, every registered backend
    python benchmarks/idle_spin.py --model zoo:distilbert --repeats 9   # any benchmarks/speed.py model name

A thread pool that spins after a call holds a core that the next candidate `auto` times (edgedyn/turns.py), or the
next benchmark worker, would have had. The parent exports the model once per backend; then each backend's bundle
runs in a worker process of its own (no torch there): per repeat, 20 calls, then the process sleeps for a window
and its CPU time over that window is read (100% = one core busy all along), for each window in turn; and once per
repeat `edgedyn.turns.settle`'s wait after 20 calls. Medians over repeats. Table as Markdown, JSON with the CPU model
to benchmarks/results/DATE-idle-spin.json. Run it on a quiet machine: another process's load does not count here
(only the worker's own CPU time does), but it delays the worker's threads.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

RESULTS = REPO / "benchmarks" / "results"
WINDOWS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
CALLS = 20


def worker(bundle: str, repeats: int) -> Dict[str, Any]:
    """In the worker process: busy share of one core per window after CALLS calls, and settle's wait."""
    import numpy as np

    import edgedyn.runtime as rt
    from edgedyn.turns import settle

    program = rt.load(bundle)
    spec = program.specializations[0]
    values, _ = program.reference(spec)  # the export's own example inputs: what is timed does not matter here
    inputs = [np.asarray(values[name], order="C") for name in spec.inputs]
    run = spec.executor.run
    for _ in range(50):
        run(inputs)
    busy = {window: [] for window in WINDOWS_S}  # type: Dict[float, List[float]]
    settled = []  # type: List[float]
    for _ in range(repeats):
        for window in WINDOWS_S:
            for _ in range(CALLS):
                run(inputs)
            cpu, wall = time.process_time(), time.perf_counter()
            time.sleep(window)
            busy[window].append((time.process_time() - cpu) / (time.perf_counter() - wall))
        for _ in range(CALLS):
            run(inputs)
        settled.append(settle())
    return {"busy_share": {str(window): statistics.median(shares) for window, shares in busy.items()},
            "settle_ms": statistics.median(settled) * 1000.0, "torch_loaded": "torch" in sys.modules,
            "executor": spec.executor.describe()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2", help="a benchmarks/speed.py model name, or zoo:NAME")
    parser.add_argument("--backends", default="", help="comma-separated (default: every registered backend)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default="")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.repeats)))
        return

    import edgedyn
    from edgedyn.errors import EdgedynError
    from edgedyn.registry import BACKENDS
    from edgedyn.runtime import sysinfo
    from speed import build_model  # the models and example inputs speed.py times

    model, example, _ = build_model(args.model)
    backends = [name for name in (args.backends.split(",") if args.backends else BACKENDS) if name]
    results = {}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-idle-spin-") as workdir:
        for backend in backends:
            bundle = Path(workdir) / "{}.edgedyn".format(backend)
            try:
                edgedyn.export(model, example, board="x86-64", backend=backend, output=bundle)
            except EdgedynError as error:
                results[backend] = {"skipped": error.message}
                continue
            done = subprocess.run([sys.executable, __file__, "--worker", str(bundle), "--repeats",
                                   str(args.repeats)], capture_output=True, text=True, env=dict(os.environ))
            if done.returncode != 0:
                results[backend] = {"failed": done.stderr.strip().splitlines()[-1:]}
                continue
            results[backend] = json.loads(done.stdout.strip().splitlines()[-1])
    environment = sysinfo.environment()
    header = "| backend | " + " | ".join("{:g} ms".format(w * 1000) for w in WINDOWS_S) + " | auto's wait |"
    lines = [header, "|---|" + "---:|" * (len(WINDOWS_S) + 1)]
    for backend, result in results.items():
        if "busy_share" not in result:
            lines.append("| {} | {} |".format(backend, result.get("skipped") or result.get("failed")))
            continue
        shares = " | ".join("{:.0f}%".format(100 * result["busy_share"][str(w)]) for w in WINDOWS_S)
        lines.append("| {} | {} | {:.0f} ms |".format(backend, shares, result["settle_ms"]))
    print("{} ({} cores), {}: the worker's CPU time over each window after its last call (100% = one core), "
          "median of {} repeats".format(environment.get("cpu_model"), os.cpu_count(), args.model, args.repeats))
    print("\n".join(lines))
    stamp = datetime.datetime.now(datetime.timezone.utc)
    output = Path(args.output) if args.output else RESULTS / "{}-idle-spin.json".format(stamp.strftime("%Y-%m-%d"))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"created": stamp.isoformat(), "model": args.model,
                                  "windows_s": WINDOWS_S, "calls_before_each_window": CALLS,
                                  "repeats": args.repeats, "environment": environment, "results": results},
                                 indent=2, default=str))
    print("results: {}".format(output))


if __name__ == "__main__":
    main()
