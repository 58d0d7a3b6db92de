"""A fleet with an emulated Raspberry Pi in it: a tracker on loopback, `edgedyn serve` on this machine (key `x86`)
and on the Pi (key `pi4`, the board's Python under qemu-user, which shares this machine's network), and verify,
bench and run sent to each key, compared with the same command run on that board directly."""
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import numpy as np
import pytest

from conftest import RTOL, torch_model
from test_fleet import LOOPBACK, Fleet  # tests/test_fleet.py: the tracker and its served boards

from .emulator import installed_checkout, run_edgedyn

pytestmark = pytest.mark.requires("tvm", "tornado", "cloudpickle", "psutil")  # the tracker's

PI_CPU = "cortex-a72"
KEYS = ("x86", "pi4")
BOARDS = {"x86": "x86-64", "pi4": "raspberry-pi-4"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, pi_rootfs: Path) -> Iterator[Fleet]:
    from edgedyn.emulate.rootfs import board_command, board_environment

    work = tmp_path_factory.mktemp("fleet")
    site = installed_checkout(pi_rootfs)
    fleet = Fleet(work)
    try:
        fleet.wait(lambda: fleet.summary() is not None, "the tracker")
        fleet.serve("x86-board", "x86")
        # The board's bundle cache in this test's folder: a host path, so runs never write into the shared rootfs.
        env = board_environment(pi_rootfs, {"EDGEDYN_CACHE": str(work / "pi-cache")}, [site])
        # From the install folder, so that `-m` finds the installed wheel rather than a source tree.
        fleet.serve("pi4-board", "pi4", board_command(pi_rootfs, ["-m", "edgedyn"], cpu=PI_CPU), env, site.parent,
                    seconds=300)
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def bundles(export_example: Callable[..., Path]) -> Dict[str, Path]:
    return {key: export_example("tiny_cnn", board=board, backend="tvm") for key, board in BOARDS.items()}


def _local(key: str, pi_rootfs: Path, *args: str) -> Any:
    """`edgedyn ARGS` run directly on the board of `key`: here for x86, under qemu on the Pi."""
    return _python(key, pi_rootfs, "-m", "edgedyn", *args)


def _python(key: str, pi_rootfs: Path, *argv: str) -> Any:
    """The board's Python with `argv`: this one for x86 (as a user runs it), the Pi's under qemu."""
    import subprocess

    if key == "pi4":
        return run_edgedyn(pi_rootfs, list(argv), cpu=PI_CPU)
    environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
    return subprocess.run([sys.executable, *argv], env=environment, capture_output=True, text=True, timeout=600)


def _json(result: Any) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_fleet_lists_both_keys(fleet: Fleet) -> None:
    keys = fleet.summary()
    assert {key: keys[key]["total"] for key in KEYS} == {"x86": 1, "pi4": 1}


@pytest.mark.parametrize("key", KEYS)
def test_remote_verify_equals_verify_on_the_board(fleet: Fleet, bundles: Dict[str, Path], pi_rootfs: Path,
                                                  run_cli, key: str) -> None:
    local = _json(_local(key, pi_rootfs, "verify", "--json", str(bundles[key])))
    remote = _json(run_cli("verify", str(bundles[key]), "--json", "--remote", fleet.address, "--key", key))
    assert remote["ok"] and local["ok"] and remote["arch"] == local["arch"]
    assert remote["arch"] == ("aarch64" if key == "pi4" else "x86_64")
    assert remote["remote"]["env"]["emulated_by"] == ("qemu-aarch64-st" if key == "pi4" else None)
    pairs = [(r["specialization"], r["output"], r["artifact"]) for r in remote["results"]]
    assert pairs == [(r["specialization"], r["output"], r["artifact"]) for r in local["results"]]
    for got, want in zip(remote["results"], local["results"]):
        assert got["max_rel"] < RTOL and abs(got["max_abs"] - want["max_abs"]) <= RTOL * max(want["max_abs"], 1e-6)


@pytest.mark.parametrize("key", KEYS)
def test_remote_bench_reports_like_a_bench_on_the_board(fleet: Fleet, bundles: Dict[str, Path], pi_rootfs: Path,
                                                         run_cli, key: str) -> None:
    from edgedyn.emulate import MEANINGLESS

    args = ("--iterations", "5", "--duration", "0.05", "--warmup", "1")
    local = _json(_local(key, pi_rootfs, "bench", str(bundles[key]), *args, "--json", "-"))
    remote = _json(run_cli("bench", str(bundles[key]), *args, "--json", "-", "--remote", fleet.address,
                           "--key", key))
    for field in ("model", "board", "backend", "specialization", "bundle_sha256", "inputs", "selection"):
        assert remote[field] == local[field], field
    assert remote["env"]["machine"] == local["env"]["machine"] and remote["latency_ms"]["median"] > 0
    table = run_cli("bench", str(bundles[key]), *args, "--remote", fleet.address, "--key", key)
    assert table.returncode == 0, table.stderr
    if key == "pi4":  # timings under qemu say nothing about a Pi, and the report says so
        assert remote["emulation"]["timings"] == MEANINGLESS and remote["emulation"]["emulator"] == "qemu-aarch64-st"
        assert "({})".format(MEANINGLESS) in table.stdout
    else:
        assert "emulation" not in remote and MEANINGLESS not in table.stdout


@pytest.mark.parametrize("key", KEYS)
def test_remote_run_equals_a_run_on_the_board_and_torch(fleet: Fleet, bundles: Dict[str, Path], pi_rootfs: Path,
                                                        tmp_path: Path, key: str) -> None:
    import torch

    from edgedyn.fleet.client import run_remote

    x = np.random.default_rng().standard_normal((1, 3, 64, 64)).astype(np.float32)
    (got,) = run_remote((LOOPBACK, fleet.port), key, bundles[key], {"x": x})
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, edgedyn.runtime as rt\n"
            "np.save(sys.argv[3], rt.load(sys.argv[1])(np.load(sys.argv[2])))\n")
    done = _python(key, pi_rootfs, "-c", code, str(bundles[key]), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    assert done.returncode == 0, done.stderr
    on_board = np.load(tmp_path / "y.npy")
    with torch.no_grad():
        want = torch_model("tiny_cnn")(torch.from_numpy(x)).numpy()
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, on_board, rtol=RTOL, atol=RTOL * scale)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * scale)



def test_serve_on_a_board_without_tvms_wheel_says_what_to_do(bullseye_rootfs: Path) -> None:
    """The old board (Python 3.9, as the Jetsons' 3.8): `edgedyn serve` refuses with the path TVM offers there."""
    result = run_edgedyn(bullseye_rootfs, ["-m", "edgedyn", "serve", "--tracker", "127.0.0.1:9190", "--key", "nano"],
                         cpu="cortex-a57")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot run `edgedyn serve`" in result.stderr and "needs Python >= 3.10, this board runs 3.9" in result.stderr
    assert "tvm_rpc" in result.stderr and "hint: see docs/fleet.md" in result.stderr
