"""`edgedyn tracker`: start Apache TVM's RPC tracker, which boards register with and hosts ask for boards."""
from typing import Optional

import typer
from typing_extensions import Annotated

from edgedyn.cli.common import err


def tracker_command(
    port: Annotated[int, typer.Option(help="Port to listen on (the next free one up to --port-end is taken).")]
    = 9190,
    port_end: Annotated[Optional[int], typer.Option(help="Stop trying ports here (default: --port + 10).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; keep it on a private network (docs/fleet.md).")]
    = "0.0.0.0",
) -> None:
    """Run TVM's RPC tracker until interrupted: `edgedyn serve` on each board registers with it."""
    from edgedyn.fleet import tracker as fleet_tracker

    tracker = fleet_tracker.start(host, port, port_end or port + 10)
    err.print("tracker listening on {}:{}".format(host, tracker.port))
    fleet_tracker.wait(tracker)
