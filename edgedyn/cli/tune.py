"""`edgedyn tune`: MetaSchedule tuning of a model's TVM kernels for a board, into the target's tuning database."""
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional

import typer
from typing_extensions import Annotated

from edgedyn.cli.common import JsonOption, emit_json, err

if TYPE_CHECKING:
    from edgedyn.fleet.tuning import Progress as TuneProgress


def tune_command(
    model: Annotated[str, typer.Argument(help="The model as path/to/model.py:Name, as for `edgedyn export`.")],
    board: Annotated[str, typer.Option("--board", "-b", help="Board name (see `edgedyn boards`) or a board TOML.")],
    trials: Annotated[int, typer.Option(help="Measured candidates per specialization (MetaSchedule's "
                                             "max_trials_global); a few hundred for real use.")] = 64,
    per_task: Annotated[Optional[int], typer.Option(
        "--per-task", help="At most this many trials per kernel (default: --trials).")] = None,
    input_: Annotated[Optional[List[str]], typer.Option(
        "--input", "-i", help="Example inputs as for `edgedyn export` (default: the model's example_inputs()).")]
    = None,
    remote: Annotated[Optional[str], typer.Option(
        "--remote", help="Measure on boards of --key from this RPC tracker (HOST:PORT) instead of here.")] = None,
    key: Annotated[Optional[str], typer.Option("--key", help="With --remote: the boards' key.")] = None,
    database: Annotated[Optional[Path], typer.Option(
        "--database", help="Folder holding one database per target (default: $EDGEDYN_TUNING_DIR or "
                           "~/.cache/edgedyn/tuning).")] = None,
    json_: JsonOption = None,
) -> None:
    """Tune MODEL's kernels for BOARD's CPU; `edgedyn export --backend tvm` (and auto) then build with the records."""
    from edgedyn.boards import load_board
    from edgedyn.errors import EdgedynError
    from edgedyn.fleet.client import parse_address
    from edgedyn.backends.tuning_records import database_dir, record_count
    from edgedyn.fleet.tuning import Remote, tune_model

    if remote is not None and not key:
        raise EdgedynError("--remote needs --key: which kind of board to measure on",
                           hint="`edgedyn boards --remote {}` lists the keys".format(remote))
    boards = Remote(parse_address(remote), key) if remote is not None and key else None
    with _progress() as on_progress:
        try:
            record = tune_model(model, load_board(board), input_ or None, trials, per_task, boards, database,
                                on_progress)
        except KeyboardInterrupt:
            folder = database_dir(load_board(board).target("cpu").name, database)
            err.print("interrupted: {} has {} records (MetaSchedule commits a kernel's measured batch when it "
                      "collects the results)".format(folder, record_count(folder)))
            raise typer.Exit(130)
    err.print("tuning database {}: {} records, sha256 {}".format(
        record["database"], record["records"], record.get("sha256", "-")[:16]))
    emit_json(record, json_)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[..., None]]:
    """Trials, best GFLOPS and elapsed time: a live bar on a terminal, a line per batch elsewhere."""
    if not err.is_terminal:
        def plain(progress: "TuneProgress") -> None:
            err.print("tune {}: {}/{} trials over {} kernels, best {:.3g} GFLOPS, {:.0f} s".format(
                progress.specialization, progress.trials, progress.total, progress.tasks, progress.best_gflops,
                progress.elapsed_s))
        yield plain
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("tune {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("best {task.fields[gflops]:.3g} GFLOPS"), TimeElapsedColumn(), console=err) as bar:
        task = bar.add_task("", total=None, gflops=0.0)

        def live(progress: "TuneProgress") -> None:
            bar.update(task, description=progress.specialization, completed=progress.trials, total=progress.total,
                       gflops=progress.best_gflops)
        yield live
