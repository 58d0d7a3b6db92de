"""What the commands share: a stderr console for everything but data, and a progress display."""
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup
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


# Note: `--json [PATH]` means the same on every reporting command: alone (or `--json -`), the JSON report on
# stdout instead of the table; with a path, the table as usual and the report written to PATH. Click has no
# option with an optional value that Typer passes on, and a bare `--json` followed by the bundle would swallow it
# as PATH: so the command group rewrites the arguments first (JsonArgsGroup), reading `--json X` as a path only
# when X ends in .json (`--json=PATH` for any other name).
STDOUT = "-"
JsonOption = Annotated[Optional[str], typer.Option(
    "--json", metavar="[PATH]",
    help="The report as JSON: on stdout instead of the table, or into PATH (a name ending in .json, or "
         "--json=PATH) beside the table.")]


def json_args(args: List[str]) -> List[str]:
    """`--json` not followed by a .json path (or '-') becomes `--json=-`, so it never eats the next argument."""
    fixed = []
    for index, arg in enumerate(args):
        following = args[index + 1] if index + 1 < len(args) else None
        if arg == "--json" and (following is None or not (following == STDOUT or following.endswith(".json"))):
            arg = "--json=" + STDOUT
        fixed.append(arg)
    return fixed


def check_braces_kept(args: List[str]) -> None:
    """`--input x=1x{16,32}` unquoted reaches us as `--input x=1x16 x=1x32` (bash and zsh expand braces): say so
    rather than let the parser call the second word an unexpected argument."""
    from edgedyn.errors import EdgedynError

    for index, arg in enumerate(args[:-2]):
        name = args[index + 1].split("=")[0]
        following = args[index + 2]
        if arg in ("--input", "-i") and "=" in following and following.split("=")[0] == name:
            raise EdgedynError("unexpected argument {}: the shell expanded the braces of a bucketed --input into "
                               "separate words".format(following),
                               hint="quote the option so edgedyn sees the braces: --input '{}=1x{{16,32,64}}:int64'"
                                    "".format(name))


class JsonArgsGroup(TyperGroup):
    """The top-level command group: applies json_args() before Click parses anything."""

    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:  # ctx: Typer's own (vendored) Click context
        check_braces_kept(args)
        return super().parse_args(ctx, json_args(args))


def emit_json(value: Any, path: Optional[str]) -> bool:
    """Writes the report where --json said; True when it went to stdout (then the table must not)."""
    if path is None:
        return False
    if path == STDOUT:
        print_json(value)
        return True
    output_file(Path(path), "--json")
    Path(path).write_text(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    err.print("wrote {}".format(path))
    return False


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """Yields a callback that shows the current step with the seconds since the start: a line per step (under a
    live spinner on a terminal). Plain prints, not Console.log, which would end every line in this file's name."""
    started = time.monotonic()

    def line(message: str) -> str:
        return "{}: {} ({:.1f} s)".format(title, message, time.monotonic() - started)

    if not err.is_terminal:
        yield lambda message: err.print(line(message))
        return
    with err.status(title) as status:
        def update(message: str) -> None:
            status.update("{}: {}".format(title, message))
            err.print(line(message))
        yield update


def output_file(path: Path, option: str) -> Path:
    """A file path the command will write, refused before any work when it cannot be: a folder, or a path under
    something that is not a folder."""
    from edgedyn.runtime.errors import EdgedynError

    if path.is_dir():
        raise EdgedynError("{} {} is a folder, not a file".format(option, path),
                           hint="give a file name, e.g. {} {}".format(option, path / "out{}".format(path.suffix)))
    blocker = _non_folder_parent(path)
    if blocker is not None:
        raise EdgedynError("{} {}: {} is not a folder".format(option, path, blocker),
                           hint="write to a path whose parent is a folder, or remove {}".format(blocker))
    return path


def output_folder(path: Path, option: str) -> Path:
    """A folder the command will write into (created when missing), refused when a file is in the way."""
    from edgedyn.runtime.errors import EdgedynError

    blocker = path if path.exists() and not path.is_dir() else _non_folder_parent(path)
    if blocker is not None:
        raise EdgedynError("{} {}: {} is not a folder".format(option, path, blocker),
                           hint="give a folder (it is created when missing), e.g. {} {}".format(option, path.parent))
    return path


def _non_folder_parent(path: Path) -> Optional[Path]:
    """The nearest existing ancestor of `path` when it is not a folder (a file in the way), else None."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


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
