"""`--backend auto` for another board (a Raspberry Pi 5 from this x86 host): every candidate, fp16 ones included, is
run on the emulated board, judged against torch eager, counted there, and the one with the fewest guest
instructions per call is kept (edgedyn/onboard.py)."""
import json
import re
from pathlib import Path

import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import EdgedynError

from conftest import EXAMPLES, raw_sensor_model, require

EMULATED_PI5 = "the emulated raspberry-pi-5 (qemu -cpu cortex-a76)"


@pytest.fixture(scope="module")
def pi5_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgedyn.onboard import unavailable
    from edgedyn.boards import load_board

    why = unavailable(load_board("raspberry-pi-5"))
    require(why is None, "auto for another board measures on its emulated CPU: {}".format(why),
            "bash scripts/install.sh (qemu-user, qemu-user-static, mmdebstrap, gcc)")
    lines = []
    with pytest.MonkeyPatch.context() as patch:  # no tuning records, whatever this machine has tuned
        patch.setenv("EDGEDYN_TUNING_DIR", str(tmp_path_factory.mktemp("no-tuning-records")))
        path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64"], board="raspberry-pi-5",
                              output=tmp_path_factory.mktemp("onboard") / "tiny-pi5.edgedyn", progress=lines.append)
    path.with_suffix(".log").write_text("\n".join(lines))
    return path


def test_every_candidate_is_counted_on_the_emulated_board_and_the_fewest_instructions_win(pi5_bundle):
    (spec,) = rt.read_manifest(pi5_bundle)["specializations"]
    (artifact,) = spec["artifacts"]
    selection = artifact["selection"]
    counts = selection["instructions_per_call"]
    assert selection["mode"] == "emulated" and selection["board"] == "raspberry-pi-5"
    assert selection["cpu"] == "cortex-a76" and "not a time" in selection["label"]
    # fp32 on every backend that installs on the board, and fp16 where a backend computes it on an A76
    assert {"onnxruntime", "tflite", "openvino", "openvino:fp16"} <= set(counts), selection
    assert counts[selection["candidate"]] == min(counts.values())  # of tied counts, either
    assert all(isinstance(n, int) and n > 10000 for n in counts.values())
    # Untuned TVM (9-38x the instructions of the fewest in every count so far) is not built while others verify.
    assert "tvm" not in counts and "untuned TVM" in selection["held_back"]["tvm"], selection
    log = pi5_bundle.with_suffix(".log").read_text()
    assert re.search(r"running and counting \d+ candidate\(s\) on the emulated raspberry-pi-5 \(qemu -cpu "
                     r"cortex-a76\), \d+ at a time", log), log
    assert "openvino:fp16: {:,} instructions per call".format(counts["openvino:fp16"]) in log


def test_the_fp16_candidate_really_computed_fp16_on_the_emulated_a76(pi5_bundle, tmp_path):
    """The same model asked for fp16 alone: its gate was measured on the emulated board, where qemu executes the
    A76's fp16 arithmetic exactly; the outputs it recorded there carry fp16's signature (far from fp32 rounding,
    within the gate)."""
    path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64"], board="raspberry-pi-5",
                          backend="auto", precision="fp16", output=tmp_path / "fp16.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["precision"] == "fp16" and artifact["selection"]["precision"] == "fp16"
    accuracy = artifact["accuracy"]
    assert accuracy["measured_on"] == EMULATED_PI5 and accuracy["samples"] == 9
    cosine = min(o["cosine"] for o in accuracy["outputs"])
    errors = [o["max_abs_error"] / o["reference_max_abs"] for o in accuracy["outputs"]]
    assert 0.999 <= cosine < 1.0 - 1e-9 and max(errors) > 1e-4  # not fp32: fp16 keeps 11 bits of mantissa


def test_a_gate_no_fp16_can_meet_drops_the_fp16_candidates_with_their_numbers(tmp_path):
    from edgedyn.boards import load_board
    from edgedyn.onboard import unavailable

    require(unavailable(load_board("raspberry-pi-5")) is None, "needs the emulated board and the counting tools",
            "bash scripts/install.sh")
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="raspberry-pi-5", precision="fp16",
                       max_accuracy_drop="cosine=0.99999999", output=tmp_path / "m.edgedyn")
    assert raised.value.message.startswith("no candidate for x=1x64 meets the accuracy gate: ")
    assert "openvino:fp16 in fp16 misses --max-accuracy-drop: output_0 cosine" in raised.value.message
    assert not (tmp_path / "m.edgedyn").exists()


def test_an_fp16_that_misses_the_gate_is_counted_again_with_its_first_layers_in_fp32(tmp_path):
    """On the emulated A76 as on the host: OpenVINO's fp16 of a model on raw sensor values misses a gate (fp16
    rounds the input itself: cosine 0.99999 against 0.999995 asked), the same IR with its first layers kept in fp32
    is run, judged and counted in the next rounds (half, then a tenth: 0.999999 both), and the fewest instructions
    among those that pass is kept."""
    from edgedyn.boards import load_board
    from edgedyn.onboard import unavailable

    require(unavailable(load_board("raspberry-pi-5")) is None, "needs the emulated board and the counting tools",
            "bash scripts/install.sh")
    model, example = raw_sensor_model(offset=4000.0)  # fp16 steps of 2 there: the input's spread of 1 is lost
    path = edgedyn.export(model, example, board="raspberry-pi-5", backend="openvino",
                          max_accuracy_drop="cosine=0.999995", output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    selection = artifact["selection"]
    assert "openvino:fp16 in fp16 misses --max-accuracy-drop" in selection["rejected"]["openvino:fp16"]
    counts = selection["instructions_per_call"]
    assert {"openvino", "openvino:fp16+fp32-first-50%", "openvino:fp16+fp32-first-10%"} <= set(counts), selection
    assert counts[selection["candidate"]] == min(counts.values())  # of tied counts, either
    mixed = [label for label in counts if "+fp32-first-" in label]
    assert all(counts[label] < counts["openvino"] for label in mixed), counts  # fp16 beyond the first layers
    if "+fp32-first-" in selection["candidate"]:
        assert artifact["accuracy"]["measured_on"] == EMULATED_PI5
        assert min(o["cosine"] for o in artifact["accuracy"]["outputs"]) >= 0.999995
        assert artifact["openvino"]["fp32_layers"]["first"] >= 1


@pytest.mark.parametrize("board,at_once", [("raspberry-pi-5", True), ("jetson-xavier-nx", False)])
def test_a_tflite_fp16_in_mirrored_coordinates_computes_right_on_the_emulated_board(tmp_path, run_cli, board,
                                                                                    at_once):
    """A MobileNet-like classifier whose stride-2 windows would need zero borders: its TFLite fp16 file computes
    with the rows and columns back to front (backends/tflite/mirror.py), and the gate measured on the emulated
    board's CPU, XNNPACK's fp16 kernels and the board's REVERSE_V2 there, holds it to torch: the Pi 5's Python 3.11
    runs ai-edge-litert, which reverses both axes in one REVERSE_V2; the Xavier's 3.8 runs tflite-runtime, which
    would reverse only the first, so its file reverses one axis at a time."""
    import torch
    from torch import nn

    from edgedyn.boards import load_board
    from edgedyn.onboard import unavailable

    require(unavailable(load_board(board)) is None, "needs the emulated board and the counting tools",
            "bash scripts/install.sh")

    class Located(nn.Module):
        """Features less their mean, weighed by where they are, then averaged: on noise a global average (and one
        weighed by place) hardly changes when a kernel is flipped the wrong way (checked: cosine 0.99997 with one
        flipped along one axis only), what varies from place to place does. Small (8x8 features), so that fp16's
        rounding of the 64 terms stays near the gate."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.features = nn.Sequential(
                nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU6(), nn.Conv2d(32, 64, 1), nn.ReLU6(),
                nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64), nn.ReLU6(), nn.Conv2d(64, 32, 1))
            self.where = nn.Parameter(torch.randn(1, 32, 8, 8))
            self.classifier = nn.Linear(32, 10, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = self.features(x)
            features = features - features.mean((2, 3), keepdim=True)  # what varies from place to place
            return self.classifier((features * self.where).mean((2, 3)))

    path = edgedyn.export(Located().eval(), (torch.randn(1, 3, 32, 32),), board=board, backend="tflite",
                          precision="fp16", max_accuracy_drop="cosine=0.99", output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    assert artifact["precision"] == "fp16" and artifact.get("tflite_mirrored") is True, artifact
    assert "REVERSE_V2" in artifact["tflite_ops"] and "CONCATENATION" not in artifact["tflite_ops"]
    assert bool(artifact.get("tflite_reverses_axes_at_once")) is at_once, artifact
    accuracy = artifact["accuracy"]
    assert accuracy["measured_on"] == "the emulated {} (qemu -cpu cortex-a76)".format(board)
    assert min(o["cosine"] for o in accuracy["outputs"]) >= 0.99  # 0.998 in fp16 either way; a kernel flipped
    # along one axis only: 0.72, refused by the export's sanity check (below 0.9: a broken artifact)
    shown = run_cli("inspect", str(path))
    assert "layout   mirrored: rows and columns back to front, the input reversed " + (
        "in one REVERSE_V2 (needs ai-edge-litert)" if at_once else "one axis at a time") in shown.stdout, \
        shown.stdout + shown.stderr


def test_without_the_emulation_tools_the_preference_decides_and_says_why(monkeypatch, tmp_path):
    import edgedyn.onboard as onboard

    monkeypatch.setattr(onboard, "unavailable", lambda board: "missing qemu-aarch64")
    path = edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="raspberry-pi-5",
                          output=tmp_path / "m.edgedyn")
    selection = rt.read_manifest(path)["specializations"][0]["artifacts"][0]["selection"]
    assert selection["mode"] == "board preference" and selection["precision"] == "fp32"
    assert selection["not_measured"] == ("the emulated raspberry-pi-5 could not measure the candidates here "
                                         "(missing qemu-aarch64); the board file's preference decided")


def test_the_chosen_bundle_verifies_on_the_emulated_board(pi5_bundle, run_cli):
    result = run_cli("verify", str(pi5_bundle), "--emulate")
    assert result.returncode == 0, result.stderr
    assert "verified 1 output(s) of 1 specialization(s) on aarch64" in result.stderr


def test_an_int8_with_fp16_float_layers_is_measured_and_verified_where_it_computes(pi5_bundle, tmp_path):
    """`--backend openvino --quantize int8` for the Pi 5: OpenVINO's layers outside int8 compute in fp16 on an A76
    (and its Arm build runs some int8 convolutions in fp16 too), so the held-out gate runs on the emulated board,
    the manifest's accuracy and recorded outputs are the board's, and `verify` there holds the bundle to its int8
    gate against torch eager (not to the outputs one CPU recorded). Before, the gate and the record were this x86
    host's (floats in fp32), and the bundle failed its own verify on the board (ResNet-18: cosine 0.9978 to the
    host's outputs, under the fp16 check's 0.999)."""
    import numpy as np

    rng = np.random.default_rng(3)
    samples = [(rng.standard_normal((1, 3, 64, 64)).astype(np.float32),) for _ in range(40)]
    path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64"], board="raspberry-pi-5",
                          backend="openvino", quantize="int8", calibration=samples, output=tmp_path / "i8.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["precision"] == "fp16" and artifact["selection"]["mode"] == "emulated", artifact["selection"]
    record = artifact["quantization"]
    assert record["float_precision"] == "fp16" and record["accuracy"]["measured_on"] == EMULATED_PI5
    assert min(o["cosine"] for o in record["accuracy"]["outputs"]) >= 0.99
    from edgedyn.emulate.board import prepare

    result = prepare(path).run_edgedyn(["-m", "edgedyn", "verify", "--json", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64", report
    assert all(r["min_cosine"] == 0.99 and r["precision"] == "fp16" and r["cosine"] >= 0.99
               for r in report["results"]), report
