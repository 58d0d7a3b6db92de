"""What the commands share: a stderr console for everything but data, and a progress display."""
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import typer
from rich.console import Console
from typing_extensions import Annotated

# Data goes to stdout; progress, warnings and errors to stderr (so `edgedyn inspect --json > x.json` stays clean).
# Markup is off: model names and shapes like [1x3] are printed as given. Off a terminal, tables get room to breathe.
def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False, markup=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, markup=False, width=160)
    return console


out = _console(stderr=False)
err = _console(stderr=True)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """Yields a callback that shows the current step: a live spinner on a terminal, plain lines elsewhere."""
    if not err.is_terminal:
        yield lambda message: err.print("{}: {}".format(title, message))
        return
    with err.status(title) as status:
        def update(message: str) -> None:
            status.update("{}: {}".format(title, message))
            err.log(message)
        yield update


def human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return "{:.0f} {}".format(size, unit) if unit == "B" else "{:.1f} {}".format(size, unit)
        size /= 1024.0
    return "{:.1f} GiB".format(size)


# Note: the options that send a device command to boards over TVM's RPC tracker (docs/fleet.md); verify and bench
# take the same three.
RemoteOption = Annotated[Optional[str], typer.Option(
    "--remote", help="Run on a board of --key from this RPC tracker (HOST:PORT) instead of on this machine.")]
KeyOption = Annotated[Optional[str], typer.Option(
    "--key", help="With --remote: the kind of board, as its `edgedyn serve --key` registered it.")]
AllBoardsOption = Annotated[bool, typer.Option(
    "--all", help="With --remote: run on every free board of --key, one report each.")]


def remote_reports(remote: str, key: Optional[str], bundle: Path, command: str, options: Dict[str, Any],
                   all_boards: bool, extra_files: Optional[Dict[str, Path]] = None) -> List[Dict[str, Any]]:
    """Each board's report in the local report's shape, plus a `remote` block: the board's name, key and its own
    environment."""
    from edgedyn.errors import EdgedynError
    from edgedyn.fleet.client import parse_address, run_command

    if not key:
        raise EdgedynError("--remote needs --key: which kind of board to run on",
                           hint="`edgedyn boards --remote {}` lists the keys".format(remote))
    if not bundle.is_file():
        raise EdgedynError("no bundle at {}".format(bundle), hint="give the path of an .edgedyn file")
    results = run_command(parse_address(remote), key, bundle, command, options, all_boards,
                          say=lambda message: err.print(message), extra_files=extra_files)
    return [dict(result["report"], remote=result["board"], bundle=str(bundle)) for result in results]
