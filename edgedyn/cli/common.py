"""What the commands share: a stderr console for everything but data, and a progress display."""
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from rich.console import Console

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
