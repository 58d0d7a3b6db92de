"""The device runtime: guards in words, damaged and foreign bundles refused, and nothing heavy imported."""
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.runtime import guards
from edgedyn.runtime.format import MANIFEST_NAME

from conftest import foreign_board, require_module

REPO = Path(__file__).resolve().parents[1]


# ---- guards, table-driven: (guard, value, failure text or None) -----------------------------------------------
X = np.zeros((1, 3, 64, 64), dtype=np.float32)
GUARD_CASES = [
    ({"kind": "tensor", "input": "x"}, X, None),
    ({"kind": "tensor", "input": "x"}, [1.0], "input 'x': expected a numpy array, got list"),
    ({"kind": "dtype", "input": "x", "expected": "float32"}, X, None),
    ({"kind": "dtype", "input": "x", "expected": "float32"}, X.astype(np.float16),
     "input 'x' dtype: expected float32, got float16"),
    ({"kind": "rank", "input": "x", "expected": 4}, X[0], "input 'x' rank: expected 4 dims, got 3 (shape 3x64x64)"),
    ({"kind": "dim", "input": "x", "index": 0, "expected": 1}, np.zeros((8, 3, 64, 64), np.float32),
     "input 'x' dim 0: expected 1, got 8"),
    ({"kind": "constant", "input": "n", "type": "int", "expected": 4}, 4, None),
    ({"kind": "constant", "input": "n", "type": "int", "expected": 4}, np.int64(4), None),
    ({"kind": "constant", "input": "n", "type": "int", "expected": 4}, 5,
     "argument 'n': this specialization was captured with n == 4, got 5"),
    ({"kind": "constant", "input": "n", "type": "int", "expected": 4}, 4.0,
     "argument 'n': expected a Python int equal to 4, got float 4.0"),
    ({"kind": "constant", "input": "flag", "type": "bool", "expected": True}, 1,
     "argument 'flag': expected a Python bool equal to True, got int 1"),
]


@pytest.mark.parametrize("guard, value, failure", GUARD_CASES)
def test_guard_check(guard, value, failure):
    assert guards.check(guard, value) == failure


@pytest.mark.parametrize("guard, text", [
    ({"kind": "dim", "input": "x", "index": 2, "expected": 64}, "x.shape[2] == 64"),
    ({"kind": "constant", "input": "n", "type": "int", "expected": 4}, "n == 4"),
    ({"kind": "dtype", "input": "x", "expected": "int64"}, "x.dtype == int64"),
])
def test_guard_describe(guard, text):
    assert guards.describe(guard) == text


# ---- dispatch, with the exact wording users see ---------------------------------------------------------------
def test_guard_error_lists_the_first_failure_of_each_specialization(export_example):
    program = rt.load(export_example("mlp"))
    with pytest.raises(rt.GuardError) as info:
        program(np.random.rand(4, 64).astype(np.float32))
    assert str(info.value) == (
        "no specialization of MLP matches these arguments:\n"
        "  x=1x64: input 'x' dim 0: expected 1, got 4\n"
        "  x=8x64: input 'x' dim 0: expected 8, got 4\n"
        "hint: pass arguments matching one specialization, or export again adding: "
        'edgedyn.export(model, inputs=[<the inputs exported before>, "x=4x64"])')


def test_guard_error_on_dtype_and_constant(export_example):
    program = rt.load(export_example("loop_example"))
    x = np.random.rand(2, 3)
    with pytest.raises(rt.GuardError) as info:
        program(x, 4)
    assert "x=2x3,n=4: input 'x' dtype: expected float32, got float64" in info.value.message
    # From Python: the cast first, and the export in Python's form (the CLI's form is in test_cli_run.py).
    assert info.value.hint.startswith("cast 'x' to float32: x.astype(np.float32); or")
    assert 'inputs=[<the inputs exported before>, "x=2x3:float64", "n=4"]' in info.value.hint
    with pytest.raises(rt.GuardError, match="captured with n == 4, got 3"):
        program(x.astype(np.float32), n=3)


def test_dispatch_picks_the_matching_specialization(export_example):
    program = rt.load(export_example("mlp"))
    for batch in (1, 8):
        spec, _ = program.dispatch(np.random.rand(batch, 64).astype(np.float32))
        assert spec.name == "x=%dx64" % batch


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "loop_example is missing argument 'x'"),
    ((1, 2, 3), {}, "loop_example takes 2 argument(s) (x, n), got 3"),
    ((), {"x": 1, "m": 2}, "loop_example got an unexpected argument 'm'; its arguments are: x, n"),
    ((np.ones((2, 3), np.float32),), {"x": 1}, "loop_example got argument 'x' twice"),
])
def test_call_binding_errors(export_example, args, kwargs, message):
    program = rt.load(export_example("loop_example"))
    with pytest.raises(rt.GuardError) as info:
        program(*args, **kwargs)
    assert message in str(info.value)


# ---- damaged, foreign and unknown bundles ---------------------------------------------------------------------
def _member_offset(path: Path, name: str) -> int:
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        content = archive.read(name)
    return data.index(content) + len(content) // 2


def test_a_flipped_byte_in_the_weights_is_a_checksum_error(export_example, tmp_path):
    source = export_example("tiny_cnn")
    manifest = rt.read_manifest(source)
    weights = manifest["specializations"][0]["artifacts"][0]["files"]["weights"]
    damaged = tmp_path / "damaged.edgedyn"
    data = bytearray(source.read_bytes())
    data[_member_offset(source, weights)] ^= 0x01
    damaged.write_bytes(bytes(data))
    with pytest.raises(rt.ChecksumError) as info:
        rt.load(damaged)
    assert "checksum mismatch in {}".format(weights) in info.value.message
    assert "the file was modified or damaged" in info.value.message


def test_a_flipped_byte_in_the_manifest_is_refused(export_example, tmp_path):
    source = export_example("tiny_cnn")
    damaged = tmp_path / "damaged.edgedyn"
    data = bytearray(source.read_bytes())
    data[_member_offset(source, MANIFEST_NAME)] ^= 0x20
    damaged.write_bytes(bytes(data))
    with pytest.raises(rt.ChecksumError, match="its manifest is damaged"):
        rt.load(damaged)


@pytest.mark.parametrize("keep", [0, 100, 0.5, -10])
def test_truncated_bundles_are_refused(export_example, tmp_path, keep):
    data = export_example("tiny_cnn").read_bytes()
    cut = tmp_path / "cut.edgedyn"
    cut.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep] if keep >= 0 else data[:keep])
    with pytest.raises(rt.BundleError) as info:
        rt.load(cut)
    assert "cut.edgedyn" in info.value.message


def test_missing_file(tmp_path):
    with pytest.raises(rt.BundleError, match="does not exist"):
        rt.load(tmp_path / "nothing.edgedyn")


def _rewrite(source: Path, target: Path, edit) -> Path:
    """Writes a copy of a bundle whose manifest was changed by `edit`."""
    with zipfile.ZipFile(source) as archive:
        manifest = json.loads(archive.read(MANIFEST_NAME))
        members = {name: archive.read(name) for name in manifest["members"]}
    edit(manifest)
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr(MANIFEST_NAME, json.dumps(manifest))
        for name, data in members.items():
            archive.writestr(name, data)
    return target


def test_future_format_version_is_refused(export_example, tmp_path):
    path = _rewrite(export_example("loop_example"), tmp_path / "future.edgedyn", lambda m: m.update(format_version=9))
    with pytest.raises(rt.BundleError) as info:
        rt.load(path)
    assert "format version 9, this runtime reads version 1" in info.value.message
    assert "install the edgedyn version that made it (0.1.0)" in info.value.hint


def test_a_member_missing_from_the_manifest_is_refused(export_example, tmp_path):
    path = _rewrite(export_example("loop_example"), tmp_path / "extra.edgedyn",
                    lambda m: m["members"].pop(sorted(m["members"])[0]))
    with pytest.raises(rt.BundleError, match="holds members its manifest does not list"):
        rt.load(path)


def test_a_bundle_for_another_cpu_is_refused(export_example):
    board, arch = foreign_board()  # on x86: raspberry-pi-4, aarch64
    here = rt.format.host_arch()
    with pytest.raises(rt.PlatformError) as info:
        rt.load(export_example("tiny_cnn", board=board))
    assert info.value.message.endswith("was built for {} (board {}), but this machine is {}".format(arch, board, here))
    hint = "run it on a {} board, or export again for this machine with --board {}".format(
        board, "x86-64" if here == "x86_64" else "<your board>")
    if arch == "aarch64" and here == "x86_64":
        hint += ("; to check it here, on the board emulated under qemu: edgedyn verify "
                 "tiny_cnn-{}-tvm.edgedyn --emulate".format(board))
    assert info.value.hint == hint


def test_member_names_must_be_plain_relative_paths(export_example, tmp_path):
    def escape(manifest):
        name = sorted(manifest["members"])[0]
        manifest["members"]["../escape.so"] = manifest["members"][name]

    with pytest.raises(rt.BundleError, match="is not a plain relative path"):
        rt.load(_rewrite(export_example("loop_example"), tmp_path / "evil.edgedyn", escape))


# ---- the runtime stays light ----------------------------------------------------------------------------------
def test_importing_the_runtime_loads_no_torch_tvm_compiler_or_onnx():
    code = ("import sys, edgedyn.runtime, edgedyn.runtime.executors.tvm; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'onnxruntime') "
            "or m.startswith('tvm')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=str(REPO))
    assert result.stdout.strip() == "[]"


def test_device_side_code_is_python_38_syntax():
    require_module("vermin")
    vermin = Path(sys.executable).parent / "vermin"
    device_side = [REPO / "edgedyn" / "runtime", REPO / "edgedyn" / "boards.py", REPO / "edgedyn" / "_schema.py",
                   REPO / "edgedyn" / "cli"]
    result = subprocess.run([str(vermin), "--no-tips", "--violations", "-t=3.8-", "--eval-annotations",
                             "--backport", "typing_extensions", *map(str, device_side)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_runtime_imports_nothing_else_from_edgedyn():
    for path in (REPO / "edgedyn" / "runtime").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import edgedyn", "from edgedyn")):
                assert stripped.startswith(("from edgedyn.runtime", "import edgedyn.runtime")), (path, line)
