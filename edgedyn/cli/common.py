"""What the commands share: a stderr console for everything but data, and a progress display."""
import contextlib
import json
import sys
from typing import Any, Callable, Iterator

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


def human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return "{:.0f} {}".format(size, unit) if unit == "B" else "{:.1f} {}".format(size, unit)
        size /= 1024.0
    return "{:.1f} GiB".format(size)
