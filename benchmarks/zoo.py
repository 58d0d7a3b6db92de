"""The zoo matrix: every zoo model exported for every board and backend, verified and timed where this machine can.

    python benchmarks/zoo.py                                   # all models, all boards, all backends (long)
    python benchmarks/zoo.py --boards x86-64 --backends onnxruntime,portable --models resnet,vit

Per (model, board, backend): export ok or the error's first line, bundle size, and, for bundles this machine
runs natively, `verified` (max error relative to the largest torch eager magnitude on fresh random inputs, not
the export-time ones, within the zoo record's rtol). Per model on this machine: latency medians of each edgedyn
bundle, of onnxruntime run directly on `torch.onnx.export` of the same model ("onnxruntime-direct") and of torch
eager, with the same thread count, each variant timed in its own process and the variants alternated over
rounds (onnxruntime's spinning threads slow a neighbour in the same process). Writes markdown and JSON to
benchmarks/results/zoo-DATE.{md,json}.
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
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import first_line, machine  # noqa: E402  (one definition of the machine record)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FRESH_SEED = 1234


# --- the timing worker: one variant, in its own process ---

def worker(task: Dict[str, Any]) -> Dict[str, Any]:
    """Times one variant: warm-up, then `iterations` calls; returns the samples in milliseconds."""
    import numpy as np

    inputs = dict(np.load(task["inputs"]))
    threads = task["threads"]
    if task["variant"].startswith("edgedyn-"):
        import edgedyn.runtime as rt

        program = rt.load(task["bundle"], threads=threads)
        call = lambda: program(**inputs)  # noqa: E731
    elif task["variant"] == "onnxruntime-direct":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(task["onnx"], options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        feed = {name: inputs[name] for name in names}
        call = lambda: session.run(None, feed)  # noqa: E731
    else:
        import torch

        from edgedyn import zoo

        torch.set_num_threads(threads)
        model = zoo.build(task["model"])
        tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}

        def call() -> Any:
            with torch.no_grad():
                return model(**tensors)
    for _ in range(task["warmup"]):
        call()
    samples = []
    for _ in range(task["iterations"]):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000.0)
    return {"samples": samples}


def time_variants(tasks: Dict[str, Dict[str, Any]], rounds: int, workdir: Path) -> Dict[str, Dict[str, Any]]:
    """Each variant once per round in a rotating order, each run a fresh process; medians over all samples."""
    samples = {name: [] for name in tasks}  # type: Dict[str, List[float]]
    errors = {}  # type: Dict[str, str]
    names = list(tasks)
    for round_index in range(rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            if name in errors:
                continue
            task_path = workdir / "task-{}.json".format(name)
            task_path.write_text(json.dumps(tasks[name]))
            env = dict(os.environ, OMP_NUM_THREADS=str(tasks[name]["threads"]))
            done = subprocess.run([sys.executable, __file__, "--worker", str(task_path)], capture_output=True,
                                  text=True, env=env, timeout=600)
            if done.returncode != 0:
                errors[name] = first_line(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
                continue
            samples[name] += json.loads(done.stdout.strip().splitlines()[-1])["samples"]
    return {name: {"median_ms": statistics.median(samples[name])} if samples[name] else
            {"error": errors.get(name, "no samples")} for name in names}


# --- export and verification ---

def export_cell(name: str, board: str, backend: str, workdir: Path) -> Dict[str, Any]:
    import edgedyn
    from edgedyn import zoo

    path = workdir / "{}-{}-{}.edgedyn".format(name, board, backend)
    started = time.perf_counter()
    try:
        edgedyn.export(zoo.build(name), zoo.example_inputs(name, seed=0), board=board, backend=backend, output=path)
    except Exception as error:  # a matrix records every failure and goes on
        message = getattr(error, "message", None) or "{}: {}".format(type(error).__name__, error)
        if os.environ.get("EDGEDYN_DEBUG"):
            traceback.print_exc()
        return {"export": "error", "error": first_line(message), "export_s": round(time.perf_counter() - started, 1)}
    return {"export": "ok", "bundle": str(path), "bundle_bytes": path.stat().st_size,
            "export_s": round(time.perf_counter() - started, 1)}


def verify_cell(name: str, bundle: str) -> Dict[str, Any]:
    """The bundle against torch eager on fresh inputs: max |diff| / max |reference| over all outputs."""
    import numpy as np
    import torch

    import edgedyn.runtime as rt
    from edgedyn import zoo

    fresh = zoo.example_inputs(name, seed=FRESH_SEED)
    got = rt.load(bundle)(**{k: v.numpy() for k, v in fresh.items()})
    with torch.no_grad():
        want = zoo.build(name)(**fresh)
    worst = 0.0
    for key in want.keys():
        reference = want[key].numpy()
        worst = max(worst, float(np.abs(got[key] - reference).max() / max(np.abs(reference).max(), 1e-30)))
    return {"verified": worst <= zoo.get(name).rtol, "max_rel_error": worst}


def onnx_direct(name: str, path: Path) -> Optional[str]:
    """torch.onnx.export of the eager model (what a user would run on onnxruntime); None or the error."""
    import contextlib
    import io

    import torch

    from edgedyn import zoo

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            torch.onnx.export(zoo.build(name), (), str(path), kwargs=zoo.example_inputs(name, seed=0), dynamo=True,
                              external_data=False)
    except Exception as error:
        return first_line("{}: {}".format(type(error).__name__, error))
    return None


def run_model(name: str, args: argparse.Namespace, workdir: Path, log: Any) -> Dict[str, Any]:
    import numpy as np

    from edgedyn.boards import host_arch, load_board
    from edgedyn.zoo import example_inputs

    inputs_path = workdir / "{}-inputs.npz".format(name)
    np.savez(inputs_path, **{k: v.numpy() for k, v in example_inputs(name, seed=FRESH_SEED).items()})
    cells = {}
    timing = {}  # type: Dict[str, Dict[str, Any]]
    base = {"model": name, "inputs": str(inputs_path), "threads": args.threads, "warmup": 3,
            "iterations": args.iterations}
    for board in args.boards:
        native = load_board(board).target("cpu").arch == host_arch()
        for backend in args.backends:
            log("{} / {} / {}: exporting".format(name, board, backend))
            cell = export_cell(name, board, backend, workdir)
            if cell["export"] == "ok" and native:
                cell.update(verify_cell(name, cell["bundle"]))
                timing["edgedyn-{}-{}".format(board, backend)] = dict(base, variant="edgedyn-" + backend,
                                                                    bundle=cell["bundle"])
            elif cell["export"] == "ok":
                cell["verified"] = "not here ({} bundle)".format(load_board(board).target("cpu").arch)
            cells["{}/{}".format(board, backend)] = {k: v for k, v in cell.items() if k != "bundle"}
    peers = {}
    if timing:
        onnx_path = workdir / "{}.onnx".format(name)
        error = onnx_direct(name, onnx_path)
        if error is None:
            timing["onnxruntime-direct"] = dict(base, variant="onnxruntime-direct", onnx=str(onnx_path))
        else:
            peers["onnxruntime-direct"] = {"error": error}
        timing["torch-eager"] = dict(base, variant="torch-eager")
        log("{}: timing {} variants, {} rounds".format(name, len(timing), args.rounds))
        peers.update(time_variants(timing, args.rounds, workdir))
    return {"cells": cells, "latency": peers}


# --- the report ---

def markdown(report: Dict[str, Any]) -> str:
    lines = ["Zoo matrix, {} on {} ({} threads, {} rounds x {} iterations; medians)".format(
        report["date"], report["machine"]["cpu_model"], report["threads"], report["rounds"], report["iterations"]),
        "", "| model | board / backend | export | verified (max rel err) | bundle | edgedyn ms | "
        "onnxruntime-direct ms | torch eager ms |", "|---|---|---|---|---|---|---|---|"]
    for name, result in report["models"].items():
        latency = result["latency"]
        for key, cell in result["cells"].items():
            board, backend = key.split("/")
            export = "ok" if cell["export"] == "ok" else "error: " + cell["error"].replace("|", "/")
            verified = cell.get("verified", "-")
            if isinstance(verified, bool):
                verified = "{} ({:.1e})".format("yes" if verified else "NO", cell["max_rel_error"])
            size = "{:.1f} MB".format(cell["bundle_bytes"] / 1e6) if "bundle_bytes" in cell else "-"
            lines.append("| {} | {} / {} | {} | {} | {} | {} | {} | {} |".format(
                name, board, backend, export, verified, size,
                _ms(latency.get("edgedyn-{}-{}".format(board, backend))),
                _ms(latency.get("onnxruntime-direct")), _ms(latency.get("torch-eager"))))
    return "\n".join(lines) + "\n"


def _ms(entry: Optional[Dict[str, Any]]) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error: " + entry["error"].replace("|", "/")[:80]
    return "{:.2f}".format(entry["median_ms"])


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help="comma-separated zoo names, or all")
    parser.add_argument("--boards", default="all", help="comma-separated board names, or all")
    parser.add_argument("--backends", default="all", help="comma-separated backends (and auto), or all")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--output", type=Path, help="JSON path; the markdown goes beside it")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _choose(given: str, everything: List[str], what: str) -> List[str]:
    chosen = everything if given == "all" else [item.strip() for item in given.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in everything]
    if unknown:
        raise SystemExit("unknown {} {}; choose from: {}".format(what, ", ".join(unknown), ", ".join(everything)))
    return chosen


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker.read_text()))))
        return
    import warnings

    from edgedyn import zoo
    from edgedyn.registry import BACKENDS
    from edgedyn.boards import board_names

    warnings.simplefilter("ignore")
    args.models = _choose(args.models, zoo.names(), "model")
    args.boards = _choose(args.boards, list(board_names()), "board")
    args.backends = _choose(args.backends, ["auto"] + sorted(BACKENDS), "backend")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = {"date": datetime.date.today().isoformat(), "machine": machine(), "threads": args.threads,
              "rounds": args.rounds, "iterations": args.iterations, "models": {}}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models:
            report["models"][name] = run_model(name, args, Path(directory), log)
    output = args.output or RESULTS / "zoo-{}.json".format(report["date"])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    log("wrote {} and {}".format(output, output.with_suffix(".md")))


if __name__ == "__main__":
    main()
