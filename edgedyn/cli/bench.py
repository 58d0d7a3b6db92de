"""`edgedyn bench`: on the board, time a bundle and print a performance summary like trtexec's."""
import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import (STDOUT, AllBoardsOption, JsonOption, KeyOption, RemoteOption, emit_json, err,
                                human_bytes, out, output_file, remote_reports)
from edgedyn.errors import EdgedynError

TOP_OPS = 10  # rows of "Top by computation time", as benchmark_model prints


def bench_command(
    bundle: Annotated[Path, typer.Argument(help="The .edgedyn bundle to time.")],
    warmup: Annotated[int, typer.Option(help="Untimed runs after the first inference.")] = 5,
    iterations: Annotated[int, typer.Option(help="Time at least this many runs.")] = 50,
    duration: Annotated[float, typer.Option(help="Time for at least this many seconds.")] = 1.0,
    max_duration: Annotated[float, typer.Option(help="Stop timing after this many seconds, whatever --iterations "
                                                     "says.")] = 60.0,
    threads: Annotated[Optional[int], typer.Option(help="Threads for the executor (default: the backend's).")] = None,
    specialization: Annotated[Optional[str], typer.Option(
        help="Specialization to time (default: the first; `edgedyn inspect` lists them).")] = None,
    inputs: Annotated[Optional[Path], typer.Option(
        help="An .npz with one array per input name (default: the bundle's reference inputs).")] = None,
    random_inputs: Annotated[bool, typer.Option(
        "--random-inputs", help="Time fresh random data of the guarded shapes and dtypes instead.")] = False,
    image: Annotated[Optional[Path], typer.Option(
        "--image", help="Time the whole pipeline on this image (.jpg, .png): its pre-processing as `edgedyn run` "
                        "does it (decode, resize, scale; --preprocess) is timed beside the bundle's call, which then "
                        "takes the image.")] = None,
    preprocess: Annotated[str, typer.Option(help="With --image: auto, imagenet, unit or none (see edgedyn run).")]
    = "auto",
    json_path: JsonOption = None,
    profile: Annotated[bool, typer.Option("--profile", help="Also time each operator (the executor's profiler) and "
                                                            "print where the time goes; in --json under 'ops'.")]
    = False,
    profile_runs: Annotated[int, typer.Option(help="Calls to profile with --profile (default: as many as were "
                                                   "timed, at most 1000).")] = 0,
    device: Annotated[str, typer.Option(help="auto: GPU artifact when this machine can run it, else CPU; or cpu, gpu.")]
    = "auto",
    emulate: Annotated[bool, typer.Option("--emulate", help="Run it on an emulated board of the bundle's kind "
                                          "(qemu-user): checks that it runs there; the timings mean nothing.")]
    = False,
    remote: RemoteOption = None,
    key: KeyOption = None,
    all_boards: AllBoardsOption = False,
) -> None:
    """Time a bundle's inference: latency percentiles, throughput, init time, peak memory, guard overhead."""
    from edgedyn.runtime.bench import BenchConfig, run_benchmark

    if json_path is not None and json_path != STDOUT:
        output_file(Path(json_path), "--json")  # refused before the benchmark runs, not after
    preprocessed = None
    if image is not None:
        if remote is not None or emulate:
            raise EdgedynError("--image times the pre-processing here; it cannot be combined with --remote or "
                               "--emulate", hint="copy the image to the board and run edgedyn bench --image there")
        preprocessed, inputs = _preprocessed(bundle, image, preprocess, specialization)
    options = dict(warmup=warmup, iterations=iterations, duration_s=duration, max_duration_s=max_duration,
                   threads=threads, specialization=specialization, inputs=str(inputs) if inputs is not None else None,
                   random_inputs=random_inputs, device=device, profile=profile,
                   profile_runs=profile_runs if profile else 0)
    config = BenchConfig(**options)  # checked here, before any board is asked for
    if remote is not None:
        if emulate:
            raise EdgedynError("--emulate and --remote each choose where the bundle runs: give one",
                               hint="--remote HOST:PORT --key KEY for a real board, --emulate for the emulated one")
        extra = {"inputs": inputs} if inputs is not None else None
        reports = remote_reports(remote, key, bundle, "bench", options, all_boards, extra_files=extra)
    elif emulate:
        from edgedyn.emulate import bench_emulated

        reports = [bench_emulated(bundle, config)]
    else:
        with _progress(bundle.name) as on_progress:
            reports = [run_benchmark(str(bundle), config, on_progress=on_progress)]
        if preprocessed is not None:
            reports[0].setdefault("pipeline", {})["preprocess"] = preprocessed
    for report in reports:
        err.print("using {}{}".format(report["selection"], " on " + report["remote"]["name"]
                                      if "remote" in report else ""))
        for warning in report["warnings"]:
            err.print("warning: {}".format(warning))
    if emit_json(reports[0] if len(reports) == 1 else reports, json_path):  # one per board with --remote --all
        return
    for report in reports:
        out.print(summary_table(report))
        if "ops" in report:
            label = report["emulation"]["timings"] if "emulation" in report else None
            for table in profile_tables(report["ops"], label):
                out.print(table)
            out.print(profile_footer(report["ops"], label))


def profile_tables(ops: Dict[str, Any], label: Optional[str] = None) -> List[Table]:
    """benchmark_model's three views: every operator by time, the top ones, and the sum per op type; each title
    carries `label` when the times were taken somewhere they mean nothing (under qemu)."""
    suffix = " ({})".format(label) if label else ""
    with_bytes = any(node["bytes"] is not None for node in ops["nodes"])
    per_run = "avg ms (of {} typical runs)".format(ops["typical_runs"])
    columns = ["op", "type", "count", per_run, "%", "cdf %"] + (["bytes touched"] if with_bytes else [])
    tables = []
    for title, nodes in (("Operators by time", ops["nodes"]), ("Top by computation time", ops["nodes"][:TOP_OPS])):
        table = _profile_table(title + suffix, columns)
        for node in nodes:
            table.add_row(*[node["name"], node["type"], "{:g}".format(node["count"])] + _numbers(node, with_bytes))
        tables.append(table)
    table = _profile_table("Summary by op type" + suffix, ["type", "count", per_run, "%", "cdf %"] +
                           (["bytes touched"] if with_bytes else []))
    for entry in ops["by_type"]:
        table.add_row(*[entry["type"], str(entry["count"])] + _numbers(entry, with_bytes))
    tables.append(table)
    return tables


def _profile_table(title: str, columns: List[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="left" if column in ("op", "type") else "right", overflow="fold")
    return table


def _numbers(row: Dict[str, Any], with_bytes: bool) -> List[str]:
    cells = ["{:.4f}".format(row["ms"]), "{:.1f}".format(row["percent"]), "{:.1f}".format(row["cumulative_percent"])]
    if with_bytes:
        cells.append(human_bytes(row["bytes"]) if row["bytes"] is not None else "-")
    return cells


def profile_footer(ops: Dict[str, Any], label: Optional[str] = None) -> str:
    """What the rows add up to, against the plain and the profiled latency, and what the profiler cannot see."""
    from edgedyn.runtime.profiling import UNATTRIBUTED

    lines = [
        "timed rows (operators, copies, guards) add up to {:.3f} ms per run: {:.0%} of the median latency {:.3f} "
        "ms, {:.0%} of plain calls timed between the profiled ones ({:.3f} ms), {:.0%} of the profiled runs' "
        "median {:.3f} ms ({})".format(ops["total_ms"], ops["total_of_median"], ops["median_latency_ms"],
                                       ops["total_of_interleaved"], ops["interleaved_median_ms"],
                                       ops["total_of_profiled"], ops["profiled_median_ms"], ops["source"]),
        "all rows (with {}) add up to {:.3f} ms, {:.0%} of the median latency; averaged over the {} typical of "
        "{} profiled runs (the middle fifth by time)".format(UNATTRIBUTED, ops["table_ms"],
                                                            ops["table_of_median"], ops["typical_runs"], ops["runs"])]
    for row in ops["nodes"]:
        if "what" in row:
            lines.append("{}: {}".format(row["name"], row["what"]))
    if "graph_ops" in ops:
        lines.append("operators in the graph: " + ", ".join(
            "{} x{}".format(name, count) for name, count in sorted(ops["graph_ops"].items())))
    for note in ([ops["note"]] if "note" in ops else []) + ops["notes"]:
        lines.append("note: " + note)
    if label:
        lines.append("note: these operator times were taken {}; profile on the board itself".format(label))
    return "\n".join(lines)


def summary_table(report: Dict[str, Any]) -> Table:
    """The performance summary a person reads."""
    from edgedyn.runtime.sysinfo import describe_clocks

    latency, env = report["latency_ms"], report["env"]
    table = Table(title="bench {} ({} on {}, specialization {})".format(
        report["model"], report["backend"], report["board"], report["specialization"]), show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("load + init", "{:.1f} ms".format(report["init_ms"])),
        ("first inference", "{:.2f} ms".format(report["first_inference_ms"])),
        ("iterations", "{} in {:.2f} s (after {} warm-up)".format(report["iterations"], report["duration_s"],
                                                                   report["warmup"])),
        ("latency min / mean / median", "{:.3f} / {:.3f} / {:.3f} ms".format(latency["min"], latency["mean"],
                                                                            latency["median"])),
        ("latency p90 / p95 / p99 / max", "{:.3f} / {:.3f} / {:.3f} / {:.3f} ms".format(
            latency["p90"], latency["p95"], latency["p99"], latency["max"])),
        ("latency std", "{:.3f} ms (CV {:.1%}{})".format(latency["std"], report["cv"],
                                                         ", high" if report["cv"] > 0.10 else "")),
        ("throughput", "{:.1f} inferences/s".format(report["throughput_per_s"])),
        ("guard check", "{:.1f} us per call".format(report["guard_overhead_us"])),
        ("peak RSS", "{:.1f} MB".format(report["peak_rss_mb"]) if report["peak_rss_mb"] is not None else "unknown"),
        ("allocated per call", "{} beyond the {} of outputs ({})".format(
            human_bytes(report["per_call_allocations"]["beyond_outputs_bytes"]),
            human_bytes(report["per_call_allocations"]["output_bytes"]), report["per_call_allocations"]["measured"])),
        ("inputs", "{}: {}".format(report["inputs"]["source"], _arrays(report["inputs"]["arrays"]))),
        ("threads", str(report["threads"] or "backend default")),
        ("board", "{} (bundle); this machine: {}, {}, {} cores".format(
            report["board"], " ".join(p for p in (env.get("board_model"), env["machine"]) if p),
            env.get("cpu_model") or "unknown CPU", env["cpu_cores"])),
        ("versions", ", ".join(["Python " + env["python"], "numpy " + env["numpy"]] + [
            "{} {}".format(name, version) for name, version in sorted(env.get("runtime_versions", {}).items())])),
        ("bundle sha256", report["bundle_sha256"]),
    ]
    rows += _pipeline_rows(report.get("pipeline"))
    rows += [("clocks", line) for line in describe_clocks(env)]
    if "emulation" in report:  # edgedyn.emulate: a timing under qemu says nothing about the board
        rows = [(name, value + " ({})".format(report["emulation"]["timings"]) if name in _TIMED_ROWS else value)
                for name, value in rows]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _pipeline_rows(pipeline: Optional[Dict[str, Any]]) -> List[Any]:
    """Where a detector's time goes: pre-processing (with --image), the call, the NMS inside it."""
    if not pipeline:
        return []
    rows = []
    pre = pipeline.get("preprocess")
    if pre is not None:
        rows.append(("pre-processing", "{:.3f} ms median ({} of {}, {} runs; before the bundle is called)".format(
            pre["median_ms"], pre["steps"], Path(pre["image"]).name, pre["runs"])))
    if "model_and_nms_ms" in pipeline:
        nms = pipeline.get("nms_ms")
        rows.append(("model + NMS", "{:.3f} ms median (the bundle's call)".format(pipeline["model_and_nms_ms"])))
        rows.append(("  of which NMS", "{:.3f} ms ({:.1%} of the profiled call; {})".format(
            nms, pipeline["nms_share"] or 0.0, pipeline["nms_source"]) if nms is not None else
            "not measured: {}".format(pipeline["why"])))
    if pre is not None and "model_and_nms_ms" in pipeline:
        rows.append(("pipeline", "{:.3f} ms: pre-processing {:.0%}, model + NMS {:.0%}".format(
            pre["median_ms"] + pipeline["model_and_nms_ms"],
            pre["median_ms"] / (pre["median_ms"] + pipeline["model_and_nms_ms"]),
            pipeline["model_and_nms_ms"] / (pre["median_ms"] + pipeline["model_and_nms_ms"]))))
    return rows


def _preprocessed(bundle: Path, image: Path, preprocess: str, specialization: Optional[str]) -> Any:
    """(the pre-processing's timing record, an .npz holding the image as the bundle's input): `edgedyn run`'s
    image reading, timed over PREPROCESS_RUNS runs."""
    import tempfile
    import time

    import numpy as np

    from edgedyn.cli.run import PREPROCESS, read_image
    from edgedyn.runtime.detections import groups
    from edgedyn.runtime.format import read_manifest

    if preprocess not in PREPROCESS:
        raise EdgedynError("unknown --preprocess '{}'; choose from: {}".format(preprocess, ", ".join(PREPROCESS)))
    if not image.is_file():
        raise EdgedynError("--image {}: no such file".format(image), hint="give a .jpg or .png")
    specs = read_manifest(bundle)["specializations"]
    spec = next((s for s in specs if specialization in (None, s["name"])), specs[0])
    tensors = [record for record in spec["inputs"] if len(record["shape"]) == 4 and record["shape"][1] in (1, 3)]
    if len(spec["inputs"]) != 1 or not tensors:
        raise EdgedynError("--image needs a bundle with one image input (Nx3xHxW); {} takes {}".format(
            bundle.name, ", ".join(r["name"] for r in spec["inputs"])), hint="time it with --inputs FILE.npz")
    detector = bool(groups([record["name"] for record in spec["outputs"]]))
    mode = ("unit" if detector else "imagenet") if preprocess == "auto" else preprocess
    shape = tuple(tensors[0]["shape"])
    times = []
    for _ in range(PREPROCESS_RUNS):
        started = time.perf_counter()
        array = read_image(image, shape, mode)
        times.append((time.perf_counter() - started) * 1000.0)
    folder = tempfile.mkdtemp(prefix="edgedyn-bench-")
    path = Path(folder) / "image.npz"
    np.savez(str(path), **{tensors[0]["name"]: array})
    record = {"image": str(image), "preprocess": mode, "runs": PREPROCESS_RUNS,
              "median_ms": float(np.median(times)), "steps": "decode, resize to {}x{}, {}".format(
                  shape[2], shape[3], {"unit": "scale to 0-1", "imagenet": "ImageNet normalization",
                                       "none": "0-255 floats"}[mode])}
    return record, path


PREPROCESS_RUNS = 20
_TIMED_ROWS = ("load + init", "first inference", "iterations", "latency min / mean / median",
               "latency p90 / p95 / p99 / max", "latency std", "throughput", "guard check")


def _arrays(arrays: Dict[str, Any]) -> str:
    return ", ".join("{} {}[{}]".format(name, a["dtype"], "x".join(str(d) for d in a["shape"])) if "shape" in a
                     else "{}={!r}".format(name, a["value"]) for name, a in arrays.items())


@contextlib.contextmanager
def _progress(title: str) -> Iterator[Callable[[str, int, float], None]]:
    """A live bar on a terminal; one plain line per phase elsewhere (logs, pipes, CI)."""
    if not err.is_terminal:
        seen = set()

        def plain(phase: str, done: int, elapsed: float) -> None:
            if phase not in seen:
                seen.add(phase)
                err.print("bench {}: {}".format(title, phase))
        yield plain
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("bench {}: {{task.description}}".format(title)),
                  TextColumn("{task.completed} runs"), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("loading", total=None)

        def live(phase: str, done: int, elapsed: float) -> None:
            bar.update(task, description=phase, completed=done)
        yield live
