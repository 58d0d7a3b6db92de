"""The board-fit check at export: the error text people read, the warning, and the measured runtime overheads."""
import sys
import warnings
from pathlib import Path

import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.boards import load_board
from edgedyn.fit import MB, FitError, FitWarning, check_fit, estimate, measure_overhead_bytes

from conftest import EXAMPLES, require

BOARDS = Path(__file__).resolve().parents[1] / "boards"


def _board_file(tmp_path: Path, budget_mb: int, name: str = "tiny-board") -> Path:
    """A user's board file: the shipped x86-64 one with its own name and memory budget."""
    text = (BOARDS / "x86-64.toml").read_text()
    text = text.replace('name = "x86-64"', 'name = "{}"'.format(name))
    text = text.replace("ram_mb = 16384", "ram_mb = 1024").replace("budget_mb = 12288", "budget_mb = {}".format(budget_mb))
    path = tmp_path / (name + ".toml")
    path.write_text(text)
    return path


def test_over_budget_fails_with_the_numbers_and_what_to_do(tmp_path):
    board = _board_file(tmp_path, budget_mb=1)
    with pytest.raises(FitError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board=str(board), backend="portable",
                       output=tmp_path / "mlp.edgedyn")
    message = str(raised.value.message)
    assert message.startswith("the model does not fit board 'tiny-board': estimated peak 35.")
    assert "MB = runtime 35.0 MB (portable) + bundle 0.1 MB + weights 0.1 MB + arena 0.0 MB" in message
    assert message.endswith("is over its memory budget of 1.0 MB")
    assert "try another --backend" in raised.value.hint
    assert "budget_mb" in raised.value.hint
    assert not (tmp_path / "mlp.edgedyn").exists()  # nothing written


def test_over_budget_error_through_the_cli(tmp_path, run_cli):
    board = _board_file(tmp_path, budget_mb=1)
    result = run_cli("export", str(EXAMPLES / "loop_example.py:loop_example"), "--input", "x=2x3", "--input", "n=4",
                     "--board", str(board), "--backend", "portable", "-o", str(tmp_path / "loop.edgedyn"))
    assert result.returncode == 2, result.stderr
    assert "error: the model does not fit board 'tiny-board'" in result.stderr
    assert "hint: " in result.stderr and "Traceback" not in result.stderr


def test_bundle_records_the_fit(export_example):
    manifest = rt.read_manifest(export_example("tiny_cnn", backend="portable"))
    fit = manifest["fit"]
    assert fit["status"] == "ok" and fit["executor"] == "portable" and fit["board"] == "x86-64"
    assert fit["total_bytes"] == fit["overhead_bytes"] + fit["bundle_bytes"] + fit["weights_bytes"] + fit["arena_bytes"]
    assert fit["arena_bytes"] == manifest["specializations"][0]["memory"]["arena_bytes"]


# (executor, weights MB, arena MB, budget MB) -> status; the portable runtime is charged 35 MB, the bundle 1 MB.
CASES = [
    ("portable", 10, 4, 100, "ok"),
    ("portable", 41, 10, 96, "close"),  # 87 of 96 MB: over 90%
    ("portable", 40, 30, 96, "over"),
    ("tvm", 1, 1, 90, "close"),  # 81 + 3 = 84 of 90 MB
    ("some-new-executor", 1, 1, 80, "over"),  # not measured: charged the largest known overhead
]


@pytest.mark.parametrize("executor, weights, arena, budget, status", CASES)
def test_fit_table(tmp_path, executor, weights, arena, budget, status):
    board = load_board(str(_board_file(tmp_path, budget_mb=budget)))
    report = estimate(board, executor, bundle_bytes=1 * MB, weights_bytes=[weights * MB], arena_bytes=[arena * MB])
    assert report.status == status
    if status == "over":
        with pytest.raises(FitError, match="over its memory budget of {}.0 MB".format(budget)):
            check_fit(report)
    elif status == "close":
        assert "within 10% of its {}.0 MB budget".format(budget) in check_fit(report)
    else:
        assert check_fit(report) is None


def test_over_budget_suggestions_follow_the_numbers(tmp_path):
    board = load_board(str(_board_file(tmp_path, budget_mb=40)))
    heavy_weights = estimate(board, "tvm", 20 * MB, [20 * MB], [1 * MB])
    with pytest.raises(FitError) as raised:
        check_fit(heavy_weights)
    assert "int8" in raised.value.hint and "--backend portable" in raised.value.hint
    big_arena = estimate(board, "portable", 1 * MB, [1 * MB], [30 * MB, 30 * MB])
    with pytest.raises(FitError) as raised:
        check_fit(big_arena, specializations=2)
    assert "smaller batch" in raised.value.hint and "int8" not in raised.value.hint


def test_close_to_budget_warns_at_export(tmp_path, monkeypatch):
    import edgedyn.fit as fit

    # Make the portable runtime cost exactly what leaves the bundle within 10% of a 40 MB budget.
    monkeypatch.setitem(fit.RUNTIME_OVERHEAD_BYTES, "portable", 38 * MB)
    board = _board_file(tmp_path, budget_mb=40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        edgedyn.export(str(EXAMPLES / "loop_example.py:loop_example"), inputs=["x=2x3", "n=4"], board=str(board),
                       backend="portable", output=tmp_path / "loop.edgedyn")
    fits = [w for w in caught if issubclass(w.category, FitWarning)]
    assert len(fits) == 1 and "within 10% of its 40.0 MB budget" in str(fits[0].message)
    assert rt.read_manifest(tmp_path / "loop.edgedyn")["fit"]["status"] == "close"


def test_measured_overhead_sees_what_the_executor_imports_hold(monkeypatch):
    """The measurement itself, on a known load; the real overheads are re-measured by benchmarks/overheads.py."""
    import edgedyn.fit as fit

    require(sys.platform.startswith("linux"), "measure_overhead_bytes reads /proc/self/status", "run it on Linux")
    # An "executor" whose import holds 64 MB of touched memory (bytes, not calloc'd zeros, so the pages are real).
    monkeypatch.setitem(fit._IMPORTS, "holds-64-mb", "held = b'\\x01' * (64 * 1024 * 1024)")
    baseline = measure_overhead_bytes("portable")
    loaded = measure_overhead_bytes("holds-64-mb")
    assert 20 * MB < baseline < loaded  # an interpreter with numpy and the runtime
    # A few MB of the baseline's freed heap may be reused for the 64 MB: not exact, but never far off.
    assert 56 * MB <= loaded - baseline <= 72 * MB, "grew {:.1f} MB".format((loaded - baseline) / MB)
