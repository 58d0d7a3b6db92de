"""Each pass shrinks the graph and keeps outputs equal to torch eager on fresh random inputs."""
import copy

import pytest
import torch
from torch import nn

import edgedyn
from edgedyn.passes import PIPELINES, run_pipeline
from edgedyn.passes.batchnorm import fold_batchnorm
from edgedyn.passes.constant_folding import fold_constants
from edgedyn.passes.dead_code import remove_dead_code
from edgedyn.passes.decompose import decompose_to_core_aten, is_core_aten
from edgedyn.passes.graph import op_count, op_histogram
from edgedyn.passes.indexing import index_put_to_where, index_to_views
from edgedyn.errors import EdgedynError

RTOL = 1e-5


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn2 = nn.BatchNorm2d(8, affine=False)
        self.fc = nn.Linear(8, 4)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2.0)
        self.bn1.weight.data.uniform_(0.5, 2.0)
        self.bn1.bias.data.uniform_(-1, 1)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        return self.fc(x.mean((2, 3)))


class DeadAndConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 5))
        self.scale = nn.Parameter(torch.rand(5) + 0.5)
        self.unused = nn.Linear(5, 5)

    def forward(self, x):
        unused = self.unused(x) * 3  # noqa: F841  dead: its result is never returned
        w = (self.weight * self.scale).t()  # weights only: folded at export time
        return x @ w.t().t()


def _graph(model, *shapes):
    inputs = tuple(torch.randn(*s) for s in shapes)
    (spec,) = edgedyn.capture(model.eval(), inputs).specializations
    return spec.program.module()


def _assert_same(model, gm, *shapes):
    for _ in range(3):
        inputs = tuple(torch.randn(*s) for s in shapes)
        with torch.no_grad():
            expected = model(*inputs)
            (actual,) = gm(*inputs)
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=1e-6)


def test_decompose_gives_core_aten_and_same_outputs():
    model = ConvBN()
    gm = decompose_to_core_aten(_graph(model, (2, 3, 16, 16)))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert all(is_core_aten(t) for t in targets), [t for t in targets if not is_core_aten(t)]
    assert torch.ops.aten.convolution.default in targets and torch.ops.aten.conv2d.default not in targets
    _assert_same(model, gm, (2, 3, 16, 16))


def test_fold_batchnorm_removes_every_batch_norm():
    model = ConvBN()
    gm = decompose_to_core_aten(_graph(model, (2, 3, 16, 16)))
    before = op_count(gm)
    gm = remove_dead_code(fold_batchnorm(gm))
    assert "_native_batch_norm_legit_no_training.default" not in str(op_histogram(gm))
    assert op_count(gm) == before - 2
    _assert_same(model, gm, (2, 3, 16, 16))


def test_fold_batchnorm_keeps_a_conv_whose_raw_output_is_also_used():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    model = Shared()
    gm = decompose_to_core_aten(_graph(model, (1, 3, 4, 4)))
    before = op_histogram(gm)
    gm = remove_dead_code(fold_batchnorm(gm))
    assert op_histogram(gm) == before
    _assert_same(model, gm, (1, 3, 4, 4))


def test_fold_constants_evaluates_weight_only_subgraphs():
    model = DeadAndConstant()
    gm = decompose_to_core_aten(_graph(model, (3, 5)))
    before = op_count(gm)
    gm = remove_dead_code(fold_constants(gm))
    histogram = op_histogram(gm)
    assert op_count(gm) < before
    assert "mul.Tensor" not in str(histogram)  # weight * scale was computed at export time
    _assert_same(model, gm, (3, 5))


class MaskedAttention(nn.Module):
    """Attention with the mask plumbing transformers builds at run time from shapes alone: arange, a compare,
    where, full_like. At fixed shapes all of it is a constant; only the scores depend on the input."""

    def forward(self, x):
        n = x.shape[1]
        positions = torch.arange(n)
        allowed = (positions[None, :] <= positions[:, None]) | (positions[None, :] >= 0)
        mask = torch.where(allowed, torch.tensor(0.0), torch.tensor(float("-inf")))
        scores = x @ x.transpose(1, 2) + mask + torch.full_like(x[:, :, :1], 0.25)
        return torch.softmax(scores, -1) @ x


def _op_names(histogram):
    return {name.split("::")[-1].split(".")[0] for name in histogram}


def test_fold_constants_evaluates_what_depends_only_on_shapes():
    model = MaskedAttention()
    gm = decompose_to_core_aten(_graph(model, (2, 6, 4)))
    before = op_histogram(gm)
    assert {"arange", "where", "full_like"} <= _op_names(before)
    gm = remove_dead_code(fold_constants(gm))
    after = op_histogram(gm)
    assert op_count(gm) < sum(before.values())
    assert not {"arange", "le", "ge", "bitwise_or", "logical_or", "where", "full_like"} & _op_names(after), after
    _assert_same(model, gm, (2, 6, 4))


def test_fold_constants_leaves_uninitialized_memory_alone():
    class Empty(nn.Module):
        def forward(self, x):
            return torch.empty_like(x).fill_(2.0) * x  # fill_ makes it a value; empty_like alone never is

    gm = decompose_to_core_aten(_graph(Empty(), (3, 4)))
    gm = remove_dead_code(fold_constants(gm))
    _assert_same(Empty(), gm, (3, 4))


class IndexByAranges(nn.Module):
    """x[arange, arange] with broadcast aranges, as transformers reads an attention mask (padding_mask_function)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        batch, length = x.shape[0], x.shape[-1]
        b = torch.arange(batch)[:, None, None, None]
        k = torch.arange(length)[None, None, None, :]
        if self.kind == "mask":  # the transformers pattern: [B, L] -> [B, 1, 1, L]
            return x[b, k] * 2.0
        if self.kind == "leading":  # only the first dim indexed; the trailing dims stay
            return x[torch.arange(batch)[:, None]] + 1.0
        if self.kind == "reversed":  # not an arange: a real gather, left alone
            return x[b, torch.flip(k, [-1])] * 2.0
        raise ValueError(self.kind)


@pytest.mark.parametrize("kind, shape, rewritten", [
    ("mask", (1, 7), True), ("mask", (3, 5), True), ("leading", (2, 3, 4), True), ("reversed", (2, 6), False)])
def test_index_to_views_replaces_arange_gathers_with_views(kind, shape, rewritten):
    model = IndexByAranges(kind)
    gm = fold_constants(decompose_to_core_aten(_graph(model, shape)))
    assert "index" in _op_names(op_histogram(gm))
    gm = remove_dead_code(index_to_views(gm))
    assert ("index" not in _op_names(op_histogram(gm))) == rewritten, op_histogram(gm)
    _assert_same(model, gm, shape)


class WritePositions(nn.Module):
    """x[mask] = 0 and x[arange(B), positions] = 1, as transformers' audio models build their frame masks."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "mask":
            y = x.clone()
            y[x > 0.5] = 0.0
            return y * 3.0
        positions = (x.abs().sum(-1) * 2).long() % x.shape[-1] - 1  # one per row, -1 wraps to the last
        y = torch.zeros_like(x)
        y[(torch.arange(x.shape[0]), positions)] = 1.0
        return y + x


@pytest.mark.parametrize("kind, shape", [("mask", (2, 5, 3)), ("positions", (1, 8)), ("positions", (3, 6))])
def test_index_put_to_where_keeps_outputs_without_a_scatter(kind, shape):
    model = WritePositions(kind)
    gm = fold_constants(decompose_to_core_aten(_graph(model, shape)))
    assert "index_put" in _op_names(op_histogram(gm))
    gm = remove_dead_code(index_put_to_where(gm))
    assert "index_put" not in _op_names(op_histogram(gm)), op_histogram(gm)
    _assert_same(model, gm, shape)


def test_remove_dead_code_drops_unused_ops_and_their_weights():
    # torch.export already drops code that is dead in the source; dead code appears when passes rewrite the graph
    # (a folded batch norm's statistics, a weight replaced by its folded copy), so add some as a pass would.
    model = DeadAndConstant()
    gm = decompose_to_core_aten(_graph(model, (3, 5)))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    gm.register_parameter("stale", nn.Parameter(torch.randn(5), requires_grad=False))
    with gm.graph.inserting_before(output):
        stale = gm.graph.get_attr("stale")
        gm.graph.call_function(torch.ops.aten.relu.default, (gm.graph.call_function(torch.ops.aten.mul.Tensor, (x, stale)),))
    gm.recompile()
    before = op_count(gm)
    gm = remove_dead_code(gm)
    assert op_count(gm) == before - 2
    assert "stale" not in {n for n, _ in gm.named_parameters()}
    _assert_same(model, gm, (3, 5))


def test_default_pipeline_shrinks_and_keeps_outputs():
    model = ConvBN()
    (spec,) = edgedyn.capture(model.eval(), (torch.randn(1, 3, 16, 16),)).specializations
    optimized = run_pipeline(spec.program)
    assert op_count(optimized.graph_module) < op_count(spec.program.graph_module)
    _assert_same(model, optimized.module(), (1, 3, 16, 16))
    assert [p.__name__ for p in PIPELINES["default"]] == [
        "decompose_to_core_aten", "fold_batchnorm", "merge_parallel_convolutions", "fold_constants", "index_to_views",
        "index_put_to_where", "remove_dead_code"]


def test_passes_do_not_touch_the_users_model():
    model = ConvBN()
    state = copy.deepcopy(model.state_dict())
    (spec,) = edgedyn.capture(model.eval(), (torch.randn(1, 3, 8, 8),)).specializations
    run_pipeline(spec.program)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)


def test_unknown_pipeline_lists_choices():
    (spec,) = edgedyn.capture(ConvBN().eval(), (torch.randn(1, 3, 8, 8),)).specializations
    with pytest.raises(EdgedynError, match="unknown pass pipeline 'fast'; choose from: default, none"):
        run_pipeline(spec.program, "fast")


class _Branches(nn.Module):
    """A MobileOne-style block (timm's training-time form): two kxk convolutions, a 1x1 and a batch-normed identity
    of one input, each with its batch norm, summed in place; then a RepMixer-style `x + scale * (mixer(x) - norm(x))`
    on its output. Every batch norm has spread statistics, so a wrong merge shows in the outputs."""

    def __init__(self, channels=8, groups=1, kernel=3):
        super().__init__()
        conv = lambda k: nn.Sequential(nn.Conv2d(channels, channels, k, padding=k // 2, groups=groups, bias=False),
                                       nn.BatchNorm2d(channels))
        self.kxk = nn.ModuleList([conv(kernel), conv(kernel)])
        self.scale = conv(1)
        self.identity = nn.BatchNorm2d(channels)
        self.mixer = conv(3)
        self.norm = nn.BatchNorm2d(channels)
        self.layer_scale = nn.Parameter(torch.rand(channels, 1, 1) + 0.5)
        for bn in [m for m in self.modules() if isinstance(m, nn.BatchNorm2d)]:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 2.0)
            bn.bias.data.uniform_(-1, 1)

    def forward(self, x):
        out = self.scale(x) + self.identity(x)
        for branch in self.kxk:
            out += branch(x)
        y = torch.relu(out)
        return y + self.layer_scale * (self.mixer(y) - self.norm(y))


def _convolutions(gm):
    return sum(count for name, count in op_histogram(gm).items() if "conv" in name)


@pytest.mark.parametrize("pipeline", ["default", "onnxruntime"])
@pytest.mark.parametrize("groups, kernel", [(1, 3), (8, 3), (8, 5)])
def test_merge_parallel_convolutions_writes_each_sum_of_branches_as_one_convolution(pipeline, groups, kernel):
    model = _Branches(groups=groups, kernel=kernel).eval()
    (spec,) = edgedyn.capture(model, (torch.randn(1, 8, 12, 12),)).specializations
    before = run_pipeline(spec.program, "none").module()
    assert _convolutions(before) == 4  # two kxk branches, the 1x1 and the mixer
    optimized = run_pipeline(spec.program, pipeline).module()
    assert _convolutions(optimized) == 2, op_histogram(optimized)  # one per sum
    assert not any("batch_norm" in name for name in op_histogram(optimized)), op_histogram(optimized)
    for _ in range(3):  # the fp32 tolerance: a merged kernel sums the branches in another order than torch
        x = torch.randn(1, 8, 12, 12)
        with torch.no_grad():
            want = model(x)
            (got,) = optimized(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


class _StridedChain(nn.Module):
    """Two of timm's MobileOne blocks without an identity branch (strided), as timm writes them: the sum starts at
    the number 0 (`out = scale(x) + 0`, then `out += kxk(x)`), and the second block reads the first's sum directly."""

    def __init__(self, channels=8):
        super().__init__()
        block = lambda stride: nn.ModuleList([
            nn.Sequential(nn.Conv2d(channels, channels, k, stride=stride, padding=k // 2, bias=False),
                          nn.BatchNorm2d(channels)) for k in (1, 3, 3)])
        self.blocks = nn.ModuleList([block(2), block(1)])
        for bn in [m for m in self.modules() if isinstance(m, nn.BatchNorm2d)]:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2.0)
            bn.bias.data.uniform_(-1, 1)

    def forward(self, x):
        for scale, *kxk in self.blocks:
            identity_out = 0
            out = scale(x) + identity_out
            for branch in kxk:
                out += branch(x)
            x = out
        return x


@pytest.mark.parametrize("pipeline", ["default", "onnxruntime"])
def test_merge_parallel_convolutions_takes_a_sum_started_at_zero_and_a_chain_of_sums(pipeline):
    model = _StridedChain().eval()
    (spec,) = edgedyn.capture(model, (torch.randn(1, 8, 12, 12),)).specializations
    assert _convolutions(run_pipeline(spec.program, "none").module()) == 6
    optimized = run_pipeline(spec.program, pipeline).module()
    assert _convolutions(optimized) == 2, op_histogram(optimized)  # one per block
    for _ in range(3):
        x = torch.randn(1, 8, 12, 12)
        with torch.no_grad():
            want = model(x)
            (got,) = optimized(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


class _NotMergeable(nn.Module):
    """Sums the pass must leave alone: a branch also read elsewhere, a strided convolution beside the identity, two
    different inputs, and an even kernel (no centre to align on)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)
        self.strided = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.other = nn.Conv2d(4, 4, 3, padding=1)
        self.even = nn.Conv2d(4, 4, 2, padding=1)
        self.odd = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        shared = self.a(x)
        first = shared + self.b(x)  # `shared` is also returned
        second = self.strided(x) + x[:, :, ::2, ::2]
        third = self.other(x) + self.b(torch.relu(x))
        fourth = self.even(x)[:, :, :-1, :-1] + self.odd(x)
        return first, shared, second, third, fourth


@pytest.mark.parametrize("pipeline", ["default", "onnxruntime"])
def test_merge_parallel_convolutions_leaves_sums_it_cannot_merge(pipeline):
    model = _NotMergeable().eval()
    (spec,) = edgedyn.capture(model, (torch.randn(1, 4, 8, 8),)).specializations
    optimized = run_pipeline(spec.program, pipeline).module()
    assert _convolutions(optimized) == 7, op_histogram(optimized)
    for _ in range(3):
        x = torch.randn(1, 4, 8, 8)
        with torch.no_grad():
            for got, want in zip(optimized(x), model(x)):
                torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-6)


def test_merged_branches_export_and_match_torch_on_fresh_inputs(tmp_path):
    import numpy as np

    import edgedyn.runtime as rt
    from conftest import require_module

    require_module("onnxruntime")
    model = _Branches(groups=8).eval()
    path = edgedyn.export(model, (torch.randn(1, 8, 16, 16),), board="x86-64", backend="onnxruntime",
                          output=tmp_path / "branches.edgedyn")
    program = rt.load(path)
    assert all(result["ok"] for result in program.verify())
    for _ in range(3):
        x = torch.randn(1, 8, 16, 16)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(np.asarray(program(x.numpy())), want, rtol=1e-4, atol=1e-5)
