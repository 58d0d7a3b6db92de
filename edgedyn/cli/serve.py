"""`edgedyn serve`: on a board, a TVM RPC server registered with a tracker that runs edgedyn's device commands."""
from typing import Optional

import typer
from typing_extensions import Annotated

from edgedyn.cli.common import err


def serve_command(
    tracker: Annotated[str, typer.Option(help="The tracker's HOST:PORT (see `edgedyn tracker`).")],
    key: Annotated[str, typer.Option(help="The kind of board, shared by boards that are alike: pi5, orin-nano, ...")],
    host: Annotated[str, typer.Option(help="Address to listen on; keep it on a private network (docs/fleet.md).")]
    = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on (the next free one up to --port-end is taken).")]
    = 9090,
    port_end: Annotated[Optional[int], typer.Option(help="Stop trying ports here (default: --port + 10).")] = None,
) -> None:
    """Serve verify, bench, run and inspect of uploaded bundles (and MetaSchedule measurements) until interrupted."""
    from edgedyn.fleet.client import parse_address
    from edgedyn.fleet.server import serve

    address = parse_address(tracker)
    server = serve(address, key, host, port, port_end or port + 10)
    err.print("serving key '{}' on {}:{}, registered with the tracker {}:{}".format(
        key, host, server.port, address[0], address[1]))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
