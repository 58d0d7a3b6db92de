"""`edgedyn serve`'s side: a TVM RPC server that registers with a tracker and offers edgedyn's device commands.

Each command is a global function in the server process (`edgedyn.fleet.verify`, ...) that a client calls through
its RPC session after uploading a bundle into the session's work folder. Arguments and results are JSON text (and
.npz bytes for `run`); a user error on the board comes back as {"error": {...}} so the host can print it with its
hint, while an RPC failure means the board itself went away.

Board side: standard library, numpy, edgedyn.runtime and TVM's RPC only (never torch), Python 3.8 syntax.
"""
import errno
import json
import multiprocessing
import socket
import struct
import sys
import traceback
from typing import Any, Callable, Dict, Optional, Tuple

from edgedyn.fleet import device
from edgedyn.runtime.errors import EdgedynError, MissingDependencyError

PREFIX = "edgedyn.fleet."
# Note: TVM 0.27's Python wheel (its RPC server included) needs this Python; boards below it (the Jetson Nano and
# Xavier NX run 3.8) use TVM's C++ `tvm_rpc` server instead: docs/fleet.md. `edgedyn boards show` reads it too.
TVM_WHEEL_PYTHON = (3, 10)


def tvm_wheel_note(python: str) -> Optional[str]:
    """Why a board with this Python cannot run `edgedyn serve`, or None when it can."""
    parts = tuple(int(p) for p in python.split(".")[:2])
    if parts >= TVM_WHEEL_PYTHON:
        return None
    return ("apache-tvm 0.27's Python wheel (and so `edgedyn serve`) needs Python >= {}.{}, this board runs {}; "
            "build TVM's C++ RPC server `tvm_rpc` on the board to use it for remote TVM runs and MetaSchedule tuning "
            "(docs/fleet.md), and run `edgedyn verify`/`bench` on the board itself".format(
                TVM_WHEEL_PYTHON[0], TVM_WHEEL_PYTHON[1], python))


def _work_path(name: str) -> str:
    """The path of an uploaded file inside this RPC session's work folder (what `session.upload` wrote)."""
    import tvm_ffi

    return str(tvm_ffi.get_global_func("tvm.rpc.server.workpath")(name))


def _answer(call: Callable[[], Any]) -> str:
    try:
        return json.dumps({"ok": call()}, default=str)
    except Exception as error:
        return _failure(error)


def _failure(error: Exception) -> str:
    if isinstance(error, EdgedynError):
        return json.dumps({"error": {"type": type(error).__name__, "message": error.message, "hint": error.hint}})
    # A bug, reported with its traceback rather than mistaken for a board that went away.
    return json.dumps({"error": {"type": type(error).__name__, "message": str(error), "hint": None,
                                 "traceback": traceback.format_exc()}})


def verify(bundle: str, options: str) -> str:
    opts = json.loads(options)
    return _answer(lambda: device.verify_report(_work_path(bundle), opts.get("threads"), opts.get("device", "auto")))


def bench(bundle: str, options: str) -> str:
    opts = json.loads(options)
    if opts.get("inputs"):
        opts["inputs"] = _work_path(opts["inputs"])
    return _answer(lambda: device.bench_report(_work_path(bundle), opts))


def inspect(bundle: str, options: str) -> str:
    return _answer(lambda: device.inspect_report(_work_path(bundle)))


def environment(options: str) -> str:
    return _answer(device.board_environment)


def run(bundle: str, inputs_npz: bytes, options: str) -> bytes:
    """Outputs as .npz bytes; a failure as the JSON error text, told apart by the zip magic."""
    opts = json.loads(options)
    try:
        return device.run_arrays(_work_path(bundle), bytes(inputs_npz), opts.get("threads"))
    except Exception as error:
        return _failure(error).encode()


FUNCTIONS = {"verify": verify, "bench": bench, "inspect": inspect, "environment": environment, "run": run}


def register_functions() -> None:
    """Registers the device commands as TVM global functions; runs in the RPC server's process before it serves."""
    import tvm_ffi

    for name, function in FUNCTIONS.items():
        tvm_ffi.register_global_func(PREFIX + name, function, override=True)


def import_rpc() -> Any:
    """TVM's RPC module, or the error a board without TVM's Python wheel needs to read."""
    note = tvm_wheel_note("{}.{}".format(*sys.version_info[:2]))
    if note is not None:
        raise MissingDependencyError("this machine cannot run `edgedyn serve`: " + note,
                                     hint="see docs/fleet.md, 'Boards on Python 3.8'")
    try:
        from tvm import rpc
    except ImportError as error:
        raise MissingDependencyError("`edgedyn serve` needs TVM's RPC server ({})".format(error),
                                     hint="pip install 'edgedyn[tvm]'")
    return rpc


class Served:
    """TVM's RPC server loop run in this process, on a socket bound to `port`, registered with the tracker."""

    def __init__(self, sock: socket.socket, port: int, tracker: Tuple[str, int], key: str) -> None:
        self.sock, self.port, self.tracker, self.key = sock, port, tracker, key

    def run(self) -> None:
        """Serves sessions until interrupted: TVM's listen loop (tracker registration, key matching, a forked
        process per session with its session timeout)."""
        from tvm.rpc import server as rpc_server

        try:
            rpc_server._listen_loop(self.sock, self.port, self.key, self.tracker, None, None)
        except RuntimeError as error:  # TVM's words once the tracker stopped answering for a minute
            raise EdgedynError("lost the tracker {}:{}: {}".format(self.tracker[0], self.tracker[1], error),
                               hint="start `edgedyn tracker` there again; under systemd, Restart=always starts this "
                                    "server again too (docs/fleet.md)")
        finally:
            self.sock.close()


def check_tracker(tracker: Tuple[str, int]) -> None:
    """Fails at once unless a TVM RPC tracker answers at `tracker` (TVM's own loop would retry for a minute, then
    stop with a traceback)."""
    from tvm.rpc import base

    where = "{}:{}".format(*tracker)
    try:
        with socket.create_connection(tracker, timeout=5) as sock:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            answer = base.recvall(sock, 4)
    except OSError as error:
        raise EdgedynError("no RPC tracker answers at {} ({})".format(where, error),
                           hint="start one there with `edgedyn tracker --port {}`, or check --tracker".format(
                               tracker[1]))
    if struct.unpack("<i", answer)[0] != base.RPC_TRACKER_MAGIC:
        raise EdgedynError("{} answers, but not as a TVM RPC tracker".format(where),
                           hint="give the address `edgedyn tracker` printed with --tracker")


def serve(tracker: Tuple[str, int], key: str, host: str, port: int, port_end: int) -> Served:
    """Binds the first free port of [port, port_end) and registers edgedyn's device commands; `run()` serves.

    Not `tvm.rpc.Server`: that starts its loop in a new Python process (exec), which a board emulated under
    qemu-user cannot do (only fork), and which needs cloudpickle; the loop itself is the same."""
    import_rpc()
    check_tracker(tracker)
    # Sessions are forks of this process, which holds the registered functions (and a fork is all qemu-user
    # can start); Python 3.14 makes forkserver the default.
    multiprocessing.set_start_method("fork", force=True)
    register_functions()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for candidate in range(port, port_end):
        try:
            sock.bind((host, candidate))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                continue
            sock.close()
            raise EdgedynError("`edgedyn serve` cannot listen on {}:{}: {}".format(host, candidate, error),
                               hint="give an address of this machine with --host (0.0.0.0 for all)")
        sock.listen(1)
        return Served(sock, candidate, tracker, key)
    sock.close()
    raise EdgedynError("`edgedyn serve` cannot listen on {}: every port in [{}, {}) is taken".format(
        host, port, port_end), hint="choose another --port, or stop the server already running there")
