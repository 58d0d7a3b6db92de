"""Bundles of the CPU backends run on the emulated Raspberry Pi 4 (aarch64, bookworm, -cpu cortex-a72).

Table-driven by backend name: a backend that should run on the Pi adds one entry to PI_BACKENDS (the models it
must verify there) and, when its runtime needs something the board image lacks, a wheel in emulator.PI_BOOKWORM.
"""
import json
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

from conftest import ALL_MODELS, RTOL, require_module, torch_model

from .emulator import run_edgedyn

BOARD = "raspberry-pi-4"
# backend -> (the Python package its export needs on the host, its executor, the models that must verify on the Pi)
PI_BACKENDS: Dict[str, Tuple[str, str, List[str]]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime", sorted(ALL_MODELS)),
    "tflite": ("tflite", "litert", sorted(ALL_MODELS)),
}
CASES = [(backend, model) for backend, (_, _, models) in sorted(PI_BACKENDS.items()) for model in models]


def export_for_pi(export_example, backend: str, model: str) -> Path:
    require_module(PI_BACKENDS[backend][0])
    return export_example(model, board=BOARD, backend=backend)


def board_run(rootfs: Path, argv: List[str]):
    return run_edgedyn(rootfs, argv, cpu="cortex-a72")


@pytest.mark.parametrize("backend, model", CASES)
def test_bundle_verifies_on_the_pi4(pi_rootfs, export_example, backend, model):
    bundle = export_for_pi(export_example, backend, model)
    result = board_run(pi_rootfs, ["-m", "edgedyn", "verify", "--json", "--threads", "2", str(bundle)])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64", report
    assert report["results"] and all(r["artifact"] == backend for r in report["results"]), report
    assert all(r["max_rel"] < RTOL for r in report["results"]), report


@pytest.mark.parametrize("backend", sorted(PI_BACKENDS))
def test_fresh_inputs_on_the_pi4_match_torch_on_the_host(pi_rootfs, export_example, backend, tmp_path):
    """MobileNetV2 on a fresh random input on the board, two threads: equal to torch eager run here."""
    import torch

    bundle = export_for_pi(export_example, backend, "mobilenet_v2")
    x = np.random.default_rng().standard_normal((1, 3, 96, 96)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import json, sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1], threads=2); np.save(sys.argv[3], m(np.load(sys.argv[2])))\n"
            "print(json.dumps(m.specializations[0].executor.describe()))")
    result = board_run(pi_rootfs, ["-c", code, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout.strip().splitlines()[-1])
    assert described["executor"] == PI_BACKENDS[backend][1] and described["threads"] == 2, described
    with torch.no_grad():
        expected = torch_model("mobilenet_v2")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())


def test_onnxruntime_on_the_pi4_runs_on_its_cpu_provider(pi_rootfs, export_example):
    code = ("import json, sys, edgedyn.runtime as rt\n"
            "print(json.dumps(rt.load(sys.argv[1]).specializations[0].executor.describe()))")
    result = board_run(pi_rootfs, ["-c", code, str(export_for_pi(export_example, "onnxruntime", "tiny_cnn"))])
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout.strip().splitlines()[-1])
    assert described["providers"] == ["CPUExecutionProvider"], described
    assert described["providers_requested"] == ["CPUExecutionProvider"]


def test_litert_on_the_pi4_is_ai_edge_litert(pi_rootfs, export_example):
    code = ("import json, sys, edgedyn.runtime as rt\n"
            "print(json.dumps(rt.load(sys.argv[1]).specializations[0].executor.describe()))")
    result = board_run(pi_rootfs, ["-c", code, str(export_for_pi(export_example, "tflite", "tiny_cnn"))])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["runtime"] == "ai-edge-litert"
