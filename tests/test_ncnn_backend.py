"""The ncnn backend end to end: fp32 equal to torch eager, what ncnn cannot hold refused in words, the model file
checked before ncnn parses it, and the precision options set from the artifact and the CPU."""
import dataclasses
import zipfile

import numpy as np
import pytest
import torch

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import BackendError, EdgedynError
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors.ncnn_param import check_model
from edgedyn.runtime.format import host_arch

from conftest import ALL_MODELS, EXAMPLES, RTOL, assert_matches_torch, require

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


def test_fp32_bundle_is_portable_verifies_and_records_its_settings(ncnn_bundle):
    (spec,) = rt.read_manifest(ncnn_bundle("tiny_cnn"))["specializations"]
    (artifact,) = spec["artifacts"]
    assert (artifact["backend"], artifact["executor"], artifact["arch"], artifact["precision"]) == (
        "ncnn", "ncnn", None, "fp32")
    assert sorted(artifact["files"]) == ["model", "weights"]
    record = artifact["ncnn"]
    assert record["batch"] == 1 and record["input_shapes"] == [[3, 64, 64]] and record["output_shapes"] == [[10]]
    assert record["weights"] == "fp32" and record["converted_by"].startswith("pnnx ")
    assert record["layers"]["Convolution"] == 2 and artifact["requires"] == {"python": ["ncnn>=1.0.20250503"]}
    program = rt.load(ncnn_bundle("tiny_cnn"), threads=2)
    described = program.specializations[0].executor.describe()
    assert described["threads"] == 2 and described["fp16"] == {"fp16_storage": False, "fp16_packed": False,
                                                               "fp16_arithmetic": False}
    results = program.verify()
    assert results and all(r["ok"] and r["max_rel"] < RTOL for r in results), results


def test_a_batch_runs_item_by_item(ncnn_bundle):
    """ncnn has no batch axis: the MLP's batch-8 specialization runs 8 extractions and stacks them."""
    program = rt.load(ncnn_bundle("mlp"))
    batches = [spec.executor.describe()["batch_runs"] for spec in program.specializations]
    assert batches == [1, 8]


def test_an_fp16_artifact_computes_fp32_off_arm_and_says_why(ncnn_bundle, tmp_path):
    """ncnn's fp16 arithmetic is Arm v8.2's: elsewhere the fp16 artifact computes fp32 from the same fp32 weights,
    equal to torch at the fp32 tolerance, and the runtime says why."""
    from conftest import with_precision

    require(host_arch() != "aarch64", "checks the fallback on a CPU that is not Arm", "run it on x86")
    path = with_precision(ncnn_bundle("mobilenet_v2"), "fp16", tmp_path / "fp16.edgedyn")
    program = rt.load(path)
    (spec,) = program.specializations
    assert spec.precision() == ("fp32", "fp16 artifact computes in fp32 here: ncnn computes fp16 on Arm v8.2 "
                                        "cores only")
    assert not any(spec.executor.describe()["fp16"].values())
    assert_matches_torch(program, "mobilenet_v2", seed=7)


def test_fp16_is_an_arm_precision_of_this_backend(tmp_path):
    with pytest.raises(EdgedynError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="x86-64", backend="ncnn",
                       precision="fp16", output=tmp_path / "m.edgedyn")
    assert raised.value.message.startswith("backend ncnn does not compute fp16 on a x86_64 CPU; backends that do: ")


def _write_model(tmp_path, source: str) -> str:
    path = tmp_path / "model.py"
    path.write_text("import torch\n\n" + source)
    return "{}:Model".format(path)


@pytest.mark.parametrize("source, inputs, words", [
    ("class Model(torch.nn.Module):\n    def forward(self, x):\n        return x.sum(0, keepdim=True) * 2\n",
     ["x=4x8"], "ncnn has no batch axis, so each item of the first axis runs on its own, and its inputs and outputs "
                "disagree on that axis (input 'x' 4, output 0 1)"),
    ("class Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.softmax(x, 0)\n",
     ["x=4x8"], "the ncnn model pnnx converted disagrees with torch eager on output 0 for random inputs: max relative "
                "error"),
    ("class Model(torch.nn.Module):\n    def forward(self, x):\n        return x @ x.t()\n",
     ["x=4x8"], "the ncnn model pnnx converted fails on random inputs: ncnn computed output output_0 as 1 values of "
                "shape (1,); the model declares (4,)"),
    ("class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
     ["x=1x2x3x4x5x6"], "the ncnn backend cannot express input 'x' of shape [1, 2, 3, 4, 5, 6]: ncnn has no batch "
                        "axis and holds each item of the first axis as a blob of 1 to 4 dimensions"),
    ("class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
     ["x=1x8:int32"], "the ncnn backend cannot express input 'x' of dtype int32: ncnn computes float32 tensors only"),
])
def test_what_ncnn_cannot_hold_is_refused_in_words(tmp_path, source, inputs, words):
    with pytest.raises(BackendError) as raised:
        edgedyn.export(_write_model(tmp_path, source), inputs=inputs, backend="ncnn", output=tmp_path / "m.edgedyn")
    assert words in raised.value.message, raised.value.message
    assert not (tmp_path / "m.edgedyn").exists()


def _model_files(ncnn_bundle) -> tuple:
    with zipfile.ZipFile(str(ncnn_bundle("tiny_cnn"))) as archive:
        names = archive.namelist()
        param = archive.read(next(n for n in names if n.endswith("model.param")))
        weights = archive.read(next(n for n in names if n.endswith("weights.bin")))
    return param, weights


TINY_SHAPES = {"x": (3, 64, 64)}


@pytest.mark.parametrize("edit_param, edit_weights, words", [
    (lambda p: p.replace(b"7 7", b"9 7", 1), None, "the header says 9 layers, the text has 7"),
    (lambda p: p.replace(b"Pooling", b"Python", 1), None, "layer 4: layer type 'Python' is not one edgedyn's ncnn "
                                                          "files use"),
    (lambda p: p + b"\xff", None, "the .param text holds bytes other than printable ASCII"),
    (lambda p: p.replace(b" 6 output_0", b" 7 output_0", 1), None, "layer 6 (linear_5) reads blob 7 before any "
                                                                   "layer makes it"),
    (lambda p: p.replace(b"0=10 ", b"0=10 9=\"abc\" ", 1), None, "value '\"abc\"' is not a number"),
    (lambda p: p.replace(b"0=10 ", b"0=10 30=4,1,1,1 ", 1), None, "parameter id 30 (ids are 0-31, each once; no "
                                                                  "shape hints)"),
    (lambda p: p.replace(b"6=432", b"6=432 31=1", 1), None, "has feature mask 1 (31=3 is the only one"),
    (lambda p: p.replace(b"Pooling mean_8 1 1 4 6 0=1 4=1", b"Pooling mean_8 1 1 4 6 0=1 4=1 31=3", 1), None,
     "layer 'mean_8' computes in fp32 (31=3) but reads '4', which may be fp16"),
    (lambda p: p.replace(b"-23310=2,", b"-23310=9,", 1), None, "array -23310 says 9 items and holds 2"),
    (lambda p: p.replace(b"0=10 ", b"0=0 ", 1), None, "parameter 0 must be at least 1, got 0"),
    (lambda p: p.replace(b"6=432", b"6=432 8=1", 1), None, "an int8 layer; edgedyn's ncnn files are float"),
    (None, lambda w: w[:-4], "10 weights at bytes 22928..22968 lie outside the 22964-byte .bin"),
    (None, lambda w: b"\x78\x56\x34\x12" + w[4:], "weights tagged 0x12345678 at byte 0; edgedyn writes fp32 (0) or "
                                                  "fp16 (0x1306b47)"),
    (lambda p: p.replace(b"1=2 11=2 12=2", b"1=99 11=99 12=2", 1), None, "layer 4 (Pooling maxpool2d_0): a 99-wide "
                                                                       "window over 16 values (inputs [[32, 16, 16]])"),
    (lambda p: p.replace(b"4=1 5=1 6=432", b"4=70000 5=1 6=432", 1), None, "pads [70000, 70000, 1, 1] are neither "
                                                                           "all 0-65536 nor one SAME mode"),
    (lambda p: p.replace(b"1=3 11=3 12=1 13=2 14=1 2=1 3=2 4=1 5=1 6=432", b"1=1 11=1 12=1 13=2 14=1 2=1 3=2 4=1 5=1 "
                                                                          b"6=432", 1), None,
     "432 weights; 16 outputs x 3 inputs / 1 groups x kernel [1, 1] take 48"),
    (lambda p: p.replace(b"Pooling mean_8 1 1 4 6 0=1 4=1", b"Reduction mean_8 1 1 4 6 0=3 1=0 -23303=2,2,7 4=0 5=1",
                         1), None, "axis 7 of a 3-d blob"),
    (lambda p: p.replace(b"Pooling mean_8 1 1 4 6 0=1 4=1", b"Reshape mean_8 1 1 4 6 0=33", 1), None,
     "a reshape of 2048 values to [33]"),
])
def test_the_model_file_is_checked_before_ncnn_parses_it(ncnn_bundle, edit_param, edit_weights, words):
    param, weights = _model_files(ncnn_bundle)
    assert len(check_model(param, weights, "m", TINY_SHAPES)) == 7  # the real one passes
    with pytest.raises(BundleError) as raised:
        check_model(edit_param(param) if edit_param else param, edit_weights(weights) if edit_weights else weights,
                    "bundle m.edgedyn: model.param", TINY_SHAPES)
    assert raised.value.message.startswith("bundle m.edgedyn: model.param is not a valid ncnn model: ")
    assert words in raised.value.message, raised.value.message


def test_board_options_reach_the_artifact_and_bad_ones_are_refused():
    from edgedyn.backends.ncnn import board_options
    from edgedyn.boards import load_board
    from edgedyn.runtime.executors.ncnn import options

    assert options({}) == {}
    with pytest.raises(BundleError) as raised:
        options({"ncnn": {"options": {"use_vulkan_compute": True}}})
    assert "ncnn.options: use_vulkan_compute = True is not allowed" in raised.value.message
    board = dataclasses.replace(load_board("raspberry-pi-5"), ncnn_options={"use_winograd_convolution": False})
    assert board_options(board) == {"use_winograd_convolution": False}
    with pytest.raises(EdgedynError) as raised:
        dataclasses.replace(load_board("raspberry-pi-5"), ncnn_options={"use_fp16_arithmetic": True})
    assert "ncnn" in raised.value.message and "use_fp16_arithmetic" in raised.value.message


def test_an_older_ncnn_than_the_exports_is_noted():
    from edgedyn.runtime.executors.ncnn import _older_note

    assert _older_note("1.0.20261020", "1.0.20261020") is None and _older_note("1.0.20261020", None) is None
    assert _older_note("1.0.20260526", "1.0.20261020") == (
        "ncnn 1.0.20260526 here is older than the 1.0.20261020 this model was checked with at export: run `edgedyn "
        "verify` on this board, or pip install -U ncnn")


class _SharedSiLU(torch.nn.Module):
    """One SiLU module called at two places, as ultralytics' Conv.default_act is."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.second = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        y = self.act(self.first(x))
        return y + self.act(self.second(y))


def test_a_silu_pnnx_left_in_three_layers_becomes_one_swish(tmp_path):
    torch.manual_seed(0)
    model = _SharedSiLU().eval()
    path = edgedyn.export(model, (torch.randn(1, 8, 16, 16),), backend="ncnn", output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    layers = artifact["ncnn"]["layers"]
    assert layers.get("Swish") == 2 and "Sigmoid" not in layers and layers["BinaryOp"] == 1, layers
    program = rt.load(path, threads=1)
    x = np.random.default_rng(5).standard_normal((1, 8, 16, 16)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("rows, fused", [
    (["Split s 1 2 a b c", "Sigmoid g 1 1 c d", "BinaryOp m 2 1 b d e 0=2"], True),
    (["Split s 1 2 a b c", "Sigmoid g 1 1 b d", "BinaryOp m 2 1 d c e 0=2"], True),
    # the sigmoid's result has a second reader: x * sigmoid(x) + sigmoid(x) keeps its three layers
    (["Split s 1 2 a b c", "Sigmoid g 1 1 c d", "Split t 1 2 d f h", "BinaryOp m 2 1 b f e 0=2",
      "BinaryOp n 2 1 e h i 0=0"], False),
    # a product of two different tensors, or another operation, is not a SiLU
    (["Split s 1 2 a b c", "Sigmoid g 1 1 c d", "BinaryOp m 2 1 b d e 0=0"], False),
    (["Split s 1 2 a b c", "Sigmoid g 1 1 c d", "BinaryOp m 2 1 b d e 0=2 1=1 2=2.0"], False),
])
def test_swish_fusion_takes_only_x_times_sigmoid_x(rows, fused):
    from edgedyn.backends.ncnn import fuse_swish

    blobs = {token for row in rows for token in row.split()[4:] if "=" not in token}
    param = "\n".join(["7767517", "{} {}".format(len(rows) + 1, len(blobs)), "Input in 0 1 a"] + rows + [""])
    out = fuse_swish(param.encode("ascii")).decode("ascii").splitlines()
    if not fused:
        assert out == param.splitlines()
        return
    assert out[1] == "{} {}".format(len(rows) - 1, len(blobs) - 3)
    assert out[2:] == ["Input in 0 1 a", "Swish g_swish 1 1 a e"]


class _SqueezeExcite(torch.nn.Module):
    """A squeeze-excite block (a mean kept as (c, 1, 1), read by a 1x1 convolution) and a mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.reduce = torch.nn.Conv2d(16, 4, 1)
        self.expand = torch.nn.Conv2d(4, 16, 1)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        scale = torch.sigmoid(self.expand(torch.relu(self.reduce(y.mean((2, 3), keepdim=True)))))
        return self.head((y * scale).mean((2, 3)))


def test_a_mean_over_height_and_width_becomes_global_pooling_and_matches_torch(tmp_path):
    torch.manual_seed(0)
    model = _SqueezeExcite().eval()
    path = edgedyn.export(model, (torch.randn(1, 3, 24, 24),), backend="ncnn", output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    layers = artifact["ncnn"]["layers"]
    assert "Reduction" not in layers and layers["Pooling"] == 2, layers
    # the block's two 1x1 convolutions run on the pooled vector, straight into the multiply: no Reshape left
    assert layers["Convolution"] == 1 and layers["InnerProduct"] == 3 and "Reshape" not in layers, layers
    program = rt.load(path, threads=1)
    x = np.random.default_rng(9).standard_normal((1, 3, 24, 24)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))


class _ImagePooling(torch.nn.Module):
    """DeepLabV3's ASPP image pooling: a pooled 1x1 convolution, then spread back over the map (no BinaryOp)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pooled = torch.nn.Conv2d(8, 6, 1)
        self.local = torch.nn.Conv2d(8, 6, 1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        branch = torch.relu(self.pooled(y.mean((2, 3), keepdim=True)))
        spread = torch.nn.functional.interpolate(branch, size=y.shape[-2:], mode="bilinear", align_corners=False)
        return torch.cat([self.local(y), spread], dim=1)


def test_a_pooled_convolution_not_read_by_a_multiply_keeps_its_reshape_after_it_and_matches_torch(tmp_path):
    torch.manual_seed(0)
    model = _ImagePooling().eval()
    path = edgedyn.export(model, (torch.randn(1, 3, 20, 20),), backend="ncnn", output=tmp_path / "m.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    layers = artifact["ncnn"]["layers"]
    assert layers["InnerProduct"] == 1 and layers["Reshape"] == 1 and layers["Convolution"] == 2, layers
    program = rt.load(path, threads=1)
    x = np.random.default_rng(4).standard_normal((1, 3, 20, 20)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))


POOLED = ["Pooling p 1 1 a v 0=1 4=1", "Reshape r 1 1 v m 0=1 1=1 2=-1"]
POINTWISE = "Convolution {} 1 1 {} {} 0=4 1=1 11=1 12=1 13=1 14=0 2=1 3=1 4=0 5=1 6=32"


@pytest.mark.parametrize("rows, expected", [
    # into a multiply with the (8, h, w) map (a's copy through a Split): the Reshape goes, the vector is multiplied
    (["Split s 1 2 a a0 a1"] + POOLED[:1] + ["Reshape r 1 1 v m 0=1 1=1 2=-1",
      "Convolution c 1 1 m n 0=8 1=1 11=1 12=1 13=1 14=0 2=1 3=1 4=0 5=1 6=64 9=1", "Sigmoid g 1 1 n o",
      "BinaryOp x 2 1 o a1 y 0=2"],
     None),
    # ended elsewhere: the Reshape follows the chain, an array parameter (clip's bounds) kept under its key
    (POOLED + [POINTWISE.format("c", "m", "n") + " 9=3 -23310=2,0.0,6.0", "Sigmoid g 1 1 n o"],
     POOLED[:1] + ["InnerProduct c 1 1 v n 0=4 1=1 2=32 9=3 -23310=2,0.0,6.0", "Sigmoid g 1 1 n o_vec",
                   "Reshape r_moved 1 1 o_vec o 0=1 1=1 2=-1"]),
    # not a matrix product on the vector: stride 2, a pad, a 3x3 kernel; a blob read twice; no convolution at all
    (POOLED + [POINTWISE.format("c", "m", "n").replace("3=1", "3=2")], []),
    (POOLED + [POINTWISE.format("c", "m", "n").replace("4=0", "4=1")], []),
    (POOLED + [POINTWISE.format("c", "m", "n").replace("1=1 11=1", "1=3 11=3").replace("4=0", "4=1").replace(
        "14=0", "14=1").replace("6=32", "6=288")], []),
    (POOLED + ["Split s 1 2 m m0 m1", POINTWISE.format("c", "m0", "n"), "Sigmoid g 1 1 m1 o"], []),
    (POOLED + ["Sigmoid g 1 1 m o"], []),
    # flattened at the chain's end (MobileNetV4's head, then its classifier): both Reshapes go
    (POOLED + [POINTWISE.format("c", "m", "n") + " 9=1", "Reshape f 1 1 n o 0=4", "ReLU z 1 1 o q"],
     POOLED[:1] + ["InnerProduct c 1 1 v o 0=4 1=1 2=32 9=1", "ReLU z 1 1 o q"]),
])
def test_pooled_convolutions_become_inner_products_only_as_matrix_products_on_the_vector(rows, expected):
    from edgedyn.backends.ncnn import fuse_pooled_convolutions

    blobs = {token for row in rows for token in row.split()[4:] if "=" not in token} | {"a"}
    param = "\n".join(["7767517", "{} {}".format(len(rows) + 1, len(blobs)), "Input in 0 1 a"] + rows + [""])
    out = fuse_pooled_convolutions(param.encode("ascii"), {"a": (8, 5, 6)}).decode("ascii").splitlines()
    if expected == []:
        assert out == param.splitlines()
        return
    if expected is None:
        expected = ["Split s 1 2 a a0 a1", POOLED[0],
                    "InnerProduct c 1 1 v n 0=8 1=1 2=64 9=1", "Sigmoid g 1 1 n o", "BinaryOp x 2 1 o a1 y 0=2"]
    made = {token for row in expected for token in row.split()[4:] if "=" not in token} | {"a"}
    assert out[1] == "{} {}".format(len(expected) + 1, len(made))
    assert out[2:] == ["Input in 0 1 a"] + expected


MEAN = "Reduction r 1 1 a b 0=3 1=0 -23303=2,2,1 5=1"


@pytest.mark.parametrize("rows, expected", [
    ([MEAN + " 4=0"], ["Pooling r 1 1 a b 0=1 4=1"]),
    # kept axes read only by a Reshape to (c): one Pooling in place of both
    ([MEAN + " 4=1", "Reshape s 1 1 b c 0=8"], ["Pooling r 1 1 a c 0=1 4=1"]),
    # kept axes read by something else: Pooling, then a Reshape back to (c, 1, 1)
    ([MEAN + " 4=1", "Sigmoid g 1 1 b c"], ["Pooling r 1 1 a b_gap 0=1 4=1", "Reshape r_keepdims 1 1 b_gap b 0=1 1=1 "
                                                                             "2=-1", "Sigmoid g 1 1 b c"]),
    # not a mean over height and width: a max, one axis, the channels
    (["Reduction r 1 1 a b 0=4 1=0 -23303=2,2,1 4=0 5=1"], None),
    (["Reduction r 1 1 a b 0=3 1=0 -23303=1,2 4=0 5=1"], None),
    (["Reduction r 1 1 a b 0=3 1=0 -23303=2,0,1 4=0 5=1"], None),
])
def test_global_pooling_fusion_takes_only_a_mean_over_height_and_width(rows, expected):
    from edgedyn.backends.ncnn import fuse_global_pooling

    blobs = {token for row in rows for token in row.split()[4:] if "=" not in token}
    param = "\n".join(["7767517", "{} {}".format(len(rows) + 1, len(blobs)), "Input in 0 1 a"] + rows + [""])
    out = fuse_global_pooling(param.encode("ascii"), {"a": (8, 5, 6)}).decode("ascii").splitlines()
    if expected is None:
        assert out == param.splitlines()
        return
    made = {token for row in expected for token in row.split()[4:] if "=" not in token} | {"a"}
    assert out[1] == "{} {}".format(len(expected) + 1, len(made))
    assert out[2:] == ["Input in 0 1 a"] + expected


@pytest.mark.parametrize("first, copied", [
    ("torch.nn.Conv2d(3, 4, 3)", False),
    ("torch.nn.ReLU()", True),  # in place in ncnn: handed a copy
])
def test_the_callers_array_is_read_never_written_and_copied_only_for_an_in_place_layer(tmp_path, first, copied):
    torch.manual_seed(1)
    model = eval("torch.nn.Sequential({}, torch.nn.Conv2d({}, 4, 1))".format(first, 4 if "Conv" in first else 3))
    model = model.eval()
    path = edgedyn.export(model, (torch.randn(1, 3, 12, 12),), backend="ncnn", output=tmp_path / "m.edgedyn")
    program = rt.load(path, threads=1)
    assert program.specializations[0].executor._copy == [copied]
    x = np.random.default_rng(3).standard_normal((1, 3, 12, 12)).astype(np.float32)
    kept = x.copy()
    with torch.no_grad():
        want = model(torch.from_numpy(kept)).numpy()
    for _ in range(2):
        np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))
        np.testing.assert_array_equal(x, kept)


def test_an_input_reaches_an_in_place_layer_through_split_and_is_copied():
    from edgedyn.runtime.executors.ncnn import _read_in_place
    from edgedyn.runtime.executors.ncnn_param import parse_param

    def build(rows: list) -> list:
        blobs = {token for row in rows for token in row.split()[4:] if "=" not in token} | {"x"}
        text = ["7767517", "{} {}".format(len(rows) + 1, len(blobs)), "Input in 0 1 x"] + rows
        return parse_param("\n".join(text).encode("ascii"), "m")

    two_convs = ["Split s 1 2 x a b", "Convolution c 1 1 a c 0=1 1=1 6=3", "Convolution d 1 1 b d 0=1 1=1 6=3"]
    assert not _read_in_place(build(two_convs), "x")
    assert _read_in_place(build(two_convs[:2] + ["ReLU r 1 1 b d"]), "x")
    assert _read_in_place(build(["Split s 1 2 x a b", "Split t 1 2 b e f", "Convolution c 1 1 a c 0=1 1=1 6=3",
                                 "Convolution d 1 1 e d 0=1 1=1 6=3", "BinaryOp m 1 1 f g 0=2 1=1 2=2.0"]), "x")


def test_a_layer_that_fails_in_ncnn_raises_an_execution_error_instead_of_crashing(ncnn_bundle):
    """ncnn reports a failed layer (-100: an allocation failed, as on a board out of memory) by its status and an
    empty Mat, and numpy over an empty Mat crashes the process. Here the input never reaches ncnn, so the first
    convolution has nothing to allocate for and fails with -100, as a real out-of-memory does; the call must raise
    the runtime's ExecutionError with the status, and the next call run normally."""
    from edgedyn.runtime.errors import ExecutionError

    program = rt.load(ncnn_bundle("tiny_cnn"), threads=1)
    executor = program.specializations[0].executor
    net = executor._net

    class Dropped:  # an Extractor that drops its input, and otherwise is ncnn's
        def __init__(self) -> None:
            self.real = net.create_extractor()

        def input(self, name, mat) -> int:
            return 0

        def extract(self, name):
            return self.real.extract(name)

    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = program(x)
    executor._net = type("FailingNet", (), {"create_extractor": lambda self: Dropped(), "opt": net.opt})()
    with pytest.raises(ExecutionError) as raised:
        program(x)
    assert "status -100: ncnn could not allocate memory" in raised.value.message, raised.value.message
    assert raised.value.hint and "edgedyn verify" in raised.value.hint
    executor._net = net
    np.testing.assert_array_equal(program(x), want)


class _ShuffleAndNorm(torch.nn.Module):
    """torchvision ShuffleNetV2's channel shuffle (view, transpose, view) and a batch norm after an add, which no
    convolution absorbs (timm FastViT has them): ncnn's ShuffleChannel and BatchNorm layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.side = torch.nn.Conv2d(3, 8, 1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Conv2d(8, 4, 1)
        with torch.no_grad():  # statistics and an affine map a trained network would hold, not 0, 1, 1, 0
            for tensor in (self.norm.running_mean, self.norm.weight, self.norm.bias):
                tensor.copy_(torch.randn(8))
            self.norm.running_var.copy_(torch.rand(8) + 0.5)

    def forward(self, x):
        y = self.conv(x)
        b, c, h, w = y.shape
        y = y.view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)
        return self.head(self.norm(torch.relu(y) + self.side(x)))


def _shuffle_and_norm_bundle(tmp_path):
    torch.manual_seed(0)
    model = _ShuffleAndNorm().eval()
    return model, edgedyn.export(model, (torch.randn(1, 3, 16, 16),), backend="ncnn", output=tmp_path / "m.edgedyn")


def test_a_channel_shuffle_and_an_unfolded_batch_norm_run_in_ncnn_and_match_torch(tmp_path):
    # Before ncnn_channels.py the checker did not know either layer, and the export refused the ncnn candidate for
    # ShuffleNetV2 and FastViT ("uses ncnn layer(s) ... which edgedyn's ncnn checker does not know yet").
    model, path = _shuffle_and_norm_bundle(tmp_path)
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    layers = artifact["ncnn"]["layers"]
    assert layers.get("ShuffleChannel") == 1 and layers.get("BatchNorm") == 1, layers
    _assert_matches_on_fresh_inputs(model, path, (1, 3, 16, 16))


def _assert_matches_on_fresh_inputs(model, path, shape):
    program = rt.load(path, threads=1)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(program(x), want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("edit, words", [
    (lambda p: p.replace(b"ShuffleChannel", b"ShuffleChannel_", 1), "is not one edgedyn's ncnn files use"),
    (lambda p: _set_param(p, b"ShuffleChannel", b"0=", b"0=3"), "3 groups (reverse 0) of a blob of shape [8, 16, 16]"),
    (lambda p: _set_param(p, b"ShuffleChannel", b"0=", b"0=0"), "0 groups (reverse 0)"),
    (lambda p: _set_param(p, b"ShuffleChannel", b"1=", b"1=2"), "(reverse 2)"),
    # fewer channels read fewer weights, and the walk through the .bin lands the next layer's weights off their tag
    (lambda p: _set_param(p, b"BatchNorm", b"0=", b"0=4"), "(Convolution conv_5): weights tagged 0x"),
])
def test_shuffle_channel_and_batch_norm_parameters_are_checked_against_their_input(tmp_path, edit, words):
    _assert_edit_refused(_shuffle_and_norm_bundle(tmp_path)[1], {"x": (3, 16, 16)}, edit, words)


def _assert_edit_refused(path, shapes, edit, words):
    """The bundle's ncnn model passes the checker, and with its .param text edited by `edit` is refused, saying
    `words`."""
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    with zipfile.ZipFile(str(path)) as archive:
        param = archive.read(artifact["files"]["model"])
        weights = archive.read(artifact["files"]["weights"])
    check_model(param, weights, "m", shapes)  # the real one passes
    with pytest.raises(BundleError) as raised:
        check_model(edit(param), weights, "m", shapes)
    assert words in raised.value.message, raised.value.message


def _set_param(param: bytes, layer: bytes, key: bytes, value: bytes) -> bytes:
    """The .param text with `layer`'s parameter `key` (b"0=") set to `value`, appended when the layer lacks it."""
    lines = param.split(b"\n")
    index = next(i for i, line in enumerate(lines) if line.startswith(layer + b" "))
    tokens = [t for t in lines[index].split() if not t.startswith(key)]
    lines[index] = b" ".join(tokens + [value])
    return b"\n".join(lines)


def test_a_batch_norm_takes_only_an_input_with_its_channel_count_along_ncnns_first_axis():
    # ncnn indexes BatchNorm's weights along w of a 1-d blob, h of a 2-d one, c otherwise: numpy's first axis
    from edgedyn.runtime.executors.ncnn_channels import batch_norm
    from edgedyn.runtime.executors.ncnn_shapes import ShapeError

    get = lambda key, default: {0: 8}.get(key, default)  # noqa: E731
    for shape in ((8,), (8, 5), (8, 4, 4), (8, 2, 4, 4)):
        assert batch_norm([shape], get, {}) == [shape]
    for shape in ((5,), (5, 8), (4, 8, 8), (4, 8, 4, 4)):
        with pytest.raises(ShapeError, match=r"weights for 8 channels, an input of shape"):
            batch_norm([shape], get, {})


def test_mutants_of_a_bundle_with_shuffle_channel_and_batch_norm_are_refused_cleanly(tmp_path):
    # The fuzz run of tests/test_fuzz.py over the bundle that holds the two layers ncnn_channels.py checks: every
    # mutant (its .param and .bin tampered with and resealed among them) loads, runs and verifies or is refused
    # with an EdgedynError, in a worker that must not crash.
    _assert_mutants_refused_cleanly(_shuffle_and_norm_bundle(tmp_path)[1], seed=2612)


def _assert_mutants_refused_cleanly(path, seed):
    """30 mutants of the bundle (tests/test_fuzz.py's campaign) each load, run and verify or are refused with an
    EdgedynError, a third at least refused, in a worker that must not crash."""
    from test_fuzz import _fuzz

    fuzz = _fuzz()
    records = fuzz.campaign([path], 30, seed=seed)
    assert sum(record["outcome"] == "refused" for record in records) >= len(records) // 3
    bad = fuzz.findings(records)
    assert not bad, [(r["family"], r["mutation"], r["outcome"], r.get("type")) for r in bad[:10]]


class _RowsMlp(torch.nn.Module):
    """ConvNeXt's block in small: a depthwise convolution, then LayerNorm and a Linear MLP over the channels-last
    rows, back to channels first, and global average pooling of that permuted tensor (which torch.export writes as
    a mean re-strided by `as_strided`)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = torch.nn.LayerNorm(16)
        self.up, self.down = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.down(torch.nn.functional.gelu(self.up(self.norm(y))))
        x = x + y.permute(0, 3, 1, 2)
        return self.head(self.pool(x).flatten(1))


def _rows_mlp_bundle(tmp_path):
    torch.manual_seed(0)
    model = _RowsMlp().eval()
    return model, edgedyn.export(model, (torch.randn(1, 3, 12, 12),), backend="ncnn", output=tmp_path / "m.edgedyn")


def test_a_linear_over_rows_runs_in_ncnn_as_gemm_and_matches_torch(tmp_path):
    # timm's ConvNeXt-T was refused twice over: torch's ONNX exporter wrote its pooled features' `as_strided` as a
    # Gather of 0..767 (no ncnn layer: onnx_rewrites.identity_gathers makes it a Reshape), and pnnx writes each
    # Linear on rows as a Gemm between Reshapes given shape expressions (ncnn_rewrites.static_reshapes fixes them;
    # ncnn_gemm.py checks the Gemm).
    model, path = _rows_mlp_bundle(tmp_path)
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    layers = artifact["ncnn"]["layers"]
    assert layers.get("Gemm") == 2 and "Gather" not in layers, layers
    _assert_matches_on_fresh_inputs(model, path, (1, 3, 12, 12))
    with zipfile.ZipFile(str(path)) as archive:
        assert b'6="' not in archive.read(artifact["files"]["model"])  # no shape expression left


@pytest.mark.parametrize("edit, words", [
    (lambda p: _set_param(p, b"Gemm", b"7=", b"7=100"), "an input of 144 rows for constantM 100"),
    (lambda p: _set_param(p, b"Gemm", b"14=", b"14=1"), "parameter(s) [14] set"),
    (lambda p: _set_param(p, b"Gemm", b"18=", b"18=1"), "an int8 layer"),
    (lambda p: _set_param(p, b"Gemm", b"4=", b"4=1"), "(Gemm gemm_0): 2304 weights at bytes"),  # A read from the .bin
    (lambda p: _set_param(p, b"Gemm", b"10=", b"10=7"), "a weight array of -1 items"),
    # fewer outputs read fewer weights: the walk through the .bin lands the next array off its tag
    (lambda p: _set_param(p, b"Gemm", b"8=", b"8=32"), "weights tagged 0x"),
])
def test_gemm_parameters_are_checked_against_their_input_and_weights(tmp_path, edit, words):
    _assert_edit_refused(_rows_mlp_bundle(tmp_path)[1], {"x": (3, 12, 12)}, edit, words)


def test_a_gemm_bias_by_rows_needs_constant_m_to_be_the_inputs_rows():
    from edgedyn.runtime.executors.ncnn_gemm import gemm
    from edgedyn.runtime.executors.ncnn_shapes import ShapeError

    def get(values):
        return lambda key, default: values.get(key, default)

    linear = {5: 1, 6: 1, 8: 4, 9: 16, 10: 4}
    assert gemm([(9, 16)], get(linear), {}) == [(9, 4)]  # a bias per output: any number of rows
    assert gemm([(9, 16)], get({**linear, 7: 9, 10: 3}), {}) == [(9, 4)]
    for values in ({**linear, 10: 3}, {**linear, 10: 1}):  # ncnn sizes that bias by constantM, here unset
        with pytest.raises(ShapeError, match="a bias by rows"):
            gemm([(9, 16)], get(values), {})
    for shape in ((3, 9, 16), (9, 15), (16,)):  # ncnn's packed weights read K values of each row
        with pytest.raises(ShapeError, match=r"for constantK 16"):
            gemm([shape], get(linear), {})
    with pytest.raises(ShapeError, match="alpha"):
        gemm([(9, 16)], get(linear), {0: (1.0, 2.0)})
    for key in (2, 4):  # A transposed or constant: not a Linear's
        with pytest.raises(ShapeError, match="edgedyn's files hold an input times constant weights"):
            gemm([(9, 16)], get({**linear, key: 1}), {})


def test_mutants_of_a_bundle_with_gemm_are_refused_cleanly(tmp_path):
    # The fuzz run of tests/test_fuzz.py over a bundle holding Gemm (ncnn_gemm.py), as for every layer the checker
    # takes: every mutant loads, runs and verifies or is refused with an EdgedynError, in a worker that must not crash.
    _assert_mutants_refused_cleanly(_rows_mlp_bundle(tmp_path)[1], seed=2613)


def _zoo_ncnn_bundle(tmp_path, name):
    from edgedyn import zoo

    model = zoo.build(name)
    return model, edgedyn.export(model, inputs=zoo.input_options(name), backend="ncnn",
                                 output=tmp_path / "{}.edgedyn".format(name))


@pytest.mark.parametrize("name, layer", [("efficientnet", "Pooling"), ("poolformer", "GroupNorm"),
                                         ("segformer", "MultiHeadAttention")])
def test_transformers_models_refused_before_run_in_ncnn_and_match_torch(tmp_path, name, layer):
    # EfficientNet pools its last (320, 2, 2) map with AvgPool2d(320, ceil_mode=True), which ncnn's Pooling would
    # not clip (edgedyn's checker refused it); the ONNX model now holds the GlobalAveragePool it is
    # (onnx_rewrites.whole_map_pools). PoolFormer normalizes with GroupNorm, SegFormer attends with
    # MultiHeadAttention (on one blob, and on three for its reduced keys and values), which the checker did not
    # know (ncnn_channels.group_norm, ncnn_attention.py).
    model, path = _zoo_ncnn_bundle(tmp_path, name)
    (spec,) = rt.read_manifest(path)["specializations"]
    assert spec["artifacts"][0]["ncnn"]["layers"].get(layer), spec["artifacts"][0]["ncnn"]["layers"]
    shape = tuple(spec["inputs"][0]["shape"])
    program = rt.load(path, threads=1)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = model(torch.from_numpy(x)).logits.numpy()
        np.testing.assert_allclose(program(x)["logits"], want, rtol=RTOL, atol=1e-5 * float(np.abs(want).max()))


def test_a_group_norm_takes_only_an_input_of_its_channels_split_evenly():
    from edgedyn.runtime.executors.ncnn_channels import group_norm
    from edgedyn.runtime.executors.ncnn_shapes import ShapeError

    def get(values):
        return lambda key, default: values.get(key, default)

    for shape in ((8,), (8, 5), (8, 4, 4), (8, 2, 4, 4)):
        assert group_norm([shape], get({0: 2, 1: 8}), {2: 1e-5}) == [shape]
    with pytest.raises(ShapeError, match=r"8 channels, an input of shape \[4, 8, 8\]"):
        group_norm([(4, 8, 8)], get({0: 2, 1: 8}), {})
    for values in ({0: 3, 1: 8}, {0: 0, 1: 8}, {0: 1, 1: 0}, {0: 2, 1: 8, 3: 2}):
        with pytest.raises(ShapeError, match="groups of"):
            group_norm([(8, 4, 4)], get(values), {})
    with pytest.raises(ShapeError, match="eps"):
        group_norm([(8, 4, 4)], get({0: 2, 1: 8}), {2: (1.0, 2.0)})


def test_mutants_of_a_bundle_with_group_norm_are_refused_cleanly(tmp_path):
    _assert_mutants_refused_cleanly(_zoo_ncnn_bundle(tmp_path, "poolformer")[1], seed=2614)


def test_multi_head_attention_takes_only_inputs_as_wide_as_its_weights():
    from edgedyn.runtime.executors.ncnn_attention import _weights, multi_head_attention
    from edgedyn.runtime.executors.ncnn_shapes import ShapeError

    def get(values):
        return lambda key, default: values.get(key, default)

    self_attention = {0: 32, 1: 2, 2: 1024, 3: 32, 4: 32}
    assert multi_head_attention([(16, 32)], get(self_attention), {}) == [(16, 32)]
    reduced = {0: 16, 1: 1, 2: 256, 3: 16, 4: 16}  # SegFormer: 64 queries, 16 keys and values
    assert multi_head_attention([(64, 16), (16, 16), (16, 16)], get(reduced), {6: 0.25}) == [(64, 16)]
    assert _weights(get(self_attention)) == [(1024, True), (32, False)] * 4
    for shapes in ([(16, 31)], [(64, 16), (16, 8), (16, 16)], [(64, 16), (16, 16), (15, 16)], [(2, 16, 32)]):
        with pytest.raises(ShapeError, match="query|inputs of shapes"):
            multi_head_attention(shapes, get(self_attention if len(shapes) == 1 else reduced), {})
    for key, value in ((5, 1), (7, 1), (18, 1)):  # a mask, a key-value cache, int8: not in edgedyn's files
        with pytest.raises(ShapeError, match=r"parameter\(s\) \[{}\] set".format(key)):
            multi_head_attention([(16, 32)], get({**self_attention, key: value}), {})
    for values in ({**self_attention, 1: 3}, {**self_attention, 2: 1000}, {**self_attention, 0: 0}):
        with pytest.raises(ShapeError, match="embed_dim"):
            multi_head_attention([(16, 32)], get(values), {})
    assert _weights(get({**self_attention, 2: 1000})) == [(-1, True)]  # the walk refuses it before ncnn reads


def test_mutants_of_a_bundle_with_multi_head_attention_are_refused_cleanly(tmp_path):
    _assert_mutants_refused_cleanly(_zoo_ncnn_bundle(tmp_path, "segformer")[1], seed=2615)
