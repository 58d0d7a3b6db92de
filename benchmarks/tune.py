"""TVM tuned with MetaSchedule (`edgedyn tune`) against untuned TVM and onnxruntime, per zoo model, on this machine.

    python benchmarks/tune.py --models mobilenet_v2,distilbert --trials 256
    python benchmarks/tune.py --models vit --trials 32 --database DIR     # reuse (and extend) a database
    python benchmarks/tune.py --models examples/mobilenet_v2.py:MobileNetV2 --trials 132

Per model: tunes it for x86-64 into a database (a fresh one unless --database), then exports it with the TVM
backend twice, with no records (untuned) and with the database (tuned; the manifest says how many kernels took a
tuned schedule), and times both beside onnxruntime run directly on `torch.onnx.export` of the same model
("onnxruntime-direct"), with zoo.py's timing worker: each variant in its own process, alternated over rounds,
the median of all samples. Ratios are against onnxruntime-direct. Writes benchmarks/results/tune-DATE.json.
Run it under `nice` on a shared machine: the tuning uses every core.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare import first_line, machine  # noqa: E402  (one definition of the machine record)
from zoo import FRESH_SEED, onnx_direct, time_variants  # noqa: E402  (one timing worker for the benchmarks)

RESULTS = HERE / "results"
BOARD = "x86-64"
UNTUNED, TUNED, DIRECT = "edgedyn-tvm-untuned", "edgedyn-tvm-tuned", "onnxruntime-direct"


def model_and_inputs(name: str, seed: int) -> Any:
    """(model, {input name: tensor}) for a zoo name or a model reference as `edgedyn export` takes it
    (`examples/mobilenet_v2.py:MobileNetV2`, whose example_inputs() are drawn under `seed`)."""
    if ":" not in name:
        from edgedyn import zoo

        return zoo.build(name), zoo.example_inputs(name, seed=seed)
    import inspect

    import torch

    from edgedyn.frontend.loading import load_reference

    torch.manual_seed(0)  # the same weights in every process that builds the model
    model, examples, _ = load_reference(name)
    torch.manual_seed(seed)
    values = examples() if examples is not None else ()
    return model, dict(zip(inspect.signature(model.forward).parameters, values))


def onnx_file(name: str, path: Path) -> Optional[str]:
    """torch.onnx.export of the eager model, or the error: zoo.py's for zoo names, the same call for references."""
    if ":" not in name:
        return onnx_direct(name, path)
    import torch

    model, inputs = model_and_inputs(name, seed=0)
    try:
        torch.onnx.export(model, (), str(path), kwargs=inputs, dynamo=True, external_data=False)
    except Exception as error:
        return first_line("{}: {}".format(type(error).__name__, error))
    return None


def tune(name: str, trials: int, per_task: Optional[int], root: Path, log: Any) -> Dict[str, Any]:
    """`edgedyn tune` of the model into `root`; the database's record and the wall time."""
    from edgedyn.boards import load_board
    from edgedyn.fleet.tuning import tune_model

    def progress(state: Any) -> None:
        log("  tune {}: {}/{} trials over {} kernels, best {:.3g} GFLOPS, {:.0f} s".format(
            name, state.trials, state.total, state.tasks, state.best_gflops, state.elapsed_s))

    started = time.perf_counter()
    try:
        model, inputs = model_and_inputs(name, seed=0)
        record = tune_model(model, load_board(BOARD), None, trials, per_task, root=root, on_progress=progress,
                            example_inputs=inputs)
    except Exception as error:  # the report keeps torch's or TVM's own words
        return {"error": first_line(getattr(error, "message", None) or "{}: {}".format(type(error).__name__, error)),
                "tune_s": round(time.perf_counter() - started, 1)}
    return dict(record, tune_s=round(time.perf_counter() - started, 1))


def export_tvm(name: str, tuning_root: Path, path: Path) -> Dict[str, Any]:
    """The model exported with the TVM backend, building with the records under `tuning_root` (if any)."""
    import edgedyn
    import edgedyn.runtime as rt

    before = os.environ.get("EDGEDYN_TUNING_DIR")
    os.environ["EDGEDYN_TUNING_DIR"] = str(tuning_root)  # where the TVM backend looks for records
    started = time.perf_counter()
    try:
        model, inputs = model_and_inputs(name, seed=0)
        edgedyn.export(model, inputs, board=BOARD, backend="tvm", output=path)
    except Exception as error:  # whole: a verification mismatch's numbers come after its first line
        return {"error": getattr(error, "message", None) or "{}: {}".format(type(error).__name__, error)}
    finally:
        if before is None:
            del os.environ["EDGEDYN_TUNING_DIR"]
        else:
            os.environ["EDGEDYN_TUNING_DIR"] = before
    tuning = rt.load(path).specializations[0].artifact.get("tuning", {})
    return {"bundle": str(path), "export_s": round(time.perf_counter() - started, 1),
            "tuned_functions": tuning.get("tuned_functions", 0), "database_sha256": tuning.get("sha256")}


def run_model(name: str, args: argparse.Namespace, workdir: Path, log: Any) -> Dict[str, Any]:
    import numpy as np

    root = args.database or workdir / "tuning-{}".format(name.replace("/", "_").replace(":", "_"))
    if args.no_tune:  # time what --database already holds
        from edgedyn.backends import tuning_records

        record = tuning_records.describe(tuning_records.database_dir("x86-64-v2", root)) or {"error": "no records"}
        result = {"tune": dict(record, tune_s=0.0, reused=True)}  # type: Dict[str, Any]
    else:
        log("{}: tuning, {} trials".format(name, args.trials))
        result = {"tune": tune(name, args.trials, args.per_task, root, log)}
    if "error" in result["tune"]:
        log("{}: tuning failed: {}".format(name, result["tune"]["error"]))
    label = name.replace("/", "_").replace(":", "_")
    inputs = workdir / "{}-inputs.npz".format(label)
    np.savez(inputs, **{k: v.numpy() for k, v in model_and_inputs(name, seed=FRESH_SEED)[1].items()})
    base = {"model": name, "inputs": str(inputs), "threads": args.threads, "warmup": 3,
            "iterations": args.iterations}
    timing = {}  # type: Dict[str, Dict[str, Any]]
    for variant, records in ((UNTUNED, workdir / "no-records"), (TUNED, root)):
        log("{}: exporting {}".format(name, variant))
        result[variant] = export_tvm(name, records, workdir / "{}-{}.edgedyn".format(label, variant))
        if "bundle" in result[variant]:
            timing[variant] = dict(base, variant=variant, bundle=result[variant]["bundle"])
    error = onnx_file(name, workdir / "{}.onnx".format(label))
    if error is None:
        timing[DIRECT] = dict(base, variant=DIRECT, onnx=str(workdir / "{}.onnx".format(label)))
    log("{}: timing {} variants, {} rounds".format(name, len(timing), args.rounds))
    latency = time_variants(timing, args.rounds, workdir)
    if error is not None:
        latency[DIRECT] = {"error": error}
    direct = latency.get(DIRECT, {}).get("median_ms")
    for entry in latency.values():
        if direct and entry.get("median_ms"):
            entry["slowdown_vs_onnxruntime_direct"] = entry["median_ms"] / direct
    result["latency"] = latency
    return scrubbed(result)


def scrubbed(result: Dict[str, Any]) -> Dict[str, Any]:
    """The report without this run's temporary paths (bundles, the database folder): only what it measured."""
    for entry in result.values():
        entry.pop("bundle", None)
    if "database" in result["tune"]:
        result["tune"]["database"] = Path(result["tune"]["database"]).name
    return result


def markdown(report: Dict[str, Any]) -> str:
    lines = ["TVM tuning, {} on {} ({} threads, {} rounds x {} iterations, medians; load average {})".format(
        report["date"], report["machine"]["cpu_model"], report["threads"], report["rounds"], report["iterations"],
        " / ".join("{:.1f}".format(x) for x in report["load_average"])),
        "In brackets: the median over onnxruntime-direct's (higher is slower).", "",
        "| model | trials | kernels tuned | tune time | TVM untuned | TVM tuned | onnxruntime-direct |",
        "|---|---|---|---|---|---|---|"]
    for name, result in report["models"].items():
        tuned = result.get(TUNED, {})
        tune_cell = result["tune"].get("error") or ("reused --database" if result["tune"].get("reused") else
                                                    "{:.0f} s".format(result["tune"]["tune_s"]))
        lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
            name, report["trials"], tuned.get("tuned_functions", "-"), tune_cell.replace("|", "/"),
            _ms(result["latency"].get(UNTUNED) or result.get(UNTUNED)),
            _ms(result["latency"].get(TUNED) or result.get(TUNED)),
            _ms(result["latency"].get(DIRECT))))
    return "\n".join(lines) + "\n"


def _ms(entry: Optional[Dict[str, Any]]) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error: " + entry["error"].replace("|", "/")[:80]
    ratio = entry.get("slowdown_vs_onnxruntime_direct")
    return "{:.3g} ms{}".format(entry["median_ms"], " ({:.2f}x)".format(ratio) if ratio else "")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet_v2,distilbert", help="comma-separated zoo names or model references (examples/mobilenet_v2.py:MobileNetV2)")
    parser.add_argument("--trials", type=int, default=256, help="edgedyn tune --trials, per model")
    parser.add_argument("--per-task", type=int, help="edgedyn tune --per-task")
    parser.add_argument("--database", type=Path, help="tuning root to use and extend (default: a fresh one)")
    parser.add_argument("--no-tune", action="store_true", help="with --database: time its records, tune nothing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--output", type=Path, help="JSON path; the markdown goes beside it")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    import warnings

    from edgedyn import zoo

    args = parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in zoo.names() and ":" not in n]
    if unknown:
        raise SystemExit("unknown model {}; choose from: {}".format(", ".join(unknown), ", ".join(zoo.names())))
    warnings.simplefilter("ignore")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report = {"date": datetime.date.today().isoformat(), "machine": machine(), "threads": args.threads,
              "rounds": args.rounds, "iterations": args.iterations, "trials": args.trials,
              "per_task": args.per_task, "load_average": list(os.getloadavg()), "models": {}}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-tune-bench-") as directory:
        for name in names:
            report["models"][name] = run_model(name, args, Path(directory), log)
    report["load_average_after"] = list(os.getloadavg())
    output = args.output or RESULTS / "tune-{}.json".format(report["date"])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    log("wrote {} and {}".format(output, output.with_suffix(".md")))


if __name__ == "__main__":
    main()
