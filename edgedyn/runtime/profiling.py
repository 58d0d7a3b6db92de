"""`edgedyn bench --profile`: per-operator times from an executor's profiler, summed into benchmark_model's tables.

Standard library and numpy only, Python 3.8 syntax: this file runs on the board.

Note: the contract between an executor's `profile(inputs, runs)` and this file. The executor runs the model `runs`
times and returns, per run, its wall time (`wall_ms`, the executor's whole call as `run()` makes it) and each
operator's time in that run (`samples_ms[run][op]`, aligned with `ops`: name, type, calls per run, optionally
bytes). Rows are averaged over the typical runs only, the middle fifth by wall time: a busy machine preempts a long
run part-way (a 15 ms run on a loaded 2-core host took 5x its unloaded time), and a per-op median dodges those
stalls where a per-run median does not, so medians of ops would not add up to any run. The mean over the same runs
of every op, plus the guards timed apart, plus what the run spent outside all of them ("unattributed", its own row), is
exactly those runs' mean wall time with the guards: the table accounts for a typical run and never scales anything to fit.
"""
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from edgedyn.runtime.errors import EdgedynError

# Profiling repeats the timed runs' count, up to this: onnxruntime's profiler writes three JSON events per node
# per run, and a small model times ~30,000 runs in the timing loop's one second.
MAX_RUNS = 1000
UNATTRIBUTED = "(unattributed)"
TYPICAL_SHARE = 0.2
# Plain calls are timed between the profiled runs in blocks of this many, not one by one: onnxruntime's profiling
# session and the plain one evict each other's caches, and alternating every call slowed both (mobilenet_v2's plain
# calls 0.565 ms against 0.332 ms in the timing loop). The first run after each switch is the slow one.
INTERLEAVE_BLOCK = 10
# Profiled runs further than this from the timing loop's median get a note: the profile then describes other runs.
PROFILED_DRIFT = 0.15
GUARDS = "(edgedyn guards)"


def nothing() -> None:
    """What an executor's profile calls between profiled runs unless told otherwise."""


def clock_overhead_s(clock: Callable[[], float] = time.perf_counter, samples: int = 200) -> float:
    """What timing an empty call between two clock readings measures: the profiler's own cost per timed op."""
    def nothing() -> None:
        return None

    times = []
    for _ in range(samples):
        before = clock()
        nothing()
        times.append(clock() - before)
    return float(np.median(times))


def typical_runs(wall_ms: List[float]) -> List[int]:
    """Indices of the middle fifth of the runs by wall time (at least the median one): the runs a median latency
    describes. A wider band averages in runs a loaded machine preempted, whose share grows with a run's length."""
    order = sorted(range(len(wall_ms)), key=lambda i: wall_ms[i])
    keep = max(1, int(round(len(order) * TYPICAL_SHARE)))
    start = (len(order) - keep) // 2
    return order[start:start + keep]


def summarize(raw: Dict[str, Any], median_ms: float, guard_ms: float, interleaved_ms: List[float]) -> Dict[str, Any]:
    """The report's `ops`: every row sorted by time with its share, the same per op type, and the totals that say
    how much of the latency the profiler explains (see the module's note). `interleaved_ms` are plain calls timed
    between the profiled ones: the same machine, the same moments, without the profiler."""
    wall, samples = raw["wall_ms"], raw["samples_ms"]
    if not wall or len(samples) != len(wall):
        raise ValueError("profile: expected one list of op times per run, got {} for {} runs".format(
            len(samples), len(wall)))
    chosen = typical_runs(wall)
    typical_wall = float(np.mean([wall[i] for i in chosen]))
    nodes = []  # type: List[Dict[str, Any]]
    for index, op in enumerate(raw["ops"]):
        nodes.append({"name": op["name"], "type": op["type"], "count": op["calls"], "bytes": op.get("bytes"),
                      "ms": float(np.mean([samples[i][index] for i in chosen]))})
    # The timing loop calls the program, whose guards and dispatch run before the executor: timed apart.
    nodes.append({"name": GUARDS, "type": GUARDS, "count": 1, "bytes": None, "ms": guard_ms,
                  "what": "guard checks and dispatch before the executor runs (median of calls timed apart)"})
    attributed = sum(node["ms"] for node in nodes)
    rest = typical_wall + guard_ms - attributed
    rows = list(nodes)
    if rest > 0:
        rows.append({"name": UNATTRIBUTED, "type": UNATTRIBUTED, "count": 1, "bytes": None, "ms": rest,
                     "what": raw["unattributed"]})
    table = sum(row["ms"] for row in rows)
    profiled = float(np.median(wall)) + guard_ms
    interleaved = float(np.median(interleaved_ms)) if interleaved_ms else median_ms
    result = {
        "source": raw["source"], "runs": len(wall), "typical_runs": len(chosen),
        "total_ms": attributed, "unattributed_ms": rest, "guards_ms": guard_ms, "table_ms": table,
        "median_latency_ms": median_ms, "profiled_median_ms": profiled, "interleaved_median_ms": interleaved,
        "total_of_median": _ratio(attributed, median_ms), "table_of_median": _ratio(table, median_ms),
        "profiled_of_median": _ratio(profiled, median_ms), "total_of_profiled": _ratio(attributed, profiled),
        "total_of_interleaved": _ratio(attributed, interleaved),
        "profiled_of_interleaved": _ratio(profiled, interleaved),
        "nodes": _shares(rows, table), "by_type": _shares(_by_type(rows), table), "notes": [],
    }
    for key in ("note", "graph_ops"):
        if key in raw:
            result[key] = raw[key]
    if rest < 0:
        result["notes"].append("the timed rows add up to {:.4f} ms more than their runs took: the profiler's clock "
                               "or its own per-op cost counts some time twice".format(-rest))
    if abs(result["profiled_of_interleaved"] - 1.0) > PROFILED_DRIFT:
        result["notes"].append(
            "the profiled runs' median is {:.0%} of the plain calls' timed between them: the profiler's own cost "
            "slows what it times".format(result["profiled_of_interleaved"]))
    if abs(_ratio(interleaved, median_ms) - 1.0) > PROFILED_DRIFT:
        result["notes"].append(
            "plain calls timed between the profiled ones took {:.0%} of the timing loop's median: the machine's "
            "load changed while this ran".format(_ratio(interleaved, median_ms)))
    return result


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _by_type(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    by_type = {}  # type: Dict[str, Dict[str, Any]]
    for row in rows:
        entry = by_type.setdefault(row["type"], {"type": row["type"], "count": 0, "ms": 0.0, "bytes": None})
        entry["count"] += 1
        entry["ms"] += row["ms"]
        if row["bytes"] is not None:
            entry["bytes"] = (entry["bytes"] or 0) + row["bytes"]
    return list(by_type.values())


def _shares(rows: List[Dict[str, Any]], total: float) -> List[Dict[str, Any]]:
    """Rows sorted by time (slowest first) with their percent of `total` and the cumulative percent."""
    ordered = sorted(rows, key=lambda row: -row["ms"])
    cumulative = 0.0
    for row in ordered:
        share = 100.0 * row["ms"] / total if total > 0 else 0.0
        cumulative += share
        row["percent"], row["cumulative_percent"] = share, cumulative
    return ordered


def runs_to_profile(asked: int, timed: int) -> int:
    """As many profiled runs as timed ones unless asked for a number, at most MAX_RUNS."""
    return asked if asked > 0 else max(1, min(timed, MAX_RUNS))


# The row types that are the NMS op in each executor's profile (edgedyn/runtime/detections.py's outputs come from it).
NMS_TYPES = ("edgedyn.nms.default", "NonMaxSuppression", "edgedyn.nms")
NMS_PROFILE_RUNS = 20


def detection_pipeline(spec: Any, values: Dict[str, Any], report: Dict[str, Any], call: Callable[[], Any],
                       clock: Callable[[], float]) -> Dict[str, Any]:
    """How a detector's call divides: the NMS op (from the executor's profiler: its own `ops` when the bench
    profiled, else NMS_PROFILE_RUNS profiled calls) and the rest of the graph. Pre-processing happens before the
    bundle is called (`edgedyn bench --image` times it)."""
    median = report["latency_ms"]["median"]
    pipeline = {"model_and_nms_ms": median}  # type: Dict[str, Any]
    if getattr(spec.executor, "profile", None) is None or spec.artifact["executor"] == "litert":
        pipeline["nms_ms"] = None
        pipeline["why"] = "the {} executor times no single operator".format(spec.artifact["executor"])
        return pipeline
    ops = report.get("ops") or profile_ops(spec, values, NMS_PROFILE_RUNS, median,
                                           report["guard_overhead_us"] / 1000.0, call, clock)
    nms = sum(row["ms"] for row in ops["by_type"] if row["type"] in NMS_TYPES)
    pipeline.update(nms_ms=nms, nms_share=nms / ops["table_ms"] if ops["table_ms"] else None,
                    nms_source="{} per-operator profile, {} typical runs".format(spec.artifact["executor"],
                                                                              ops["typical_runs"]))
    return pipeline


def profile_ops(spec: Any, values: Dict[str, Any], runs: int, median_ms: float, guard_ms: float,
                call: Optional[Callable[[], Any]] = None, clock: Callable[[], float] = time.perf_counter) -> Dict[str, Any]:
    """The executor's per-operator times over `runs` calls, summed into benchmark_model's tables
    (edgedyn/runtime/profiling.py says how the rows add up to a typical run); `call`, the timed call, runs between
    blocks of profiled ones so both see the same machine."""
    profile = getattr(spec.executor, "profile", None)
    if profile is None:
        raise EdgedynError("the {} executor has no per-operator profiler".format(spec.artifact["executor"]),
                           hint="run edgedyn bench without --profile")
    interleaved = []  # type: List[float]
    block = min(INTERLEAVE_BLOCK, runs)
    profiled = [0]

    def timed_call() -> None:
        profiled[0] += 1
        if profiled[0] % block:
            return
        for _ in range(block):
            before = clock()
            call()
            interleaved.append((clock() - before) * 1000.0)

    arrays = [np.asarray(values[name], order="C") for name in spec.inputs]
    raw = profile(arrays, runs, timed_call) if call is not None else profile(arrays, runs)
    return summarize(raw, median_ms, guard_ms, interleaved)
