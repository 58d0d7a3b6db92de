"""Buckets and padding: --input sizes in braces, the padding proof at export, dispatch, slicing and the errors users see.

Small hand-written models on the portable backend, compared with torch eager on the unpadded call; the zoo encoders
on every backend are in test_buckets_zoo.py.
"""
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgedyn
import edgedyn.runtime as rt
from edgedyn.errors import CaptureError
from edgedyn.frontend.buckets import expand_buckets, parse_pad
from edgedyn.frontend.inputs import Buckets, TensorSpec, parse_input_options, parse_value
from edgedyn.frontend.padding import PaddingRefused, _affine
from edgedyn.runtime import bucket_schema
from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError, GuardError

RTOL = 1e-4


class TokenModel(nn.Module):
    """Ids -> per-token features and a masked mean: padding-invariant only through its attention_mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None):
        hidden = torch.tanh(self.mix(self.embed(input_ids)))
        if attention_mask is None:
            pooled = hidden.mean(1)  # over the padding too
        else:
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1)
        return {"logits": self.head(pooled), "tokens": hidden}


class Conv1dValid(nn.Module):
    """A conv without padding: an output frame per 3 samples, so lengths below 3 give nothing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv1d(2, 4, 3, stride=2)

    def forward(self, x):
        return torch.relu(self.conv(x))


class SmallCNN(nn.Module):
    """Per sample: conv, batch norm (eval), global pool, linear; batches pad safely, images do not."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


TOKENS = ["input_ids=1x{4,8,16}:int64", "attention_mask=1x{4,8,16}:int64"]


@pytest.fixture(scope="module")
def tokens_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("buckets") / "tokens.edgedyn"
    return edgedyn.export(TokenModel(), inputs=TOKENS, pad="input_ids=0,attention_mask=0", backend="portable",
                          output=path)


def _eager(model, **tensors):
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in tensors.items()})
    return out if isinstance(out, dict) else {"output": out}


def _assert_close(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    assert float(np.max(np.abs(got - want))) <= 1e-6 + RTOL * scale


# --- parsing ---

@pytest.mark.parametrize("text, expected", [
    ("1x{16,32,64}:int64", Buckets((1, 16), "int64", 1, (16, 32, 64), "x=1x{16,32,64}:int64")),
    ("{1,4,8}x3x8x8", Buckets((1, 3, 8, 8), "float32", 0, (1, 4, 8), "x={1,4,8}x3x8x8")),
    ("1x{32,16}", Buckets((1, 16), "float32", 1, (16, 32), "x=1x{32,16}")),
])
def test_bucket_sizes_parse_into_one_axis(text, expected):
    assert parse_value("x", text) == expected
    assert expected.at(expected.sizes[-1]).shape[expected.axis] == expected.sizes[-1]


@pytest.mark.parametrize("text, message", [
    ("1x{16,32}x{2,4}", "cannot read --input x=1x{16,32}x{2,4}"),
    ("1x{16,16}", "a size is listed twice"),
    ("1x{16,}", "cannot read"),
    ("1x{0,16}", "zero or negative size"),
])
def test_bucket_sizes_errors(text, message):
    with pytest.raises(CaptureError, match=message.replace("{", r"\{").replace("}", r"\}")):
        parse_value("x", text)


def test_inputs_bucketed_together_take_their_sizes_in_step():
    sets, groups = expand_buckets(parse_input_options(TOKENS + ["n=2"]))
    assert [s["input_ids"].shape for s in sets] == [(1, 4), (1, 8), (1, 16)]
    assert [s["attention_mask"] for s in sets] == [TensorSpec((1, n), "int64") for n in (4, 8, 16)]
    assert all(s["n"] == 2 for s in sets)
    (group,) = groups
    assert group.inputs == {"input_ids": 1, "attention_mask": 1} and group.specializations == [0, 1, 2]
    with pytest.raises(CaptureError, match="list different sizes"):
        expand_buckets(parse_input_options(["a=1x{4,8}", "b=1x{4,16}"]))


@pytest.mark.parametrize("pad, message", [
    ("input_ids", "cannot read --pad 'input_ids'"),
    ("input_ids=0,input_ids=1", "gives 'input_ids' twice"),
    ("input_ids=zero", "the pad value must be a number"),
])
def test_pad_option_errors(pad, message):
    with pytest.raises(CaptureError, match=message):
        parse_pad(pad)


@pytest.mark.parametrize("pad, message", [
    ("input_ids=0", "--pad gives no value for bucketed input\\(s\\) attention_mask"),
    ("input_ids=0,attention_mask=0,labels=0", "--pad names labels, which is not bucketed"),
    ("input_ids=0.5,attention_mask=0", "input 'input_ids' is int64, which cannot hold that value exactly"),
])
def test_pad_values_are_checked_against_the_buckets(pad, message, tmp_path):
    with pytest.raises(CaptureError, match=message):
        edgedyn.export(TokenModel(), inputs=TOKENS, pad=pad, backend="portable", output=tmp_path / "t.edgedyn")


def test_pad_without_buckets_says_how_to_bucket(tmp_path):
    with pytest.raises(CaptureError, match="--pad is given, but no input is bucketed"):
        edgedyn.export(TokenModel(), inputs=["input_ids=1x8:int64"], pad="input_ids=0", backend="portable",
                       output=tmp_path / "t.edgedyn")


# --- length rules ---

def test_length_rules_fold_nested_floors():
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    s = sympy.Symbol("s", integer=True, positive=True)
    chain = FloorDiv(FloorDiv(FloorDiv(s, 5) - 9, 4) - 7, 4) + 1  # wav2vec2's three strided convs
    rule = _affine(chain, {s})
    assert rule == {"scale": 1, "offset": -105, "divisor": 80}
    for length in range(265, 2000, 7):
        assert (length - 105) // 80 == ((((length // 5) - 9) // 4) - 7) // 4 + 1
    assert _affine(2 * s + 3, {s}) == {"scale": 2, "offset": 3, "divisor": 1}
    assert _affine(sympy.Max(s, 4), {s}) is None
    assert _affine(s * s, {s}) is None


# --- dispatch on the board ---

def test_calls_between_buckets_match_torch_on_the_unpadded_input(tokens_bundle):
    model = TokenModel().eval()
    program = rt.load(tokens_bundle)
    rng = np.random.default_rng(0)
    for length in list(rng.integers(1, 17, 16)) + [1, 4, 8, 16]:
        ids = rng.integers(0, 10, (1, int(length))).astype(np.int64)
        mask = np.ones_like(ids)
        want = _eager(model, input_ids=ids, attention_mask=mask)
        for got in (program(ids, mask), program(input_ids=ids, attention_mask=mask), program(ids, mask)):
            _assert_close(got["logits"], want["logits"].numpy())
            _assert_close(got["tokens"], want["tokens"].numpy())


def test_a_call_pads_to_the_smallest_bucket_that_holds_it(tokens_bundle):
    program = rt.load(tokens_bundle)
    ids = np.arange(5, dtype=np.int64)[None] % 10
    spec, arrays, finish = program.route_call((ids, np.ones_like(ids)), {})
    assert spec.name == "input_ids=1x8:int64,attention_mask=1x8:int64"
    assert arrays[0].tolist() == [[0, 1, 2, 3, 4, 0, 0, 0]] and arrays[1].tolist() == [[1] * 5 + [0] * 3]
    assert program.dispatch(ids, np.ones_like(ids))[0] is spec  # what `edgedyn run` reports
    exact = np.zeros((1, 8), np.int64)
    assert program.route_call((exact, exact), {})[2] is None  # a bucket's own length: no padding


@pytest.mark.parametrize("lengths, message, hint", [
    ((17, 17), "'input_ids' dim 1, 'attention_mask' dim 1 length 17 is above the largest bucket, 16",
     "cut the input to 16, or export again adding a bucket: --input 'input_ids=1x{4,8,16,17}:int64' --input "
     "'attention_mask=1x{4,8,16,17}:int64' --pad input_ids=0,attention_mask=0"),
    ((5, 6), "the bucketed inputs must have one length, got 'input_ids' dim 1 = 5, 'attention_mask' dim 1 = 6",
     "pad or cut them together"),
])
def test_lengths_the_buckets_cannot_serve_fail_in_words(tokens_bundle, lengths, message, hint):
    program = rt.load(tokens_bundle)
    with pytest.raises(GuardError) as raised:
        program(np.zeros((1, lengths[0]), np.int64), np.ones((1, lengths[1]), np.int64))
    assert raised.value.message == message
    assert raised.value.hint.startswith(hint)


def test_a_length_too_short_for_the_model_is_refused_in_words(tmp_path):
    path = edgedyn.export(Conv1dValid(), inputs=["x=1x2x{8,16}"], pad="x=0", backend="portable",
                          output=tmp_path / "conv.edgedyn")
    program = rt.load(path)
    padding = program.manifest["buckets"][0]["padding"]
    assert padding["min_length"] == 3
    assert padding["outputs"][0]["axes"] == [{"axis": 2, "scale": 1, "offset": -1, "divisor": 2}]
    for length in range(3, 17):
        x = np.random.default_rng(length).standard_normal((1, 2, length)).astype(np.float32)
        _assert_close(program(x), _eager(Conv1dValid().eval(), x=x)["output"].numpy())
    with pytest.raises(GuardError, match="'x' dim 2 length 2 is below 3, the shortest this model takes"):
        program(np.ones((1, 2, 2), np.float32))


def test_batch_buckets_pad_with_zeros_and_match_per_sample(tmp_path):
    model = SmallCNN().eval()
    path = edgedyn.export(model, inputs=["x={1,4,8}x3x8x8"], pad="x=0", backend="portable",
                          output=tmp_path / "batch.edgedyn")
    program = rt.load(path)
    assert program.manifest["buckets"][0]["padding"]["outputs"][0]["axes"][0]["axis"] == 0
    for batch in (1, 2, 3, 4, 5, 7, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        _assert_close(program(x), _eager(model, x=x)["output"].numpy())


def test_left_padding_keeps_the_end_of_each_output(tmp_path):
    model = TokenModel().eval()  # no positions: padding on the left is as invariant as on the right
    path = edgedyn.export(model, inputs=TOKENS, pad="input_ids=0,attention_mask=0", pad_side="left",
                          backend="portable", output=tmp_path / "left.edgedyn")
    program = rt.load(path)
    assert program.manifest["buckets"][0]["padding"]["source"] == ("--pad input_ids=0,attention_mask=0 "
                                                                   "--pad-side left")
    ids = np.arange(3, 9, dtype=np.int64)[None]
    spec, arrays, _ = program.route_call((ids, np.ones_like(ids)), {})
    assert arrays[0].tolist() == [[0, 0, 3, 4, 5, 6, 7, 8]] and arrays[1].tolist() == [[0, 0] + [1] * 6]
    want = _eager(model, input_ids=ids, attention_mask=np.ones_like(ids))
    got = program(ids, np.ones_like(ids))
    _assert_close(got["tokens"], want["tokens"].numpy())
    _assert_close(got["logits"], want["logits"].numpy())


def test_exact_buckets_without_pad_say_how_to_pad(tmp_path):
    path = edgedyn.export(TokenModel(), inputs=TOKENS, backend="portable", output=tmp_path / "exact.edgedyn")
    program = rt.load(path)
    assert "padding" not in program.manifest["buckets"][0]
    program(np.zeros((1, 8), np.int64), np.ones((1, 8), np.int64))  # a bucket's own shape runs
    with pytest.raises(GuardError, match="no specialization of TokenModel matches") as raised:
        program(np.zeros((1, 5), np.int64), np.ones((1, 5), np.int64))
    assert raised.value.hint == ("its buckets [4, 8, 16] are exact shapes (exported without --pad): pass one of "
                                 "those lengths, or export again with --pad input_ids=0,attention_mask=0 to pad the "
                                 "lengths between them")


# --- refusals ---

def _mean_over_padding(x):
    return (x * 2.0).mean(1)


@pytest.mark.parametrize("model, inputs, pad, message, hint", [
    (_mean_over_padding, ["x=1x{4,8}"], "x=0",
     "padding is not exact for _mean_over_padding: output 'output_0' changes when 'x' dim 1 is padded from 2 to 4",
     "pool over the valid positions only (masked pooling"),
    (SmallCNN(), ["x=1x3x{8,16}x16"], "x=0",
     "padding is not exact for SmallCNN: output 'output_0' changes when 'x' dim 2 is padded from",
     "pool over the valid positions only"),
    (TokenModel(), ["input_ids=1x{4,8}:int64"], "input_ids=0",
     "padding is not exact for TokenModel: output 'logits' changes when 'input_ids' dim 1 is padded from 2 to 4",
     "pass the model its attention_mask as an input, bucketed and padded with 0 (--input "
     "'attention_mask=1x{4,8}:int64' --pad input_ids=0,attention_mask=0)"),
])
def test_outputs_that_depend_on_the_padding_refuse_it_with_the_numbers(model, inputs, pad, message, hint, tmp_path):
    with pytest.raises(PaddingRefused) as raised:
        edgedyn.export(model, inputs=inputs, pad=pad, backend="portable", output=tmp_path / "r.edgedyn")
    assert raised.value.message.startswith(message), raised.value.message
    assert "max abs error" in raised.value.message and "the fp32 tolerance is 0.0001" in raised.value.message
    assert hint in raised.value.hint and raised.value.hint.endswith(
        "or leave --pad out: the buckets still work as exact shapes")
    assert not (tmp_path / "r.edgedyn").exists()
    edgedyn.export(model, inputs=inputs, backend="portable", output=tmp_path / "exact.edgedyn")  # exact: fine


class NormOverTime(nn.Module):
    """A group norm over the padded axis (wav2vec2-base's first conv does this): the padding moves its statistics."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.proj = nn.Conv1d(2, 4, 1)
        self.norm = nn.GroupNorm(4, 4)

    def forward(self, x):
        return self.norm(self.proj(x))


@pytest.mark.parametrize("model, inputs, culprit", [
    (NormOverTime(), ["x=1x2x{8,16}"], "norm (GroupNorm)"),
    (SmallCNN(), ["x=1x3x{8,16}x16"], "SmallCNN.forward itself, outside its submodules"),
])
def test_the_refusal_names_the_module_where_padding_leaks_in(model, inputs, culprit, tmp_path):
    with pytest.raises(PaddingRefused) as raised:
        edgedyn.export(model, inputs=inputs, pad="x=0", backend="portable", output=tmp_path / "r.edgedyn")
    assert raised.value.message.endswith(
        "the first module whose output's valid part changes while its input's does not: " + culprit)


# --- the bundle: manifest, verify, memory ---

def test_the_manifest_records_rules_and_proof_and_verify_runs_padded_calls(tokens_bundle):
    program = rt.load(tokens_bundle)
    (group,) = program.manifest["buckets"]
    assert group["sizes"] == [4, 8, 16] and group["inputs"] == {"input_ids": 1, "attention_mask": 1}
    padding = group["padding"]
    assert padding["source"] == "--pad input_ids=0,attention_mask=0" and padding["min_length"] == 1
    assert [o["axes"] for o in padding["outputs"]] == [[], [{"axis": 1, "scale": 1, "offset": 0, "divisor": 1}]]
    probes = padding["proof"]["probes"]
    assert {p["size"] for p in probes} == {4, 8, 16} and all(p["length"] < p["size"] for p in probes)
    assert max(o["max_rel"] for p in probes for o in p["outputs"]) < 1e-5
    results = program.verify()
    padded = [r for r in results if "padded from" in r["specialization"]]
    assert len(padded) == 2 * len(padding["reference_lengths"]) and all(r["ok"] for r in results)


def test_bucket_executors_share_one_arena_and_fit_counts_it_once(tokens_bundle):
    program = rt.load(tokens_bundle)
    arenas = [spec.executor.arena for spec in program.specializations]
    assert all(np.shares_memory(arenas[0], other) for other in arenas[1:])
    planned = [spec.record["memory"]["arena_bytes"] for spec in program.specializations]
    assert program.manifest["fit"]["arena_bytes"] == max(planned) < sum(planned)
    from edgedyn.fit import shared_arenas

    assert shared_arenas([10, 30, 20, 5], ["portable", "portable", "onnxruntime", "portable"], [[0, 1, 2]]) == [
        30, 0, 20, 5]


def test_threads_calling_different_buckets_at_once_get_their_own_answers(tokens_bundle):
    program = rt.load(tokens_bundle)
    model = TokenModel().eval()
    failures = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            ids = rng.integers(0, 10, (1, int(rng.integers(1, 17)))).astype(np.int64)
            mask = np.ones_like(ids)
            got = program(ids, mask)["tokens"]
            want = _eager(model, input_ids=ids, attention_mask=mask)["tokens"].numpy()
            if got.shape != want.shape or np.max(np.abs(got - want)) > 1e-4:
                failures.append((seed, ids.shape))
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def _manifest(tokens_bundle: Path):
    return json.loads(json.dumps(rt.load(tokens_bundle).manifest))


@pytest.mark.parametrize("edit, message", [
    (lambda g: g.update(sizes=[8, 4, 16]), "expected 1 to 64 increasing sizes"),
    (lambda g: g.update(specializations=[0, 1, 7]), "is outside"),
    (lambda g: g.update(specializations=[1, 0, 2]), "specialization 1 does not take input '[a-z_]+' with dim 1 of "
                                                    "size 4"),
    (lambda g: g.update(inputs={"labels": 1}), "is not one of input_ids, attention_mask"),
    (lambda g: g["padding"].update(min_length=0), "min_length: 0 is outside"),
    (lambda g: g["padding"]["outputs"][1]["axes"][0].update(divisor=0), "divisor: 0 is outside"),
    (lambda g: g["padding"]["outputs"][1]["axes"][0].update(axis=5), "axis: 5 is outside"),
    (lambda g: g["padding"].update(values={"input_ids": 0}), "pads input_ids, the group buckets"),
    (lambda g: g["padding"].update(side="middle"), "'middle' is not one of right, left"),
    (lambda g: g["padding"].update(reference="nope.npz"), "names member nope.npz, which the manifest does not list"),
])
def test_the_manifest_buckets_are_checked_before_use(tokens_bundle, edit, message):
    manifest = _manifest(tokens_bundle)
    edit(manifest["buckets"][0])
    with pytest.raises(BundleError, match=message):
        bucket_schema.check_buckets(schema.Checker("t.edgedyn", "manifest.json"), manifest)


def test_mutated_bucket_bundles_are_refused_cleanly(tokens_bundle):
    """The fuzz run of test_fuzz.py over a padded bundle: its manifest edits reach the bucket records, and the
    worker's verify() runs the padded calls; nothing may crash or raise anything but an EdgedynError."""
    from test_fuzz import _fuzz

    fuzz = _fuzz()
    records = fuzz.campaign([tokens_bundle], 40, seed=29)
    assert {record["family"] for record in records} >= {"manifest", "zip"}
    bad = fuzz.findings(records)
    assert not bad, [(r["family"], r["mutation"], r["outcome"], r.get("type")) for r in bad[:10]]



@pytest.mark.parametrize("shape", [[], [1]])
def test_a_bucket_whose_output_rank_differs_from_the_groups_is_refused(tokens_bundle, tmp_path, shape):
    """The fuzz run above found it (seed 29, once the manifest's paths changed): a bucket other than the group's
    last with a scalar (or lower-rank) output passed the schema, and slicing that output raised IndexError at the
    first padded call. Every bucket's outputs are cut by the same rules, so they must agree in rank."""
    import zipfile

    with zipfile.ZipFile(tokens_bundle) as source:
        manifest = json.loads(source.read("manifest.json"))
        manifest["specializations"][1]["outputs"][1]["shape"] = shape
        mutated = tmp_path / "mutated.edgedyn"
        with zipfile.ZipFile(mutated, "w") as target:
            for info in source.infolist():
                data = json.dumps(manifest).encode() if info.filename == "manifest.json" else source.read(info)
                target.writestr(info, data)
    with pytest.raises(rt.EdgedynError) as raised:
        rt.load(mutated).verify()
    assert "buckets[0].padding" in raised.value.message and "outputs of ranks" in raised.value.message


# --- the command line ---

def test_cli_export_inspect_and_bench_buckets(run_cli, tmp_path):
    model = tmp_path / "tok.py"
    model.write_text("import torch\n\ndef double(x):\n    return torch.tanh(x) * 2\n")
    bundle = tmp_path / "d.edgedyn"
    exported = run_cli("export", "{}:double".format(model), "--input", "x=1x{4,8}", "--pad", "x=0", "--backend",
                       "portable", "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr
    assert "proving that padding x to {4,8} leaves every output exact" in exported.stderr
    text = run_cli("inspect", str(bundle)).stdout
    assert "buckets    x dim 1: 4, 8  (--input 'x=1x{4,8}')" in text
    assert "padding  right with x=0; lengths 1 to 8; proven at" in text
    assert "output   output_0: sliced to dim 1: L" in text
    timed = run_cli("bench", str(bundle), "--buckets", "--iterations", "5", "--duration", "0", "--warmup", "1",
                    "--json", "-")
    report = json.loads(timed.stdout)
    assert [(b["bucket"]["size"], b["bucket"]["length"]) for b in report["buckets"]] == [(4, 2), (8, 6)]
    assert all(b["dispatch_us"] > 0 and 0 < b["dispatch_share"] for b in report["buckets"])
    timed = run_cli("bench", str(bundle), "--length", "3", "--iterations", "5", "--duration", "0")
    assert "dispatch" in timed.stdout and "padding and slicing back" in timed.stdout, timed.stdout + timed.stderr
    assert "random (seed 0) at length 3: x float32[1x3]" in timed.stdout


def test_cli_refusal_and_shell_expanded_braces_are_errors_with_hints(run_cli, tmp_path):
    model = tmp_path / "mean.py"
    model.write_text("def mean(x):\n    return x.mean(1)\n")
    refused = run_cli("export", "{}:mean".format(model), "--input", "x=1x{4,8}", "--pad", "x=0", "--backend",
                      "portable", "-o", str(tmp_path / "m.edgedyn"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "error: padding is not exact for mean: output 'output_0' changes when 'x' dim 1 is padded" in refused.stderr
    assert "hint: pool over the valid positions only" in refused.stderr
    expanded = run_cli("export", "{}:mean".format(model), "--input", "x=1x4", "x=1x8", "-o",
                       str(tmp_path / "x.edgedyn"))
    assert expanded.returncode == 2
    assert "error: unexpected argument x=1x8: the shell expanded the braces of a bucketed --input into separate " \
           "words" in expanded.stderr
    assert "hint: quote the option so edgedyn sees the braces: --input 'x=1x{16,32,64}:int64'" in expanded.stderr
