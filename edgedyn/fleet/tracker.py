"""`edgedyn tracker`'s side: Apache TVM's RPC tracker, started in the worker process TVM runs it in, and stopped
with it.

TVM's `Tracker` serves from a `tvm.support.popen_pool` worker (`python -m tvm.exec.popen_worker`): the command
itself only waits. Both processes need what the worker protocol imports, and a worker that dies leaves boards
retrying their tracker, so everything is checked before it starts and a worker that ends is an error.
"""
import signal
from typing import Any, Dict

from edgedyn.errors import EdgedynError, require_modules

# What TVM's tracker imports only once it is running (module -> what for); `edgedyn[fleet]` installs them.
NEEDS = {
    "tornado": "its event loop",
    "cloudpickle": "the worker process TVM serves it from (tvm.support.popen_pool)",
    "psutil": "stopping that worker",
}  # type: Dict[str, str]


def start(host: str, port: int, port_end: int) -> Any:
    """TVM's tracker listening on the first free port of [port, port_end), in its worker process."""
    require_modules(NEEDS, "the tracker (TVM's)", "fleet")
    from tvm.rpc.tracker import Tracker

    try:
        return Tracker(host, port=port, port_end=port_end, silent=True)
    except ValueError as error:  # TVM's words for "every port in the range is taken"
        raise EdgedynError("the tracker cannot listen on {}: {}".format(host, error),
                           hint="choose another --port, or stop the tracker already running there")
    except ChildProcessError:
        raise EdgedynError("TVM's tracker process ended as it started; its own error is printed above",
                           hint="EDGEDYN_DEBUG=1 shows more; `python -m tvm.exec.popen_worker` must run here")


def wait(tracker: Any) -> None:
    """Serves until interrupted (Ctrl-C, or SIGTERM as systemd stops it), then stops the worker too; a worker that
    ends by itself is an error, since every board would be left retrying it."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        tracker.proc.join()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(tracker)
    if not interrupted:
        raise EdgedynError("TVM's tracker process ended; the boards registered with it retry it for a minute, "
                           "then stop", hint="its own error is printed above; start `edgedyn tracker` again")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(tracker: Any) -> None:
    try:
        tracker.terminate()
    except OSError:  # TVM stops it over 127.0.0.1, which a tracker on another address does not answer
        tracker.proc.kill()
