"""ncnn files with some layers in fp32 inside an fp16 network (runtime/executors/ncnn_mixed.py, layer_probe.py): what
the export writes passes the runtime's checks and computes as before where fp16 is off, a feature mask ncnn would
compute wrong is refused, and the probe names the fewest layers whose gains cover the gate. The fp16 side runs on
the emulated Pi 5 (tests/board/test_pi_ncnn.py)."""
import zipfile

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.candidates import Candidate
from edgedyn.layer_probe import MARGIN, chosen, probe
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors.ncnn_mixed import ENTRY, mark_fp32, mask_problem, masked, probed_layers
from edgedyn.runtime.executors.ncnn_param import check_model, parse_param

from conftest import with_member

pytestmark = pytest.mark.requires("ncnn", "pnnx", "onnx")
SHAPES = {"x": (3, 96, 96)}


@pytest.fixture(scope="module")
def bundle(export_example):
    return export_example("mobilenet_v2", backend="ncnn")


def _files(bundle) -> tuple:
    with zipfile.ZipFile(str(bundle)) as archive:
        names = archive.namelist()
        return (archive.read(next(n for n in names if n.endswith("model.param"))),
                archive.read(next(n for n in names if n.endswith("weights.bin"))))


def test_every_layer_marked_fp32_reads_only_fp32_blobs_and_computes_as_before_without_fp16(bundle, tmp_path):
    param, weights = _files(bundle)
    layers = parse_param(param, "m")
    names = probed_layers(layers)
    assert len(names) > 10
    marked = mark_fp32(param.decode("ascii"), names).encode("ascii")
    checked = check_model(marked, weights, "m", SHAPES)
    assert masked(checked) == names and mask_problem(checked) is None
    entries = [layer for layer in checked if layer.type == ENTRY]
    # an entry before each marked layer that reads a layer left in fp16 (none before the first: it reads the input)
    assert 0 < len(entries) < len(names) and len(checked) == len(layers) + len(entries)
    assert checked[1].name == names[0] and checked[1].bottoms == layers[1].bottoms
    x = np.random.default_rng(3).standard_normal((1, 3, 96, 96)).astype(np.float32)
    plain = rt.load(bundle, threads=1)(x)
    mixed = rt.load(with_member(bundle, "model.param", lambda _: marked, tmp_path / "mixed.edgedyn"), threads=1)
    np.testing.assert_allclose(mixed(x), plain, rtol=1e-6, atol=1e-6 * np.abs(plain).max())


def test_marking_a_layer_twice_or_none_changes_nothing_else(bundle):
    param = _files(bundle)[0].decode("ascii")
    names = probed_layers(parse_param(param.encode(), "m"))
    once = mark_fp32(param, names[3:5])
    assert mark_fp32(once, names[3:5]) == once
    assert mark_fp32(param, []) == param.rstrip("\n") + "\n"
    assert mark_fp32(param, names[4:5]).count(ENTRY) == 1


@pytest.mark.parametrize("edit, words", [
    (lambda text, names: text.replace(" 31=3", " 31=1", 1), "has feature mask 1 (31=3 is the only one"),
    (lambda text, names: text.replace(" 31=3", " 31=7", 1), "has feature mask 7"),
    (lambda text, names: text.replace(ENTRY + " ", "Noop ", 1), "computes in fp32 (31=3) but reads"),
    (lambda text, names: text.replace("_fp32\n", "_fp32 0=2.0\n", 1), "computes in fp32 (31=3) but reads"),
])
def test_a_mask_ncnn_would_compute_wrong_is_refused_before_ncnn_reads_it(bundle, edit, words):
    param, weights = _files(bundle)
    names = probed_layers(parse_param(param, "m"))
    text = mark_fp32(param.decode("ascii"), names[2:6])
    check_model(text.encode("ascii"), weights, "m", SHAPES)
    with pytest.raises(BundleError) as raised:
        check_model(edit(text, names).encode("ascii"), weights, "m", SHAPES)
    assert "is not a valid ncnn model: " in raised.value.message and words in raised.value.message, raised.value


def test_the_probe_names_the_fewest_layers_that_bring_the_error_to_half_the_allowance():
    names = [("a",), ("b",), ("c",), ("d",)]
    # every layer reduced: error 0.004 (cosine 0.996), the gate's allowance 0.001: gains must reach 0.0035
    assert chosen(names, 0.004, [0.001, 0.0001, 0.0035, 0.0041], 0.999) == ([("b",)], True)
    assert chosen(names, 0.004, [0.0024, 0.002, 0.0035, 0.0041], 0.999) == ([("b",), ("a",)], True)
    assert chosen(names, 0.004, [0.0035, 0.0038, 0.0039, 0.0041], 0.999) == ([("a",), ("b",), ("c",)], False)
    assert chosen(names, 0.004, [0.0041, 0.0042, 0.004, 0.005], 0.999) == ([], False)  # no layer alone gains
    assert chosen(names, 0.0004, [0.0001, 0.0003, 0.0004, 0.0004], 0.999) == ([("a",)], True)  # within: the best
    assert chosen(names, 0.01, [0.009, 0.008, 0.0099, 0.01], None) == ([("b",), ("a",), ("c",)], False)
    assert MARGIN == 2.0


def test_a_probed_candidate_says_how_many_layers_it_keeps_fp32():
    candidate = Candidate("ncnn", "fp16", fp32_layers=("conv_3", "convdw_7"))
    assert candidate.label == "ncnn:fp16+fp32-2-layers"
    assert candidate.words == "ncnn in fp16 with the 2 layers it costs most accuracy in fp32"
    assert Candidate("ncnn", "fp16", fp32_layers=("conv_3",)).words.endswith(" with the layer it costs most accuracy "
                                                                              "in fp32")


def test_mutants_of_a_mixed_bundle_are_refused_cleanly(bundle, tmp_path):
    # tests/test_fuzz.py's campaign over a bundle whose model holds feature masks and entry Dropouts: every mutant
    # (its .param and .bin tampered with and resealed among them) loads, runs and verifies or is refused with an
    # EdgedynError, in a worker that must not crash.
    from test_ncnn_backend import _assert_mutants_refused_cleanly

    def marked(param: bytes) -> bytes:
        return mark_fp32(param.decode("ascii"), probed_layers(parse_param(param, "m"))[2:9]).encode("ascii")

    _assert_mutants_refused_cleanly(with_member(bundle, "model.param", marked, tmp_path / "mixed.edgedyn"), seed=1207)


class _Gate:
    """A FloatGate's interface over a fixed reference vector: its error is 1 - the lowest cosine over its batches."""

    def __init__(self) -> None:
        from edgedyn.quantize.accuracy import Gate

        self.gate, self.batches, self.reference = Gate(min_cosine=0.999), [0, 1], np.ones(64)

    def first(self, count: int) -> "_Gate":
        return self

    def measure(self, run) -> list:
        got = [run(batch)[0] for batch in self.batches]
        return [{"cosine": min(float(g @ self.reference / np.linalg.norm(g) / np.linalg.norm(self.reference))
                               for g in got)}]


class _Board:
    """The emulated board's probe_layers over a model whose error is the sum of its fp16 layers' sensitivities."""

    def __init__(self, sensitivity: dict, joint=None) -> None:
        # joint(names in fp32) -> the error, where the layers' errors do not simply add up
        self.sensitivity, self.joint, self.runs = sensitivity, joint, []

    def where(self) -> str:
        return "a fake board"

    def probe_layers(self, label, staged, script, variants, batches, base) -> dict:
        self.runs.append([names for _, names in variants])
        outputs = {}
        for key, names in ([("base", [])] if base else []) + [tuple(v) for v in variants]:
            error = (self.joint(names) if self.joint else
                     sum(s for name, s in self.sensitivity.items() if name not in names))
            orthogonal = np.zeros(64)
            orthogonal[:32], orthogonal[32:] = 1.0, -1.0  # at right angles to the reference, as long
            spread = np.sqrt(1.0 / (1.0 - error) ** 2 - 1.0)  # cosine exactly 1 - error
            for b in range(batches):
                outputs["{}.{}".format(key, b)] = [np.ones(64) + spread * orthogonal]
        return outputs


def _artifact(names: list):
    """An ncnn fp16 artifact of a chain of 1x1 convolutions named `names` (the probe reads only its .param)."""
    from edgedyn.backends.artifact import Artifact

    lines = ["7767517", "{0} {0}".format(len(names) + 1), "Input in0 0 1 b0"] + [
        "Convolution {} 1 1 b{} b{} 0=1 1=1 6=1".format(name, i, i + 1) for i, name in enumerate(names)]
    return Artifact(backend="ncnn", executor="ncnn", device="cpu", arch=None, target="ncnn-cpu-fp16",
                    files={"model": "\n".join(lines).encode("ascii"), "weights": b""},
                    file_names={"model": "model.param", "weights": "weights.bin"}, meta={})


def test_the_probe_searches_groups_then_the_layers_of_those_that_gain():

    names = ["conv_{}".format(i) for i in range(16)]
    artifact = _artifact(names)
    sensitivity = dict({name: 0.00001 for name in names}, conv_5=0.003, conv_11=0.0005)
    board, said = _Board(sensitivity), []
    # every layer fp16: error 0.00364, 0.00314 over half the allowance: conv_5 alone leaves 0.00064, both 0.00014
    assert probe(board, "ncnn:fp16", None, artifact, _Gate(), said.append) == ("conv_5", "conv_11")
    groups, singles, together = board.runs
    # measured together: the best alone leaves 0.00064, not enough; the best two 0.00014
    assert [len(names) for names in together] == [1, 2, 3, 4, 6, 8] and together[1] == ["conv_5", "conv_11"]
    assert groups == [names[i:i + 4] for i in range(0, 16, 4)]  # sqrt(16) groups of 4
    assert sorted(singles) == [[name] for name in sorted(names[4:12])]  # the two groups that gained, layer by layer
    assert "probing which of its 16 layers fp16 costs most accuracy in, 4 groups first, on a fake board" in said[0]
    # an error spread evenly (0.0004 a layer, 0.0064 in all): every group, then the 15 layers that leave 0.0004
    board = _Board({name: 0.0004 for name in names})
    assert len(probe(board, "ncnn:fp16", None, artifact, _Gate(), said.append)) == 15
    assert len(board.runs) == 3 and len(board.runs[1]) == 16
    assert [len(names) for names in board.runs[2]] == [1, 2, 3, 4, 6, 9, 13, 15, 16]  # the sum's 15 is the fewest


def test_the_probe_names_the_fewest_layers_that_measured_together_leave_half_the_allowance():
    # MobileNetV2's ncnn fp16 on the emulated Orin: the sum of gains alone asked for 10 layers, its best 5 together
    # reached cosine 0.99961. Here an error that compounds: each of the 8 sensitive layers in fp32 cuts what is left
    # by a factor, so the sum of gains alone is wrong both ways.
    names = ["conv_{}".format(i) for i in range(16)]
    artifact = _artifact(names)
    sensitive = names[:8]

    def joint(fp32) -> float:
        return 0.008 * 0.5 ** len([name for name in fp32 if name in sensitive])

    # alone, each gains 0.004 of 0.008; the sum says two cover the 0.0075 needed, measured two leave 0.002 and it
    # takes four (one group's: the two gain alike) to leave 0.0005
    board, said = _Board({}, joint=joint), []
    assert probe(board, "ncnn:fp16", None, artifact, _Gate(), said.append) in (tuple(sensitive[:4]),
                                                                                tuple(sensitive[4:]))
    assert [len(names) for names in board.runs[2]] == [1, 2, 3, 4]
    board = _Board({}, joint=lambda fp32: 0.008 * 0.6 ** len([name for name in fp32 if name in sensitive]))
    # groups 0 and 1 gain, each layer alone 0.0032: the sum says three, measured three leave 0.0017 and six 0.00037
    chosen_layers = probe(board, "ncnn:fp16", None, artifact, _Gate(), said.append)
    assert len(chosen_layers) == 6 and set(chosen_layers) <= set(sensitive)
    assert "measuring its best" in said[-1]
