"""Every zoo model, held as users hold it, exported for x86-64 and compared with torch eager on fresh inputs."""
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from edgedyn import zoo

pytestmark = pytest.mark.requires("transformers")

# One model per family the default run must keep (cnn, encoder, detector); the others are `zoo_full`.
PARAMS = [pytest.param(name, marks=() if zoo.get(name).fast else pytest.mark.zoo_full, id=name)
          for name in zoo.names()]
FRESH_SEED = 1234  # not the seed the capture drew its example inputs with


def _numpy(values: Dict[str, Any]) -> Dict[str, np.ndarray]:
    return {name: tensor.numpy() for name, tensor in values.items()}


@pytest.mark.parametrize("name", PARAMS)
def test_zoo_model_matches_torch_eager_on_fresh_inputs(name: str, tmp_path: Path) -> None:
    check_against_eager(name, "onnxruntime", tmp_path)


@pytest.mark.zoo_full
def test_swin_on_onnxruntime_keeps_its_high_level_graph(tmp_path: Path) -> None:
    """Swin's windowed attention once failed torch's ONNX exporter when it ran under autograd (a view of a
    non-contiguous tensor); exported as inference, the high-level graph converts and its attention is fused (the
    comparison with eager is the parametrized test's)."""
    import edgedyn
    import edgedyn.runtime as rt

    path = edgedyn.export(zoo.build("swin"), zoo.example_inputs("swin", seed=0), board="x86-64",
                          backend="onnxruntime", output=tmp_path / "swin.edgedyn")
    artifact = rt.load(path).specializations[0].artifact
    assert "onnx_graph" not in artifact
    assert artifact["onnx_rewrites"]["attention_fused"] >= 1


def test_a_high_level_graph_the_exporter_refuses_is_lowered_from_core_aten_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When torch's exporter cannot convert the high-level graph, the backend exports the core-ATen one, the
    manifest says so and why, and the bundle still matches eager on fresh inputs."""
    import edgedyn.runtime as rt
    from edgedyn.backends import onnxruntime as backend
    from edgedyn.errors import BackendError

    real_export = backend._export

    def refuse_high_level(onnx: Any, program: Any, *args: Any) -> Any:
        targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
        if any(".linear." in target for target in targets):  # core ATen has no linear: it is addmm there
            raise BackendError("torch's ONNX exporter cannot convert this graph: ValueError: refused for the test")
        return real_export(onnx, program, *args)

    monkeypatch.setattr(backend, "_export", refuse_high_level)
    check_against_eager("vit", "onnxruntime", tmp_path)
    lowered = rt.load(tmp_path / "vit.edgedyn").specializations[0].artifact["onnx_graph"]
    assert lowered["lowered_from"].startswith("core ATen") and "refused for the test" in lowered["why"]


def check_against_eager(name: str, backend: str, tmp_path: Path) -> None:
    import torch

    import edgedyn
    import edgedyn.runtime as rt

    record = zoo.get(name)
    model = zoo.build(name)
    path = edgedyn.export(model, zoo.example_inputs(name, seed=0), board="x86-64", backend=backend,
                          output=tmp_path / "{}.edgedyn".format(name))
    program = rt.load(path)
    spec = program.specializations[0]
    assert [o["name"] for o in spec.record["outputs"]] == list(record.outputs)
    # Scalar defaults (interpolate_pos_encoding=False, logits_to_keep=0) are guarded constants beside the tensors.
    assert [p["name"] for p in program.signature if p["kind"] == "tensor"] == [i.name for i in record.inputs]

    fresh = zoo.example_inputs(name, seed=FRESH_SEED)
    actual = program(**_numpy(fresh))
    with torch.no_grad():
        expected = model(**fresh)
        other = model(**zoo.example_inputs(name, seed=FRESH_SEED + 1))
    assert isinstance(actual, dict) and list(actual) == list(record.outputs)
    for key in record.outputs:
        want = expected[key].numpy()
        scale = float(np.abs(want).max())
        # The comparison means something only if the output moves with the input by far more than the tolerance.
        assert float(np.abs(other[key].numpy() - want).max()) > 100 * record.rtol * scale, key
        np.testing.assert_allclose(actual[key], want, rtol=record.rtol, atol=record.rtol * scale,
                                   err_msg="{} output {}".format(name, key))


def test_zoo_records_are_complete() -> None:
    assert len(zoo.names()) >= 12
    assert {zoo.get(n).family for n in zoo.names()} <= set(zoo.FAMILIES)
    fast = {zoo.get(n).family for n in zoo.names() if zoo.get(n).fast}
    assert {"cnn", "encoder", "detector"} <= fast
    for name in zoo.names():
        record = zoo.get(name)
        assert record.outputs and record.inputs and record.description
        for spec in record.inputs:
            assert (spec.high is not None) == spec.dtype.startswith("int"), (name, spec)


def test_token_ids_are_int64_and_in_range() -> None:
    ids = zoo.example_inputs("gpt2", seed=3)["input_ids"]
    assert str(ids.dtype) == "torch.int64"
    assert int(ids.min()) >= 0 and int(ids.max()) < zoo.get("gpt2").inputs[0].high
    assert zoo.input_options("gpt2") == ["input_ids=1x16:int64"]


def test_build_is_deterministic_and_leaves_the_global_generator_alone() -> None:
    import torch

    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    first = zoo.build("vit")
    assert torch.equal(torch.rand(1), before)
    second = zoo.build("vit")
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), key


def test_build_is_the_same_in_a_fresh_process(tmp_path: Path) -> None:
    """Bundles, ONNX files and benchmark workers are made in other processes than the model they are checked with."""
    import subprocess
    import sys

    import torch

    # The child runs one torch thread, the parent as many as it has: the build must not depend on the count.
    script = ("import torch, sys; torch.set_num_threads(1); from edgedyn import zoo; "
              "torch.save(zoo.build('segformer').state_dict(), sys.argv[1])")
    path = tmp_path / "state.pt"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, cwd=str(Path(__file__).parents[1]))
    theirs = torch.load(str(path))
    for key, value in zoo.build("segformer").state_dict().items():
        assert torch.equal(value, theirs[key]), key


def test_unknown_zoo_model_lists_the_names() -> None:
    from edgedyn.errors import EdgedynError

    with pytest.raises(EdgedynError, match="unknown zoo model 'resnet5'; choose from: resnet, mobilenet_v2"):
        zoo.get("resnet5")


def test_onnx_file_of_a_zoo_model_exports_and_matches_eager(tmp_path: Path) -> None:
    """DistilBERT's ONNX file holds its linear layers as MatMul + Add (onnxruntime 1.32 rejected those re-exported)."""
    import contextlib
    import io

    import torch

    import edgedyn
    import edgedyn.runtime as rt

    model = zoo.build("distilbert")
    path = tmp_path / "distilbert.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, (), str(path), kwargs=zoo.example_inputs("distilbert", seed=0), dynamo=True,
                          external_data=False)
    program = rt.load(edgedyn.export(str(path), backend="onnxruntime", output=tmp_path / "distilbert.edgedyn"))
    fresh = zoo.example_inputs("distilbert", seed=FRESH_SEED)
    (got,) = program(**_numpy(fresh)).values()
    with torch.no_grad():
        want = model(**fresh)["logits"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
