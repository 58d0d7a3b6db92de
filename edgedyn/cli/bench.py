"""`edgedyn bench`: on the board, time a bundle and print a performance summary like trtexec's."""
import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import (STDOUT, AllBoardsOption, JsonOption, KeyOption, RemoteOption, emit_json, err,
                                human_bytes, out, output_file, remote_reports)
from edgedyn.cli.bench_pipeline import pipeline_rows, time_preprocessing
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
    length: Annotated[Optional[int], typer.Option(help="Time random inputs of this length on the bucketed dims: "
                                                       "padded to the next bucket and sliced back.")] = None,
    buckets: Annotated[bool, typer.Option("--buckets", help="Time each bucket at a length between it and the one "
                                                            "below (padding and slicing included) and print one "
                                                            "row per bucket.")] = False,
    emulate: Annotated[bool, typer.Option("--emulate", help="Run it on an emulated board of the bundle's kind "
                                          "(qemu-user): checks that it runs there; the timings mean nothing.")]
    = False,
    instructions: Annotated[bool, typer.Option("--instructions", help="With --emulate: count the guest instructions "
                                               "per call of each specialization on the emulated board (qemu-user, "
                                               "one thread), a deterministic proxy for speed there; not a time.")]
    = False,
    cpu: Annotated[Optional[str], typer.Option(help="With --instructions: count under this qemu CPU model instead of "
                                                    "the board's (one a board file's [emulation] qemu_cpu names, "
                                                    "e.g. cortex-a72).")] = None,
    calls: Annotated[Optional[int], typer.Option(help="With --instructions: calls counted after one warm-up call "
                                                      "(default 10).")] = None,
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
        preprocessed, inputs = time_preprocessing(bundle, image, preprocess, specialization)
    options = dict(warmup=warmup, iterations=iterations, duration_s=duration, max_duration_s=max_duration,
                   threads=threads, specialization=specialization, inputs=str(inputs) if inputs is not None else None,
                   random_inputs=random_inputs, device=device, profile=profile,
                   profile_runs=profile_runs if profile else 0, length=length)
    config = BenchConfig(**options)  # checked here, before any board is asked for
    if instructions or cpu is not None or calls is not None:
        _check_instruction_options(instructions, emulate, remote, config, cpu, calls)
        _bench_instructions(bundle, config, cpu, calls, json_path)
        return
    if buckets:
        _bench_buckets(bundle, config, json_path, remote is not None or emulate)
        return
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


def _bench_instructions(bundle: Path, config: Any, cpu: Optional[str], calls: Optional[int],
                        json_path: Optional[str]) -> None:
    """`bench --emulate --instructions`: guest instructions per call of each specialization, as a table or JSON."""
    from edgedyn.emulate.instructions import count_bundle

    report = count_bundle(bundle, calls=10 if calls is None else calls, cpu=cpu, specialization=config.specialization,
                          inputs=Path(config.inputs) if config.inputs else None, random_inputs=config.random_inputs)
    if not emit_json(report, json_path):
        out.print(instructions_table(report))
        out.print(instructions_footer(report))


def _check_instruction_options(instructions: bool, emulate: bool, remote: Optional[str], config: Any,
                               cpu: Optional[str], calls: Optional[int]) -> None:
    """Refuse options that do not go with counting instructions, before anything is built."""
    if not instructions:
        given = "--cpu" if cpu is not None else "--calls"
        raise EdgedynError("{} applies to counting instructions".format(given),
                           hint="add --emulate --instructions, or drop {}".format(given))
    if not emulate or remote is not None:
        raise EdgedynError("--instructions counts on the emulated board: it needs --emulate{}".format(
            " instead of --remote" if remote is not None else ""),
            hint="edgedyn bench BUNDLE --emulate --instructions")
    if config.threads is not None and config.threads != 1:
        raise EdgedynError("--instructions counts on one thread (a pool's idle spinning would be counted as work); "
                           "got --threads {}".format(config.threads), hint="drop --threads")
    if config.profile:
        raise EdgedynError("--profile times operators; --instructions counts a whole call", hint="give one of them")


def instructions_table(report: Dict[str, Any]) -> Table:
    """Guest instructions per call, one row per specialization."""
    table = Table(title="guest instructions per call: {} on an emulated {} (qemu-user -cpu {}, 1 thread)".format(
        report["model"], report["board"], report["cpu"]), title_justify="left")
    for column in ("specialization", "runs", "per call", "process with 1 call", "calls counted", "wall s here"):
        table.add_column(column, justify="left" if column in ("specialization", "runs") else "right", overflow="fold")
    for count in report["counts"]:
        runs = count["selection"].split(": ", 1)[-1]
        table.add_row(count["specialization"], runs, "{:,.0f} ({:.2f} M)".format(count["per_call"],
                                                                              count["per_call"] / 1e6),
                      "{:,}".format(count["baseline"]), str(report["calls"]), "{:.1f}".format(count["wall_s"]))
    return table


def instructions_footer(report: Dict[str, Any]) -> str:
    """What the numbers are and are not, and how they were counted."""
    return "\n".join([
        "note: {}".format(report["label"]),
        "note: per call = {}; inputs: {}; same command, same count".format(
            report["method"], ", ".join(sorted({c["inputs"] for c in report["counts"]}))),
        "note: the guest sees a {} (/proc/cpuinfo part {}, features: {})".format(
            report["cpu"], report["cpuinfo"]["cpu_part"], report["cpuinfo"]["features"])])


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
        ("dispatch", "{:.1f} us per call, {:.2%} of the median (guards, routing{})".format(
            report["dispatch_us"], report["dispatch_share"],
            ", padding and slicing back" if "length" in report["inputs"]["source"] else "")),
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
    rows += pipeline_rows(report.get("pipeline"))
    rows += [("clocks", line) for line in describe_clocks(env)]
    if "emulation" in report:  # edgedyn.emulate: a timing under qemu says nothing about the board
        rows = [(name, value + " ({})".format(report["emulation"]["timings"]) if name in _TIMED_ROWS else value)
                for name, value in rows]
    for name, value in rows:
        table.add_row(name, value)
    return table


_TIMED_ROWS = ("load + init", "first inference", "iterations", "latency min / mean / median",
               "latency p90 / p95 / p99 / max", "latency std", "throughput", "guard check", "dispatch")


def _bench_buckets(bundle: Path, config: Any, json_path: Optional[str], elsewhere: bool) -> None:
    """`--buckets`: one benchmark per bucket, a row each (runtime/bench_buckets.py)."""
    from edgedyn.runtime.bench_buckets import run_bucket_benchmarks

    if elsewhere:
        raise EdgedynError("--buckets runs here only", hint="on an emulated or remote board, time one bucket at a "
                                                            "time with --length N")
    if config.length is not None or config.specialization is not None or config.inputs is not None:
        raise EdgedynError("--buckets chooses each bucket's length and inputs itself",
                           hint="leave --length, --specialization and --inputs out")
    with _progress(bundle.name) as on_progress:
        report = run_bucket_benchmarks(str(bundle), config, on_progress=on_progress)
    if emit_json(report, json_path):
        return
    table = Table(title="bench {} buckets ({} on {})".format(report["model"], report["backend"], report["board"]))
    for column in ("bucket", "length", "median ms", "p90 ms", "dispatch us", "dispatch %"):
        table.add_column(column, justify="right")
    for row in report["buckets"]:
        table.add_row(str(row["bucket"]["size"]), str(row["bucket"]["length"]),
                      "{:.3f}".format(row["latency_ms"]["median"]), "{:.3f}".format(row["latency_ms"]["p90"]),
                      "{:.1f}".format(row["dispatch_us"]), "{:.2%}".format(row["dispatch_share"]))
    out.print(table)
    out.print("dispatch: guards, routing, padding the bucketed inputs and slicing the outputs back, per call "
              "(the median of repeated calls; latency includes it)")


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
