"""`edgedyn bench`: on the board, time a bundle and print a performance summary like trtexec's."""
import contextlib
import json
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import AllBoardsOption, KeyOption, RemoteOption, err, human_bytes, out, remote_reports


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
    json_path: Annotated[Optional[Path], typer.Option(
        "--json", help="Also write the full report as JSON to this file ('-' for stdout, without the table).")] = None,
    device: Annotated[str, typer.Option(help="auto: GPU artifact when this machine can run it, else CPU; or cpu, gpu.")]
    = "auto",
    remote: RemoteOption = None,
    key: KeyOption = None,
    all_boards: AllBoardsOption = False,
) -> None:
    """Time a bundle's inference: latency percentiles, throughput, init time, peak memory, guard overhead."""
    from edgedyn.runtime.bench import BenchConfig, run_benchmark

    options = dict(warmup=warmup, iterations=iterations, duration_s=duration, max_duration_s=max_duration,
                   threads=threads, specialization=specialization, inputs=str(inputs) if inputs is not None else None,
                   random_inputs=random_inputs, device=device)
    config = BenchConfig(**options)  # checked here before any board is asked for
    if remote is not None:
        extra = {"inputs": inputs} if inputs is not None else None
        _show(remote_reports(remote, key, bundle, "bench", options, all_boards, extra_files=extra), json_path)
        return
    with _progress(bundle.name) as on_progress:
        report = run_benchmark(str(bundle), config, on_progress=on_progress)
    _show([report], json_path)


def _show(reports: List[Dict[str, Any]], json_path: Optional[Path]) -> None:
    """The summary of each report (one per board with --remote --all); the JSON is one report, or a list of them."""
    for report in reports:
        err.print("using {}{}".format(report["selection"], " on " + report["remote"]["name"]
                                      if "remote" in report else ""))
        for warning in report["warnings"]:
            err.print("warning: {}".format(warning))
    data = json.dumps(reports[0] if len(reports) == 1 else reports, indent=2, sort_keys=True) + "\n"
    if json_path is not None and str(json_path) == "-":
        out.file.write(data)
        return
    for report in reports:
        out.print(summary_table(report))
    if json_path is not None:
        json_path.write_text(data)
        err.print("wrote {}".format(json_path))


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
        ("board", "{} (bundle); {}: {}, {}, {} cores".format(
            report["board"], "board " + report["remote"]["name"] if "remote" in report else "this machine", " ".join(p for p in (env.get("board_model"), env["machine"]) if p),
            env.get("cpu_model") or "unknown CPU", env["cpu_cores"])),
        ("versions", ", ".join(["Python " + env["python"], "numpy " + env["numpy"]] + [
            "{} {}".format(name, version) for name, version in sorted(env.get("runtime_versions", {}).items())])),
        ("bundle sha256", report["bundle_sha256"]),
    ]
    rows += [("clocks", line) for line in describe_clocks(env)]
    for name, value in rows:
        table.add_row(name, value)
    return table


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
