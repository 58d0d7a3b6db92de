"""The host side of the fleet: ask TVM's tracker for boards of a key, upload a bundle, run a device command there.

Everything travels over TVM's own RPC (tvm.rpc.connect_tracker, TrackerSession.request, RPCSession.upload and
remote global functions registered by `edgedyn serve`, see server.py); edgedyn adds no transport of its own.
"""
import io
import json
import socket
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.errors import EdgedynError, MissingDependencyError
from edgedyn.fleet.server import PREFIX

DEFAULT_TRACKER_PORT = 9190
# A run longer than this is ended by the board's RPC server (TVM's session timeout), so a hung board frees itself.
SESSION_TIMEOUT_S = 600
Say = Callable[[str], None]


class BoardLost(Exception):
    """The RPC session to a board failed: the board went away (crashed, powered off, network down)."""


def parse_address(text: str, default_port: int = DEFAULT_TRACKER_PORT) -> Tuple[str, int]:
    """`HOST:PORT` (or `HOST`) as a (host, port) pair; a clear error for anything else."""
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(default_port))
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EdgedynError("'{}' is not a tracker address".format(text),
                           hint="give HOST:PORT, for example --remote 127.0.0.1:{}".format(default_port))
    return host, int(port)


def _rpc() -> Any:
    try:
        from tvm import rpc
    except ImportError as error:
        raise MissingDependencyError("talking to boards needs TVM's RPC client ({})".format(error),
                                     hint="pip install 'edgedyn[tvm]'")
    return rpc


def connect(address: Tuple[str, int]) -> Any:
    """A session with the tracker, or an error naming the address when nothing answers there."""
    rpc = _rpc()
    try:
        # TVM's connect_tracker retries for 60 s, logging each try; a wrong address should fail at once.
        socket.create_connection(address, timeout=5).close()
        return rpc.connect_tracker(*address)
    except (OSError, RuntimeError) as error:
        raise EdgedynError("no RPC tracker answers at {}:{} ({})".format(address[0], address[1], error),
                           hint="start one with `edgedyn tracker --port {}`, or check the address".format(address[1]))


def fleet_summary(address: Tuple[str, int]) -> Dict[str, Any]:
    """The tracker's view: {key: {"total", "free", "pending", "servers": ["host:port", ...]}}."""
    summary = connect(address).summary()
    keys = {}  # type: Dict[str, Dict[str, Any]]
    for server in summary.get("server_info", []):
        key = server["key"].split(":", 1)[-1]  # "server:pi5" -> "pi5"
        entry = keys.setdefault(key, {"total": 0, "free": 0, "pending": 0, "servers": []})
        entry["total"] += 1
        entry["servers"].append(":".join(str(part) for part in server["addr"]))
    for key, queue in summary.get("queue_info", {}).items():
        entry = keys.setdefault(key, {"total": 0, "free": 0, "pending": 0, "servers": []})
        entry["free"], entry["pending"] = queue["free"], queue["pending"]
    return keys


def _require_key(address: Tuple[str, int], key: str) -> Dict[str, Any]:
    keys = fleet_summary(address)
    if not keys.get(key, {}).get("total"):
        known = ", ".join("{} ({} boards)".format(k, v["total"]) for k, v in sorted(keys.items()) if v["total"])
        raise EdgedynError("no board with key '{}' is registered at the tracker {}:{}; it has: {}".format(
            key, address[0], address[1], known or "no boards"),
            hint="start `edgedyn serve --tracker {}:{} --key {}` on the board".format(address[0], address[1], key))
    return keys[key]


class Board:
    """One RPC session to a board of `key`, with the board's own environment."""

    def __init__(self, session: Any, key: str) -> None:
        self.session = session
        self.key = key
        self.env = self.call("environment", json.dumps({}))
        self.name = "{} ({})".format(self.env.get("hostname") or "board", key)

    def call(self, command: str, *args: Any) -> Any:
        """Calls a device command registered by `edgedyn serve`; its answer, or its user error raised here."""
        try:
            answer = self.session.get_function(PREFIX + command)(*args)
        except Exception as error:  # the RPC layer failed: the board is gone, not our data
            raise BoardLost(str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__)
        if isinstance(answer, (bytes, bytearray)) and answer[:2] == b"PK":
            return bytes(answer)
        data = json.loads(bytes(answer).decode() if isinstance(answer, (bytes, bytearray)) else str(answer))
        if "error" in data:
            error = data["error"]
            raise EdgedynError("on board {}: {}".format(getattr(self, "name", self.key), error["message"]),
                               hint=error.get("hint") or error.get("traceback"))
        return data["ok"]

    def close(self) -> None:
        """Ends the session (TVM closes an RPC session when its last reference goes), freeing the board."""
        self.session = None

    def upload(self, path: Path, name: str) -> str:
        try:
            self.session.upload(str(path), target=name)
        except Exception as error:
            raise BoardLost("upload of {} failed: {}".format(path.name, error))
        return name


def _request(tracker: Any, key: str) -> Board:
    try:
        return Board(tracker.request(key, session_timeout=SESSION_TIMEOUT_S, max_retry=2), key)
    except BoardLost:
        raise
    except RuntimeError as error:
        raise BoardLost(str(error).strip().splitlines()[-1])


def run_command(address: Tuple[str, int], key: str, bundle: Path, command: str, options: Dict[str, Any],
                all_boards: bool = False, say: Optional[Say] = None,
                extra_files: Optional[Dict[str, Path]] = None) -> List[Dict[str, Any]]:
    """Runs `command` (verify, bench, inspect) on one board of `key`, or on every free one: a list of
    {"board": {...}, "report": {...}}. A board lost mid-run is reported and the run retried once on another."""
    say = say or (lambda message: None)
    queue = _require_key(address, key)
    tracker = connect(address)
    count = max(1, queue["free"]) if all_boards else 1
    boards = [_request(tracker, key) for _ in range(count)]  # held together, so each is a different board
    results = []
    for board in boards:
        results.append(_run_with_retry(address, tracker, board, bundle, command, options, say, extra_files or {}))
    return results


def _run_with_retry(address: Tuple[str, int], tracker: Any, board: Board, bundle: Path, command: str,
                    options: Dict[str, Any], say: Say, extra_files: Dict[str, Path]) -> Dict[str, Any]:
    for attempt in (1, 2):
        try:
            say("{} on {}".format(command, board.name))
            names = {option: board.upload(path, path.name) for option, path in extra_files.items()}
            report = board.call(command, board.upload(bundle, bundle.name), json.dumps(dict(options, **names)))
            if command == "bench" and board.env.get("emulated_by"):
                from edgedyn.emulate import emulation_block

                report["emulation"] = emulation_block(report, {"board": board.name,
                                                               "emulator": board.env["emulated_by"]})
            return {"board": {"name": board.name, "key": board.key, "env": board.env, "attempt": attempt},
                    "report": report}
        except BoardLost as lost:
            if attempt == 2:
                raise EdgedynError("board {} went away during {} ({}), and so did the retry".format(
                    board.name, command, lost), hint="check the boards with `edgedyn boards --remote {}:{}`".format(
                        *address))
            say("warning: board {} went away during {} ({}); retrying once on another board of key '{}'".format(
                board.name, command, lost, board.key))
            board.close()
            _require_key(address, board.key)
            board = _request(tracker, board.key)
    raise AssertionError("unreachable")


def run_remote(address: Tuple[str, int], key: str, bundle: Path, inputs: Dict[str, np.ndarray],
               threads: Optional[int] = None) -> List[np.ndarray]:
    """Calls a bundle once on a board of `key` with these arguments; its outputs in the bundle's output order.
    The Python counterpart of a local `edgedyn.runtime.load(bundle)(**inputs)`."""
    _require_key(address, key)
    board = _request(connect(address), key)
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value) for name, value in inputs.items()})
    answer = board.call("run", board.upload(bundle, bundle.name), bytearray(buffer.getvalue()),
                        json.dumps({"threads": threads}))
    with np.load(io.BytesIO(answer), allow_pickle=False) as data:
        return [data["output.{}".format(i)] for i in range(len(data.files))]
