"""The zoo's CI subset per board family: one CNN, one encoder and one detector, each exported once per session
with the board's default backend and compared with torch eager on fresh inputs (not the export-time ones):
x86-64 here, Raspberry Pi and Jetson on the emulated board, where a Jetson bundle's CPU fallback is what runs."""
import json
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest

from edgedyn import zoo

from .emulator import preference_decides, run_edgedyn

pytestmark = pytest.mark.requires("transformers")

MODELS = [name for name in zoo.names() if zoo.get(name).fast]  # resnet (cnn), vit (encoder), yolos (detector)
FRESH_SEED = 1234
GPU_BUILD = pytest.mark.requires("tvm", "nvidia.cuda_nvrtc")  # a Jetson's default export builds GPU code first
# board -> the artifact its default export must run on the CPU (never untuned TVM where onnxruntime verifies)
AARCH64 = {"raspberry-pi-4": "onnxruntime-cpu", "jetson-orin-nano": "onnxruntime-cpu"}

# Runs on the board: each bundle on its fresh inputs, outputs to an .npz, and which artifact ran and why.
BOARD_SCRIPT = """
import json, sys
import numpy as np
import edgedyn.runtime as rt
ran = {}
for job in json.load(open(sys.argv[1])):
    program = rt.load(job["bundle"], threads=2)
    with np.load(job["inputs"]) as data:
        np.savez(job["out"], **program(**{k: data[k] for k in data.files}))
    spec = program.specializations[0]
    ran[job["model"]] = {"artifact": spec.artifact["backend"] + "-" + spec.artifact["device"],
                         "skipped": [list(pair) for pair in spec.skipped]}
print(json.dumps(ran))
"""


@pytest.fixture(scope="module")
def export_for(tmp_path_factory) -> Callable[[str, str], Path]:
    """Each (model, board) exported once per session, with the default backend and device."""
    import edgedyn

    folder = tmp_path_factory.mktemp("zoo-boards")
    done = {}  # type: Dict[tuple, Path]

    def export(name: str, board: str) -> Path:
        if (name, board) not in done:
            with preference_decides():  # what is checked is the model on the board's CPU, not the choice
                done[name, board] = edgedyn.export(zoo.build(name), zoo.example_inputs(name, seed=0), board=board,
                                                   output=folder / "{}-{}.edgedyn".format(name, board))
        return done[name, board]

    return export


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Dict[str, Path]:
    """Each model's fresh inputs as an .npz (for the board) beside torch eager's outputs on them."""
    folder = tmp_path_factory.mktemp("zoo-fresh")
    paths = {}
    for name in MODELS:
        paths[name] = folder / "{}.npz".format(name)
        np.savez(paths[name], **{k: v.numpy() for k, v in zoo.example_inputs(name, seed=FRESH_SEED).items()})
    return paths


def eager_outputs(name: str) -> Dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        outputs = zoo.build(name)(**zoo.example_inputs(name, seed=FRESH_SEED))
    return {key: outputs[key].numpy() for key in outputs.keys()}


def assert_matches_eager(name: str, actual: Dict[str, np.ndarray]) -> None:
    record = zoo.get(name)
    expected = eager_outputs(name)
    assert sorted(actual) == sorted(record.outputs) == sorted(expected), name
    for key in record.outputs:
        scale = float(np.abs(expected[key]).max())
        np.testing.assert_allclose(actual[key], expected[key], rtol=record.rtol, atol=record.rtol * scale,
                                   err_msg="{} output {}".format(name, key))


@pytest.mark.parametrize("name", MODELS)
def test_x86_default_export_matches_torch_eager_here(export_for, fresh, name: str) -> None:
    import edgedyn.runtime as rt

    program = rt.load(export_for(name, "x86-64"))
    with np.load(fresh[name]) as data:
        actual = program(**{k: data[k] for k in data.files})
    artifact = program.specializations[0].artifact
    assert artifact["backend"] != "tvm"  # untuned TVM is never the CPU default
    if artifact.get("precision", "fp32") == "fp32":
        assert_matches_eager(name, actual)
        return
    # `auto` kept bf16 or fp16 (faster here and through the float gate): held to that gate, not to fp32's tolerance
    expected = eager_outputs(name)
    for key in zoo.get(name).outputs:
        a, b = actual[key].ravel().astype(np.float64), expected[key].ravel().astype(np.float64)
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= 0.999, (name, key, artifact["precision"])


@pytest.mark.parametrize("board", [pytest.param("raspberry-pi-4"), pytest.param("jetson-orin-nano", marks=GPU_BUILD)])
def test_aarch64_default_export_matches_torch_eager_on_the_emulated_board(pi_rootfs, export_for, fresh, tmp_path,
                                                                          board: str) -> None:
    """All three models in one board process (qemu's start and the runtime's imports once), on the board's CPU."""
    from edgedyn.boards import load_board

    jobs = [{"model": name, "bundle": str(export_for(name, board)), "inputs": str(fresh[name]),
             "out": str(tmp_path / "{}.npz".format(name))} for name in MODELS]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    result = run_edgedyn(pi_rootfs, ["-c", BOARD_SCRIPT, str(tmp_path / "jobs.json")], cpu=load_board(board).qemu_cpu)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = json.loads(result.stdout.strip().splitlines()[-1])
    for job in jobs:
        assert ran[job["model"]]["artifact"] == AARCH64[board], ran
        with np.load(job["out"]) as data:
            assert_matches_eager(job["model"], {k: data[k] for k in data.files})
    if load_board(board).gpu_target is not None:
        skipped: List[List[str]] = [pair for entry in ran.values() for pair in entry["skipped"]]
        assert {label for label, _ in skipped} == {"tvm-cuda (sm_87)"}, ran
        assert all(why == "no NVIDIA driver (libcuda.so.1 not found)" for _, why in skipped), ran


@GPU_BUILD
@pytest.mark.parametrize("name", MODELS)
def test_jetson_default_export_carries_gpu_code_then_the_cpu_fallback(export_for, name: str) -> None:
    from edgedyn.runtime.format import read_manifest

    (spec,) = read_manifest(export_for(name, "jetson-orin-nano"))["specializations"]
    assert "no_gpu_code" not in spec, spec.get("no_gpu_code")
    gpu, cpu = spec["artifacts"]
    assert (gpu["backend"], gpu["device"], gpu["gpu"]["arch"]) == ("tvm", "cuda", "sm_87")
    assert gpu["gpu"]["kernels"] > 0 and gpu["gpu"]["schedules"]["rules"]
    assert (cpu["backend"], cpu["device"]) == ("onnxruntime", "cpu")
