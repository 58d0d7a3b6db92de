"""Wires the commands together and turns user errors into `error:` / `hint:` lines."""
import os
import sys
from typing import Any, List, Optional

import typer
from typing_extensions import Annotated

from edgedyn.cli import boards
from edgedyn.cli.bench import bench_command
from edgedyn.cli.common import JsonArgsGroup
from edgedyn.cli.export import export_command
from edgedyn.cli.inspect import inspect_command
from edgedyn.cli.keygen import keygen_command
from edgedyn.cli.run import run_command
from edgedyn.cli.serve import serve_command
from edgedyn.cli.tracker import tracker_command
from edgedyn.cli.tune import tune_command
from edgedyn.cli.verify import verify_command
from edgedyn.version import __version__

app = typer.Typer(
    name="edgedyn",
    help="Take a PyTorch model to an embedded board: export, verify, run, inspect, bench.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=JsonArgsGroup,
)
app.command("export")(export_command)
app.command("verify")(verify_command)
app.command("run")(run_command)
app.command("inspect")(inspect_command)
app.command("bench")(bench_command)
app.command("keygen")(keygen_command)
app.add_typer(boards.app, name="boards")
app.command("serve")(serve_command)
app.command("tracker")(tracker_command)
app.command("tune")(tune_command)

# Commands that run on the board (or only talk RPC): they never compile, so TVM may load its runtime library alone.
# Not `serve`: MetaSchedule's RPCRunner calls tvm.contrib.random.random_fill_for_measure there, which only the full
# TVM library registers.
DEVICE_COMMANDS = ("verify", "run", "inspect", "bench", "boards", "tracker")


def _print_version(value: bool) -> None:
    if value:
        typer.echo("edgedyn {}".format(__version__))
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", "-V", callback=_print_version, is_eager=True,
                                                   help="Print the edgedyn version and exit.")] = False) -> None:
    """Take a PyTorch model to an embedded board: export, verify, run, inspect, bench."""


def _report(error: BaseException) -> None:
    message = getattr(error, "message", str(error))
    hint = getattr(error, "hint", None)
    sys.stderr.write("error: {}\n".format(message))
    if hint:
        sys.stderr.write("hint: {}\n".format(hint))


def _show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                  line: Optional[str] = None) -> None:
    """Warnings from the library (GPU fallback, tuning records left out) as a person reads them: `warning: ...`,
    not Python's file:line and source."""
    sys.stderr.write("warning: {}\n".format(message))


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the `edgedyn` script."""
    import warnings

    from edgedyn.runtime import guards
    from edgedyn.runtime.errors import EdgedynError

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in DEVICE_COMMANDS and "tvm" not in sys.modules:
        # Note: see edgedyn/runtime/executors/tvm.py; only a process that never compiles may set this.
        os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    style, guards.hint_style = guards.hint_style, "cli"  # a person at the command line: hints in --input syntax
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        app(args=args, prog_name="edgedyn")  # usage errors exit 2 from click itself
    except EdgedynError as error:
        if os.environ.get("EDGEDYN_DEBUG"):
            raise
        _report(error)
        sys.exit(getattr(error, "exit_code", 2))
    finally:
        guards.hint_style = style  # main() called in-process (tests) leaves Python callers their hints
        warnings.showwarning = shown

if __name__ == "__main__":
    main()
