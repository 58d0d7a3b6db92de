"""The ncnn backend end to end: fp32 equal to torch eager, what ncnn cannot hold refused in words, the model file
checked before ncnn parses it, and the precision options set from the artifact and the CPU."""
import dataclasses
import zipfile

import numpy as np
import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import BackendError
from edgedyn.runtime import precision as precisions
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors.ncnn_param import check_model

from conftest import ALL_MODELS, EXAMPLES, RTOL, assert_matches_torch

pytestmark = pytest.mark.requires("ncnn", "pnnx", "onnx")
# Models ncnn cannot hold, and the words their export fails with.
REFUSED = {
    "transformer_block": "the ncnn backend cannot express Tensor.reshape, torch.unbind: pnnx found no ncnn layer for "
                         "them, at ",
}


@pytest.fixture(scope="module")
def ncnn_bundle(export_example):
    return lambda name: export_example(name, backend="ncnn")


@pytest.mark.parametrize("name", sorted(set(ALL_MODELS) - set(REFUSED)))
def test_fp32_matches_torch_on_fresh_inputs(ncnn_bundle, name):
    program = rt.load(ncnn_bundle(name), threads=2)
    assert all(spec.precision() == ("fp32", None) for spec in program.specializations)
    assert_matches_torch(program, name, seed=2026)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_ncnn_cannot_hold_is_refused_with_the_op_and_line(tmp_path, name):
    reference, inputs = ALL_MODELS[name]
    with pytest.raises(BackendError) as raised:
        edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), backend="ncnn", output=tmp_path / "m.edgedyn")
    assert raised.value.message.startswith(REFUSED[name]), raised.value.message
    assert "{}.py:".format(name) in raised.value.message  # the user's line
    assert not (tmp_path / "m.edgedyn").exists()
