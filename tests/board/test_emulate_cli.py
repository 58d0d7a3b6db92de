"""`edgedyn verify --emulate` and `edgedyn bench --emulate`: a bundle for an aarch64 board checked from this host.

Through the CLI as a user runs it: the board's rootfs and this checkout's wheel come from edgedyn.emulate's cache.
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Dict

import pytest

from conftest import EXAMPLES

from edgedyn.boards import list_boards

from .emulator import REPO, build_wheel

AARCH64_BOARDS = sorted(board.name for board in list_boards() if board.arch == "aarch64")
INPUT = "x=1x3x64x64"

# TinyCNN with one weight changed: its export verifies against itself, but not against TinyCNN's reference.
CHANGED_MODEL = '''
import torch
from tiny_cnn import TinyCNN


class ChangedCNN(TinyCNN):
    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.classifier.bias[3] += 0.5
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Exports a model through the CLI once per (model, board), with onnxruntime: what these tests check is the
    emulation around a bundle, not the choice of backend (the default export for another board counts every
    candidate on the emulated CPU; tests/board/test_onboard.py checks that and verifies its choice)."""
    folder = tmp_path_factory.mktemp("emulate")
    bundles = {}  # type: Dict[tuple, Path]

    def export(board: str, model: str = str(EXAMPLES / "tiny_cnn.py:TinyCNN")) -> Path:
        if (board, model) not in bundles:
            path = folder / "{}-{}.edgedyn".format(Path(model.split(":")[0]).stem, board)
            result = edgedyn_cli("export", model, "--board", board, "-i", INPUT, "--backend", "onnxruntime", "-o",
                                 str(path))
            assert result.returncode == 0, result.stderr
            bundles[board, model] = path
        return bundles[board, model]

    return export


def edgedyn_cli(*args: str, env: Dict[str, str] = None) -> "subprocess.CompletedProcess[str]":
    environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(REPO), env=environment,
                          capture_output=True, text=True, timeout=3600)


def test_every_aarch64_board_is_emulated():
    assert AARCH64_BOARDS == ["jetson-nano", "jetson-orin-nano", "jetson-xavier-nx", "raspberry-pi-4",
                              "raspberry-pi-5"]


@pytest.mark.parametrize("board", AARCH64_BOARDS)
def test_verify_emulate_passes_for_the_board(exported, board):
    from edgedyn.boards import load_board

    bundle = exported(board)
    result = edgedyn_cli("verify", str(bundle), "--emulate", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64", report
    # fp32 artifacts within the fp32 tolerance; a reduced-precision one (the default where the board's CPU has fp16
    # arithmetic and it met the float gate at export) at its recorded cosine gate
    assert report["results"] and all(r["ok"] and (r["max_rel"] < 1e-4 if r.get("cosine") is None else
                                                   r["cosine"] >= r["min_cosine"] >= 0.999)
                                     for r in report["results"]), report
    emulation = report["emulation"]
    assert (emulation["board"], emulation["qemu_cpu"]) == (board, load_board(board).qemu_cpu)
    assert (emulation["debian_suite"], emulation["python"]) == ("bookworm", "3.11")
    assert "ran on an emulated {}: Debian bookworm arm64".format(board) in result.stderr
    assert "verified 1 output(s) of 1 specialization(s) on aarch64" in result.stderr


def test_verify_emulate_prints_the_verify_table(exported):
    result = edgedyn_cli("verify", str(exported("raspberry-pi-4")), "--emulate")
    assert result.returncode == 0, result.stderr
    assert "max rel err" in result.stdout and "ok" in result.stdout and "MISMATCH" not in result.stdout
    assert "ran on an emulated raspberry-pi-4" in result.stderr


def test_a_numerically_wrong_bundle_fails_on_the_emulated_board(exported, tmp_path):
    from edgedyn.bundle import BundleWriter
    from edgedyn.runtime.format import MANIFEST_NAME

    right = exported("raspberry-pi-4")
    (tmp_path / "changed.py").write_text("import sys\nsys.path.insert(0, {!r})\n".format(str(EXAMPLES)) + CHANGED_MODEL)
    changed = exported("raspberry-pi-4", str(tmp_path / "changed.py:ChangedCNN"))
    # The changed model's artifacts with TinyCNN's reference inputs and outputs, written by the bundle writer
    # (so every checksum holds: only the numbers are wrong).
    with zipfile.ZipFile(changed) as archive:
        manifest = json.loads(archive.read(MANIFEST_NAME))
        members = {name: archive.read(name) for name in manifest["members"]}
    with zipfile.ZipFile(right) as archive:
        reference = manifest["specializations"][0]["reference"]
        members[reference] = archive.read(reference)
    writer = BundleWriter()
    for name, data in members.items():
        assert writer.add(name, data) == name
    planted = writer.write(tmp_path / "planted.edgedyn", manifest)

    result = edgedyn_cli("verify", str(planted), "--emulate")
    assert result.returncode == 1, result.stderr
    assert "MISMATCH" in result.stdout and "output_0" in result.stdout and "max abs err" in result.stdout
    assert "error: 1 of 1 outputs differ from torch eager beyond tolerance" in result.stderr
    assert "ran on an emulated raspberry-pi-4" in result.stderr

    report = json.loads(edgedyn_cli("verify", str(planted), "--emulate", "--json").stdout)
    (output,) = report["results"]
    assert not report["ok"] and not output["ok"] and output["max_abs"] >= 0.4, report


def test_bench_emulate_labels_every_timing(exported, tmp_path):
    bundle = exported("raspberry-pi-5")
    result = edgedyn_cli("bench", str(bundle), "--emulate", "--iterations", "3", "--warmup", "1", "--duration", "0",
                         "--json", str(tmp_path / "bench.json"))
    assert result.returncode == 0, result.stderr
    timed = ["load + init", "first inference", "iterations", "latency min / mean / median",
             "latency p90 / p95 / p99 / max", "latency std", "throughput", "guard check"]
    for row in timed:
        (line,) = [line for line in result.stdout.splitlines() if row + " " in line]
        assert "(under qemu emulation: meaningless)" in line, line
    assert "Cortex-A76" in result.stdout or "aarch64" in result.stdout
    assert "warning: timed on an emulated raspberry-pi-5 under qemu-user" in result.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["env"]["machine"] == "aarch64" and report["iterations"] >= 3
    assert report["emulation"]["timings"] == "under qemu emulation: meaningless"
    assert {"latency_ms", "init_ms", "throughput_per_s"} <= set(report["emulation"]["timing_fields"])
    assert report["emulation"]["qemu_cpu"] == "cortex-a76"


def test_bench_emulate_profile_comes_back_labelled(exported, tmp_path):
    bundle = exported("raspberry-pi-4")
    result = edgedyn_cli("bench", str(bundle), "--emulate", "--iterations", "3", "--warmup", "1", "--duration", "0",
                         "--profile", "--json", str(tmp_path / "bench.json"))
    assert result.returncode == 0, result.stderr
    for title in ("Operators by time", "Top by computation time", "Summary by op type"):
        assert "{} (under qemu emulation: meaningless)".format(title) in result.stdout
    assert "note: these operator times were taken under qemu emulation: meaningless" in result.stdout
    report = json.loads((tmp_path / "bench.json").read_text())
    ops = report["ops"]
    assert ops["runs"] == report["iterations"] >= 3 and "ops" in report["emulation"]["timing_fields"]
    assert report["env"]["machine"] == "aarch64" and ops["nodes"] and ops["total_ms"] > 0
    assert "(edgedyn guards)" in [node["name"] for node in ops["nodes"]]


def test_missing_host_tools_name_the_packages(exported):
    bundle = exported("raspberry-pi-4")
    result = edgedyn_cli("verify", str(bundle), "--emulate", env={"PATH": str(Path(sys.executable).parent)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: the emulated board needs qemu-aarch64-static, mmdebstrap, not found on PATH" in result.stderr
    assert "hint: sudo apt-get install qemu-user-static mmdebstrap debian-archive-keyring uidmap" in result.stderr


def test_an_x86_bundle_is_not_emulated(exported):
    result = edgedyn_cli("verify", str(exported("x86-64")), "--emulate")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: board 'x86-64' (x86_64) has no emulated form" in result.stderr
    assert "hint: an x86_64 bundle runs here as is: drop --emulate" in result.stderr


def test_an_installed_wheel_is_packed_again_for_the_board(tmp_path):
    """Without a source checkout, the wheel for the board is made from the installed distribution's own files."""
    wheel = build_wheel(REPO, tmp_path / "wheel")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp_path / "site"),
                    str(wheel)], check=True, capture_output=True)
    code = ("import sys; from pathlib import Path; import edgedyn.emulate.wheels as w\n"
            "print(w.source_checkout(), w.host_wheel(Path(sys.argv[1])), w.PACKAGE)")
    (tmp_path / "out").mkdir()
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], cwd=str(tmp_path), text=True,
                            capture_output=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert result.returncode == 0, result.stderr
    checkout, repacked, package = result.stdout.split()
    assert (checkout, package) == ("None", str(tmp_path / "site" / "edgedyn"))
    with zipfile.ZipFile(wheel) as original, zipfile.ZipFile(repacked) as again:
        record = "edgedyn-0.1.0.dist-info/RECORD"
        assert sorted(again.namelist()) == sorted(original.namelist())
        assert all(again.read(n) == original.read(n) for n in original.namelist() if n != record)
        assert sorted(again.read(record).splitlines()) == sorted(original.read(record).splitlines())
