"""Wires the commands together and turns user errors into `error:` / `hint:` lines."""
import os
import sys
from typing import List, Optional

import typer

from edgedyn.cli import boards
from edgedyn.cli.bench import bench_command
from edgedyn.cli.export import export_command
from edgedyn.cli.inspect import inspect_command
from edgedyn.cli.serve import serve_command
from edgedyn.cli.tracker import tracker_command
from edgedyn.cli.tune import tune_command
from edgedyn.cli.verify import verify_command

app = typer.Typer(
    name="edgedyn",
    help="Take a PyTorch model to an embedded board: export, verify, inspect, bench.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("export")(export_command)
app.command("verify")(verify_command)
app.command("inspect")(inspect_command)
app.command("bench")(bench_command)
app.add_typer(boards.app, name="boards")
app.command("serve")(serve_command)
app.command("tracker")(tracker_command)
app.command("tune")(tune_command)

# Commands that run on the board (or only talk RPC): they never compile, so TVM may load its runtime library alone.
# Not `serve`: MetaSchedule's RPCRunner calls tvm.contrib.random.random_fill_for_measure there, which only the full
# TVM library registers.
DEVICE_COMMANDS = ("verify", "inspect", "bench", "boards", "tracker")


def _report(error: BaseException) -> None:
    message = getattr(error, "message", str(error))
    hint = getattr(error, "hint", None)
    sys.stderr.write("error: {}\n".format(message))
    if hint:
        sys.stderr.write("hint: {}\n".format(hint))


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the `edgedyn` script."""
    from edgedyn.runtime.errors import EdgedynError

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in DEVICE_COMMANDS and "tvm" not in sys.modules:
        # Note: see edgedyn/runtime/executors/tvm.py; only a process that never compiles may set this.
        os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    try:
        app(args=args, prog_name="edgedyn")  # usage errors exit 2 from click itself
    except EdgedynError as error:
        if os.environ.get("EDGEDYN_DEBUG"):
            raise
        _report(error)
        sys.exit(getattr(error, "exit_code", 2))

if __name__ == "__main__":
    main()
