"""int8 bundles on the emulated Raspberry Pi 4 (aarch64 bookworm, -cpu cortex-a72): onnxruntime and LiteRT.

On the board `edgedyn verify` compares an int8 artifact with its own outputs recorded at export on x86 (tolerance
edgedyn.quantize.accuracy.INT8_TOLERANCE: 2% of the largest output magnitude), and the accuracy against torch
eager measured at export is checked here again on fresh inputs run on the board.
"""
import json
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np
import pytest

import edgedyn
from edgedyn.frontend.loading import load_reference
from edgedyn.quantize.accuracy import INT8_TOLERANCE, output_metrics

from conftest import EXAMPLES

from .emulator import run_edgedyn

pytestmark = pytest.mark.requires("onnxruntime", "tflite")

BOARD = "raspberry-pi-4"
MODELS = {
    "tiny_cnn": ("tiny_cnn.py:TinyCNN", ["x=1x3x64x64"], (1, 3, 64, 64)),
    "mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", ["x=1x3x96x96"], (1, 3, 96, 96)),
    "mlp": ("mlp.py:MLP", ["x=1x64", "x=8x64"], (1, 64)),
}
CASES = [(backend, model) for backend in ("onnxruntime", "tflite") for model in sorted(MODELS)]


@pytest.fixture(scope="module")
def int8_for_pi(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    cache = {}  # type: Dict[Tuple[str, str], Path]
    directory = tmp_path_factory.mktemp("pi-int8")

    def export(backend: str, model: str) -> Path:
        if (backend, model) not in cache:
            reference, inputs, shape = MODELS[model]
            rng = np.random.default_rng(0)
            samples = [(rng.standard_normal(shape).astype(np.float32),) for _ in range(40)]
            cache[backend, model] = edgedyn.export(
                str(EXAMPLES / reference), inputs=inputs, board=BOARD, backend=backend, quantize="int8",
                calibration=samples, output=directory / "{}-{}-int8.edgedyn".format(model, backend))
        return cache[backend, model]

    return export


def board_run(rootfs: Path, argv):
    return run_edgedyn(rootfs, argv, cpu="cortex-a72")


@pytest.mark.parametrize("backend, model", CASES)
def test_int8_bundle_verifies_on_the_pi4(pi_rootfs, int8_for_pi, backend, model):
    bundle = int8_for_pi(backend, model)
    result = board_run(pi_rootfs, ["-m", "edgedyn", "verify", "--json", str(bundle)])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64", report
    assert report["results"] and all(r["artifact"] == backend and r["against"] == "int8 outputs recorded at export"
               and r["rtol"] == INT8_TOLERANCE["rtol"] for r in report["results"]), report
    print("{} {} on the Pi: max rel error to the x86 int8 outputs {}".format(
        model, backend, [round(r["max_rel"], 5) for r in report["results"]]))


@pytest.mark.parametrize("backend", ["onnxruntime", "tflite"])
def test_int8_on_the_pi4_agrees_with_torch_on_fresh_inputs(pi_rootfs, int8_for_pi, backend, tmp_path):
    import torch

    bundle = int8_for_pi(backend, "tiny_cnn")
    x = np.random.default_rng(7).standard_normal((16, 1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1], threads=2)\n"
            "np.save(sys.argv[3], np.stack([m(x) for x in np.load(sys.argv[2])]))")
    result = board_run(pi_rootfs, ["-c", code, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    assert result.returncode == 0, result.stderr
    model, _, _ = load_reference(str(EXAMPLES / MODELS["tiny_cnn"][0]))
    with torch.no_grad():
        expected = [model.eval()(torch.from_numpy(sample)).numpy() for sample in x]
    metrics = output_metrics(list(np.load(tmp_path / "y.npy")), expected)
    print("tiny_cnn {} int8 on the Pi vs torch: {}".format(backend, metrics))
    assert metrics["cosine"] > 0.999 and metrics["top1_agreement"] >= 0.9, metrics
