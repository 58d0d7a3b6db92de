"""`edgedyn tune` and the tuning database: records written by MetaSchedule are used by the next TVM export, whose
manifest names the database; the tuned build still equals torch eager."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import RTOL


pytestmark = pytest.mark.requires("tvm", "xgboost", "psutil", "cloudpickle")

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


def test_a_tuned_build_that_disagrees_is_built_again_without_the_records(tuned, tmp_path: Path, monkeypatch):
    """A wrong tuned build (planted: the build that took the records gets its weights negated, as a wrong record
    computes something else) must not ship, and must not cost the export: it is made again without the records,
    with a warning and the reason in the manifest."""
    import io

    import torch

    import edgedyn
    import edgedyn.runtime as rt
    from edgedyn.backends import tvm as tvm_backend
    from edgedyn.runtime.format import pack_arrays
    from edgedyn.selection import TuningRejectedWarning

    work, root, record, _ = tuned
    real = tvm_backend.lower

    def wrong_when_tuned(build):
        artifact = real(build)
        if artifact.meta.get("tuning", {}).get("tuned_functions"):
            with np.load(io.BytesIO(artifact.files["weights"]), allow_pickle=False) as weights:
                artifact.files["weights"] = pack_arrays({name: -weights[name] for name in weights.files})
        return artifact

    monkeypatch.setenv("EDGEDYN_TUNING_DIR", str(root))
    monkeypatch.setattr(tvm_backend, "lower", wrong_when_tuned)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())  # the tuned kernel's workload
    with pytest.warns(TuningRejectedWarning, match="disagreed with torch eager"):
        path = edgedyn.export(model, (torch.randn(4, 32),), board="x86-64", backend="tvm",
                              output=tmp_path / "t.edgedyn")
    tuning = rt.load(path).specializations[0].artifact["tuning"]
    assert tuning["tuned_functions"] == 0 and tuning["sha256"] == record["sha256"]
    assert "with 1 tuned kernels disagreed" in tuning["rejected"] and "built without the records" in tuning["rejected"]
    x = np.random.default_rng(12).standard_normal((4, 32)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(rt.load(path)(x), want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


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
