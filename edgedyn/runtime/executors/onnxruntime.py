"""Runs an ONNX model (`.onnx` written by edgedyn's onnxruntime backend) with onnxruntime."""
import bisect
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime import profiling, sysinfo
from edgedyn.runtime.errors import BundleError, MissingDependencyError

CPU = "CPUExecutionProvider"
# Runs of the fresh profiling session left out of its profile: its first calls grow memory arenas and caches.
WARMUP_RUNS = 5


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise MissingDependencyError(
            "this bundle runs on onnxruntime, which is not installed ({})".format(error),
            hint="pip install 'edgedyn[onnxruntime]'  (on a Jetson: the onnxruntime-gpu wheel for its JetPack)",
        )
    return onnxruntime


def usable_providers(wanted: List[str], available: List[str]) -> List[str]:
    """The artifact's providers that this onnxruntime offers, in the artifact's order, with CPU last."""
    return [name for name in wanted if name in available and name != CPU] + [CPU]


# The board's [onnxruntime] table as the backend records it in the artifact (edgedyn/boards.py validates the
# board file against these same choices; a bundle is checked again here, since a file controls it). Without a
# record: these values.
DEFAULT_SESSION = {"graph_optimization": "all", "intra_op_threads": 0, "allow_spinning": True,
                   "execution_mode": "sequential"}
GRAPH_OPTIMIZATIONS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC",
                       "disabled": "ORT_DISABLE_ALL"}
EXECUTION_MODES = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}
MAX_INTRA_OP_THREADS = 1024


def session_settings(artifact: Dict[str, Any]) -> Dict[str, Any]:
    """The artifact's recorded session settings over the defaults, each checked."""
    recorded = artifact.get("onnxruntime", {}).get("session", {})
    if not isinstance(recorded, dict) or set(recorded) - set(DEFAULT_SESSION):
        raise BundleError("onnxruntime.session: expected a table with {}, got {!r}".format(
            ", ".join(DEFAULT_SESSION), recorded))
    settings = dict(DEFAULT_SESSION, **recorded)
    threads = settings["intra_op_threads"]
    valid_threads = type(threads) is int and 0 <= threads <= MAX_INTRA_OP_THREADS
    if (settings["graph_optimization"] not in GRAPH_OPTIMIZATIONS or settings["execution_mode"] not in EXECUTION_MODES
            or not isinstance(settings["allow_spinning"], bool) or not valid_threads):
        raise BundleError("onnxruntime.session: invalid settings {!r}".format(settings),
                          hint="graph_optimization: {}; execution_mode: {}; allow_spinning: true/false; "
                               "intra_op_threads: 0-{}".format(", ".join(GRAPH_OPTIMIZATIONS),
                                                               ", ".join(EXECUTION_MODES), MAX_INTRA_OP_THREADS))
    return settings


def intra_op_threads(settings: Dict[str, Any], threads: Optional[int]) -> int:
    """The session's thread count: the runtime's `threads`, else the board's, else one per physical core this
    process may use.

    Note: always given to onnxruntime, never left at 0. With 0, onnxruntime 1.32 takes one thread per physical core
    of the machine and pins each pool thread to one CPU (the calling thread stays free): on a 2-core x86 VM its
    one worker was bound to CPU 1, where it waits for any other process running there while the caller spins,
    and under `taskset -c 0` it was bound to CPU 1 all the same. A named count pins nothing, and is what
    onnxruntime-direct with that count runs: the one difference found between the MobileNetV4-conv-small bundle,
    1.4-1.5x slower, and onnxruntime-direct on the same graph (benchmarks/README.md). Counted here from the CPUs
    this process may use."""
    count = threads or settings["intra_op_threads"]
    return int(count) if count else sysinfo.physical_cores()


def _session_options(ort: Any, settings: Dict[str, Any], threads: Optional[int]) -> Any:
    """SessionOptions from the checked settings; the runtime's `threads` wins over the board's thread count."""
    options = ort.SessionOptions()
    # The file holds only the portable (basic) optimizations; the layout and fusion rewrites for this CPU and
    # these providers happen here, on the board ("all" unless the board file says otherwise).
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               GRAPH_OPTIMIZATIONS[settings["graph_optimization"]])
    options.execution_mode = getattr(ort.ExecutionMode, EXECUTION_MODES[settings["execution_mode"]])
    options.log_severity_level = 3
    options.intra_op_num_threads = intra_op_threads(settings, threads)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings["allow_spinning"] else "0")
    return options


def _session(ort: Any, model: bytes, options: Any, providers: List[str]) -> Any:
    """An InferenceSession. For CPU-only sessions onnxruntime's retry "on the CPU" is off: it would build the same
    session again, and it prints its banner on stdout, where `edgedyn run --json` and callers' pipes write."""
    extra = {"enable_fallback": 0} if providers == [CPU] else {}  # older releases ignore the keyword
    return ort.InferenceSession(model, options, providers=providers, **extra)


class OnnxRuntimeExecutor:
    """One onnxruntime InferenceSession over the bundle's model file."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        ort = _import_onnxruntime()
        threads = options.get("threads")
        self._settings = session_settings(artifact)
        session_options = _session_options(ort, self._settings, threads)
        self._requested = list(artifact.get("execution_providers", [CPU]))
        providers = usable_providers(self._requested, ort.get_available_providers())
        model = bundle.read(artifact["files"]["model"])
        self._model = model  # profile() needs a session of its own: profiling is fixed when a session is made
        self._session = _session(ort, model, session_options, providers)
        self._inputs = list(artifact["input_names"])
        self._outputs = list(artifact["output_names"])
        self._threads = threads
        self._version = getattr(ort, "__version__", "unknown")
        self.artifact = artifact
        self._run = self._runner(self._session)

    def _runner(self, session: Any) -> Callable[[Dict[str, np.ndarray]], List[np.ndarray]]:
        """How this executor calls `session`: natively when it can (see _native_run), else the public run."""
        outputs = self._outputs
        return self._native_run(session) or (lambda feed: session.run(outputs, feed))

    def _native_run(self, session: Any = None) -> Optional[Callable[[Dict[str, np.ndarray]], List[np.ndarray]]]:
        """The session's (default: this executor's) own C++ run, for CPU-only sessions, when onnxruntime has one."""
        session = session or self._session
        # Note: onnxruntime's Python `run` re-validates the feed's names and its OrtValues' ownership on every call
        # (1-7 us measured on a 2-core x86 host, against ~5 us for a small model's whole call); this executor
        # always passes exactly the model's inputs as numpy arrays. Sessions with a GPU provider keep the public
        # `run`: it holds onnxruntime's retry on the CPU when a GPU provider fails.
        native = getattr(session, "_sess", None)
        if native is None or not hasattr(native, "run") or session.get_providers() != [CPU]:
            return None
        outputs = self._outputs
        return lambda feed: native.run(outputs, feed, None)

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        return list(self._run(dict(zip(self._inputs, inputs))))

    def profile(self, inputs: List[np.ndarray], runs: int,
                between: Callable[[], None] = profiling.nothing) -> Dict[str, Any]:
        """Per-node kernel times from onnxruntime's own profiler in each of `runs` calls after a few warm-up calls,
        and each call's wall time around session.run."""
        ort = _import_onnxruntime()
        directory = tempfile.mkdtemp(prefix="edgedyn-ort-profile-")
        clock = time.perf_counter
        walls = []  # type: List[float]
        try:
            # The same settings as the session that runs the bundle, so the profile times the same kernels.
            options = _session_options(ort, self._settings, self._threads)
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(directory, "profile")
            session = _session(ort, self._model, options, self._session.get_providers())
            run = self._runner(session)  # as run() calls it
            feeds = dict(zip(self._inputs, inputs))
            for _ in range(WARMUP_RUNS):
                run(feeds)
            for _ in range(runs):
                started = clock()
                run(feeds)
                walls.append((clock() - started) * 1000.0)
                between()
            with open(session.end_profiling()) as handle:
                events = json.load(handle)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        ops, samples = node_times(events, skip_runs=WARMUP_RUNS)
        walls = walls[:len(samples)]  # onnxruntime stops recording past its event limit: keep the runs it has
        floor_ms = profiler_floor_ms(ops, samples)
        samples = [[max(0.0, spent - floor_ms * op["calls"]) for op, spent in zip(ops, one)] for one in samples]
        return {"source": "onnxruntime profiler (SessionOptions.enable_profiling), whole microseconds per node",
                "ops": ops, "samples_ms": samples, "wall_ms": walls, "profiler_floor_ms": floor_ms,
                "note": "{:.1f} us taken off each node call: the shortest node's kernel span, what onnxruntime's "
                        "profiler itself adds inside every span (a Reshape that moves no data reads 2-4 us "
                        "profiled)".format(floor_ms * 1000.0),
                "unattributed": "inside session.run, outside every node's kernel: the fences between nodes, the "
                                "binding's input and output copies, the profiler's own events and its rounding "
                                "to whole microseconds"}

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "onnxruntime",
            "device": "cpu" if self._session.get_providers()[0] == CPU else "gpu",
            "onnxruntime": self._version,
            "providers": self._session.get_providers(),
            "providers_requested": self._requested,
            "threads": self._threads,
            "intra_op_threads": self._session.get_session_options().intra_op_num_threads,
            "session": dict(self._settings),
        }


def profiler_floor_ms(ops: List[Dict[str, Any]], samples: List[List[float]]) -> float:
    """The profiler's own cost inside one kernel span, bounded from above by the shortest node's median span per
    call.

    Note: onnxruntime's profiler inflates every span it records (its clock reads and event bookkeeping sit inside
    the span): on a 2-core x86 host a profiled MobileNetV2 (58 nodes) ran 1.8x its plain time and its node spans
    summed to 1.3x it, while a Reshape that moves no data read 2 us. Taking the shortest span off every call keeps
    each row a lower bound of its node's time; what that leaves unexplained shows in the unattributed row.
    """
    if len(ops) < 2 or not samples:  # one node: its span is all there is to attribute
        return 0.0
    per_call = [float(np.median([run[index] for run in samples])) / max(1, op["calls"])
                for index, op in enumerate(ops)]
    return max(0.0, min(per_call))


def node_times(events: List[Dict[str, Any]], skip_runs: int) -> Tuple[List[Dict[str, Any]], List[List[float]]]:
    """The nodes of an onnxruntime profile (name, op type, calls per run) and each one's kernel time in every run
    after the first `skip_runs` (ms, aligned with the nodes).

    Each node has `_fence_before`, `_kernel_time` and `_fence_after` events; only the kernel time is the node's.
    A node event belongs to the `model_run` session event whose time span holds it.
    """
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session"
                  and e.get("name") == "model_run")[skip_runs:]
    starts = [start for start, _ in runs]
    per_run = [{} for _ in runs]  # type: List[Dict[str, float]]
    calls = [{} for _ in runs]  # type: List[Dict[str, int]]
    types = {}  # type: Dict[str, str]
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        run = bisect.bisect_right(starts, event["ts"]) - 1
        if run < 0 or event["ts"] > runs[run][1]:
            continue
        node = name[:-len("_kernel_time")]
        types.setdefault(node, event.get("args", {}).get("op_name", "?"))
        per_run[run][node] = per_run[run].get(node, 0.0) + event["dur"] / 1000.0
        calls[run][node] = calls[run].get(node, 0) + 1
    nodes = list(types)
    ops = [{"name": node, "type": types[node], "calls": max(counts.get(node, 0) for counts in calls)}
           for node in nodes]
    return ops, [[times.get(node, 0.0) for node in nodes] for times in per_run]
