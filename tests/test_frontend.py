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
