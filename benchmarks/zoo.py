"""The zoo matrix: every zoo model exported for every board and backend, verified where it can run, timed here.

    python benchmarks/zoo.py                                   # all models, all boards, all backends (long)
    python benchmarks/zoo.py --boards x86-64 --backends onnxruntime,portable --models resnet,vit
    python benchmarks/zoo.py --boards all --backends auto --no-timing  # the default export for all six boards

Per (model, board, backend): export ok or the error's first line, export time, bundle size, what a Jetson
bundle's GPU part holds (kernels, or each function without GPU code and why), and `verified`: the bundle's
outputs on fresh random inputs (not the export-time ones) against torch eager here, max error relative to the
largest reference magnitude, within the zoo record's rtol. x86-64 bundles run here; aarch64 bundles run on their
board emulated under qemu-user (edgedyn.emulate, the board's CPU; one board process runs all of a board's
bundles of one backend; correctness only). Per model on this machine: latency medians of each verified x86
edgedyn bundle, of onnxruntime run directly on `torch.onnx.export` of the same model ("onnxruntime-direct") and
of torch eager, with the same thread count, each variant timed in its own process and the variants alternated
over rounds (onnxruntime's spinning threads slow a neighbour in the same process).

Exports and verifications are cached (--cache; keyed by this checkout's edgedyn sources, so an edit redoes
them), so a second run, or a run with more backends, does only what is new. Every failure is recorded and the
run goes on; the report is rewritten after each step, so an interrupted run leaves what it did. Writes markdown
and JSON to benchmarks/results/zoo-DATE.{md,json}.
"""
import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import first_line, machine  # noqa: E402  (one definition of the machine record)

# benchmarks/profile.py would shadow the standard library's profile (transformers imports it): drop the folder
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's edgedyn, not whichever one is installed
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


# --- the cache: one folder per state of the edgedyn sources ---

def source_key() -> str:
    """A digest of what decides an export: edgedyn's sources, the board files, and the torch/transformers versions."""
    import torch
    import transformers

    digest = hashlib.sha256("{} {}".format(torch.__version__, transformers.__version__).encode())
    for path in sorted(list((REPO / "edgedyn").rglob("*.py")) + list((REPO / "boards").glob("*.toml"))):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def default_cache() -> Path:
    from edgedyn.runtime.format import cache_dir

    return cache_dir() / "zoo-matrix"


class Cells:
    """Each (model, board, backend) cell's record and bundle in the cache folder; records are saved as they grow."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def stem(self, name: str, board: str, backend: str) -> Path:
        return self.folder / "{}--{}--{}".format(name, board, backend)

    def load(self, name: str, board: str, backend: str) -> Optional[Dict[str, Any]]:
        path = self.stem(name, board, backend).with_suffix(".json")
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, name: str, board: str, backend: str, cell: Dict[str, Any]) -> None:
        path = self.stem(name, board, backend).with_suffix(".json")
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(cell, sort_keys=True))
        os.replace(str(partial), str(path))

    def fresh_inputs(self, name: str) -> Path:
        """The model's fresh inputs (seed FRESH_SEED, not the export's), saved once for every process that runs it."""
        import numpy as np

        from edgedyn import zoo

        path = self.folder / "{}-inputs.npz".format(name)
        if not path.is_file():
            np.savez(str(path), **{k: v.numpy() for k, v in zoo.example_inputs(name, seed=FRESH_SEED).items()})
        return path


# --- export ---

def export_cell(name: str, board: str, backend: str, bundle: Path) -> Dict[str, Any]:
    """Exports one cell (verify=False: verification on fresh inputs is ours); any failure is the cell's record."""
    import warnings

    import edgedyn
    from edgedyn import zoo

    started = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            edgedyn.export(zoo.build(name), zoo.example_inputs(name, seed=0), board=board, backend=backend,
                           output=bundle, verify=False)
    except Exception as error:  # a matrix records every failure and goes on
        message = getattr(error, "message", None) or "{}: {}".format(type(error).__name__, error)
        if os.environ.get("EDGEDYN_DEBUG"):
            traceback.print_exc()
        return {"export": "error", "error": first_line(message), "export_s": round(time.perf_counter() - started, 1)}
    cell = {"export": "ok", "bundle_bytes": bundle.stat().st_size, "export_s": round(time.perf_counter() - started, 1),
            "warnings": sorted({first_line(str(w.message)) for w in caught
                                if w.category.__name__ in ("GpuFallbackWarning", "FitWarning")})}
    cell.update(bundle_facts(bundle))
    return cell


def bundle_facts(bundle: Path) -> Dict[str, Any]:
    """The artifacts of the bundle (backend-device, in the runtime's order) and, for a GPU board, its GPU code."""
    from edgedyn.runtime.format import read_manifest

    (spec, *_) = read_manifest(bundle)["specializations"]
    facts = {"artifacts": ["{}-{}".format(a["backend"], a["device"]) for a in spec["artifacts"]]}  # type: Dict[str, Any]
    for artifact in spec["artifacts"]:
        if "gpu" in artifact:
            gpu = artifact["gpu"]
            schedules = gpu.get("schedules") or {}
            facts["gpu"] = {"arch": gpu["arch"], "kernels": gpu["kernels"], "functions": len(schedules.get("rules", {})),
                            "later_rule": len(schedules.get("rule_failures", {}))}
    if "no_gpu_code" in spec:
        facts["gpu"] = {"none": first_line(spec["no_gpu_code"]["reason"]),
                        "functions_without": spec["no_gpu_code"].get("functions", {})}
    return facts


# --- verification: here, or on the emulated board ---

def reference(name: str, cells: Cells, memo: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """torch eager's outputs on the model's fresh inputs (numpy), computed once per run."""
    import numpy as np
    import torch

    from edgedyn import zoo

    if name not in memo:
        with np.load(str(cells.fresh_inputs(name))) as data:
            fresh = {k: torch.from_numpy(data[k]) for k in data.files}
        with torch.no_grad():
            outputs = zoo.build(name)(**fresh)
        memo[name] = {key: outputs[key].numpy() for key in outputs.keys()}
    return memo[name]


def compare_outputs(name: str, got: Dict[str, Any], want: Dict[str, Any]) -> Dict[str, Any]:
    """max |diff| / max |reference| over all outputs, against the zoo record's rtol."""
    import numpy as np

    from edgedyn import zoo

    missing = sorted(set(want) - set(got))
    if missing:
        return {"verified": False, "verify_error": "outputs missing: {}".format(", ".join(missing))}
    worst = 0.0
    for key, expected in want.items():
        actual = np.asarray(got[key])
        if actual.shape != expected.shape:
            return {"verified": False, "verify_error": "{}: shape {} != {}".format(key, actual.shape, expected.shape)}
        worst = max(worst, float(np.abs(actual - expected).max() / max(float(np.abs(expected).max()), 1e-30)))
    return {"verified": worst <= zoo.get(name).rtol, "max_rel_error": worst}


def verify_here(name: str, bundle: Path, cells: Cells, memo: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    import numpy as np

    import edgedyn.runtime as rt

    try:
        program = rt.load(str(bundle))
        with np.load(str(cells.fresh_inputs(name))) as data:
            got = program(**{k: data[k] for k in data.files})
        ran = program.specializations[0].selection()
    except Exception as error:
        return {"verified": False, "verify_error": first_line("{}: {}".format(type(error).__name__, error))}
    return dict(compare_outputs(name, got, reference(name, cells, memo)), ran=ran, verified_on="here")


# Runs on the board (Python 3.8 syntax, numpy and edgedyn.runtime only): every job's outputs to its .npz, and
# after each job the list of results so far, so a crash or a timeout loses only the job it happened in.
BOARD_SCRIPT = """
import json, sys
import numpy as np
import edgedyn.runtime as rt
jobs = json.load(open(sys.argv[1]))
results = []
for job in jobs:
    try:
        program = rt.load(job["bundle"])
        with np.load(job["inputs"]) as data:
            outputs = program(**{k: data[k] for k in data.files})
        np.savez(job["out"], **outputs)
        results.append({"ok": True, "ran": program.specializations[0].selection()})
    except Exception as error:
        text = str(error).strip().splitlines()
        results.append({"ok": False, "error": "{}: {}".format(type(error).__name__, text[0] if text else "")})
    with open(sys.argv[2] + ".partial", "w") as stream:
        json.dump(results, stream)
    import os
    os.replace(sys.argv[2] + ".partial", sys.argv[2])
"""


def verify_emulated(jobs: List[Tuple[str, Path]], cells: Cells, memo: Dict[str, Dict[str, Any]],
                    log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Runs the bundles (all of one board and one set of runtime extras) in one process on the emulated board;
    returns each model's verification, or why it could not run there."""
    from edgedyn.emulate import prepare
    from edgedyn.errors import EdgedynError

    try:
        board = prepare(jobs[0][1], say=log)
    except EdgedynError as error:
        return {name: {"verified": "not run: " + first_line(error.message)} for name, _ in jobs}
    work = Path(tempfile.mkdtemp(prefix="zoo-board-", dir=str(cells.folder)))
    listing = [{"bundle": str(bundle.resolve()), "inputs": str(cells.fresh_inputs(name).resolve()),
                "out": str((work / "{}.npz".format(name)).resolve())} for name, bundle in jobs]
    (work / "jobs.json").write_text(json.dumps(listing))
    log("running {} bundles on the emulated {} (qemu -cpu {})".format(len(jobs), board.name, board.qemu_cpu))
    crash = None
    try:
        done = board.run_edgedyn(["-c", BOARD_SCRIPT, str(work / "jobs.json"), str(work / "results.json")],
                                 timeout=300 + 240 * len(jobs))
        if done.returncode != 0:
            crash = "the board's python3 exited {}: {}".format(done.returncode, first_line(
                done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""))
    except subprocess.TimeoutExpired:
        crash = "timed out on the emulated board"
    results = json.loads((work / "results.json").read_text()) if (work / "results.json").is_file() else []
    import numpy as np

    verdicts = {}
    for index, (name, _) in enumerate(jobs):
        if index >= len(results):
            verdicts[name] = {"verified": False, "verify_error": crash or "no result", "verified_on": board.name}
            continue
        result = results[index]
        if not result["ok"]:
            verdicts[name] = {"verified": False, "verify_error": first_line(result["error"]), "verified_on": board.name}
            continue
        with np.load(listing[index]["out"]) as data:
            got = {k: data[k] for k in data.files}
        verdicts[name] = dict(compare_outputs(name, got, reference(name, cells, memo)), ran=result["ran"],
                              verified_on="emulated {} (qemu -cpu {})".format(board.name, board.qemu_cpu))
    return verdicts


def emulation_group(bundle: Path) -> Tuple[str, Tuple[str, ...]]:
    """Bundles that need the same emulated board: the board and the runtime extras its artifacts need."""
    from edgedyn.emulate.board import board_extras
    from edgedyn.runtime.format import read_manifest

    manifest = read_manifest(bundle)
    return str(manifest["board"]["name"]), board_extras(manifest)


def onnx_direct(name: str, path: Path) -> Optional[str]:
    """torch.onnx.export of the eager model (what a user would run on onnxruntime); None or the error."""
    import contextlib
    import io

    import torch

    from edgedyn import zoo

    try:
        # Under no_grad, as an inference export is written (and as speed.py's peer and edgedyn's backend export):
        # under autograd torch 2.13's exporter fails on Swin's windowed attention.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            torch.onnx.export(zoo.build(name), (), str(path), kwargs=zoo.example_inputs(name, seed=0), dynamo=True,
                              external_data=False)
    except Exception as error:
        return first_line("{}: {}".format(type(error).__name__, error))
    return None


# --- the run: every backend's exports, then their verification, then timing ---

def run_backend(backend: str, args: argparse.Namespace, cells: Cells, report: Dict[str, Any],
                memo: Dict[str, Dict[str, Any]], save: Callable[[], None], log: Callable[[str], None]) -> None:
    """One backend for every board and model: export (cached), verify x86 here, then each aarch64 board's
    bundles in one emulated board process."""
    from edgedyn.boards import host_arch, load_board

    emulated = {}  # type: Dict[Tuple[str, Tuple[str, ...]], List[Tuple[str, Path]]]
    for board in args.boards:
        native = load_board(board).target("cpu").arch == host_arch()
        for name in args.models:
            bundle = cells.stem(name, board, backend).with_suffix(".edgedyn")
            cell = cells.load(name, board, backend)
            if cell is None:
                log("{} / {} / {}: exporting".format(name, board, backend))
                cell = export_cell(name, board, backend, bundle)
                cells.save(name, board, backend, cell)
            if cell["export"] == "ok" and "verified" not in cell:
                if native:
                    cell.update(verify_here(name, bundle, cells, memo))
                    cells.save(name, board, backend, cell)
                else:
                    emulated.setdefault(emulation_group(bundle), []).append((name, bundle))
            report["models"].setdefault(name, {"cells": {}, "latency": {}})["cells"]["{}/{}".format(board, backend)] = cell
            save()
    for (board, _), jobs in sorted(emulated.items()):
        for name, verdict in verify_emulated(jobs, cells, memo, log).items():
            cell = dict(cells.load(name, board, backend), **verdict)
            cells.save(name, board, backend, cell)
            report["models"][name]["cells"]["{}/{}".format(board, backend)] = cell
        save()


def time_model(name: str, backends: List[str], args: argparse.Namespace, cells: Cells,
               log: Callable[[str], None]) -> Dict[str, Any]:
    """Latency medians of the model's x86 edgedyn bundles of `backends` that verified, onnxruntime-direct and
    torch eager; cached beside the cells (for these backends, threads, rounds and iterations)."""
    cached = cells.folder / "latency-{}-{}-{}t-{}x{}.json".format(name, "+".join(backends), args.threads,
                                                                args.rounds, args.iterations)
    if cached.is_file():
        return json.loads(cached.read_text())
    peers = _time_model(name, backends, args, cells, log)
    cached.write_text(json.dumps(peers, sort_keys=True))
    return peers


def _time_model(name: str, backends: List[str], args: argparse.Namespace, cells: Cells,
                log: Callable[[str], None]) -> Dict[str, Any]:
    base = {"model": name, "inputs": str(cells.fresh_inputs(name)), "threads": args.threads, "warmup": 3,
            "iterations": args.iterations}
    timing = {}  # type: Dict[str, Dict[str, Any]]
    for backend in backends:
        cell = cells.load(name, "x86-64", backend)
        if cell and cell.get("verified") is True:
            timing["edgedyn-x86-64-" + backend] = dict(base, variant="edgedyn-" + backend,
                                                       bundle=str(cells.stem(name, "x86-64", backend).with_suffix(".edgedyn")))
    if not timing:
        return {}
    peers = {}
    onnx_path = cells.folder / "{}.onnx".format(name)
    error = None if onnx_path.is_file() else onnx_direct(name, onnx_path)
    if error is None:
        timing["onnxruntime-direct"] = dict(base, variant="onnxruntime-direct", onnx=str(onnx_path))
    else:
        peers["onnxruntime-direct"] = {"error": error}
    timing["torch-eager"] = dict(base, variant="torch-eager")
    log("{}: timing {} variants, {} rounds".format(name, len(timing), args.rounds))
    with tempfile.TemporaryDirectory(dir=str(cells.folder)) as work:
        peers.update(time_variants(timing, args.rounds, Path(work)))
    return peers


# --- the report ---

def markdown(report: Dict[str, Any]) -> str:
    lines = ["Zoo matrix, {} on {} ({} threads, {} rounds x {} iterations; medians). aarch64 bundles verified on "
             "the emulated board (qemu-user, the board's CPU).".format(
                 report["date"], report["machine"]["cpu_model"], report["threads"], report["rounds"],
                 report["iterations"]),
             "", "| model | board / backend | export (s) | artifacts | GPU code | verified (max rel err) | bundle | "
             "edgedyn ms | onnxruntime-direct ms | torch eager ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in report["models"].items():
        latency = result["latency"]
        for key, cell in result["cells"].items():
            board, backend = key.split("/")
            export = ("ok ({})".format(cell["export_s"]) if cell["export"] == "ok"
                      else "error: " + _cell_text(cell["error"]))
            lines.append("| {} | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                name, board, backend, export, ", ".join(cell.get("artifacts", [])) or "-", _gpu_text(cell),
                _verified_text(cell), "{:.1f} MB".format(cell["bundle_bytes"] / 1e6) if "bundle_bytes" in cell else "-",
                _ms(latency.get("edgedyn-{}-{}".format(board, backend))) if board == "x86-64" else "-",
                _ms(latency.get("onnxruntime-direct")), _ms(latency.get("torch-eager"))))
    return "\n".join(lines) + "\n"


def summary(reports: List[Dict[str, Any]]) -> str:
    """Per backend found in the reports (merged, the default first), one row per model and one column per board:
    the CPU artifact that ran and its max relative error, or what failed; the default's table also has the x86
    bundle's latency against its peers."""
    from edgedyn import zoo

    cells = {}  # type: Dict[str, Dict[str, Dict[str, Any]]]
    latency = {}  # type: Dict[str, Dict[str, Any]]
    for report in reports:
        for name, result in report["models"].items():
            cells.setdefault(name, {}).update(result["cells"])
            latency[name] = result.get("latency") or latency.get(name, {})
    keys = {key for row in cells.values() for key in row}
    backends = sorted({key.split("/")[1] for key in keys}, key=lambda b: (b != "auto", b))
    tables = []
    for backend in backends:
        boards = sorted(key.split("/")[0] for key in keys if key.endswith("/" + backend))
        timed = backend == "auto"
        lines = ["backend `{}`:".format(backend), "",
                 "| model | " + " | ".join(boards) + (" | x86 ms | onnxruntime-direct ms | torch eager ms |" if timed else " |"),
                 "|---|" + "---|" * (len(boards) + (3 if timed else 0))]
        for name in [n for n in zoo.names() if n in cells]:
            shown = [_summary_cell(cells[name].get("{}/{}".format(board, backend))) for board in boards]
            peers = latency.get(name, {})
            times = [_ms(peers.get("edgedyn-x86-64-auto")), _ms(peers.get("onnxruntime-direct")),
                     _ms(peers.get("torch-eager"))] if timed else []
            lines.append("| " + " | ".join([name] + shown + times) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables) + "\n"


def _summary_cell(cell: Optional[Dict[str, Any]]) -> str:
    if cell is None:
        return "not run"
    if cell["export"] != "ok":
        return "export error: " + _cell_text(cell["error"], 100)
    if "verified" not in cell:
        return "exported ({}), not verified: the run stopped first".format(", ".join(cell.get("artifacts", [])))
    ran = str(cell.get("ran", "")).split(": ", 1)[-1].split(" on ")[0] or ", ".join(cell.get("artifacts", []))
    return "{} {}".format(ran, _verified_text(cell).replace(" on qemu", ""))


def _cell_text(text: str, limit: int = 160) -> str:
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", text).replace("|", "/").replace("\n", " ")  # torch.onnx colours its errors
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _gpu_text(cell: Dict[str, Any]) -> str:
    gpu = cell.get("gpu")
    if not gpu:
        return "-"
    if "none" in gpu:
        return "none: " + _cell_text("{} ({} functions named)".format(gpu["none"], len(gpu["functions_without"])))
    return "{}, {} kernels, {} functions{}".format(gpu["arch"], gpu["kernels"], gpu["functions"], (
        " ({} after a rule failed)".format(gpu["later_rule"]) if gpu["later_rule"] else ""))


def _verified_text(cell: Dict[str, Any]) -> str:
    verified = cell.get("verified", "-")
    where = " on qemu" if str(cell.get("verified_on", "")).startswith("emulated") else ""
    if verified is True or (verified is False and "max_rel_error" in cell):
        return "{}{} ({:.1e})".format("yes" if verified else "NO", where, cell["max_rel_error"])
    if verified is False:
        return "NO{}: {}".format(where, _cell_text(cell.get("verify_error", "")))
    return _cell_text(str(verified))


def _ms(entry: Optional[Dict[str, Any]]) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error: " + _cell_text(entry["error"], 80)
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
    parser.add_argument("--cache", type=Path, help="folder for cached exports and verifications "
                                                   "(default: edgedyn's cache folder, zoo-matrix)")
    parser.add_argument("--no-timing", dest="timing", action="store_false", help="exports and verification only")
    parser.add_argument("--summarize", type=Path, nargs="+", help="print one row per model from these reports' JSON")
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
    if args.summarize:
        print(summary([json.loads(path.read_text()) for path in args.summarize]))
        return
    import warnings

    from edgedyn import zoo
    from edgedyn.registry import BACKENDS
    from edgedyn.boards import board_names

    warnings.simplefilter("ignore")
    args.models = _choose(args.models, zoo.names(), "model")
    args.boards = _choose(args.boards, list(board_names()), "board")
    # auto (each board's default) first: it is the column that must be complete
    args.backends = _choose(args.backends, ["auto"] + sorted(BACKENDS), "backend")

    def log(message: str) -> None:
        print("[{}] {}".format(time.strftime("%H:%M:%S"), message), file=sys.stderr, flush=True)

    cells = Cells((args.cache or default_cache()) / source_key())
    log("cache: {}".format(cells.folder))
    report = {"date": datetime.date.today().isoformat(), "machine": machine(), "threads": args.threads,
              "rounds": args.rounds, "iterations": args.iterations, "models": {}}  # type: Dict[str, Any]
    output = args.output or RESULTS / "zoo-{}.json".format(report["date"])
    output.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        output.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        output.with_suffix(".md").write_text(markdown(report))

    memo = {}  # type: Dict[str, Dict[str, Any]]
    for index, backend in enumerate(args.backends):
        run_backend(backend, args, cells, report, memo, save, log)
        if index == 0 and args.timing and "x86-64" in args.boards:
            # right after the first backend (auto: the default export), so a long run has its numbers early
            for name in args.models:
                report["models"][name]["latency"] = time_model(name, [backend], args, cells, log)
                save()
    save()
    print(markdown(report))
    log("wrote {} and {}".format(output, output.with_suffix(".md")))


if __name__ == "__main__":
    main()
