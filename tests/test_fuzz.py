"""A bounded fuzz run over real bundles of every backend (scripts/fuzz.py runs the long campaign).

Byte flips, truncation, zip edits, manifest edits and checksum-consistent tampering of every member kind: each
mutant is loaded, called once and verified in a worker process, which must never crash, raise anything but an
EdgedynError, or grow its peak RSS by more than twice the bundle's declared sizes over the unmutated bundle's cost.
Tampered TVM libraries are native code that dlopen runs: counted, not judged (docs/robustness.md).
"""
import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
MUTANTS = {"portable": 40, "onnxruntime": 40, "openvino": 40, "ncnn": 60, "tflite": 40, "tvm": 25}


def _fuzz() -> Any:
    spec = importlib.util.spec_from_file_location("edgedyn_fuzz", str(REPO / "scripts" / "fuzz.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("backend", sorted(MUTANTS))
def test_mutated_bundles_are_refused_cleanly(export_example: Any, backend: str) -> None:
    fuzz = _fuzz()
    bundle = export_example("tiny_cnn", backend=backend)
    records = fuzz.campaign([bundle], MUTANTS[backend], seed=sum(map(ord, backend)))
    families = {record["family"] for record in records}
    assert {"zip", "manifest", "tamper-npz"} <= families and families & {"bytes", "truncate"}, families
    assert sum(record["outcome"] == "refused" for record in records) >= len(records) // 3  # the mutants bite
    bad = fuzz.findings(records)
    assert not bad, "{} of {} mutants broke a rule:\n{}".format(len(bad), len(records), "\n".join(
        "{family} {mutation}: {outcome} {type} rss {rss_growth} > {limit}? stdout {stdout!r}".format(
            type=r.get("type"), stdout=r.get("stdout", ""), **r)
        for r in bad[:10]))


@pytest.mark.parametrize("backend", ["tvm", "portable"])
def test_signed_bundles_refuse_every_tampered_mutant_before_parsing(export_example: Any, backend: str) -> None:
    """Trusting one key, every changed manifest or member (TVM libraries included) is a SignatureError."""
    fuzz = _fuzz()
    records = fuzz.campaign([export_example("tiny_cnn", backend=backend)], 15, seed=7, signed=True)
    assert {"manifest", "native" if backend == "tvm" else "tamper-json"} <= {r["family"] for r in records}
    bad = fuzz.findings(records)
    assert not bad, [(r["family"], r["mutation"], r["outcome"], r.get("type")) for r in bad[:10]]


def test_findings_judge_native_code_apart(tmp_path: Path) -> None:
    """A crash is a finding unless native code from a tampered TVM library ran; a wrong exception always is."""
    fuzz = _fuzz()
    result = fuzz.run_one(str(tmp_path))  # a directory, not a bundle: refused as an EdgedynError
    assert result["outcome"] == "refused", result
    base = dict(result, limit=1 << 30)
    assert fuzz.findings([dict(base, family="zip")]) == []
    assert fuzz.findings([dict(base, family="zip", outcome="wrong-exception")])
    assert fuzz.findings([dict(base, family="tamper-npz", outcome="crash")])
    assert fuzz.findings([dict(base, family="native", outcome="crash")]) == []
    assert fuzz.findings([dict(base, family="zip", rss_growth=2 << 30)])


def test_a_model_onnxruntime_cannot_load_is_refused_without_printing(export_example: Any, tmp_path: Path,
                                                                      capfd: Any) -> None:
    """onnxruntime retries a failed session "on the CPU" and says so on stdout; a CPU session has nothing to retry,
    and the runtime's stdout is the caller's (`edgedyn run --json`, pipes)."""
    import json

    import edgedyn.runtime as rt

    fuzz = _fuzz()
    members = fuzz.read_members(export_example("tiny_cnn", backend="onnxruntime").read_bytes())
    manifest = json.loads(dict(members)[fuzz.MANIFEST])
    models = [name for name, _ in members if name.endswith(".onnx")]
    assert models, [name for name, _ in members]
    broken = [(name, _not_utf8(content) if name in models else content) for name, content in members]
    path = tmp_path / "broken.edgedyn"
    path.write_bytes(fuzz.resealed(broken, manifest))
    capfd.readouterr()
    with pytest.raises(rt.EdgedynError):
        program = rt.load(str(path))
        program(**{record["name"]: _random(record) for record in program.specializations[0].record["inputs"]})
    assert capfd.readouterr().out == ""


def _not_utf8(model: bytes) -> bytes:
    """The model with an operator named in bytes that are not UTF-8: onnxruntime's error message quotes the name and
    its Python layer fails to decode the message (a ValueError, the kind it retries "on the CPU"); a
    checksum-consistent fuzz mutant found this."""
    import onnx

    proto = onnx.load_from_string(model)
    proto.graph.node[0].op_type = "edgedyn-marker"
    return proto.SerializeToString().replace(b"edgedyn-marker", b"\xff\xfe" * 7)


def _random(record: Any) -> Any:
    import numpy as np

    return np.random.default_rng(1).standard_normal(record["shape"]).astype(record["dtype"])


def test_crafted_tflite_operators_that_crash_litert_are_refused_by_the_reader() -> None:
    """scripts/fuzz_tflite_ops.py, bounded: single-operator files with crafted integer inputs, each run by LiteRT in
    a process of its own; a file that crashes LiteRT must be one the runtime's reader refuses (exit status 0), and
    this seed's 16 reversals include one that crashes it (a REVERSE_V2 without an axis)."""
    import subprocess
    import sys

    from conftest import require_module

    require_module("ai_edge_litert", "LiteRT runs the crafted files")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz_tflite_ops.py"), "--ops", "REVERSE_V2,TRANSPOSE",
                          "--files", "16"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "REVERSE_V2       16 files    1 crashed LiteRT    1 of those refused" in run.stdout, run.stdout
