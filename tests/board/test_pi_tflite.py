"""TFLite bundles on the emulated Raspberry Pi 4 (aarch64 bookworm, Cortex-A72): LiteRT with XNNPACK there."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLE_MODELS, EXAMPLES, REPO

from .emulator import run_on_board

pytest.importorskip("tflite")
REFERENCE_MODELS = {"mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", ("x=1x3x96x96",)),
                    "transformer_block": ("transformer_block.py:TransformerBlock", ("x=1x32x64",))}


def board_cli(rootfs: Path, *args: str):
    return run_on_board(rootfs, ["-m", "edgedyn", *args], cpu="cortex-a72", pythonpath=[REPO],
                        env={"EDGEDYN_CACHE": str(rootfs / "root" / "edgedyn-cache")})


@pytest.fixture(scope="module")
def pi_tflite_bundle(export_example, tmp_path_factory):
    directory = tmp_path_factory.mktemp("pi-tflite")

    def get(name: str) -> Path:
        if name in EXAMPLE_MODELS:
            return export_example(name, board="raspberry-pi-4", backend="tflite")
        import edgedyn

        reference, inputs = REFERENCE_MODELS[name]
        return edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board="raspberry-pi-4",
                              backend="tflite", output=directory / (name + ".edgedyn"))

    return get


@pytest.mark.parametrize("name", sorted(EXAMPLE_MODELS) + sorted(REFERENCE_MODELS))
def test_tflite_bundle_verifies_on_the_pi4(pi_rootfs, pi_tflite_bundle, name):
    result = board_cli(pi_rootfs, "verify", "--json", "--threads", "2", str(pi_tflite_bundle(name)))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64"
    assert report["results"] and all(r["artifact"] == "tflite" and r["max_rel"] < 1e-4 for r in report["results"])


def test_litert_on_the_board_matches_torch_on_fresh_inputs(pi_rootfs, pi_tflite_bundle, tmp_path):
    import torch

    from edgedyn.frontend.loading import load_reference

    bundle = pi_tflite_bundle("tiny_cnn")
    x = np.random.default_rng().standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import json, sys, numpy as np, edgedyn.runtime as rt\n"
            "m = rt.load(sys.argv[1]); np.save(sys.argv[3], m(np.load(sys.argv[2])))\n"
            "print(json.dumps(m.specializations[0].executor.describe()))")
    result = run_on_board(pi_rootfs, ["-c", code, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          pythonpath=[REPO])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["runtime"] == "ai-edge-litert"
    model, _, _ = load_reference(str(EXAMPLES / "tiny_cnn.py:TinyCNN"))
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
