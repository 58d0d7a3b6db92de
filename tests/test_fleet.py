"""The fleet over TVM's RPC tracker, end to end on loopback: a tracker, `edgedyn serve` processes on this machine,
and verify / bench / run sent to them, compared with the same commands run here."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import pytest

from conftest import REPO, RTOL, torch_model

pytestmark = pytest.mark.requires("tvm", "tornado", "cloudpickle", "psutil")

LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class Fleet:
    """A tracker and the `edgedyn serve` processes registered with it; everything stops at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.address = "{}:{}".format(LOOPBACK, self.port)
        self.processes = {}  # type: Dict[str, subprocess.Popen]
        self._start("tracker", ["tracker", "--host", LOOPBACK, "--port", str(self.port)])

    def _start(self, name: str, args: List[str], edgedyn: Sequence[str] = (sys.executable, "-m", "edgedyn"),
               env: Optional[Dict[str, str]] = None, cwd: Path = REPO) -> None:
        log = (self.workdir / "{}.log".format(name)).open("w")
        # A session of its own: stopping it stops the sessions it forked too.
        self.processes[name] = subprocess.Popen([*edgedyn, *args], cwd=str(cwd), env=env,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def serve(self, name: str, key: str, edgedyn: Sequence[str] = (sys.executable, "-m", "edgedyn"),
              env: Optional[Dict[str, str]] = None, cwd: Path = REPO, seconds: float = 120) -> None:
        """`edgedyn serve` for `key`, started with the `edgedyn` command line given (this Python by default; the
        board tests give the emulated board's), once it has registered with the tracker."""
        before = self.summary().get(key, {}).get("total", 0)
        self._start(name, ["serve", "--tracker", self.address, "--key", key, "--host", LOOPBACK,
                           "--port", str(_free_port())], edgedyn, env, cwd)
        self.wait(lambda: self.summary().get(key, {}).get("free", 0) > before, "{} to register".format(name),
                  seconds)

    def summary(self) -> Dict[str, Any]:
        from edgedyn.fleet.client import fleet_summary

        return fleet_summary((LOOPBACK, self.port))

    def log(self, name: str) -> str:
        return (self.workdir / "{}.log".format(name)).read_text()

    def wait(self, condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except Exception:  # the tracker may not listen yet
                pass
            time.sleep(0.5)
        raise AssertionError("timed out waiting for {}; logs:\n{}".format(
            what, "\n".join(self.log(n)[-2000:] for n in self.processes)))

    def stop(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended, and so did everything it started
            pass
        process.wait()

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        fleet.wait(lambda: fleet.summary() is not None, "the tracker")
        fleet.serve("board-a", "x86")
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def bundle(export_example: Callable[..., Path]) -> Path:
    return export_example("tiny_cnn", backend="onnxruntime")


def _json(result: "subprocess.CompletedProcess[str]") -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_boards_remote_lists_the_fleet(fleet: Fleet, run_cli) -> None:
    keys = _json(run_cli("boards", "--remote", fleet.address, "--json"))
    assert keys["x86"]["total"] == 1 and keys["x86"]["free"] == 1 and keys["x86"]["pending"] == 0
    table = run_cli("boards", "--remote", fleet.address)
    assert table.returncode == 0 and "x86" in table.stdout and "pending" in table.stdout


def test_remote_verify_equals_a_local_run(fleet: Fleet, bundle: Path, run_cli) -> None:
    local = _json(run_cli("verify", str(bundle), "--json"))
    remote = _json(run_cli("verify", str(bundle), "--json", "--remote", fleet.address, "--key", "x86"))
    assert remote["ok"] and remote["arch"] == local["arch"]
    pairs = [(r["specialization"], r["output"], r["artifact"], r["max_abs"]) for r in remote["results"]]
    assert pairs == [(r["specialization"], r["output"], r["artifact"], r["max_abs"]) for r in local["results"]]
    board = remote["remote"]
    assert board["key"] == "x86" and board["env"]["python"] and board["env"]["cpu_cores"] >= 1
    assert {k: v for k, v in remote.items() if k != "remote"}.keys() == local.keys()
    table = run_cli("verify", str(bundle), "--remote", fleet.address, "--key", "x86")
    assert table.returncode == 0 and "max abs err" in table.stdout and "on " + board["name"] in table.stdout


def test_remote_bench_reports_like_a_local_run(fleet: Fleet, bundle: Path, run_cli) -> None:
    args = ("--iterations", "20", "--duration", "0.1", "--json", "-")
    local = _json(run_cli("bench", str(bundle), *args))
    remote = _json(run_cli("bench", str(bundle), *args, "--remote", fleet.address, "--key", "x86"))
    assert set(remote) == set(local) | {"remote"}
    for field in ("model", "board", "backend", "specialization", "bundle_sha256", "inputs"):
        assert remote[field] == local[field], field
    assert remote["iterations"] >= 20 and remote["latency_ms"]["median"] > 0
    assert remote["env"]["machine"] == local["env"]["machine"] and "onnxruntime" in remote["env"]["runtime_versions"]
    table = run_cli("bench", str(bundle), "--iterations", "5", "--duration", "0.05", "--remote", fleet.address,
                    "--key", "x86")
    assert table.returncode == 0 and "latency min / mean / median" in table.stdout and "board " in table.stdout


def test_remote_run_matches_torch(fleet: Fleet, bundle: Path) -> None:
    import torch

    from edgedyn.fleet.client import run_remote

    x = np.random.default_rng(7).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (got,) = run_remote((LOOPBACK, fleet.port), "x86", bundle, {"x": x})
    with torch.no_grad():
        want = torch_model("tiny_cnn")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def test_a_user_error_on_the_board_comes_back_with_its_hint(fleet: Fleet, bundle: Path, run_cli) -> None:
    result = run_cli("bench", str(bundle), "--specialization", "x=9x9", "--remote", fleet.address, "--key", "x86")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: on board" in result.stderr and "no specialization 'x=9x9'" in result.stderr
    result = run_cli("verify", str(bundle), "--device", "gpu", "--remote", fleet.address, "--key", "x86")
    assert result.returncode == 2 and "error: on board" in result.stderr and "hint: use --device auto" in result.stderr


@pytest.mark.parametrize("args, message", [
    (("--remote", "127.0.0.1:notaport", "--key", "x86"), "is not a tracker address"),
    (("--remote", "127.0.0.1:9"), "--remote needs --key"),
])
def test_bad_remote_options_are_user_errors(bundle: Path, run_cli, args, message) -> None:
    result = run_cli("verify", str(bundle), *args)
    assert result.returncode == 2 and "error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_key_and_absent_tracker_say_what_to_do(fleet: Fleet, bundle: Path, run_cli) -> None:
    result = run_cli("verify", str(bundle), "--remote", fleet.address, "--key", "pi5")
    assert result.returncode == 2 and "no board with key 'pi5'" in result.stderr and "x86 (1 boards)" in result.stderr
    assert "edgedyn serve --tracker" in result.stderr
    result = run_cli("verify", str(bundle), "--remote", "127.0.0.1:{}".format(_free_port()), "--key", "x86")
    assert result.returncode == 2 and "no RPC tracker answers" in result.stderr and "edgedyn tracker" in result.stderr


def test_all_boards_and_a_board_lost_mid_run_is_retried_once(fleet: Fleet, bundle: Path, run_cli) -> None:
    fleet.serve("board-b", "x86")
    both = _json(run_cli("verify", str(bundle), "--json", "--all", "--remote", fleet.address, "--key", "x86"))
    assert len(both) == 2 and all(report["ok"] for report in both)
    # A long bench; whichever board takes it is killed once it started, and the run moves to the other one.
    command = [sys.executable, "-m", "edgedyn", "bench", str(bundle), "--iterations", "100000000", "--duration", "3",
               "--max-duration", "3", "--json", "-", "--remote", fleet.address, "--key", "x86"]
    marks = {name: fleet.log(name).count("connected from") for name in ("board-a", "board-b")}
    run = subprocess.Popen(command, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        fleet.wait(lambda: any(fleet.log(n).count("connected from") > marks[n] for n in marks), "a board to start")
        taken = next(n for n in marks if fleet.log(n).count("connected from") > marks[n])
        time.sleep(1.0)
        fleet.stop(taken)
        stdout, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr
    assert "went away during bench" in stderr and "retrying once on another board of key 'x86'" in stderr
    report = json.loads(stdout)
    assert report["remote"]["attempt"] == 2 and report["iterations"] > 0


def test_the_board_side_imports_only_the_runtime(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import edgedyn.fleet.server as server\n"
            "server.register_functions()\n"
            "import tvm_ffi; assert tvm_ffi.get_global_func('edgedyn.fleet.environment')\n"
            "others = [m for m in sys.modules if m.startswith('edgedyn') and not m.startswith('edgedyn.runtime')]\n"
            "print(sorted(others))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['edgedyn', 'edgedyn.fleet', 'edgedyn.fleet.device', 'edgedyn.fleet.server', 'edgedyn.version']"


def test_boards_on_python_38_are_told_the_path_tvm_offers(run_cli) -> None:
    from edgedyn.fleet.server import tvm_wheel_note

    assert tvm_wheel_note("3.11") is None and tvm_wheel_note("3.10") is None
    assert "tvm_rpc" in tvm_wheel_note("3.8") and "3.8" in tvm_wheel_note("3.8")
    nano = run_cli("boards", "show", "jetson-nano")
    assert nano.returncode == 0 and "Python >= 3.10" in nano.stdout and "tvm_rpc" in nano.stdout
    pi = run_cli("boards", "show", "raspberry-pi-5")
    assert "edgedyn serve (TVM's Python RPC server)" in pi.stdout


def _blocking(tmp_path: Path, module: str) -> Dict[str, str]:
    """An environment in which `module` fails to import, as it does where it is not installed."""
    package = tmp_path / "blocked" / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError(\"No module named '{}'\")\n".format(module))
    return {"PYTHONPATH": os.pathsep.join([str(package.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


@pytest.mark.parametrize("module", ["tornado", "cloudpickle", "psutil"])
def test_the_tracker_names_what_it_misses_before_it_starts(tmp_path: Path, run_cli, module: str) -> None:
    # Without cloudpickle TVM's worker died after the command had started, and every board retried it.
    result = run_cli("tracker", "--host", LOOPBACK, "--port", str(_free_port()), env=_blocking(tmp_path, module))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "error: the tracker (TVM's) needs what is not installed here: {} (for".format(module) in result.stderr
    assert "hint: pip install 'edgedyn[fleet]'" in result.stderr


def test_serve_without_a_tracker_fails_at_once(run_cli) -> None:
    port = _free_port()
    began = time.monotonic()
    result = run_cli("serve", "--tracker", "{}:{}".format(LOOPBACK, port), "--key", "x86", "--host", LOOPBACK,
                     "--port", str(_free_port()))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "error: no RPC tracker answers at {}:{}".format(LOOPBACK, port) in result.stderr
    assert "edgedyn tracker --port {}".format(port) in result.stderr
    assert time.monotonic() - began < 50  # TVM's own loop retries for 60 s


def _tracker_and_worker(fleet: Fleet) -> Any:
    import psutil

    fleet.wait(lambda: fleet.summary() is not None, "the tracker")
    (worker,) = psutil.Process(fleet.processes["tracker"].pid).children()
    return fleet.processes["tracker"], worker


def test_a_tracker_whose_worker_dies_says_so(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    try:
        tracker, worker = _tracker_and_worker(fleet)
        worker.kill()
        assert tracker.wait(timeout=60) == 2
        assert "error: TVM's tracker process ended" in fleet.log("tracker")
    finally:
        fleet.close()


def test_stopping_the_tracker_stops_its_worker(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    try:
        tracker, worker = _tracker_and_worker(fleet)
        tracker.terminate()  # SIGTERM, as systemd or kill stop it
        assert tracker.wait(timeout=60) == 0, fleet.log("tracker")
        worker.wait(timeout=30)  # psutil raises TimeoutExpired if the worker outlives its command
    finally:
        fleet.close()
