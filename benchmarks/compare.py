"""edgedyn against what users would pick instead, on this machine, in one run.

    python benchmarks/compare.py                      # all reference models, all variants (~10 min on 2 cores)
    python benchmarks/compare.py --quick --models tiny_cnn,mlp

For each reference model: torch eager, torch.compile (inductor), onnxruntime on the same model (torch.onnx.export
then an InferenceSession: "onnxruntime-direct"), and the model exported with each edgedyn backend registered in
edgedyn.backends.BACKENDS. All run with the same thread count, warmed up, then timed in interleaved rounds (every
variant once per round, in a rotating order) so that a noisy neighbour hurts all of them alike. The table shows
medians and the speed-up over torch eager and over the best peer; peak memory comes from a separate process per
variant, since that is what has to fit on a board. JSON goes to benchmarks/results/.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# name -> (model reference, input name, shape); batch 1, as on a board.
MODELS = {
    "tiny_cnn": ("examples/tiny_cnn.py:TinyCNN", "x", (1, 3, 64, 64)),
    "mobilenet_v2": ("examples/mobilenet_v2.py:MobileNetV2", "x", (1, 3, 96, 96)),
    "mlp": ("examples/mlp.py:MLP", "x", (1, 64)),
    "transformer_block": ("examples/transformer_block.py:TransformerBlock", "x", (1, 32, 64)),
}
PEERS = ("torch-eager", "torch-compile", "onnxruntime-direct")
# Registry entries that pick another backend rather than being one.
NOT_BACKENDS = ("auto",)

Call = Callable[[], Any]


# --- the variants: each is built inside its own worker process from files the parent wrote ---

def build_call(task: Dict[str, Any]) -> Call:
    """A no-argument callable running one inference of the variant in `task` (torch is imported only for torch)."""
    import numpy as np

    inputs = np.load(task["inputs"])["x"]
    variant, threads, input_name = task["variant"], task["threads"], task["input_name"]
    if variant.startswith("edgedyn-"):
        import edgedyn.runtime as rt

        program = rt.load(task["bundle"], threads=threads)
        arguments = {input_name: inputs}
        return lambda: program(**arguments)
    if variant == "onnxruntime-direct":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(task["onnx"], options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: inputs}
        return lambda: session.run(None, feed)
    import torch

    torch.set_num_threads(threads)
    model = load_model(task["model_ref"])
    if variant == "torch-compile":
        model = torch.compile(model, backend="inductor")
    elif variant != "torch-eager":
        raise ValueError("unknown variant {!r}".format(variant))
    tensor = torch.from_numpy(inputs)

    def call() -> Any:
        with torch.inference_mode():
            return model(tensor)
    return call


def load_model(model_ref: str) -> Any:
    from edgedyn.frontend.loading import load_reference

    return load_reference(str(REPO / model_ref))[0].eval()


def export_onnx(model_ref: str, input_name: str, shape: Tuple[int, ...], path: Path) -> None:
    """torch.onnx.export as a user would call it: the dynamo exporter, else the TorchScript one."""
    import contextlib
    import io
    import logging
    import warnings

    import torch

    model, example = load_model(model_ref), (torch.randn(*shape),)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, example, str(path), input_names=[input_name], dynamo=True, external_data=False)
        except Exception:
            torch.onnx.export(model, example, str(path), input_names=[input_name], dynamo=False)


def export_edgedyn(backend: str, model_ref: str, input_name: str, shape: Tuple[int, ...], board: str,
                   path: Path) -> None:
    import edgedyn

    edgedyn.export(str(REPO / model_ref), inputs=["{}={}".format(input_name, "x".join(map(str, shape)))],
                   board=board, backend=backend, output=path)


# --- the worker process: build, warm up, then time blocks of calls when the parent asks ---

def worker_main(task: Dict[str, Any]) -> None:
    """Speaks JSON lines on the original stdout; anything libraries print goes to stderr instead."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def send(message: Dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    started = time.perf_counter()
    try:
        call = build_call(task)
        call()  # torch.compile compiles here: a failure is a skip, not a timing
    except Exception as error:
        send({"error": first_line(getattr(error, "message", None) or str(error) or type(error).__name__)})
        return
    setup_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(task["warmup"]):
        call()
    send({"ready": True, "setup_s": setup_s,
          "estimate_s": (time.perf_counter() - started) / max(1, task["warmup"])})
    from edgedyn.runtime.bench import StopRule, time_calls

    for line in sys.stdin:
        command = json.loads(line)
        if command.get("run"):
            # Exactly the block the parent asked for: it caps each variant's total time itself (block_sizes).
            block = StopRule(command["run"], 0.0, math.inf, command["run"])
            send({"samples_ms": [s * 1000.0 for s in time_calls(call, block)]})
        else:
            from edgedyn.runtime.bench import peak_rss_mb

            send({"peak_rss_mb": peak_rss_mb(), "torch_loaded": "torch" in sys.modules})
            return


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, task: Dict[str, Any], log_path: Path) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(task["threads"]), TVM_NUM_THREADS=str(task["threads"]))
        if task["variant"] == "edgedyn-tvm":
            env["TVM_USE_RUNTIME_LIB"] = "1"  # as on a board: the TVM runtime library, not the compiler
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)], cwd=str(REPO), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_path.open("w"), text=True)

    def ask(self, command: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        if command is not None:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return {"error": "worker exited {}: {}".format(self.process.returncode, first_line(tail[0]))}
        return json.loads(line)

    def close(self) -> Dict[str, Any]:
        try:
            return self.ask({"quit": True})
        finally:
            self.process.stdin.close()
            self.process.wait(timeout=60)


# --- timing, interleaved across the workers ---

def block_sizes(estimates: Dict[str, float], iterations: int, rounds: int, seconds_per_variant: float) -> Dict[str, int]:
    """Calls per round for each variant: `iterations` in all, fewer when that would pass `seconds_per_variant`
    (untuned TVM on MobileNetV2 is ~180 ms a call): capped by time, so one slow variant cannot stall the run."""
    wanted = int(math.ceil(iterations / float(rounds)))
    return {name: max(1, min(wanted, int(seconds_per_variant / rounds / max(estimate, 1e-6))))
            for name, estimate in estimates.items()}


def time_interleaved(workers: Dict[str, Worker], sizes: Dict[str, int], rounds: int) -> Dict[str, List[float]]:
    """Per-call latencies (ms): each round runs every worker's block once, in a rotating order, one at a time."""
    samples = {name: [] for name in workers}  # type: Dict[str, List[float]]
    names = list(workers)
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            samples[name].extend(workers[name].ask({"run": sizes[name]})["samples_ms"])
            wait_until_idle(workers[name].process.pid)
    return samples


def wait_until_idle(pid: int) -> None:
    """Waits until worker `pid` is idle (edgedyn.turns.settle on its CPU time from /proc/PID/stat): a thread pool
    keeps spinning on a core after its last call (numpy's OpenBLAS ~100 ms, onnxruntime ~50 ms; measured by
    benchmarks/idle_spin.py), which would slow the next worker's block. Without /proc: a fixed 0.1 s."""
    from edgedyn.turns import IDLE_WINDOW_S, settle

    stat = Path("/proc/{}/stat".format(pid))
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def cpu_s() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / float(tick)  # utime + stime

    try:
        # The counters move in whole clock ticks: over 4 of them a worker that got a quarter of a core or more
        # crossed one, so it reads busy. Over 2 (as before), a spinning worker on a loaded machine (half a core)
        # could read idle: tests/test_bench.py's spinner was let go after 0.02 s during a CI run beside other work.
        settle(cpu_s, max(IDLE_WINDOW_S, 4.0 / tick))
    except (OSError, ValueError, IndexError):
        time.sleep(0.1)


# --- one model ---

def run_model(name: str, args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Dict[str, Any]:
    import numpy as np

    from edgedyn.registry import BACKENDS
    from edgedyn.runtime.bench import percentile

    model_ref, input_name, shape = MODELS[name]
    inputs_path = workdir / "{}-inputs.npz".format(name)
    np.savez(inputs_path, x=np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    results = {}  # type: Dict[str, Dict[str, Any]]
    tasks = {}  # type: Dict[str, Dict[str, Any]]
    base = {"model_ref": model_ref, "input_name": input_name, "inputs": str(inputs_path), "threads": args.threads,
            "warmup": args.warmup}
    for variant in ("torch-eager", "torch-compile"):
        results[variant] = {"kind": "peer"}
        tasks[variant] = dict(base, variant=variant)
    onnx_path = workdir / "{}.onnx".format(name)
    results["onnxruntime-direct"] = {"kind": "peer"}
    log("{}: torch.onnx.export for onnxruntime-direct".format(name))
    try:
        export_onnx(model_ref, input_name, shape, onnx_path)
        tasks["onnxruntime-direct"] = dict(base, variant="onnxruntime-direct", onnx=str(onnx_path))
    except Exception as error:  # reported as skipped, with its reason
        results["onnxruntime-direct"]["skipped"] = "torch.onnx.export failed: " + first_line(str(error))
    for backend in sorted(b for b in BACKENDS if b not in NOT_BACKENDS):
        variant, bundle = "edgedyn-" + backend, workdir / "{}-{}.edgedyn".format(name, backend)
        results[variant] = {"kind": "edgedyn"}
        log("{}: edgedyn export --backend {}".format(name, backend))
        started = time.perf_counter()
        try:
            export_edgedyn(backend, model_ref, input_name, shape, args.board, bundle)
        except Exception as error:
            if args.debug:
                traceback.print_exc()
            results[variant]["skipped"] = first_line(getattr(error, "message", None) or str(error))
            log("{}: {} skipped: {}".format(name, variant, results[variant]["skipped"]))
            continue
        results[variant].update(export_s=time.perf_counter() - started, bundle_bytes=bundle.stat().st_size)
        tasks[variant] = dict(base, variant=variant, bundle=str(bundle))
    workers, estimates = {}, {}  # type: Dict[str, Worker], Dict[str, float]
    try:
        for variant, task in tasks.items():
            log("{}: starting {} (its own process)".format(name, variant))
            worker = Worker(task, workdir / "{}-{}.log".format(name, variant))
            ready = worker.ask()
            if "error" in ready:
                results[variant]["skipped"] = ready["error"]
                log("{}: {} skipped: {}".format(name, variant, ready["error"]))
                worker.process.wait()
                continue
            workers[variant], estimates[variant] = worker, ready["estimate_s"]
            results[variant]["setup_s"] = ready["setup_s"]
        sizes = block_sizes(estimates, args.iterations, args.rounds, args.seconds_per_variant)
        log("{}: timing {} variants in {} interleaved rounds".format(name, len(workers), args.rounds))
        samples = time_interleaved(workers, sizes, args.rounds)
        for variant, values in samples.items():
            results[variant].update(median_ms=percentile(values, 50), p90_ms=percentile(values, 90),
                                    min_ms=min(values), iterations=len(values))
    finally:
        for variant, worker in workers.items():
            results[variant]["peak_rss_mb"] = worker.close().get("peak_rss_mb")
    add_ratios(results)
    return results


def add_ratios(results: Dict[str, Dict[str, Any]]) -> None:
    """Speed-up (>1 is faster) over torch eager and over the fastest peer that ran."""
    eager = results.get("torch-eager", {}).get("median_ms")
    peers = [(results[p]["median_ms"], p) for p in PEERS if "median_ms" in results.get(p, {})]
    best = min(peers) if peers else None
    for record in results.values():
        if "median_ms" not in record:
            continue
        record["speedup_vs_eager"] = eager / record["median_ms"] if eager else None
        record["speedup_vs_best_peer"] = best[0] / record["median_ms"] if best else None
        record["best_peer"] = best[1] if best else None


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "unknown error"
    return line if len(line) <= 160 else line[:157] + "..."


# --- the report ---

def machine() -> Dict[str, Any]:
    import numpy as np

    from edgedyn.runtime import sysinfo

    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("torch", "onnxruntime", "tvm", "ai_edge_litert"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            pass
    info = sysinfo.environment()
    return {"cpu_model": info.get("cpu_model"), "cores": info.get("cpu_cores"), "machine": info["machine"],
            "system": info["system"], "versions": versions}


def print_table(report: Dict[str, Any], stream: Any = sys.stdout) -> None:
    """Markdown, so the same text reads in a terminal and pastes into benchmarks/README.md."""
    stream.write("| model | variant | median ms | p90 ms | vs torch eager | vs best peer | peak RSS MB | note |\n")
    stream.write("|---|---|---:|---:|---:|---:|---:|---|\n")
    for model, results in report["models"].items():
        for variant, r in results.items():
            if "skipped" in r:
                stream.write("| {} | {} | - | - | - | - | - | skipped: {} |\n".format(
                    model, variant, r["skipped"].replace("|", "/")))
                continue
            note = "best peer" if r.get("best_peer") == variant else ""
            stream.write("| {} | {} | {:.3f} | {:.3f} | {} | {} | {} | {} |\n".format(
                model, variant, r["median_ms"], r["p90_ms"], _ratio(r.get("speedup_vs_eager")),
                _ratio(r.get("speedup_vs_best_peer")),
                "{:.0f}".format(r["peak_rss_mb"]) if r.get("peak_rss_mb") else "-", note))


def _ratio(value: Optional[float]) -> str:
    return "{:.2f}x".format(value) if value else "-"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, from: {} (default: all)".format(", ".join(MODELS)))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every variant")
    parser.add_argument("--iterations", type=int, default=200, help="timed calls per variant, at most")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per variant")
    parser.add_argument("--seconds-per-variant", type=float, default=6.0,
                        help="time cap per variant and model; slow variants get fewer iterations")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 iterations, 3 rounds, 1 s cap")
    parser.add_argument("--board", default="x86-64", help="edgedyn board to export for (this machine)")
    parser.add_argument("--output", type=Path, help="JSON file (default: benchmarks/results/DATE-CPU-Nt.json)")
    parser.add_argument("--workdir", type=Path, help="keep exported models here (default: a temporary folder)")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of failed exports")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.rounds, args.warmup, args.seconds_per_variant = 20, 3, 3, 1.0
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error("unknown model(s) {}; choose from: {}".format(", ".join(unknown), ", ".join(MODELS)))
    if args.threads < 1 or args.iterations < 1 or args.rounds < 1:
        parser.error("--threads, --iterations and --rounds must be at least 1")
    return args


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.worker:
        worker_main(json.loads(args.worker))
        return

    def log(message: str) -> None:
        sys.stderr.write("[{:6.1f}s] {}\n".format(time.perf_counter() - started, message))
        sys.stderr.flush()

    started = time.perf_counter()
    report = {"date": datetime.date.today().isoformat(), "machine": machine(), "threads": args.threads,
              "settings": {k: v for k, v in vars(args).items() if k in ("iterations", "rounds", "warmup",
                                                                        "seconds_per_variant", "board", "quick")},
              "load_average_at_start": os.getloadavg()[0], "models": {}}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-compare-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            report["models"][name] = run_model(name, args, workdir, log)
    report["wall_s"] = time.perf_counter() - started
    report["load_average_at_end"] = os.getloadavg()[0]
    slug = re.sub(r"[^a-z0-9]+", "-", (report["machine"]["cpu_model"] or "cpu").lower()).strip("-")
    output = args.output or RESULTS / "{}-{}-{}t.json".format(report["date"], slug, args.threads)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print("\n{} ({} cores), {} thread(s), {}, load average {:.1f} at start and {:.1f} at end; medians of "
          "interleaved rounds; speed-up >1 is faster\n".format(
              report["machine"]["cpu_model"], report["machine"]["cores"], args.threads, report["date"],
              report["load_average_at_start"], report["load_average_at_end"]))
    print_table(report)
    log("wrote {}".format(output.relative_to(REPO) if REPO in output.resolve().parents else output))


if __name__ == "__main__":
    main()
