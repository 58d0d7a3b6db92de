"""Benchmark a bundle on the board: a timing loop with TFLite-style stop rules, latency statistics, peak memory.

    from edgedyn.runtime.bench import BenchConfig, run_benchmark
    report = run_benchmark("tiny.edgedyn", BenchConfig(iterations=50, duration_s=1.0))

Standard library and numpy only, Python 3.8 syntax: this file runs on the board. The clock is a parameter, so
the stop rules can be tested with a fake one.

Note: this is edgedyn's one timing loop (`time_calls`) and its one percentile definition (`percentile`):
`edgedyn bench`, `--backend auto` (edgedyn/selection.py) and benchmarks/ all time and summarize through them.
"""
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import profiling, sysinfo
from edgedyn.runtime.profiling import detection_pipeline, profile_ops
from edgedyn.runtime.detections import groups
from edgedyn.runtime.errors import EdgedynError, GuardError

Clock = Callable[[], float]
# on_progress(phase, iterations done, elapsed seconds); called between timed calls, never inside one.
OnProgress = Callable[[str, int, float], None]

# Above this coefficient of variation the median still holds, but the machine was busy or throttling.
HIGH_CV = 0.10
PROGRESS_EVERY_S = 0.1


@dataclass(frozen=True)
class StopRule:
    """When a timing loop ends, as in TFLite's benchmark_model: at least `min_iterations` runs and at least
    `min_seconds`, but never past `max_seconds` (or `max_iterations`), and always at least one run."""

    min_iterations: int = 50
    min_seconds: float = 1.0
    max_seconds: float = 60.0
    max_iterations: Optional[int] = None

    def __post_init__(self) -> None:
        if type(self.min_iterations) is not int or self.min_iterations < 1:
            raise EdgedynError("iterations: expected an integer >= 1, got {!r}".format(self.min_iterations))
        if self.min_seconds < 0:
            raise EdgedynError("duration: expected seconds >= 0, got {!r}".format(self.min_seconds))
        if self.max_seconds <= 0 or self.max_seconds < self.min_seconds:
            raise EdgedynError("max duration: expected seconds > 0 and >= the duration ({}), got {!r}".format(
                self.min_seconds, self.max_seconds), hint="raise --max-duration or lower --duration")
        if self.max_iterations is not None and self.max_iterations < self.min_iterations:
            raise EdgedynError("max iterations: expected at least the iterations ({}), got {!r}".format(
                self.min_iterations, self.max_iterations))

    def done(self, iterations: int, elapsed: float) -> bool:
        if iterations < 1:
            return False
        if elapsed >= self.max_seconds or (self.max_iterations is not None and iterations >= self.max_iterations):
            return True
        return iterations >= self.min_iterations and elapsed >= self.min_seconds


def time_calls(call: Callable[[], Any], rule: StopRule, clock: Clock = time.perf_counter,
               on_progress: Optional[Callable[[int, float], None]] = None) -> List[float]:
    """Calls `call` until `rule` is met and returns each call's duration in seconds."""
    samples = []  # type: List[float]
    started = clock()
    next_report = PROGRESS_EVERY_S
    elapsed = 0.0
    while not rule.done(len(samples), elapsed):
        before = clock()
        call()
        after = clock()
        samples.append(after - before)
        elapsed = after - started
        if on_progress is not None and elapsed >= next_report:
            on_progress(len(samples), elapsed)
            next_report = elapsed + PROGRESS_EVERY_S
    return samples


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100; 50 is the median), linearly interpolated between the two closest samples."""
    if not len(samples):
        raise ValueError("no samples to summarize")
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def latency_stats(samples_s: Sequence[float]) -> Dict[str, float]:
    """min / mean / median / p90 / p95 / p99 / max / std of durations, in milliseconds."""
    if not len(samples_s):
        raise ValueError("no samples to summarize")
    ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    return {"min": float(ms.min()), "mean": float(ms.mean()), "median": percentile(ms, 50),
            "p90": percentile(ms, 90), "p95": percentile(ms, 95), "p99": percentile(ms, 99), "max": float(ms.max()),
            "std": float(ms.std())}


def per_call_allocations(call: Callable[[], Any]) -> Dict[str, Any]:
    """What one warm call allocates through Python's allocator (numpy arrays included), measured by tracemalloc.

    The outputs are new arrays on every call; anything above them is intermediates allocated per inference. An
    executor that plans its intermediates into one arena (portable) shows only the outputs and a small constant;
    native runtimes (onnxruntime, LiteRT, TVM) allocate outside Python's allocator, which this does not see.
    """
    import tracemalloc

    already = tracemalloc.is_tracing()
    if already:
        reset_peak = getattr(tracemalloc, "reset_peak", None)  # Python 3.9+; a fresh start resets it on 3.8
        if reset_peak is not None:
            reset_peak()
    else:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        outputs = call()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not already:
            tracemalloc.stop()
    output_bytes = sum(int(getattr(a, "nbytes", 0)) for a in _arrays(outputs))
    return {"peak_bytes": int(peak), "output_bytes": output_bytes, "beyond_outputs_bytes": max(0, int(peak) - output_bytes),
            "measured": "tracemalloc (Python and numpy allocations only)"}


def _arrays(value: Any) -> List[Any]:
    if isinstance(value, dict):
        return [a for item in value.values() for a in _arrays(item)]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in _arrays(item)]
    return [value] if hasattr(value, "nbytes") else []


def peak_rss_mb() -> Optional[float]:
    """The process's peak resident memory in MiB: VmHWM from /proc/self/status, else getrusage."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Note: ru_maxrss is in KiB on Linux, in bytes on macOS.
    return peak / (1024.0 * 1024.0) if platform.system() == "Darwin" else peak / 1024.0


@dataclass(frozen=True)
class BenchConfig:
    """What `edgedyn bench` was asked to do."""

    warmup: int = 5
    iterations: int = 50
    duration_s: float = 1.0
    max_duration_s: float = 60.0
    threads: Optional[int] = None
    specialization: Optional[str] = None
    inputs: Optional[str] = None  # path of an .npz with one array per input name
    random_inputs: bool = False
    device: str = "auto"  # auto: the GPU artifact when this machine can run it; or cpu, gpu
    seed: int = 0
    profile: bool = False  # also profile per operator (report["ops"]) over as many calls as were timed
    profile_runs: int = 0  # > 0: profile over this many calls instead (and profile even without `profile`)
    length: Optional[int] = None  # random inputs of this length on the bucketed dims, padded to a bucket
    rule: StopRule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.warmup) is not int or self.warmup < 0:
            raise EdgedynError("warmup: expected an integer >= 0, got {!r}".format(self.warmup))
        if self.threads is not None and self.threads < 1:
            raise EdgedynError("threads: expected an integer >= 1, got {!r}".format(self.threads),
                               hint="leave --threads out to let the backend choose")
        if self.inputs is not None and self.random_inputs:
            raise EdgedynError("--inputs and --random-inputs both given; choose one")
        if self.length is not None and (type(self.length) is not int or self.length < 1):
            raise EdgedynError("length: expected an integer >= 1, got {!r}".format(self.length))
        if self.length is not None and (self.inputs is not None or self.specialization is not None):
            raise EdgedynError("--length chooses the inputs and the bucket; leave --inputs and --specialization out")
        if type(self.profile_runs) is not int or self.profile_runs < 0:
            raise EdgedynError("profile runs: expected an integer >= 0, got {!r}".format(self.profile_runs))
        object.__setattr__(self, "rule", StopRule(self.iterations, self.duration_s, self.max_duration_s))


def run_benchmark(path: str, config: BenchConfig, on_progress: Optional[OnProgress] = None,
                  clock: Clock = time.perf_counter) -> Dict[str, Any]:
    """Loads the bundle, times one specialization as `config` says and returns the report (JSON-ready)."""
    from edgedyn.runtime.program import load

    report_progress = on_progress or (lambda phase, done, elapsed: None)
    report_progress("loading", 0, 0.0)
    started = clock()
    program = load(path, threads=config.threads, device=config.device)
    init_ms = (clock() - started) * 1000.0
    spec, values, source = choose_inputs(program, config)
    positional, keywords = as_called(program, values)

    def call() -> Any:
        return program(*positional, **keywords)

    def route() -> Any:
        return program.route(*positional, **keywords)

    report_progress("first inference", 0, 0.0)
    started = clock()
    call()
    first_ms = (clock() - started) * 1000.0
    if config.warmup:
        report_progress("warm-up", 0, 0.0)
        time_calls(call, StopRule(config.warmup, 0.0, config.max_duration_s), clock,
                   lambda done, elapsed: report_progress("warm-up", done, elapsed))
    report_progress("timing", 0, 0.0)
    samples = time_calls(call, config.rule, clock, lambda done, elapsed: report_progress("timing", done, elapsed))
    report_progress("guard overhead", 0, 0.0)
    guard_samples = time_calls(route, StopRule(200, 0.05, 1.0, 100000), clock)
    raw = spec.executor.run(program.route(*positional, **keywords)[1])

    def dispatch() -> Any:  # what edgedyn adds to the executor's run: guards, routing, padding, slicing back
        _, _, finish = program.route_call(positional, keywords)
        return finish(raw) if finish is not None else raw
    dispatch_samples = time_calls(dispatch, StopRule(200, 0.05, 1.0, 100000), clock)
    allocations = per_call_allocations(call)
    stats = latency_stats(samples)
    cv = stats["std"] / stats["mean"] if stats["mean"] > 0 else 0.0
    warnings = []
    if cv > HIGH_CV:
        warnings.append("latency varies a lot (coefficient of variation {:.0%}): another process, power saving or "
                        "thermal throttling; close other work, fix the clocks or run longer with --duration".format(cv))
    if len(samples) < config.iterations:
        warnings.append("stopped after {} of {} iterations: --max-duration {:g} s reached".format(
            len(samples), config.iterations, config.max_duration_s))
    manifest = program.manifest
    report = {
        "model": manifest["model"]["name"],
        "board": manifest["board"]["name"],
        "bundle": str(path),
        "bundle_sha256": program.bundle.sha256,
        "backend": spec.artifact["backend"],
        "device": spec.artifact.get("device", "cpu"),
        "selection": spec.selection(),
        "specialization": spec.name,
        "specializations": [s.name for s in program.specializations],
        "inputs": {"source": source, "arrays": _describe_values(values)},
        "threads": config.threads,
        "warmup": config.warmup,
        "stop_rule": {"min_iterations": config.rule.min_iterations, "min_seconds": config.rule.min_seconds,
                      "max_seconds": config.rule.max_seconds},
        "iterations": len(samples),
        "duration_s": float(sum(samples)),
        "init_ms": init_ms,
        "executor_init_ms": program.init_ms,
        "first_inference_ms": first_ms,
        "latency_ms": stats,
        "throughput_per_s": 1000.0 / stats["mean"] if stats["mean"] > 0 else float("inf"),
        "cv": cv,
        "guard_overhead_us": percentile(guard_samples, 50) * 1e6,
        "dispatch_us": percentile(dispatch_samples, 50) * 1e6,
        "dispatch_share": percentile(dispatch_samples, 50) * 1e3 / stats["median"] if stats["median"] > 0 else 0.0,
        "peak_rss_mb": peak_rss_mb(),
        "per_call_allocations": allocations,
        "warnings": warnings,
        "env": sysinfo.environment(spec.executor.describe()),
    }
    if config.profile or config.profile_runs:
        report_progress("profiling", 0, 0.0)
        runs = profiling.runs_to_profile(config.profile_runs, len(samples))
        report["ops"] = profile_ops(spec, values, runs, stats["median"], report["guard_overhead_us"] / 1000.0,
                                    call, clock)
    if groups([record["name"] for record in spec.outputs]):
        report_progress("timing NMS", 0, 0.0)
        report["pipeline"] = detection_pipeline(spec, values, report, call, clock)
    return report


def as_called(program: Any, values: Dict[str, Any]) -> Tuple[List[Any], Dict[str, Any]]:
    """(positional, keyword) arguments that call `program` with `values` as users call it."""
    # Positionally, in the signature's order: the fast path for arrays of the exact dtypes and shapes; keywords
    # would time binding every call, ~5 us that a positional call never pays.
    names = [param["name"] for param in program.signature]
    if all(name in values for name in names):
        return [values[name] for name in names], {}
    return [], values


def choose_inputs(program: Any, config: BenchConfig) -> Tuple[Any, Dict[str, Any], str]:
    """The specialization to time, the arguments to time it with, and where those came from."""
    if config.length is not None:
        values = program.buckets.example(config.length, program.reference, np.random.default_rng(config.seed))
        spec, _ = program.dispatch(**values)
        return spec, values, "random (seed {}) at length {}".format(config.seed, config.length)
    names = [s.name for s in program.specializations]
    chosen = None
    if config.specialization is not None:
        matches = [s for s in program.specializations if s.name == config.specialization]
        if not matches:
            raise EdgedynError("bundle has no specialization '{}'; choose from: {}".format(
                config.specialization, ", ".join(names)))
        chosen = matches[0]
    if config.inputs is None:
        spec = chosen or program.specializations[0]
        values, _ = program.reference(spec)
        if config.random_inputs:
            values = dict(values, **random_inputs(spec, np.random.default_rng(config.seed)))
            return spec, values, "random (seed {})".format(config.seed)
        return spec, values, "reference"
    values = _load_npz(program, config.inputs, chosen or program.specializations[0])
    spec, values = program.dispatch(**values)
    if chosen is not None and spec is not chosen:
        raise GuardError("the arrays in {} match specialization '{}', not '{}' asked for with --specialization".format(
            config.inputs, spec.name, chosen.name), hint="leave --specialization out or pass arrays that match it")
    return spec, values, config.inputs


def random_inputs(spec: Any, rng: "np.random.Generator") -> Dict[str, np.ndarray]:
    """Fresh arrays of the specialization's input shapes and dtypes: never all zeros, which some kernels skip."""
    arrays = {}
    for record in spec.record["inputs"]:
        shape, dtype = tuple(record["shape"]), np.dtype(record["dtype"])
        if dtype == np.bool_:
            array = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            array = rng.integers(1, 10, size=shape).astype(dtype)
        else:
            array = rng.standard_normal(size=shape).astype(dtype)
        arrays[record["name"]] = array
    return arrays


def _load_npz(program: Any, path: str, spec: Any) -> Dict[str, Any]:
    """Arguments from an .npz: one array per input name (`x` or `input.x`); constants default to the bundle's."""
    if not os.path.isfile(path):
        raise EdgedynError("inputs file {} does not exist".format(path),
                           hint="save one with numpy.savez(path, {}=array)".format(spec.inputs[0] if spec.inputs
                                                                                   else "x"))
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key[len("input."):] if key.startswith("input.") else key: data[key] for key in data.files}
    except (OSError, ValueError) as error:
        raise EdgedynError("cannot read inputs file {}: {}".format(path, error),
                           hint="write it with numpy.savez; pickled objects are refused")
    known = [p["name"] for p in program.signature]
    unknown = sorted(set(arrays) - set(known))
    if unknown:
        raise EdgedynError("inputs file {} has array(s) {} that the model does not take; its arguments are: {}".format(
            path, ", ".join(unknown), ", ".join(known)))
    values = dict(spec.record["constants"])
    for param in program.signature:
        value = arrays.get(param["name"])
        if value is not None and param["kind"] != "tensor" and value.ndim == 0:
            value = value.item()  # a specialized Python scalar saved as a 0-d array
        if value is not None:
            values[param["name"]] = value
    missing = [name for name in spec.inputs if name not in arrays]
    if missing:
        raise EdgedynError("inputs file {} lacks array(s) for input(s): {}".format(path, ", ".join(missing)),
                           hint="save one array per tensor input, named as the model's arguments")
    return values


def _describe_values(values: Dict[str, Any]) -> Dict[str, Any]:
    described = {}  # type: Dict[str, Any]
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            described[name] = {"shape": list(value.shape), "dtype": str(value.dtype)}
        else:
            described[name] = {"value": value}
    return described
