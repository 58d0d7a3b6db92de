"""`edgedyn tracker`: start Apache TVM's RPC tracker, which boards register with and hosts ask for boards."""
from typing import Any, Optional

import typer
from typing_extensions import Annotated

from edgedyn.cli.common import err
from edgedyn.errors import EdgedynError, MissingDependencyError


def tracker_command(
    port: Annotated[int, typer.Option(help="Port to listen on (the next free one up to --port-end is taken).")]
    = 9190,
    port_end: Annotated[Optional[int], typer.Option(help="Stop trying ports here (default: --port + 10).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; keep it on a private network (docs/fleet.md).")]
    = "0.0.0.0",
) -> None:
    """Run TVM's RPC tracker until interrupted: `edgedyn serve` on each board registers with it."""
    tracker = _start(host, port, port_end or port + 10)
    err.print("tracker listening on {}:{}".format(host, tracker.port))
    try:
        tracker.proc.join()
    except KeyboardInterrupt:
        tracker.terminate()


def _start(host: str, port: int, port_end: int) -> Any:
    try:
        from tvm.rpc.tracker import Tracker
    except ImportError as error:
        raise MissingDependencyError("the tracker is TVM's ({}), and its tracker needs tornado".format(error),
                                     hint="pip install 'edgedyn[fleet]'")
    try:
        return Tracker(host, port=port, port_end=port_end, silent=True)
    except ValueError as error:  # TVM's words for "every port in the range is taken"
        raise EdgedynError("the tracker cannot listen on {}: {}".format(host, error),
                           hint="choose another --port, or stop the tracker already running there")
