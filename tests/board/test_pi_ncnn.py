"""The ncnn backend on the emulated Raspberry Pi 5 (Cortex-A76, with Arm v8.2 fp16 arithmetic) and, for contrast, on
the Pi 4's Cortex-A72 (without it): an fp32 bundle exported here verifies there, and an fp16 artifact really computes
in fp16 on the A76 (ncnn's own report, and its numerical signature against torch) and in fp32 on the A72.

qemu-user gives a guest the AT_HWCAP of the CPU it emulates, and ncnn reads its features from there (its
/proc/self/auxv, which qemu answers), not from the rootfs's /proc/cpuinfo: the Pi 4 cpuinfo every emulated board
shows does not hide the A76's fp16 from it.
"""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ALL_MODELS, EXAMPLES, RTOL, require_module, torch_model, with_member, with_precision

from .emulator import REPO

BOARD = "raspberry-pi-5"
MODEL = "mobilenet_v2"
# Runs on the board: the bundle on one input, what the executor says, and the output.
REPORT = ("import json, sys, numpy as np, edgedyn.runtime as rt\n"
          "m = rt.load(sys.argv[1], threads=2); np.save(sys.argv[3], m(np.load(sys.argv[2])))\n"
          "s = m.specializations[0]\n"
          "print(json.dumps(dict(s.executor.describe(), computes=list(s.precision()))))")


@pytest.fixture(scope="module")
def pi5_bundle(export_example) -> Path:
    require_module("ncnn")
    require_module("pnnx")
    return export_example(MODEL, board=BOARD, backend="ncnn")


def _cli(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(REPO), capture_output=True, text=True,
                          timeout=3600)


def test_the_fp32_bundle_verifies_on_the_emulated_pi5(pi5_bundle):
    (spec,) = json.loads(_cli("inspect", "--json", str(pi5_bundle)).stdout)["specializations"]
    assert spec["artifacts"][0]["precision"] == "fp32"
    result = _cli("verify", str(pi5_bundle), "--emulate", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64" and report["emulation"]["qemu_cpu"] == "cortex-a76", report
    assert report["results"] and all(r["artifact"] == "ncnn" and r["max_rel"] < RTOL for r in report["results"])


def _on_board(bundle: Path, cpu: str, tmp_path: Path) -> tuple:
    """(the executor's report, its output, torch eager's) for one fresh input on the emulated board under `cpu`."""
    import torch

    from edgedyn.emulate.board import prepare

    board = dataclasses.replace(prepare(bundle), qemu_cpu=cpu)
    x = np.random.default_rng(27).standard_normal((1, 3, 96, 96)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = board.run_edgedyn(["-c", REPORT, str(bundle), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        expected = torch_model(MODEL)(torch.from_numpy(x)).numpy()
    return json.loads(result.stdout.strip().splitlines()[-1]), np.load(tmp_path / "y.npy"), expected


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_fp16_really_computes_in_fp16_on_the_a76(pi5_bundle, tmp_path):
    """ncnn reports fp16 storage and arithmetic on, and the outputs carry fp16's signature: off fp32 by far more
    than fp32 rounding (the fp32 bundle matches torch within 1e-6 there), within the float gate."""
    bundle = with_precision(pi5_bundle, "fp16", tmp_path / "fp16.edgedyn")
    described, got, expected = _on_board(bundle, "cortex-a76", tmp_path)
    assert described["computes"] == ["fp16", None] and described["cpu_fp16"] is True, described
    assert described["fp16"] == {"fp16_storage": True, "fp16_packed": True, "fp16_arithmetic": True}
    relative = float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))
    assert relative > 10 * RTOL, relative
    assert _cosine(got, expected) >= 0.999
    result = _cli("verify", str(bundle), "--emulate", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert all(r["ok"] and r["precision"] == "fp16" and r["cosine"] >= 0.999 for r in report["results"]), report


def test_an_fp16_artifact_computes_fp32_on_the_a72_and_says_why(pi5_bundle, tmp_path):
    bundle = with_precision(pi5_bundle, "fp16", tmp_path / "fp16.edgedyn")
    described, got, expected = _on_board(bundle, "cortex-a72", tmp_path)
    assert described["computes"] == ["fp32", "fp16 artifact computes in fp32 here: this CPU lacks fphp+asimdhp"]
    assert described["cpu_fp16"] is False and not any(described["fp16"].values()), described
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())


def _relative(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def test_layers_marked_fp32_compute_in_fp32_inside_the_fp16_network_on_the_a76(pi5_bundle, tmp_path):
    """Every probed layer but the first marked fp32 (31=3), behind the entries mark_fp32 writes where they read an
    fp16 layer: on the A76 ncnn computes the rest in fp16 and those in fp32, and says how many; the outputs are
    finite and far nearer torch than with every layer in fp16 (a mask that took no effect, or fp16 read as fp32,
    would be neither)."""
    from edgedyn.runtime.executors.ncnn_mixed import ENTRY, mark_fp32, probed_layers
    from edgedyn.runtime.executors.ncnn_param import parse_param

    fp16 = with_precision(pi5_bundle, "fp16", tmp_path / "fp16.edgedyn")
    marked = []

    def edit(param: bytes) -> bytes:
        marked.extend(probed_layers(parse_param(param, "m"))[1:])
        text = mark_fp32(param.decode("ascii"), marked)
        assert text.count(ENTRY + " ") >= 2
        return text.encode("ascii")

    mixed = with_member(fp16, "model.param", edit, tmp_path / "mixed.edgedyn")
    described, got, expected = _on_board(mixed, "cortex-a76", tmp_path)
    assert described["computes"] == ["fp16", None] and described["fp32_layers"] == len(marked) > 10, described
    _, everything_fp16, _ = _on_board(fp16, "cortex-a76", tmp_path)
    assert np.isfinite(got).all()
    assert _relative(got, expected) < _relative(everything_fp16, expected) / 4, (_relative(got, expected),
                                                                                 _relative(everything_fp16, expected))


def test_an_fp16_that_misses_its_gate_is_probed_and_tried_with_its_costliest_layers_fp32(tmp_path):
    """`auto` for the Pi 5 with a gate no fp16 meets: the fp16 candidate misses on the emulated A76, the probe
    names layers there, and a candidate with those layers in fp32 is built, run and judged like any other (the
    export then keeps whichever verified with the fewest instructions)."""
    import edgedyn
    from edgedyn.runtime import read_manifest
    from edgedyn.runtime.format import kept_artifact

    require_module("ncnn")
    require_module("pnnx")
    reference, inputs = ALL_MODELS[MODEL]
    lines = []  # type: list
    bundle = edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board=BOARD, backend="ncnn",
                            max_accuracy_drop="cosine=0.9999999", output=tmp_path / "m.edgedyn",
                            progress=lines.append)
    selection = kept_artifact(read_manifest(bundle)["specializations"][0])["selection"]
    assert any("probing which of its" in line for line in lines), lines
    mixed = [label for label in list(selection["rejected"]) + list(selection["instructions_per_call"])
             if label.startswith("ncnn:fp16+fp32-") and label.endswith("-layers")]
    assert mixed, selection
    assert "ncnn:fp16" in selection["rejected"], selection
