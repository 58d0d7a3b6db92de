"""Each executor's runtime overhead on this machine, against the constant the board-fit check charges for it.

    python benchmarks/overheads.py               # every executor in edgedyn.fit.RUNTIME_OVERHEAD_BYTES, 3 rounds
    python benchmarks/overheads.py --rounds 5 --executors portable,tvm

The overhead is the peak RSS (VmHWM) of a fresh interpreter that imported numpy, edgedyn.runtime and the
executor's backend runtime, with torch blocked as on a board (edgedyn.fit.measure_overhead_bytes; Linux only).
Each round measures every executor once in its own process; the table shows the median, the recorded constant
and the drift. A drift beyond 30% means the backend's `overhead_bytes` in edgedyn/registry.py should be
measured again: the script then exits 1. JSON (with the CPU model and versions) goes to
benchmarks/results/DATE-overheads-CPU.json.
"""
import argparse
import datetime
import json
import platform
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgedyn.fit import MB, RUNTIME_OVERHEAD_BYTES, measure_overhead_bytes  # noqa: E402
from edgedyn.runtime import sysinfo  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
# Library versions move the overhead by a few MB; beyond this the recorded constant is stale.
MAX_DRIFT = 0.30


def measure(executors: List[str], rounds: int) -> Dict[str, Dict[str, Any]]:
    """executor -> its measured samples (bytes) and median, or the reason it could not be measured here."""
    samples = {name: [] for name in executors}  # type: Dict[str, List[int]]
    errors = {}  # type: Dict[str, str]
    for _ in range(rounds):
        for name in executors:
            if name in errors:
                continue
            try:
                samples[name].append(measure_overhead_bytes(name))
            except RuntimeError as error:  # its runtime is not installed here
                errors[name] = str(error).splitlines()[-1]
    rows = {}  # type: Dict[str, Dict[str, Any]]
    for name in executors:
        recorded = RUNTIME_OVERHEAD_BYTES[name]
        if name in errors:
            rows[name] = {"recorded_bytes": recorded, "error": errors[name]}
            continue
        median = int(statistics.median(samples[name]))
        drift = median / float(recorded) - 1.0
        rows[name] = {"samples_bytes": samples[name], "median_bytes": median, "recorded_bytes": recorded,
                      "drift": drift, "stale": abs(drift) > MAX_DRIFT}
    return rows


def print_table(rows: Dict[str, Dict[str, Any]]) -> None:
    print("| executor | measured MB (median) | recorded MB | drift | status |")
    print("|---|---:|---:|---:|---|")
    for name, row in rows.items():
        if "error" in row:
            print("| {} | - | {:.1f} | - | not measured: {} |".format(name, row["recorded_bytes"] / MB, row["error"]))
            continue
        status = "re-measure: beyond {:.0%}".format(MAX_DRIFT) if row["stale"] else "ok"
        print("| {} | {:.1f} | {:.1f} | {:+.0%} | {} |".format(
            name, row["median_bytes"] / MB, row["recorded_bytes"] / MB, row["drift"], status))


def versions() -> Dict[str, str]:
    found = {"python": platform.python_version()}
    for module in ("numpy", "onnxruntime", "tvm", "ai_edge_litert"):
        try:
            found[module] = str(__import__(module).__version__)
        except Exception:  # not installed, or no __version__: the row says whether it was measured
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", default=",".join(RUNTIME_OVERHEAD_BYTES),
                        help="comma-separated, from: " + ", ".join(RUNTIME_OVERHEAD_BYTES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        parser.error("the overhead is read from /proc/self/status: run this on Linux")
    executors = [name for name in args.executors.split(",") if name]
    unknown = [name for name in executors if name not in RUNTIME_OVERHEAD_BYTES]
    if unknown or args.rounds < 1:
        parser.error("unknown executor(s) {}; choose from: {}".format(", ".join(unknown),
                                                                    ", ".join(RUNTIME_OVERHEAD_BYTES))
                     if unknown else "--rounds must be at least 1")
    rows = measure(executors, args.rounds)
    env = sysinfo.environment()
    print_table(rows)
    print("\n{} ({} cores), {} round(s)".format(env.get("cpu_model"), env.get("cpu_cores"), args.rounds))
    today = datetime.date.today().isoformat()
    cpu = re.sub(r"[^a-z0-9]+", "-", (env.get("cpu_model") or env["machine"]).lower()).strip("-")[:40]
    output = args.output or RESULTS / "{}-overheads-{}.json".format(today, cpu)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"date": today, "machine": {"cpu_model": env.get("cpu_model"),
                                                             "cores": env.get("cpu_cores"),
                                                             "machine": env["machine"], "system": env["system"]},
                                  "versions": versions(), "rounds": args.rounds, "max_drift": MAX_DRIFT,
                                  "executors": rows}, indent=2) + "\n")
    print("wrote {}".format(output))
    return 1 if any(row.get("stale") for row in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
