"""The zoo's detectors with NMS inside, exported unmodified with each board family's default (x86-64, Raspberry
Pi 4, Jetson Orin Nano) and compared with torch eager's post-processed result on fresh inputs: x86-64 here, the
aarch64 bundles on the emulated board (a Jetson bundle's CPU fallback is what runs there)."""
import json
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

from conftest import require_module

from .emulator import preference_decides, run_edgedyn

pytestmark = pytest.mark.requires("torchvision", "ultralytics")

MODELS = ("yolo11n", "ssdlite320")
FRESH_SEED = 1234
GPU_BUILD = pytest.mark.requires("tvm", "nvidia.cuda_nvrtc")
BOARD_SCRIPT = """
import json, sys
import numpy as np
import edgedyn.runtime as rt
from edgedyn.runtime.program import flatten_outputs
ran = {}
for job in json.load(open(sys.argv[1])):
    program = rt.load(job["bundle"], threads=2)
    spec = program.specializations[0]
    with np.load(job["inputs"]) as data:
        flat = flatten_outputs(spec.output_tree, program(**{k: data[k] for k in data.files}))
    np.savez(job["out"], **{record["name"]: array for record, array in zip(spec.outputs, flat)})
    ran[job["model"]] = spec.artifact["backend"] + "-" + spec.artifact["device"]
print(json.dumps(ran))
"""


@pytest.fixture(scope="module")
def detectors() -> Any:
    require_module("ultralytics")
    from edgedyn.zoo import detectors

    return detectors


@pytest.fixture(scope="module")
def models(detectors: Any) -> Dict[str, Any]:
    return {name: detectors.build(name) for name in MODELS}


@pytest.fixture(scope="module")
def export_for(detectors: Any, models: Dict[str, Any], tmp_path_factory: Any) -> Callable[[str, str], Path]:
    import edgedyn

    folder = tmp_path_factory.mktemp("detect-boards")
    done = {}  # type: Dict[tuple, Path]

    def export(name: str, board: str) -> Path:
        if (name, board) not in done:
            # What is checked is NMS inside a board's bundle, not the choice; in fp32, whose detections equal torch
            # eager's row for row (a bf16 or fp16 candidate passes the float gate while moving boxes across the
            # threshold: docs/precision.md), so a faster reduced precision cannot make this comparison fail.
            with preference_decides():
                done[name, board] = edgedyn.export(models[name], detectors.example_inputs(name), board=board,
                                                   nms=detectors.get(name).nms, precision="fp32",
                                                   output=folder / "{}-{}.edgedyn".format(name, board))
        return done[name, board]
    return export


def expected(detectors: Any, models: Dict[str, Any], name: str) -> Dict[str, np.ndarray]:
    """torch eager's own post-processed result on the fresh input, keyed like the bundle's outputs."""
    import torch

    from detection_reference import torchvision_result, ultralytics_result

    image = next(iter(detectors.example_inputs(name, seed=FRESH_SEED).values()))
    if detectors.get(name).nms:
        return {key: value[0] for key, value in ultralytics_result(models[name], image).items()}
    with torch.no_grad():
        return torchvision_result(models[name], image)


def assert_same(detectors: Any, models: Dict[str, Any], name: str, outputs: Dict[str, np.ndarray]) -> None:
    from edgedyn.runtime.detections import KEYS, compare_group
    from edgedyn.runtime.program import FP32_TOLERANCE

    prefix = "" if detectors.get(name).nms else "0."
    want = expected(detectors, models, name)
    got = [np.asarray(outputs[prefix + key]) for key in KEYS]
    if detectors.get(name).nms:
        got = [array[0] for array in got]  # the batch of one
    result = compare_group({key: i for i, key in enumerate(KEYS)}, got, [want[key] for key in KEYS],
                           FP32_TOLERANCE)
    assert result["ok"] and result["rows_borderline"] == 0, (name, result)
    assert result["rows_matched"] == int(want["count"]) > 0


def _fresh(detectors: Any, folder: Path) -> Dict[str, Path]:
    paths = {}
    for name in MODELS:
        paths[name] = folder / "{}.npz".format(name)
        np.savez(paths[name], **{k: v.numpy() for k, v in detectors.example_inputs(name, seed=FRESH_SEED).items()})
    return paths


# SSDlite's x86-64 default export (auto over every backend here, ~1.5 min on 2 cores) is left to tests/test_detection.py,
# which runs it on every backend that takes it; YOLO11n's stands for the x86 family.
@pytest.mark.parametrize("name", ["yolo11n"])
def test_x86_default_export_matches_torch_eager_here(detectors: Any, models: Dict[str, Any], export_for: Any,
                                                     name: str) -> None:
    import edgedyn.runtime as rt
    from edgedyn.runtime.program import flatten_outputs

    program = rt.load(export_for(name, "x86-64"))
    spec = program.specializations[0]
    image = next(iter(detectors.example_inputs(name, seed=FRESH_SEED).values())).numpy()
    flat = flatten_outputs(spec.output_tree, program(image))
    assert_same(detectors, models, name, {r["name"]: a for r, a in zip(spec.outputs, flat)})


@pytest.mark.parametrize("board", [pytest.param("raspberry-pi-4"), pytest.param("jetson-orin-nano", marks=GPU_BUILD)])
def test_aarch64_default_export_matches_torch_eager_on_the_emulated_board(pi_rootfs: Path, detectors: Any,
                                                                          models: Dict[str, Any], export_for: Any,
                                                                          tmp_path: Path, board: str) -> None:
    """Both detectors in one board process, on the board's CPU; the onnxruntime artifact runs (the boards'
    preference), NMS and all."""
    from edgedyn.boards import load_board

    fresh = _fresh(detectors, tmp_path)
    jobs = [{"model": name, "bundle": str(export_for(name, board)), "inputs": str(fresh[name]),
             "out": str(tmp_path / "{}-out.npz".format(name))} for name in MODELS]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    result = run_edgedyn(pi_rootfs, ["-c", BOARD_SCRIPT, str(tmp_path / "jobs.json")], cpu=load_board(board).qemu_cpu)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = json.loads(result.stdout.strip().splitlines()[-1])
    for job in jobs:
        assert ran[job["model"]] == "onnxruntime-cpu", ran
        with np.load(job["out"]) as data:
            assert_same(detectors, models, job["model"], {k: data[k] for k in data.files})


@GPU_BUILD
@pytest.mark.parametrize("name", MODELS)
def test_jetson_default_export_carries_gpu_code_then_the_cpu_fallback(export_for: Any, name: str) -> None:
    """NMS and top-k are packed calls in the GPU build too (edgedyn/backends/tvm_nms.py): no fallback to the CPU
    alone because of them."""
    from edgedyn.runtime.format import read_manifest

    (spec,) = read_manifest(export_for(name, "jetson-orin-nano"))["specializations"]
    assert "no_gpu_code" not in spec, spec.get("no_gpu_code")
    gpu, cpu = spec["artifacts"]
    assert (gpu["backend"], gpu["device"], gpu["gpu"]["arch"]) == ("tvm", "cuda", "sm_87")
    assert (cpu["backend"], cpu["device"]) == ("onnxruntime", "cpu")
