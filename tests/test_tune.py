"""`edgedyn tune` and the tuning database: records written by MetaSchedule are used by the next TVM export, whose
manifest names the database; the tuned build still equals torch eager."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import RTOL


pytestmark = pytest.mark.requires("tvm", "xgboost", "psutil")

# One kernel (matmul + bias + relu): MetaSchedule has a single task, so a handful of trials tunes it.
TINY = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.linear = nn.Linear(32, 16)

    def forward(self, x):
        return torch.relu(self.linear(x))
'''
TRIALS = "4"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, run_cli_module):
    """A database tuned for the tiny model on this machine (x86-64), and the model file."""
    work = tmp_path_factory.mktemp("tune")
    (work / "tiny.py").write_text(TINY)
    root = work / "tuning"
    result = run_cli_module("tune", str(work / "tiny.py") + ":Tiny", "--board", "x86-64", "--trials", TRIALS,
                            "-i", "x=4x32", "--database", str(root), "--json")
    assert result.returncode == 0, result.stderr
    return work, root, json.loads(result.stdout), result.stderr


@pytest.fixture(scope="module")
def run_cli_module():
    import subprocess
    import sys

    from conftest import REPO

    def run(*args: str, env=None) -> "subprocess.CompletedProcess[str]":
        environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
        environment.update(env or {})
        return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(REPO), env=environment,
                              capture_output=True, text=True, timeout=600)
    return run


def test_tune_writes_records_and_reports_progress(tuned) -> None:
    _, root, record, stderr = tuned
    assert record["target"] == "x86-64-v2" and record["records"] >= 1 and len(record["sha256"]) == 64
    assert Path(record["database"]) == root / "x86-64-v2"
    assert (root / "x86-64-v2" / "database_tuning_record.json").is_file()
    assert "trials over 1 kernels, best" in stderr and "GFLOPS" in stderr


def test_export_after_tuning_builds_with_the_records(tuned, run_cli_module, tmp_path: Path) -> None:
    import torch

    import edgedyn.runtime as rt

    work, root, record, _ = tuned
    out = tmp_path / "tuned.edgedyn"
    result = run_cli_module("export", str(work / "tiny.py") + ":Tiny", "--board", "x86-64", "--backend", "tvm",
                            "-i", "x=4x32", "-o", str(out), env={"EDGEDYN_TUNING_DIR": str(root)})
    assert result.returncode == 0, result.stderr
    program = rt.load(out)
    tuning = program.specializations[0].artifact["tuning"]
    assert tuning["sha256"] == record["sha256"] and tuning["database"] == record["database"]
    assert tuning["tuned_functions"] >= 1  # the kernel took its tuned schedule
    x = np.random.default_rng(11).standard_normal((4, 32)).astype(np.float32)
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("tiny_model", str(work / "tiny.py"))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.no_grad():
        want = module.Tiny()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def test_export_without_records_says_nothing_about_tuning(tuned, run_cli_module, tmp_path: Path) -> None:
    work, _, _, _ = tuned
    out = tmp_path / "untuned.edgedyn"
    result = run_cli_module("export", str(work / "tiny.py") + ":Tiny", "--board", "x86-64", "--backend", "tvm",
                            "-i", "x=4x32", "-o", str(out), env={"EDGEDYN_TUNING_DIR": str(tmp_path / "empty")})
    assert result.returncode == 0, result.stderr
    import edgedyn.runtime as rt

    assert "tuning" not in rt.load(out).specializations[0].artifact


@pytest.mark.parametrize("args, message, hint", [
    (("--board", "raspberry-pi-5"), "tuning measures kernels on the board itself", "--remote HOST:PORT --key KEY"),
    (("--board", "x86-64", "--trials", "0"), "--trials must be at least 1", "16 is a smoke test"),
    (("--board", "x86-64", "--remote", "127.0.0.1:9190"), "--remote needs --key", "edgedyn boards --remote"),
])
def test_tune_user_errors(run_cli_module, args, message, hint) -> None:
    result = run_cli_module("tune", "examples/tiny_cnn.py:TinyCNN", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr and hint in result.stderr


@pytest.mark.requires("tornado")  # the tracker's
def test_tune_through_the_tracker_measures_on_the_served_board(run_cli_module, tmp_path: Path) -> None:
    """`tune --remote`: MetaSchedule's RPCRunner measures on an `edgedyn serve` board of the key (here, on
    loopback); the records land in the database, and the export after it names that database and uses them."""
    import edgedyn.runtime as rt
    from test_fleet import Fleet

    (tmp_path / "tiny.py").write_text(TINY)
    root = tmp_path / "tuning"
    fleet = Fleet(tmp_path)
    try:
        fleet.wait(lambda: fleet.summary() is not None, "the tracker")
        fleet.serve("board", "x86")
        sessions = fleet.log("board").count("connected from")
        result = run_cli_module("tune", str(tmp_path / "tiny.py") + ":Tiny", "--board", "x86-64", "--trials", "2",
                                "-i", "x=4x32", "--database", str(root), "--json", "--remote", fleet.address,
                                "--key", "x86")
        assert result.returncode == 0, result.stderr
        assert fleet.log("board").count("connected from") > sessions  # the candidates ran on the served board
    finally:
        fleet.close()
    record = json.loads(result.stdout)
    assert record["records"] >= 1 and Path(record["database"]) == root / "x86-64-v2"
    out = tmp_path / "tuned.edgedyn"
    done = run_cli_module("export", str(tmp_path / "tiny.py") + ":Tiny", "--board", "x86-64", "--backend", "tvm",
                          "-i", "x=4x32", "-o", str(out), env={"EDGEDYN_TUNING_DIR": str(root)})
    assert done.returncode == 0, done.stderr
    tuning = rt.load(out).specializations[0].artifact["tuning"]
    assert tuning["sha256"] == record["sha256"] and tuning["tuned_functions"] >= 1
