"""Wires the commands together and turns user errors into `error:` / `hint:` lines."""
import os
import sys
from typing import List, Optional

import typer

from edgedyn.cli import boards

app = typer.Typer(
    name="edgedyn",
    help="Take a PyTorch model to an embedded board: export, verify, inspect, bench.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(boards.app, name="boards")


def _report(error: BaseException) -> None:
    message = getattr(error, "message", str(error))
    hint = getattr(error, "hint", None)
    sys.stderr.write("error: {}\n".format(message))
    if hint:
        sys.stderr.write("hint: {}\n".format(hint))


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the `edgedyn` script."""
    from edgedyn.runtime.errors import EdgedynError

    try:
        app(args=argv, standalone_mode=False)
    except EdgedynError as error:
        if os.environ.get("EDGEDYN_DEBUG"):
            raise
        _report(error)
        sys.exit(getattr(error, "exit_code", 2))
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as error:  # click's usage errors carry their own exit code (2)
        import click

        if isinstance(error, click.exceptions.ClickException):
            error.show()
            sys.exit(error.exit_code)
        if isinstance(error, click.exceptions.Abort):
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
