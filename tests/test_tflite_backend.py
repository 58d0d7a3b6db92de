"""The tflite backend end to end: examples and reference models verify, errors name the op and the user's line."""
import builtins
import importlib

import pytest
import torch
from torch import nn

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import BackendError

from conftest import ALL_MODELS, EXAMPLES, RTOL, assert_matches_torch

pytestmark = pytest.mark.requires("ai_edge_litert", "tflite")


@pytest.fixture(scope="module")
def tflite_bundle(export_example):
    """A model exported with --backend tflite (once per session, through the shared fixture)."""
    return lambda name: export_example(name, backend="tflite")


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_model_matches_torch_on_fresh_inputs(tflite_bundle, name):
    assert_matches_torch(rt.load(tflite_bundle(name), threads=2), name, seed=2024)


@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_model_bundle_is_portable_and_verifies(tflite_bundle, name):
    bundle = tflite_bundle(name)
    for spec in rt.read_manifest(bundle)["specializations"]:
        (artifact,) = spec["artifacts"]
        assert (artifact["backend"], artifact["executor"], artifact["arch"]) == ("tflite", "litert", None)
        assert artifact["tolerance"] == {"rtol": 1e-4, "atol": 1e-6}
    results = rt.load(bundle).verify()
    assert results and all(r["ok"] and r["max_rel"] < RTOL for r in results), results


def test_mobilenet_runs_nhwc_inside_with_one_transpose(tflite_bundle):
    """Layout conversion happens once at the input; the flatten of the 1x1 map costs no transpose."""
    (spec,) = rt.read_manifest(tflite_bundle("mobilenet_v2"))["specializations"]
    artifact = spec["artifacts"][0]
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MEAN"} <= set(artifact["tflite_ops"])
    bundle = rt.Bundle(tflite_bundle("mobilenet_v2"))
    model = importlib.import_module("tflite.Model").Model.GetRootAs(bundle.read(artifact["files"]["model"]))
    codes = [model.OperatorCodes(i).BuiltinCode() for i in range(model.OperatorCodesLength())]
    subgraph = model.Subgraphs(0)
    ops = [codes[subgraph.Operators(i).OpcodeIndex()] for i in range(subgraph.OperatorsLength())]
    transpose = importlib.import_module("tflite.BuiltinOperator").BuiltinOperator.TRANSPOSE
    assert ops.count(transpose) == 1
    # the interface is the torch model's: NCHW in, logits out
    assert list(subgraph.Tensors(subgraph.Inputs(0)).ShapeAsNumpy()) == [1, 3, 96, 96]
    assert list(subgraph.Tensors(subgraph.Outputs(0)).ShapeAsNumpy()) == [1, 1000]


def test_activations_are_fused_into_the_ops_before_them(tflite_bundle):
    """Every ReLU6 of MobileNetV2 follows a convolution and is its fused_activation_function, as TFLite's own
    converter writes it: no RELU6 operator (and no tensor for it) is left in the file."""
    (spec,) = rt.read_manifest(tflite_bundle("mobilenet_v2"))["specializations"]
    ops = spec["artifacts"][0]["tflite_ops"]
    assert {"CONV_2D", "DEPTHWISE_CONV_2D"} <= set(ops) and not {"RELU", "RELU6"} & set(ops), ops


def test_mlp_has_one_model_per_batch_size(tflite_bundle):
    manifest = rt.read_manifest(tflite_bundle("mlp"))
    shapes = [s["inputs"][0]["shape"] for s in manifest["specializations"]]
    assert shapes == [[1, 64], [8, 64]]


def test_cli_export_and_verify(run_cli, tmp_path):
    bundle = tmp_path / "cnn.edgedyn"
    result = run_cli("export", str(EXAMPLES / "tiny_cnn.py:TinyCNN"), "--input", "x=1x3x64x64",
                     "--backend", "tflite", "-o", str(bundle))
    assert result.returncode == 0, result.stderr
    assert "(tflite)" in result.stderr
    result = run_cli("verify", str(bundle), "--threads", "2")
    assert result.returncode == 0, result.stderr
    assert "verified 1 output(s) of 1 specialization(s)" in result.stderr


class Unsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x) * 0.5
        return torch.erfinv(y) + torch.cumprod(y, 0)


class Upsampler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 3, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


class PoolWithIndices(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
        return values + indices.float()


def _export_error(model, example, tmp_path):
    with pytest.raises(BackendError) as caught:
        edgedyn.export(model, example, backend="tflite", output=tmp_path / "x.edgedyn")
    return caught.value


def test_unsupported_op_names_the_op_the_line_and_other_backends(tmp_path):
    error = _export_error(Unsupported(), (torch.randn(2, 5),), tmp_path)
    assert error.message.startswith("the tflite backend cannot express aten.erfinv.default "
                                    "(no TFLite converter for this op), at ")
    assert "test_tflite_backend.py:" in error.message
    assert "in forward: return torch.erfinv(y) + torch.cumprod(y, 0)" in error.message
    assert error.message.endswith("; this graph also uses: aten.cumprod.default")
    assert error.hint.startswith("backends that support it: ")
    assert "tvm" in error.hint and "export with --backend " in error.hint
    assert "docs/tflite.md" in error.hint


def test_unsupported_case_of_a_supported_op(tmp_path):
    error = _export_error(Upsampler(), (torch.randn(1, 3, 8, 8),), tmp_path)
    assert "cannot express aten.convolution.default (transposed convolution (ConvTranspose2d))" in error.message
    assert "in forward: return self.up(x)" in error.message


def test_unsupported_second_output(tmp_path):
    error = _export_error(PoolWithIndices(), (torch.randn(1, 3, 8, 8),), tmp_path)
    assert "output 1 of aten.max_pool2d_with_indices.default is not supported, only output 0" in error.message
    assert "values, indices = nn.functional.max_pool2d(x, 2, return_indices=True)" in error.message


def test_unsupported_op_through_the_cli(run_cli, tmp_path):
    model = tmp_path / "inverse.py"
    model.write_text("import torch\n\n\nclass Inverse(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return torch.erfinv(x)\n")
    result = run_cli("export", "{}:Inverse".format(model), "--input", "x=4x3", "--backend", "tflite",
                     "-o", str(tmp_path / "c.edgedyn"), env={"COLUMNS": "400"})
    assert result.returncode == 2
    assert "error: the tflite backend cannot express aten.erfinv.default" in result.stderr
    assert "{}:6 in forward: return torch.erfinv(x)".format(model) in result.stderr
    assert "hint: backends that support it:" in result.stderr
    assert "Traceback" not in result.stderr


def test_function_models_name_the_users_line_too(tmp_path):
    def inverse(x):
        return torch.erfinv(x)  # the line the error must point at

    line = inverse.__code__.co_firstlineno + 1
    error = _export_error(inverse, (torch.randn(4, 3),), tmp_path)
    assert "cannot express aten.erfinv.default (no TFLite converter for this op), at tests/test_tflite_backend.py:" \
           "{} in inverse: return torch.erfinv(x)".format(line) in error.message


def test_missing_litert_names_the_install_command(tflite_bundle, monkeypatch):
    real_import = builtins.__import__

    def no_litert(name, *args, **kwargs):
        if name.startswith(("ai_edge_litert", "tflite_runtime")):
            raise ImportError("No module named {!r}".format(name))
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_litert)
    with pytest.raises(rt.MissingDependencyError) as caught:
        rt.load(tflite_bundle("tiny_cnn"))
    assert "this bundle runs on LiteRT, but ai-edge-litert is not installed" in caught.value.message
    assert caught.value.hint.startswith("pip install 'edgedyn[litert]'")


def test_a_file_reversing_both_axes_at_once_is_refused_on_tflite_runtime(monkeypatch):
    """tflite-runtime reverses only the first axis of a REVERSE_V2 given several (mirror.py): a file exported for a
    board with LiteRT says so in its manifest, and the executor refuses it there rather than compute wrong."""
    from ai_edge_litert.interpreter import Interpreter

    from edgedyn.runtime.executors import litert

    monkeypatch.setattr(litert, "_interpreter_class", lambda: (Interpreter, "tflite-runtime"))
    with pytest.raises(rt.MissingDependencyError) as caught:
        litert.LiteRtExecutor(None, {litert.REVERSES_AT_ONCE: True, "files": {"model": "model/model.tflite"}}, {})
    assert "reverses several axes in one REVERSE_V2, which tflite-runtime computes wrong" in caught.value.message
    assert "ai-edge-litert" in caught.value.hint


def test_threads_option_reaches_the_interpreter(tflite_bundle):
    program = rt.load(tflite_bundle("tiny_cnn"), threads=1)
    described = program.specializations[0].executor.describe()
    assert described["threads"] == 1 and described["runtime"] == "ai-edge-litert"
