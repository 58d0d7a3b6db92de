"""The openvino backend end to end: fp32 equal to torch eager, bf16/fp16 gated and really computed in the reduced
precision where the CPU has it, the IR checked before OpenVINO reads it, and `auto` over (backend, precision)."""
import dataclasses
import os
import sys

import numpy as np
import torch
import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import EdgedynError
from edgedyn.runtime import precision as precisions
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors.openvino_ir import check_ir

from conftest import ALL_MODELS, EXAMPLES, RTOL, assert_matches_torch, raw_sensor_model, require

pytestmark = pytest.mark.requires("openvino", "onnx")
BF16_HERE = precisions.is_native("bf16", "x86_64", precisions.host_features())


@pytest.fixture(scope="module")
def openvino_bundle(export_example):
    return lambda name: export_example(name, backend="openvino")


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_fp32_matches_torch_on_fresh_inputs(openvino_bundle, name):
    program = rt.load(openvino_bundle(name), threads=2)
    assert all(spec.precision() == ("fp32", None) for spec in program.specializations)
    assert_matches_torch(program, name, seed=2025)


def test_fp32_bundle_is_portable_verifies_and_records_its_settings(openvino_bundle):
    bundle = openvino_bundle("mobilenet_v2")
    (spec,) = rt.read_manifest(bundle)["specializations"]
    (artifact,) = spec["artifacts"]
    assert (artifact["backend"], artifact["executor"], artifact["arch"], artifact["precision"]) == (
        "openvino", "openvino", None, "fp32")
    assert sorted(artifact["files"]) == ["model", "weights"]
    assert artifact["openvino"]["weights"] == "fp32" and artifact["requires"] == {"python": ["openvino>=2024.0"]}
    results = rt.load(bundle).verify()
    assert results and all(r["ok"] and r["max_rel"] < RTOL for r in results), results


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_bf16_really_computes_in_bf16_where_the_cpu_has_it(tmp_path):
    """On a CPU with AVX512_BF16 or AMX the bf16 artifact computes in bf16: OpenVINO reports it, and the outputs
    carry its numerical signature (off fp32 by far more than fp32 rounding, within the gate). Elsewhere the export
    refuses bf16 in words: its accuracy could not be measured where its arithmetic happens."""
    model = str(EXAMPLES / "mobilenet_v2.py:MobileNetV2")
    if not BF16_HERE:
        with pytest.raises(EdgedynError) as raised:
            edgedyn.export(model, inputs=["x=1x3x96x96"], backend="openvino", precision="bf16",
                           output=tmp_path / "m.edgedyn")
        assert "bf16 would not run natively here: this CPU lacks avx512_bf16 or amx_bf16" in raised.value.message
        return
    path = edgedyn.export(model, inputs=["x=1x3x96x96"], backend="openvino", precision="bf16",
                          output=tmp_path / "m.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["precision"] == "bf16" and artifact["openvino"]["weights"] == "fp16"
    accuracy = artifact["accuracy"]
    assert accuracy["gate"] == {"min_cosine": 0.999} and accuracy["samples"] == 9
    assert all(o["cosine"] >= 0.999 for o in accuracy["outputs"])
    program = rt.load(path, threads=2)
    (loaded,) = program.specializations
    assert loaded.precision() == ("bf16", None)
    assert loaded.executor.describe()["inference_precision"] == "bf16"
    assert "in bf16" in loaded.selection()
    import torch

    from conftest import torch_model

    x = np.random.default_rng(11).standard_normal((1, 3, 96, 96)).astype(np.float32)
    with torch.no_grad():
        want = torch_model("mobilenet_v2")(torch.from_numpy(x)).numpy()
    got = program(x)
    relative = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert relative > 20 * RTOL, relative  # not fp32: bf16 keeps 8 bits of mantissa
    assert _cosine(got, want) >= 0.999
    results = program.verify()
    assert all(r["ok"] and r["precision"] == "bf16" and r["cosine"] >= 0.999 for r in results), results


def test_a_bf16_artifact_computes_fp32_on_a_cpu_without_it_and_says_why(monkeypatch, tmp_path):
    """What a board without the feature does: the executor asks OpenVINO for f32, and the runtime's report says
    why (as the GPU-to-CPU fallback does)."""
    require(BF16_HERE, "needs a bf16 bundle, which only a CPU with AVX512_BF16 or AMX exports",
            "run it on such a CPU (Zen 4, Cooper Lake, Sapphire Rapids or newer)")
    path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64"], backend="openvino",
                          precision="bf16", output=tmp_path / "t.edgedyn")
    monkeypatch.setattr(precisions, "_HOST", frozenset({"avx2", "fma"}))
    program = rt.load(path)
    (spec,) = program.specializations
    assert spec.precision() == ("fp32", "bf16 artifact computes in fp32 here: this CPU lacks avx512_bf16 or amx_bf16")
    assert spec.executor.describe()["inference_precision"] == "f32"
    assert "in fp32 (bf16 artifact computes in fp32 here" in spec.selection()
    assert all(r["ok"] for r in program.verify())


@pytest.fixture(scope="module")
def bf16_with_fallback(tmp_path_factory):
    """The example MobileNetV2 exported for the x86-64 board with auto over OpenVINO and onnxruntime, the timings
    made to crown OpenVINO bf16 and rank onnxruntime first among fp32 (which candidate is faster is timed for real
    in the tests above; this is about what the bundle carries after that choice)."""
    import edgedyn.selection as selection

    require(BF16_HERE, "needs a bf16 winner, which only a CPU with AVX512_BF16 or AMX exports",
            "run it on such a CPU (Zen 4, Cooper Lake, Sapphire Rapids or newer)")

    def timed(executors, inputs, timing, rejected):  # type: ignore[no-untyped-def]
        ranks = {"openvino:bf16": 1.0, "onnxruntime": 2.0}  # every other candidate, any thread count: 3 ms
        return {key: ranks.get(key.split(" on ")[0], 3.0) for key in executors}

    lines = []  # type: list
    listed = selection.candidate_list
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selection, "candidate_list", lambda *args: [
            c for c in listed(*args) if c.backend in ("openvino", "onnxruntime")])  # not minutes of TVM builds
        patch.setattr(selection, "timed_in_turns", timed)
        path = edgedyn.export(str(EXAMPLES / "mobilenet_v2.py:MobileNetV2"), inputs=["x=1x3x96x96"],
                              output=tmp_path_factory.mktemp("fallback") / "m.edgedyn", progress=lines.append)
    return path, lines


def test_a_bf16_winner_carries_the_fastest_fp32_of_another_backend(bf16_with_fallback, monkeypatch, run_cli):
    """The x86-64 board promises no bf16 (any x86-64-v2 CPU): the kept OpenVINO bf16 artifact is followed by the
    fastest fp32 candidate, which a CPU without AVX512_BF16 runs instead of OpenVINO in f32, saying why; the
    export's summary, `inspect` and the runtime name both."""
    from edgedyn.runtime.format import kept_artifact
    from edgedyn.runtime.choice import would_run

    path, lines = bf16_with_fallback
    (record,) = rt.read_manifest(path)["specializations"]
    bf16, fp32 = record["artifacts"]
    assert (bf16["backend"], bf16["precision"], fp32["backend"], fp32["precision"]) == (
        "openvino", "bf16", "onnxruntime", "fp32")
    assert kept_artifact(record) is bf16 and bf16["selection"]["candidate"] == "openvino:bf16"
    assert fp32["selection"]["mode"] == "fallback" and fp32["selection"]["for"] == "openvino:bf16"
    assert "run where the CPU lacks avx512_bf16 or amx_bf16" in fp32["selection"]["why"]
    assert any(line.startswith("kept onnxruntime as well, for a CPU without avx512_bf16") for line in lines)
    (here,) = rt.load(path).specializations
    assert here.artifact is not None and here.artifact["backend"] == "openvino" and here.precision()[0] == "bf16"
    shown = run_cli("inspect", str(path)).stdout
    assert "onnxruntime as well: the fp32 fallback of openvino:bf16" in shown and "would run openvino-cpu" in shown

    monkeypatch.setattr(precisions, "_HOST", frozenset({"avx2", "fma"}))  # a CPU without AVX512_BF16
    why = "its bf16 needs avx512_bf16 or amx_bf16, which this CPU lacks: the fp32 artifact after it runs"
    assert would_run(record) == {"would_run": "onnxruntime-cpu", "skipped": [["openvino-cpu", why]]}
    program = rt.load(path)
    (spec,) = program.specializations
    assert spec.artifact["backend"] == "onnxruntime" and spec.precision() == ("fp32", None)
    assert spec.skipped == [("openvino-cpu", why)]
    assert "onnxruntime-cpu on x86_64 (openvino-cpu not used: its bf16 needs" in spec.selection()
    results = program.verify()  # fp32 again: torch eager's tolerance, not the bf16 gate
    assert results and all(r["ok"] and "precision" not in r and r["max_rel"] < RTOL for r in results), results
    assert_matches_torch(program, "mobilenet_v2", seed=2031)


def test_verify_checks_the_fallback_too(bf16_with_fallback, run_cli):
    """On a CPU that runs the bf16 artifact, `edgedyn verify` also runs the fp32 fallback (load(fallbacks=True)),
    against torch eager at the fp32 tolerance: a bundle for a mixed fleet is checked whole before it ships."""
    from edgedyn.fleet.device import verify_report

    path, _ = bf16_with_fallback
    report = verify_report(str(path))
    by_artifact = {r["artifact"]: r for r in report["results"]}
    assert sorted(by_artifact) == ["onnxruntime", "openvino"] and report["ok"], report["results"]
    assert by_artifact["openvino"]["precision"] == "bf16" and by_artifact["openvino"]["min_cosine"] == 0.999
    assert "precision" not in by_artifact["onnxruntime"] and by_artifact["onnxruntime"]["max_rel"] < RTOL
    assert report["using"][1] == ("x=1x3x96x96: onnxruntime-cpu on x86_64 (openvino-cpu not used: passed over to "
                                  "check the fp32 artifact after it)")
    shown = run_cli("verify", str(path))
    assert shown.returncode == 0 and "verified 2 output(s) of 1 specialization(s)" in shown.stderr, shown.stderr
    (spec,) = rt.load(path, fallbacks=True).specializations
    assert spec.artifact["backend"] == "onnxruntime"


_ON_ANOTHER_CPU = """
import json, sys
import numpy as np
import edgedyn.runtime as rt
from edgedyn.runtime import precision
program = rt.load(sys.argv[1], threads=1)
(spec,) = program.specializations
print(json.dumps({"features": sorted(f for f in precision.host_features() if "bf16" in f),
                  "selection": spec.selection(), "verify": program.verify()}, default=float))
"""


def test_a_cpu_without_bf16_runs_the_fp32_fallback(bf16_with_fallback):
    """The same bundle on a CPU that really lacks AVX512_BF16: qemu-x86_64 emulating a Haswell (AVX2, no AVX-512),
    whose /proc/cpuinfo is this host's. The runtime goes by CPUID, as OpenVINO does, so it runs onnxruntime in fp32
    and verifies it against torch eager at the fp32 tolerance."""
    import json
    import shutil
    import subprocess

    from conftest import REPO

    require(shutil.which("qemu-x86_64") is not None, "needs qemu-x86_64 to emulate a CPU without bf16",
            "sudo apt-get install qemu-user (bash scripts/install.sh)")
    path, _ = bf16_with_fallback
    run = subprocess.run(["qemu-x86_64", "-cpu", "Haswell-v4", sys.executable, "-c", _ON_ANOTHER_CPU, str(path)],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # this host's cpuinfo says avx512_bf16 (and amx_bf16 on a Sapphire Rapids); the emulated CPU's CPUID does not
    assert seen["features"] == []
    assert seen["selection"].startswith("x=1x3x96x96: onnxruntime-cpu on x86_64 (openvino-cpu not used: its bf16")
    assert seen["verify"] and all(r["ok"] and r["max_rel"] < RTOL for r in seen["verify"]), seen["verify"]


def test_cpuid_that_denies_avx512_denies_amx_too(monkeypatch):
    """numpy reads AVX512_BF16 and AVX512_FP16 from CPUID but not AMX; a CPU whose CPUID has no AVX512F has no AMX
    either, whatever /proc/cpuinfo (the host's, under qemu-user) says."""
    from numpy._core._multiarray_umath import __cpu_features__ as found  # numpy 2, which the host installs
    for name in ("AVX512F", "AVX512BF16", "AVX512FP16"):
        monkeypatch.setitem(found, name, False)
    assert precisions._cpuid_denied() == {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"}
    for name in ("AVX512F", "AVX512BF16"):
        monkeypatch.setitem(found, name, True)
    assert precisions._cpuid_denied() == {"avx512_fp16"}


def test_auto_on_this_host_weighs_every_backend_and_precision(tmp_path):
    """The default export's candidates: fp32 on every backend, and bf16 through OpenVINO where the CPU has it, each
    checked (bf16 by the gate) and timed in turns; the record holds every candidate's time."""
    lines = []
    path = edgedyn.export(str(EXAMPLES / "mobilenet_v2.py:MobileNetV2"), inputs=["x=1x3x96x96"],
                          output=tmp_path / "m.edgedyn", progress=lines.append)
    from edgedyn.runtime.format import kept_artifact

    (spec,) = rt.read_manifest(path)["specializations"]
    artifact = kept_artifact(spec)
    selection = artifact["selection"]
    fastest_fp32 = selection["fastest_by_precision"]["fp32"]["candidate"]
    # a bf16 winner carries the fastest fp32 candidate of another backend, for CPUs without bf16 (tests below)
    carries = selection["precision"] == "bf16" and not fastest_fp32.startswith(artifact["backend"])
    assert [a["selection"].get("candidate") for a in spec["artifacts"][1:]] == ([fastest_fp32] if carries else [])
    assert selection["mode"] == "measured" and {"onnxruntime", "openvino"} <= set(selection["medians_ms"])
    assert ("openvino:bf16" in selection["medians_ms"]) == BF16_HERE
    assert selection["candidate"] == (artifact["backend"] if selection["precision"] == "fp32"
                                      else "{}:{}".format(artifact["backend"], selection["precision"]))
    assert any(line.startswith("chose {} for x=1x3x96x96".format(selection["candidate"])) for line in lines)
    assert all(r["ok"] for r in rt.load(path).verify())


def test_precision_fp32_builds_no_reduced_candidate(tmp_path):
    path = edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], precision="fp32",
                          output=tmp_path / "m.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    medians = spec["artifacts"][0]["selection"]["medians_ms"]
    assert medians and not any(":" in label for label in medians)


def test_a_reduced_precision_that_misses_the_gate_is_dropped_with_its_numbers(tmp_path):
    """--max-accuracy-drop replaces the float gate: one no bf16 arithmetic can meet drops every bf16 candidate, and
    auto keeps fp32, naming the miss; asked for bf16 alone, the export fails with the numbers."""
    require(BF16_HERE, "needs a CPU with AVX512_BF16 or AMX", "run it on such a CPU (Zen 4, Cooper Lake, Sapphire "
                                                               "Rapids or newer)")
    model = str(EXAMPLES / "mobilenet_v2.py:MobileNetV2")
    path = edgedyn.export(model, inputs=["x=1x3x96x96"], max_accuracy_drop="cosine=0.9999999",
                          output=tmp_path / "m.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    selection = spec["artifacts"][0]["selection"]
    assert selection["precision"] == "fp32"
    assert "openvino:bf16 in bf16 misses --max-accuracy-drop: output_0 cosine 0.99" in selection["rejected"][
        "openvino:bf16"]
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(model, inputs=["x=1x3x96x96"], backend="openvino", precision="bf16",
                       max_accuracy_drop="cosine=0.9999999", output=tmp_path / "n.edgedyn")
    assert "misses --max-accuracy-drop: output_0 cosine" in raised.value.message
    assert not (tmp_path / "n.edgedyn").exists()


MIXED_GATE = "cosine=0.99995"


def test_a_bf16_that_misses_the_gate_keeps_its_first_layers_in_fp32(tmp_path, run_cli):
    """Where all-bf16 misses the gate, the same IR with its first layers marked fp32 is tried next (a tenth of its
    layers first): OpenVINO runs those in f32 and the rest in bf16, as its runtime model reports, and the outputs
    meet the gate on fresh inputs. auto records the all-bf16 miss beside the mixed candidate it measured."""
    require(BF16_HERE, "needs a CPU with AVX512_BF16 or AMX", "run it on such a CPU (Zen 4, Cooper Lake, Sapphire "
                                                               "Rapids or newer)")
    model, example = raw_sensor_model()
    path = edgedyn.export(model, example, backend="openvino", precision="bf16", max_accuracy_drop=MIXED_GATE,
                          output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    assert artifact["precision"] == "bf16" and artifact["openvino"]["weights"] == "fp32"
    # the first tenth rounds up to the next convolution: the first one with its bias and ReLU
    assert artifact["openvino"]["fp32_layers"] == {"first": 3, "of": 8, "share": 0.1}
    assert artifact["selection"]["candidate"] == "openvino:bf16+fp32-first-10%"
    assert artifact["requires"]["python"][0].startswith("openvino>=20")
    program = rt.load(path, threads=1)
    (spec,) = program.specializations
    assert spec.executor.describe()["computed_in"] == {"f32": 1, "bf16": 2}  # OpenVINO's own report
    assert "its first 3 of 8 layers in fp32" in precisions_summary(artifact)
    shown = run_cli("inspect", str(path))
    assert "its first 3 of 8 layers in fp32 (a mixed artifact)" in shown.stdout, shown.stdout + shown.stderr
    x = (1000.0 + np.random.default_rng(5).standard_normal((1, 3, 32, 32))).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = program(x)
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) > 20 * RTOL  # not fp32: the rest is bf16
    assert _cosine(got, want) >= 0.99995
    auto = edgedyn.export(model, example, backend="openvino", max_accuracy_drop=MIXED_GATE,
                          output=tmp_path / "a.edgedyn")
    selection = rt.read_manifest(auto)["specializations"][0]["artifacts"][0]["selection"]
    assert "openvino:bf16 in bf16 misses --max-accuracy-drop: output_0 cosine 0.9998" in selection["rejected"][
        "openvino:bf16"]
    assert "openvino:bf16+fp32-first-10%" in selection["medians_ms"]


def test_the_shares_of_fp32_layers_are_tried_half_first_then_the_smallest_that_passes():
    from edgedyn.candidates import Candidate, more_fp32

    def after(share, passed, backend="openvino", precision="bf16"):
        return [c.fp32_share for c in more_fp32(Candidate(backend, precision, share), passed)]

    assert after(0.0, False) == [0.5] and after(0.0, True) == []  # all-bf16 missed: half in fp32 next
    assert after(0.5, False) == [] and after(0.5, True) == [0.1]  # half missed: nothing will do; passed: a tenth
    assert after(0.1, False) == [0.2] and after(0.2, False) == [0.35] and after(0.35, False) == []
    assert after(0.1, True) == [] and after(0.2, True) == []
    assert after(0.0, False, backend="tflite", precision="fp16") == []  # a backend that does not mix
    assert after(0.0, False, precision="fp32") == []
    assert Candidate("openvino", "bf16", 0.35).label == "openvino:bf16+fp32-first-35%"


def precisions_summary(artifact):
    from edgedyn.quantize.precision import summary

    return summary(dict(artifact, backend="openvino"))


def test_first_layers_are_marked_fp32_in_the_ir_and_nothing_else_changes():
    from edgedyn.backends.openvino_marks import keep_first_layers_fp32

    layers = [("0", "Parameter"), ("1", "Const"), ("2", "Convolution"), ("3", "Add"), ("4", "Convert"),
              ("5", "Relu"), ("6", "Convolution"), ("7", "Result")]
    xml = '<net name="m" version="11"><layers>{}</layers><edges /></net>'.format("".join(
        '<layer id="{}" name="l{}" type="{}" version="opset1">{}</layer>'.format(
            i, i, kind, '<rt_info><attribute name="fused_names" version="0" value="x" /></rt_info>'
            if kind == "Add" else "") for i, kind in layers)).encode("utf-8")
    out, kept, total = keep_first_layers_fp32(xml, 0.5)
    assert (kept, total) == (3, 4)  # half is two; the marks end before the next convolution, not between its layers
    import xml.etree.ElementTree as ElementTree

    marked = {layer.get("type"): [a.attrib for a in layer.iter("attribute")] for layer in
              ElementTree.fromstring(out).iter("layer")}
    mark = {"name": "DisablePrecisionConversion", "version": "0", "value": "dynamic:f16"}
    # the first three that compute (Convolution, Add, Relu) marked; not the weights, Converts, inputs or outputs
    assert [len(list(layer.iter("attribute"))) for layer in ElementTree.fromstring(out).iter("layer")] == [
        0, 0, 1, 2, 0, 1, 0, 0]
    assert marked["Add"] == [{"name": "fused_names", "version": "0", "value": "x"}, mark]  # kept beside its own
    assert keep_first_layers_fp32(xml, 1.0)[1:] == (4, 4) and keep_first_layers_fp32(xml, 0.1)[1:] == (3, 4)
    from edgedyn.backends.openvino_marks import computing_groups  # the units benchmarks/mixed_layers.py marks one by one

    assert [[layer.get("id") for layer in group] for group in computing_groups(ElementTree.fromstring(xml))] == [
        ["2", "3", "5"], ["6"]]


def test_precisions_another_board_cannot_measure_here_are_refused_in_words(tmp_path, monkeypatch):
    import edgedyn.onboard

    with pytest.raises(EdgedynError) as raised:  # the Pi 4's Cortex-A72 has no fp16 arithmetic
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="raspberry-pi-4", backend="openvino",
                       precision="fp16", output=tmp_path / "m.edgedyn")
    assert raised.value.message.startswith("raspberry-pi-4's CPU has no fp16 arithmetic (it needs fphp+asimdhp")
    # The Pi 5's has: its fp16 is measured on its emulated CPU, and refused where that cannot run
    monkeypatch.setattr(edgedyn.onboard, "unavailable", lambda board: "missing qemu-aarch64 (as if not installed)")
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="raspberry-pi-5", backend="openvino",
                       precision="fp16", output=tmp_path / "m.edgedyn")
    assert raised.value.message.startswith("fp16 for raspberry-pi-5 is measured on that board's CPU")
    monkeypatch.undo()
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], backend="tvm", precision="bf16",
                       output=tmp_path / "m.edgedyn")
    assert raised.value.message == "backend tvm does not compute bf16 on a x86_64 CPU; backends that do: openvino"
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], precision="fp8")
    assert raised.value.message == "unknown precision 'fp8'; choose from: auto, fp32, bf16, fp16"


def test_the_precision_table_is_data():
    assert precisions.is_native("fp16", "aarch64", {"fp16"})  # a board file's word
    assert precisions.is_native("fp16", "aarch64", {"fphp", "asimdhp"})  # Linux's
    assert not precisions.is_native("fp16", "aarch64", {"fphp"})
    assert precisions.is_native("bf16", "x86_64", {"amx_bf16"}) and not precisions.is_native("bf16", "aarch64",
                                                                                              {"amx_bf16"})
    assert precisions.effective("fp16", "aarch64", {"asimd"}) == (
        "fp32", "fp16 artifact computes in fp32 here: this CPU lacks fphp+asimdhp")
    assert precisions.effective("bf16", "x86_64", {"avx512_bf16"}) == ("bf16", None)
    # fp16 on x86 is AMX-FP16's: with AVX512-FP16 alone (Sapphire Rapids) OpenVINO's f16 was slower than its f32
    assert precisions.is_native("fp16", "x86_64", {"amx_fp16"})
    assert not precisions.is_native("fp16", "x86_64", {"avx512_fp16", "amx_bf16", "avx512_bf16"})


def _ir(openvino_bundle) -> tuple:
    import zipfile

    with zipfile.ZipFile(str(openvino_bundle("tiny_cnn"))) as archive:
        names = archive.namelist()
        xml = archive.read(next(n for n in names if n.endswith("model.xml")))
        weights = archive.read(next(n for n in names if n.endswith("weights.bin")))
    return xml, weights


@pytest.mark.parametrize("edit, words", [
    (lambda x: x.replace(b"<net", b'<!DOCTYPE net [<!ENTITY a "aa">]><net', 1), "declares a DOCTYPE or entities"),
    (lambda x: x.replace(b'offset="0"', b'offset="99999999"', 1), "lie outside the"),
    (lambda x: x.replace(b"<dim>64</dim>", b"<dim>6400000000</dim>", 1), "far above the"),
    (lambda x: x.replace(b"<dim>64</dim>", b"<dim>-1</dim>", 1), "is negative"),
    (lambda x: x.replace(b'version="11"', b'version="99"', 1), "expected an OpenVINO IR"),
    (lambda x: x[: len(x) // 2], "does not parse"),
])
def test_the_ir_is_checked_before_openvino_reads_it(openvino_bundle, edit, words):
    xml, weights = _ir(openvino_bundle)
    check_ir(xml, len(weights), None, "m")  # the real one passes
    with pytest.raises(BundleError) as raised:
        check_ir(edit(xml), len(weights), None, "bundle m.edgedyn: model.xml")
    assert raised.value.message.startswith("bundle m.edgedyn: model.xml is not a valid OpenVINO IR: ")
    assert words in raised.value.message


@pytest.mark.parametrize("edit", [
    lambda x: x.replace(b'type="Convolution"', b'type="NoSuchOperation"', 1),
    lambda x: x.replace(b'to-port="0"', b'to-port="7"', 1),
])
def test_an_ir_that_passes_the_checks_but_openvino_refuses_is_a_bundle_error(openvino_bundle, edit):
    """What check_ir cannot know (an op OpenVINO lacks, an edge to no port) OpenVINO refuses at compile: the
    executor says so as a BundleError naming the file, never OpenVINO's own exception."""
    from edgedyn.backends.artifact import Artifact, open_executor

    xml, weights = _ir(openvino_bundle)
    broken = edit(xml)
    assert broken != xml
    check_ir(broken, len(weights), None, "m")
    record = rt.read_manifest(openvino_bundle("tiny_cnn"))["specializations"][0]["artifacts"][0]
    artifact = Artifact(backend="openvino", executor="openvino", device="cpu", arch=None, target=record["target"],
                        files={"model": broken, "weights": weights},
                        file_names={"model": "model.xml", "weights": "weights.bin"},
                        meta={key: record[key] for key in ("input_names", "output_names", "precision", "openvino")})
    with pytest.raises(BundleError) as raised:
        with open_executor(artifact):
            pass
    assert "could not compile model/model.xml" in raised.value.message, raised.value.message


def test_only_layers_fed_by_nms_may_have_a_dynamic_dim():
    """NonMaxSuppression returns as many rows as survive ([-1, 3]); the layers that pad those rows see -1 too. A -1
    anywhere else is refused, and a dynamic port counts as the most rows NMS can return."""
    def layer(key, kind, inputs, outputs):
        ports = lambda dims_list, first: "".join(  # noqa: E731
            '<port id="{}" precision="FP32">{}</port>'.format(first + i, "".join("<dim>{}</dim>".format(d) for d in dims))
            for i, dims in enumerate(dims_list))
        return '<layer id="{}" name="l{}" type="{}" version="opset1"><input>{}</input><output>{}</output></layer>'.format(
            key, key, kind, ports(inputs, 0), ports(outputs, len(inputs)))

    def net(after_nms_kind, source_of_dynamic):
        layers = [layer(0, "Parameter", [], [[1, 2100, 4]]), layer(1, "Parameter", [], [[1, 80, 2100]]),
                  layer(2, "NonMaxSuppression", [[1, 2100, 4], [1, 80, 2100]], [[-1, 3]]),
                  layer(3, after_nms_kind, [[-1, 3]], [[300, 3]]), layer(4, "Result", [[300, 3]], [])]
        edges = [(0, 0, 2, 0), (1, 0, 2, 1), (source_of_dynamic, 2, 3, 0), (3, 1, 4, 0)]
        return ('<net name="n" version="11"><layers>{}</layers><edges>{}</edges></net>'.format(
            "".join(layers), "".join('<edge from-layer="{}" from-port="{}" to-layer="{}" to-port="{}"/>'.format(*e)
                                     for e in edges))).encode()

    assert check_ir(net("Pad", 2), 0, 10 << 20, "m") >= 80 * 2100 * 3 * 4  # the -1 counted as 80 x 2100 rows
    with pytest.raises(BundleError, match=r"layer l3 \(Pad\) port dim: -1 is negative"):
        check_ir(net("Pad", 1), 0, 10 << 20, "m")  # fed by a static port: its -1 is not NMS's


def test_board_properties_reach_the_artifact_and_bad_ones_are_refused(tmp_path):
    from edgedyn.boards import load_board
    from edgedyn.runtime.executors.openvino import properties

    assert properties({}) == {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    with pytest.raises(BundleError) as raised:
        properties({"openvino": {"properties": {"CACHE_DIR": "/tmp"}}})
    assert "openvino.properties: CACHE_DIR = /tmp is not allowed" in raised.value.message
    board = dataclasses.replace(load_board("x86-64"), openvino_properties={"ENABLE_CPU_PINNING": False})
    from edgedyn.backends.openvino import board_properties

    assert board_properties(board) == {"ENABLE_CPU_PINNING": False}



def test_int8_float_layers_take_the_reduced_precision_the_measuring_cpu_has_on_backends_that_take_one():
    from edgedyn.boards import load_board
    from edgedyn.candidates import int8_floats

    x86, pi5 = load_board("x86-64"), load_board("raspberry-pi-5")
    bf16 = frozenset({"avx512f", "avx512_bf16"})
    assert int8_floats("openvino", x86, "auto", bf16) == "bf16"
    assert int8_floats("openvino", x86, "fp32", bf16) == "fp32"  # --precision fp32 keeps every float layer fp32
    assert int8_floats("openvino", x86, "auto", frozenset({"avx2", "fma"})) == "fp32"  # never estimated
    assert int8_floats("onnxruntime", x86, "auto", bf16) == "fp32"  # its float islands are fp32 kernels
    assert int8_floats("openvino", pi5, "auto", frozenset({"asimd", "fphp", "asimdhp"})) == "fp16"
    assert int8_floats("openvino", pi5, "auto", frozenset()) == "fp32"  # no emulated board to measure fp16 on

class _Wide(torch.nn.Module):
    """Weights far larger than its activations (16 MB of fp32 weights, 4 KB of activations), as a language model's
    or a classifier head's are: its int8 IR declares the weights again as f32 where they are dequantized."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(512, 4096), torch.nn.Linear(4096, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.mark.requires("nncf")
def test_int8_through_nncf_loads_and_agrees_with_torch_on_fresh_inputs(tmp_path):
    model = _Wide().eval()
    path = edgedyn.export(model, inputs=["x=1x512"], backend="openvino", quantize="int8", calibration="random",
                          output=tmp_path / "wide-int8.edgedyn")
    program = rt.load(path)
    spec = program.specializations[0]
    assert (spec.artifact["backend"], spec.artifact["quantization"]["mode"]) == ("openvino", "int8")
    assert "NNCF" in spec.artifact["quantization"]["scheme"]
    rng = np.random.default_rng(21)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy().ravel()
    got = np.asarray(program(x)).ravel()
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine >= 0.99, cosine  # the --quantize default gate
    assert all(r["ok"] for r in program.verify())


class _SkewedStem(torch.nn.Module):
    """A CNN whose stem sees one channel of a far wider range than the others (exp of the input, times 30) while its
    weights barely read that channel: int8's one scale per tensor leaves the other channels a step or two, so every
    layer in int8 misses the gate, and the stem in float meets it (the later layers are ordinary). No biases and no
    pooling: the output (a feature map) moves with the input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        with torch.no_grad():
            self.stem.weight[:, 0] *= 1e-3
        layers = []  # type: list
        for _ in range(5):
            layers += [torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)]
        self.body = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skewed = torch.cat([torch.exp(x[:, :1]) * 30, x[:, 1:]], dim=1)
        return self.body(self.stem(skewed))


@pytest.mark.requires("nncf")
def test_int8_keeps_its_first_layers_float_when_every_layer_in_int8_misses_the_gate(tmp_path):
    from edgedyn.candidates import int8_floats
    from edgedyn.boards import load_board
    from edgedyn.runtime.precision import host_features
    from edgedyn.backends.openvino_int8 import FLOAT_FIRST

    model = _SkewedStem().eval()
    path = edgedyn.export(model, inputs=["x=1x3x32x32"], backend="openvino", quantize="int8", calibration="random",
                          output=tmp_path / "skewed-int8.edgedyn")
    artifact = rt.load(path).specializations[0].artifact
    quantization = artifact["quantization"]
    first = quantization["float_first"]
    assert first["share"] in FLOAT_FIRST[1:] and 0 < first["first"] < first["of"], first
    floats = int8_floats("openvino", load_board("x86-64"), "auto", host_features())
    assert quantization["float_precision"] == artifact["precision"] == floats
    if first.get("fp32_first"):  # the prefix, or its first tenth of the network, marked to stay fp32 in the IR
        assert artifact["openvino"]["fp32_layers"]["first"] == first["fp32_first"] <= first["first"]
        assert (first["computes_in"] == "fp32") == (first["fp32_first"] == first["first"]), first
    import zipfile

    import openvino

    from edgedyn.backends.openvino_int8 import _fed_by_fake_quantize

    with zipfile.ZipFile(str(path)) as archive:
        names = archive.namelist()
        xml = archive.read(next(n for n in names if n.endswith("model.xml")))
        weights = archive.read(next(n for n in names if n.endswith("weights.bin")))
    ir = openvino.Core().read_model(xml, openvino.Tensor(np.frombuffer(weights, np.uint8)))
    convolutions = [op for op in ir.get_ordered_ops() if op.get_type_name() == "Convolution"]
    assert not _fed_by_fake_quantize(convolutions[0]) and _fed_by_fake_quantize(convolutions[-1])  # float, then int8
    program = rt.load(path)
    rng = np.random.default_rng(5)
    cosines = []
    for _ in range(8):
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy().ravel()
        got = np.asarray(program(x)).ravel()
        cosines.append(float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))))
    assert np.mean(cosines) >= 0.99, cosines  # the --quantize default gate, on inputs the export never saw
    assert all(r["ok"] for r in program.verify())


def _ir_of(consts: list, activations: int) -> bytes:
    """An IR of Consts (element type, values, offset) and one f32 Parameter of `activations` values."""
    layers = "".join(
        '<layer id="{i}" name="w{i}" type="Const" version="opset1"><data element_type="{t}" shape="{n}" '
        'offset="{o}" size="{s}"/><output><port id="0" precision="{t}"><dim>{n}</dim></port></output></layer>'.format(
            i=i, t=t, n=n, o=o, s=n * {"i8": 1, "f32": 4}[t]) for i, (t, n, o) in enumerate(consts))
    layers += ('<layer id="{}" name="x" type="Parameter" version="opset1"><data shape="1,{n}" element_type="f32"/>'
               '<output><port id="0" precision="FP32"><dim>1</dim><dim>{n}</dim></port></output></layer>').format(
                   len(consts), n=activations)
    return '<?xml version="1.0"?><net name="t" version="11"><layers>{}</layers><edges/></net>'.format(layers).encode()


def test_the_ir_bound_without_the_manifests_count_reads_int8_weights_as_fp32_values_each_counted_once():
    """The export checks a candidate before any manifest exists: its IR's tensors are then bounded by its weights.
    An int8 IR's weights take a quarter of the bytes for the same activations (YOLO11n at 640 in int8 was refused),
    so the bound counts weight values as fp32; Consts that share bytes count them once."""
    from edgedyn.runtime.executors.openvino_ir import check_ir

    int8 = [("i8", 1000, 0)]
    assert check_ir(_ir_of(int8, 300000), 1000, None, "t") == 1000 + 4 * 300000  # refused at 16x the i8 bytes
    with pytest.raises(rt.BundleError, match="far above"):
        check_ir(_ir_of(int8, 400000), 1000, None, "t")
    with pytest.raises(rt.BundleError, match="far above"):  # the same bytes, fifty times over, raise nothing
        check_ir(_ir_of([("i8", 1000, 0)] * 50, 300000 + 250000), 1000, None, "t")
    with pytest.raises(rt.BundleError, match="far above"):  # fp32 weights of the same bytes: as before
        check_ir(_ir_of([("f32", 250, 0)], 300000), 1000, None, "t")
    assert check_ir(_ir_of(int8, 400000), 1000, 10 ** 6, "t")  # the manifest's count, where there is one


@pytest.mark.requires("nncf")
def test_a_convolution_after_a_concat_of_int8_tensors_is_int8_not_listed_float():
    """NNCF quantizes before a Concat or Split, not after: the convolution behind it computes int8 with no
    FakeQuantize of its own, and the manifest must not list it as float (YOLO11n's int8 listed 31 such)."""
    import openvino
    import openvino.opset13 as ops

    from edgedyn.backends.openvino_int8 import _float_computing

    x = ops.parameter([1, 4, 8, 8], np.float32, name="x")
    low, high = ops.constant(np.float32(-4)), ops.constant(np.float32(4))

    def quantized(value):
        return ops.fake_quantize(value, low, high, low, high, 256)

    def convolution(value, name):
        weight = ops.constant(np.random.default_rng(0).standard_normal((4, value.shape[1], 1, 1)).astype(np.float32))
        op = ops.convolution(value, weight, [1, 1], [0, 0], [0, 0], [1, 1])
        op.set_friendly_name(name)
        return op

    joined = ops.concat([quantized(x), quantized(ops.relu(x))], 1)
    behind_concat = convolution(joined, "behind_concat")
    float_one = convolution(ops.concat([quantized(x), ops.relu(x)], 1), "half_float_concat")
    plain = convolution(ops.relu(x), "no_fake_quantize")
    model = openvino.Model([behind_concat, float_one, plain], [x])
    assert _float_computing(model) == ["half_float_concat", "no_fake_quantize"]


def test_a_reduced_float_prefix_that_misses_marks_its_first_tenth_fp32_before_all_of_it():
    from edgedyn.backends.openvino_int8 import fp32_parts

    assert fp32_parts(["a", "b"], ["a", "b", "c", "d"]) == [["a", "b"], ["a", "b", "c", "d"]]
    assert fp32_parts(["a", "b"], ["a", "b"]) == [["a", "b"]]  # the prefix is the tenth: tried once
    assert fp32_parts([], ["a"]) == [["a"]]
