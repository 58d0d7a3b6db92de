"""Bundles of the CPU backends run on the emulated Raspberry Pi 4 (aarch64, bookworm, -cpu cortex-a72).

Table-driven by backend name: a backend that should run on the Pi adds one entry to PI_BACKENDS (the models it
must verify there) and, when its runtime needs something the board image lacks, a wheel in emulator.PI_BOOKWORM.
"""
import json
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
import pytest

import edgedyn
from edgedyn.frontend.loading import load_reference

from conftest import EXAMPLE_MODELS, EXAMPLES, REPO

from .emulator import run_on_board

BOARD = "raspberry-pi-4"
MODELS = {
    **EXAMPLE_MODELS,
    "mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", ("x=1x3x96x96",)),
    "transformer_block": ("transformer_block.py:TransformerBlock", ("x=1x32x64",)),
}
# backend -> (the Python package its export needs on the host, the models that must verify on the Pi)
PI_BACKENDS: Dict[str, Tuple[str, List[str]]] = {
    "onnxruntime": ("onnxruntime", sorted(MODELS)),
}
CASES = [(backend, model) for backend, (_, models) in sorted(PI_BACKENDS.items()) for model in models]


@pytest.fixture(scope="module")
def export_for_pi(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Exports a model of MODELS for the Pi 4 with one backend, once per (backend, model)."""
    cache: Dict[Tuple[str, str], Path] = {}
    directory = tmp_path_factory.mktemp("pi-bundles")

    def export(backend: str, model: str) -> Path:
        pytest.importorskip(PI_BACKENDS[backend][0])
        if (backend, model) not in cache:
            reference, inputs = MODELS[model]
            output = directory / "{}-{}.edgedyn".format(model, backend)
            cache[backend, model] = edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board=BOARD,
                                                   backend=backend, output=output)
        return cache[backend, model]

    return export


def board_run(rootfs: Path, argv: List[str]):
    return run_on_board(rootfs, argv, cpu="cortex-a72", pythonpath=[REPO],
                        env={"EDGEDYN_CACHE": str(rootfs / "root" / "edgedyn-cache")})


@pytest.mark.parametrize("backend, model", CASES)
def test_bundle_verifies_on_the_pi4(pi_rootfs, export_for_pi, backend, model):
    bundle = export_for_pi(backend, model)
    result = board_run(pi_rootfs, ["-m", "edgedyn", "verify", "--json", str(bundle)])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64", report
    assert report["results"] and all(r["artifact"] == backend for r in report["results"]), report
    assert all(r["max_rel"] < 1e-4 for r in report["results"]), report


@pytest.mark.parametrize("backend", sorted(PI_BACKENDS))
def test_fresh_inputs_on_the_pi4_match_torch_on_the_host(pi_rootfs, export_for_pi, backend, tmp_path):
    """MobileNetV2 on a fresh random input on the board, two threads: equal to torch eager run here."""
    import torch

    bundle = export_for_pi(backend, "mobilenet_v2")
    x = np.random.default_rng().standard_normal((1, 3, 96, 96)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import json, sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1], threads=2); np.save(sys.argv[3], m(np.load(sys.argv[2])))\n"
            "print(json.dumps(m.specializations[0].executor.describe()))")
    result = board_run(pi_rootfs, ["-c", code, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout.strip().splitlines()[-1])
    assert described["executor"] == backend and described["threads"] == 2, described
    model, _, _ = load_reference(str(EXAMPLES / MODELS["mobilenet_v2"][0]))
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_onnxruntime_on_the_pi4_runs_on_its_cpu_provider(pi_rootfs, export_for_pi):
    code = ("import json, sys, edgedyn.runtime as rt\n"
            "print(json.dumps(rt.load(sys.argv[1]).specializations[0].executor.describe()))")
    result = board_run(pi_rootfs, ["-c", code, str(export_for_pi("onnxruntime", "tiny_cnn"))])
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout.strip().splitlines()[-1])
    assert described["providers"] == ["CPUExecutionProvider"], described
    assert described["providers_requested"] == ["CPUExecutionProvider"]
