"""Cross-compiled TVM bundles run on the emulated Raspberry Pi: the proof that the aarch64 artifacts are right."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLE_MODELS, REPO

from .emulator import run_edgedyn

pytestmark = pytest.mark.requires("tvm")


def board_cli(rootfs: Path, *args: str, cpu: str = "cortex-a72"):
    return run_edgedyn(rootfs, ["-m", "edgedyn", *args], cpu=cpu)


@pytest.mark.parametrize("example", sorted(EXAMPLE_MODELS))
def test_example_verifies_on_the_pi4(pi_rootfs, export_example, example):
    bundle = export_example(example, board="raspberry-pi-4")
    result = board_cli(pi_rootfs, "verify", "--json", str(bundle))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64"
    assert report["results"] and all(r["max_rel"] < 1e-4 for r in report["results"])


def test_pi5_bundle_verifies_on_a_cortex_a76(pi_rootfs, export_example):
    bundle = export_example("tiny_cnn", board="raspberry-pi-5")
    result = board_cli(pi_rootfs, "verify", str(bundle), cpu="cortex-a76")
    assert result.returncode == 0, result.stderr
    assert "verified 1 output(s) of 1 specialization(s) on aarch64" in result.stderr


def test_runtime_api_on_the_board_matches_the_host_reference(pi_rootfs, export_example, tmp_path):
    """The Python API on the board, on fresh random inputs: results equal torch eager computed on the host."""
    import torch

    from edgedyn.frontend.loading import load_reference

    bundle = export_example("mlp", board="raspberry-pi-4")
    x = np.random.default_rng().standard_normal((8, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1]); np.save(sys.argv[3], m(np.load(sys.argv[2])))\n"
            "import sys as s; print(sorted(k for k in s.modules if k.split('.')[0] in ('torch', 'onnx') "
            "or k.startswith('tvm.relax')))")
    result = run_edgedyn(pi_rootfs, ["-c", code, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                         env={"TVM_USE_RUNTIME_LIB": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    model, _, _ = load_reference(str(REPO / "examples" / "mlp.py:MLP"))
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_x86_bundle_is_refused_on_the_board(pi_rootfs, export_example):
    result = board_cli(pi_rootfs, "verify", str(export_example("tiny_cnn", board="x86-64")))
    assert result.returncode == 2
    assert "was built for x86_64 (board x86-64), but this machine is aarch64" in result.stderr
    assert "Traceback" not in result.stderr


def test_guard_error_wording_on_the_board(pi_rootfs, export_example):
    code = ("import sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1])\n"
            "try:\n    m(np.ones((2, 3, 64, 64), np.float32))\nexcept rt.GuardError as e:\n    print(e)\n")
    result = run_edgedyn(pi_rootfs, ["-c", code, str(export_example("tiny_cnn", board="raspberry-pi-4"))])
    assert result.returncode == 0, result.stderr
    assert "x=1x3x64x64: input 'x' dim 0: expected 1, got 2" in result.stdout
