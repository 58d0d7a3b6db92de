"""Capture: loading models, parsing --input, guards, specializations and the errors users see."""
import operator
from pathlib import Path

import pytest
import torch

import edgedyn
from edgedyn.errors import CaptureError
from edgedyn.frontend.inputs import TensorSpec, parse_input_options, parse_value

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def loop_example(x, n):
    for i in range(1, n + 1):
        x = x * i
    return x


def test_loop_example_unrolls_into_four_multiplications_and_guards_n():
    captured = edgedyn.capture(loop_example, (torch.randn(2, 3), 4))
    (spec,) = captured.specializations
    ops = [node.target for node in spec.program.graph.nodes if node.op == "call_function"]
    assert ops == [torch.ops.aten.mul.Tensor] * 4
    factors = [node.args[1] for node in spec.program.graph.nodes if node.op == "call_function"]
    assert factors == [1, 2, 3, 4]
    assert {"kind": "constant", "input": "n", "type": "int", "expected": 4, "source": "example_inputs n=4"} in spec.guards
    assert spec.constants == {"n": 4}
    assert spec.tensor_inputs == ["x"]


@pytest.mark.parametrize("text, expected", [
    ("1x3x224x224", TensorSpec((1, 3, 224, 224), "float32")),
    ("1x3:float16", TensorSpec((1, 3), "float16")),
    ("8:int64", TensorSpec((8,), "int64")),
    ("scalar", TensorSpec((), "float32")),
    ("4", 4),
    ("-2", -2),
    ("0.5", 0.5),
    ("true", True),
    ("False", False),
])
def test_parse_value(text, expected):
    assert parse_value("x", text) == expected


@pytest.mark.parametrize("text, message", [
    ("1x3x:float32", "cannot read --input x=1x3x:float32"),
    ("1x3:float17", "unknown dtype 'float17'"),
    ("0x3", "zero or negative size"),
    ("abc", "cannot read --input x=abc"),
])
def test_parse_value_errors(text, message):
    with pytest.raises(CaptureError, match=message):
        parse_value("x", text)


def test_repeating_a_name_starts_a_new_specialization_that_keeps_the_others():
    sets = parse_input_options(["x=1x3", "n=4", "x=8x3", "n=2"])
    assert sets == [
        {"x": TensorSpec((1, 3)), "n": 4},
        {"x": TensorSpec((8, 3)), "n": 4},
        {"x": TensorSpec((8, 3)), "n": 2},
    ]


def test_several_specializations_from_the_python_api():
    captured = edgedyn.capture(loop_example, [(torch.randn(1, 3), 2), (torch.randn(8, 3), 2)])
    assert [s.name for s in captured.specializations] == ["x=1x3,n=2", "x=8x3,n=2"]
    assert [s.example_tensors[0].shape[0] for s in captured.specializations] == [1, 8]


def test_model_reference_with_example_inputs_from_the_file():
    captured = edgedyn.capture(str(EXAMPLES / "mlp.py") + ":MLP")
    assert captured.name == "MLP"
    assert [s.name for s in captured.specializations] == ["x=1x64", "x=8x64"]


def test_reference_to_a_missing_name_lists_what_the_file_defines():
    with pytest.raises(CaptureError) as info:
        edgedyn.capture(str(EXAMPLES / "tiny_cnn.py") + ":TinyCnn", inputs=["x=1x3x8x8"])
    assert "has no attribute 'TinyCnn'" in info.value.message
    assert "TinyCNN" in info.value.hint


def test_zero_argument_factory_is_called(tmp_path):
    source = tmp_path / "factory.py"
    source.write_text("import torch\ndef make():\n    return torch.nn.Linear(4, 2)\n")
    captured = edgedyn.capture("{}:make".format(source), inputs=["input=3x4"])
    assert captured.specializations[0].reference_outputs[0].shape == (3, 2)


def test_data_dependent_branch_names_the_user_line():
    def branchy(x):
        if x.sum() > 0:  # the line the error must point at
            return x * 2
        return x - 1

    line = branchy.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError) as info:
        edgedyn.capture(branchy, (torch.randn(3),))
    assert "branchy branches on tensor values at {}:{}".format(__file__, line) in info.value.message
    assert "if x.sum() > 0:" in info.value.message
    assert "torch.where" in info.value.hint


def test_missing_example_for_an_argument():
    with pytest.raises(CaptureError, match="no example value for argument 'n' of loop_example"):
        edgedyn.capture(loop_example, inputs=["x=2x3"])


def test_unknown_argument_name():
    with pytest.raises(CaptureError, match="loop_example has no argument named y"):
        edgedyn.capture(loop_example, inputs=["x=2x3", "n=1", "y=3"])


def test_output_structure_is_recorded():
    def structured(x):
        return {"a": x + 1, "b": (x * 2, None, 3)}

    (spec,) = edgedyn.capture(structured, (torch.randn(2),)).specializations
    assert spec.output_tree == {"kind": "dict", "keys": ["a", "b"], "items": [
        {"kind": "tensor", "index": 0},
        {"kind": "tuple", "items": [{"kind": "tensor", "index": 1}, {"kind": "none"}, {"kind": "constant", "value": 3}]},
    ]}
    getitems = [n for n in spec.program.graph.nodes if n.target is operator.getitem]
    assert not getitems


# Models as transformers users hold them: forward(self, pixel_values=None, ..., **kwargs) returning a dict.
class KeywordModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, pixel_values=None, mask=None, scale: float = 2.0, **kwargs):
        assert not kwargs, "capture must leave **kwargs empty"
        assert mask is None
        hidden = self.proj(pixel_values) * scale
        return {"logits": hidden, "boxes": torch.sigmoid(hidden[:, :2])}


def test_kwargs_model_captures_given_arguments_and_names_outputs_by_key(tmp_path):
    import numpy as np

    import edgedyn.runtime as rt
    from edgedyn.runtime.errors import GuardError

    model = KeywordModel().eval()
    path = edgedyn.export(model, inputs=["pixel_values=2x4"], backend="onnxruntime", output=tmp_path / "kw.edgedyn")
    program = rt.load(path)
    assert [p["name"] for p in program.signature] == ["pixel_values", "scale"]
    assert [o["name"] for o in program.specializations[0].record["outputs"]] == ["logits", "boxes"]
    fresh = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    got = program(pixel_values=fresh)
    with torch.no_grad():
        want = model(pixel_values=torch.from_numpy(fresh))
    assert list(got) == ["logits", "boxes"]
    for key in got:
        scale = float(want[key].abs().max())
        np.testing.assert_allclose(got[key], want[key].numpy(), rtol=1e-4, atol=1e-4 * scale)
    with pytest.raises(GuardError, match="got an unexpected argument 'mask'; its arguments are: pixel_values, scale"):
        program(pixel_values=fresh, mask=fresh)
    with pytest.raises(GuardError, match="captured with scale == 2.0, got 3.0"):
        program(pixel_values=fresh, scale=3.0)


def test_keyword_only_arguments_are_passed_by_name():
    def scaled(x, *, factor=2.0):
        return x * factor

    (spec,) = edgedyn.capture(scaled, inputs=["x=3:float32", "factor=0.5"]).specializations
    assert spec.constants == {"factor": 0.5}
    x = torch.randn(3)
    torch.testing.assert_close(spec.program.module()(x)[0], x * 0.5)


def test_star_args_receive_nothing_and_an_example_for_them_is_refused():
    # ultralytics' forward(self, x, *args, **kwargs): the named argument is captured and *args stays empty; a forward
    # of only *args is refused (tests/test_detection.py)
    def variadic(x, *tensors):
        return x * 2 + len(tensors)

    captured = edgedyn.capture(variadic, (torch.randn(2),))
    assert [entry["name"] for entry in captured.signature] == ["x"]
    with pytest.raises(CaptureError, match=r"2 example inputs given, but variadic takes 1"):
        edgedyn.capture(variadic, (torch.randn(2), torch.randn(2)))


@pytest.mark.parametrize("tree, names", [
    ({"kind": "tensor", "index": 0}, ["output_0"]),
    ({"kind": "tuple", "items": [{"kind": "tensor", "index": 0}, {"kind": "none"}, {"kind": "tensor", "index": 1}]},
     ["output_0", "output_1"]),
    ({"kind": "dict", "keys": ["logits", "pred_boxes"], "items": [{"kind": "tensor", "index": 0},
                                                                  {"kind": "tensor", "index": 1}]},
     ["logits", "pred_boxes"]),
    ({"kind": "tuple", "items": [{"kind": "tensor", "index": 0}, {"kind": "dict", "keys": ["a"], "items": [
        {"kind": "list", "items": [{"kind": "tensor", "index": 1}, {"kind": "tensor", "index": 2}]}]}]},
     ["0", "1.a.0", "1.a.1"]),
])
def test_output_names_come_from_the_output_tree(tree, names):
    from edgedyn.frontend.outputs import output_names

    assert output_names(tree) == names


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, x, y):
        return {"a": self.norm(self.linear(x)) + y, "b": x * 2}


def _saved_program(tmp_path):
    model = TwoInputs().eval()
    model.norm.running_mean.normal_()
    path = tmp_path / "two.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 4), torch.randn(2, 3))), str(path))
    return model, path


def test_saved_exported_program_exports_with_guards_from_its_shapes(tmp_path):
    import numpy as np

    import edgedyn.runtime as rt

    model, path = _saved_program(tmp_path)
    program = rt.load(edgedyn.export(str(path), backend="onnxruntime", output=tmp_path / "two.edgedyn"))
    spec = program.specializations[0]
    assert spec.name == "x=2x4,y=2x3"
    assert {g["source"] for g in spec.guards} == {"example_inputs x=2x4", "example_inputs y=2x3"}
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    got = program(x=x, y=y)
    with torch.no_grad():
        want = model(torch.from_numpy(x), torch.from_numpy(y))
    for key in ("a", "b"):
        np.testing.assert_allclose(got[key], want[key].numpy(), rtol=1e-4, atol=1e-4 * float(want[key].abs().max()))


def test_a_factory_returning_a_loaded_program_module_captures(tmp_path):
    _, path = _saved_program(tmp_path)
    source = tmp_path / "from_pt2.py"
    source.write_text("import torch\n\n\ndef factory():\n    return torch.export.load({!r}).module()\n".format(str(path)))
    captured = edgedyn.capture("{}:factory".format(source), inputs=["x=2x4", "y=2x3"])
    assert captured.specializations[0].output_names == ["a", "b"]


def test_unreadable_pt2_says_how_to_write_one(tmp_path):
    path = tmp_path / "broken.pt2"
    path.write_bytes(b"not a zip")
    with pytest.raises(CaptureError, match="cannot read .*broken.pt2 as a saved ExportedProgram") as info:
        edgedyn.capture(str(path))
    assert "torch.export.save" in info.value.hint


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.MaxPool2d(2)
        self.head = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(torch.nn.functional.hardswish(self.norm(self.conv(x))))
        x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
        return torch.softmax(self.head(torch.flatten(x, 1)), dim=-1)


def _onnx_file(tmp_path, dynamic=False):
    model = SmallCNN().eval()
    model.norm.running_mean.normal_()
    model.norm.running_var.uniform_(0.5, 1.5)
    path = tmp_path / ("dynamic.onnx" if dynamic else "small.onnx")
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(path), input_names=["input.1"], output_names=["probs"],
                      dynamo=False, dynamic_axes={"input.1": {0: "batch"}} if dynamic else None)
    return model, path


def test_onnx_file_exports_and_matches_the_torch_model_it_came_from(tmp_path, run_cli):
    import numpy as np

    import edgedyn.runtime as rt

    model, path = _onnx_file(tmp_path)
    result = run_cli("export", str(path), "--backend", "onnxruntime", "-o", str(tmp_path / "small.edgedyn"))
    assert result.returncode == 0, result.stderr
    program = rt.load(tmp_path / "small.edgedyn")
    assert program.specializations[0].name == "input_1=1x3x16x16"
    fresh = np.random.default_rng(11).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = program(input_1=fresh)
    with torch.no_grad():
        want = model(torch.from_numpy(fresh)).numpy()
    assert list(got) == ["probs"]
    np.testing.assert_allclose(got["probs"], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_onnx_with_a_symbolic_dimension_asks_for_input_values(tmp_path, run_cli):
    _, path = _onnx_file(tmp_path, dynamic=True)
    result = run_cli("export", str(path), "--backend", "onnxruntime", "-o", str(tmp_path / "d.edgedyn"))
    assert result.returncode == 2
    assert "error: dynamic.onnx input 'input.1' has symbolic dimension(s) 0 (batch) (shape batchx3x16x16)" in result.stderr
    assert "hint: give every input's sizes, e.g. --input input_1=1x3x16x16" in result.stderr
    assert "Traceback" not in result.stderr
    captured = edgedyn.capture(str(path), inputs=["input_1=4x3x16x16"])
    assert captured.specializations[0].name == "input_1=4x3x16x16"


def test_onnx_operator_edgedyn_cannot_read_is_named(tmp_path):
    from onnx import TensorProto, helper, save

    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "hardmax.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    with pytest.raises(CaptureError, match="hardmax.onnx uses ONNX operator\\(s\\) edgedyn cannot read yet: Hardmax"):
        edgedyn.capture(str(path))


def test_model_in_an_installed_package(tmp_path, run_cli):
    package = tmp_path / "site" / "mynets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "vision.py").write_text(
        "import torch\n\n\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x) * 3\n\n\n"
        "def example_inputs():\n    return (torch.randn(2, 5),)\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    result = run_cli("export", "mynets.vision:Net", "--backend", "onnxruntime", "-o", str(tmp_path / "n.edgedyn"),
                     env=env)
    assert result.returncode == 0, result.stderr
    assert "exported Net for x86-64 (onnxruntime): 1 specialization(s) [x=2x5]" in result.stderr
    missing = run_cli("export", "nosuchpackage.models:Net", env=env)
    assert missing.returncode == 2
    assert "error: no module named 'nosuchpackage' (and no file nosuchpackage.models here)" in missing.stderr
    assert "hint: install the package that provides it" in missing.stderr
