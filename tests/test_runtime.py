"""The device runtime: guards in words, damaged and foreign bundles refused, and nothing heavy imported."""
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.runtime import guards
from edgedyn.registry import BACKENDS
from edgedyn.runtime.format import MANIFEST_NAME, pack_arrays, read_npz

from conftest import foreign_board, require_module, reseal

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


@pytest.mark.parametrize("size", [1 << 40, 1 << 63])
def test_an_input_shape_no_machine_could_hold_is_refused_at_load(export_example, tmp_path, size):
    # `edgedyn bench` and `run` draw random inputs by the manifest's shapes: a tampered dimension must not reach an
    # allocation (the fuzz run found numpy's ValueError there: "Maximum allowed dimension exceeded").
    def edit(manifest):
        manifest["specializations"][0]["inputs"][0]["shape"][-1] = size

    path = _rewrite(export_example("tiny_cnn"), tmp_path / "huge.edgedyn", edit)
    with pytest.raises(rt.BundleError) as info:
        rt.load(path)
    assert "specializations[0].inputs: declares" in info.value.message
    assert "above this machine's" in info.value.message


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
                 "tiny_cnn-{}-tvm-fp32.edgedyn --emulate".format(board))
    assert info.value.hint == hint


def _with_artifact_threads(source: Path, target: Path, threads: Any) -> Path:
    def edit(manifest):
        manifest["specializations"][0]["artifacts"][-1]["threads"] = threads

    return _rewrite(source, target, edit)


def test_the_thread_count_auto_recorded_is_used_unless_the_caller_gives_one(export_example, tmp_path):
    path = _with_artifact_threads(export_example("tiny_cnn", backend="onnxruntime"), tmp_path / "one.edgedyn", 1)
    assert rt.load(path).specializations[0].executor.describe()["threads"] == 1
    assert rt.load(path, threads=2).specializations[0].executor.describe()["threads"] == 2


@pytest.mark.parametrize("threads", [0, -1, "2", 1.5, True, 10 ** 6])
def test_an_artifact_thread_count_out_of_range_is_refused(export_example, tmp_path, threads):
    path = _with_artifact_threads(export_example("tiny_cnn", backend="onnxruntime"), tmp_path / "bad.edgedyn",
                                  threads)
    with pytest.raises(rt.BundleError, match="threads"):
        rt.load(path)


def test_member_names_must_be_plain_relative_paths(export_example, tmp_path):
    def escape(manifest):
        name = sorted(manifest["members"])[0]
        manifest["members"]["../escape.so"] = manifest["members"][name]

    with pytest.raises(rt.BundleError, match="is not a plain relative path"):
        rt.load(_rewrite(export_example("loop_example"), tmp_path / "evil.edgedyn", escape))


# ---- bundles from anywhere: checked before use, refused cheaply, messages bounded --------------------------------
def _edit_graph(edit):
    def edit_member(name, data):
        if not name.endswith("graph.json"):
            return data
        graph = json.loads(data)
        edit(graph)
        return json.dumps(graph).encode()
    return edit_member


def _first_conv(graph):
    return next(step for step in graph["steps"] if step["op"] == "aten.convolution.default")


@pytest.mark.parametrize("edit, message", [
    (lambda g: _first_conv(g)["args"].__setitem__(5, [-1, -1]), r"args\[5\]\[0\]: -1 is outside"),
    (lambda g: _first_conv(g)["args"].__setitem__(5, [-100000, 1]), r"-100000 is outside"),
    (lambda g: g["values"][0].update(dtype="O"), r"values\[0\].dtype: 'O' is not one of"),
    (lambda g: g["values"][-1].update(offset_bytes=g["arena_bytes"]), r"reaches outside its buffer"),
    (lambda g: g["values"][-1].update(strides=[-1] * len(g["values"][-1]["strides"])), r"reaches outside"),
    (lambda g: _first_conv(g)["scratch"].pop(0), r"scratch: planned"),
    (lambda g: g.update(arena_bytes=1 << 50), r"arena_bytes: \d+ is outside"),
    (lambda g: g["steps"][0].update(op="aten.system.default"), r"no kernel for aten.system.default"),
])
def test_a_tampered_portable_graph_is_refused_before_any_view(export_example, tmp_path, edit, message):
    path = reseal(export_example("tiny_cnn", backend="portable"), tmp_path / "graph.edgedyn", _edit_graph(edit))
    with pytest.raises(rt.BundleError, match=message) as info:
        rt.load(path)
    assert "graph.json" in info.value.message


def _replace_npy_header(name, data, old, new):
    if not name.endswith("reference.npz"):
        return data
    with zipfile.ZipFile(__import__("io").BytesIO(data)) as archive:
        arrays = {n: archive.read(n) for n in archive.namelist()}
    buffer = __import__("io").BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for n, content in arrays.items():
            archive.writestr(n, content.replace(old, new, 1))
    return buffer.getvalue()


@pytest.mark.parametrize("old, new, message", [
    (b"'<f4'", b"'|O' ", "is not one a bundle may hold"),
    (b"'shape': (1, 3, 64, 64)", b"'shape': (99999, 99999, 99)", r"shape \(99999, 99999, 99\) of float32 needs \d+ bytes, the member holds"),
])
def test_npz_headers_are_checked_before_an_array_exists(export_example, tmp_path, old, new, message):
    path = reseal(export_example("tiny_cnn", backend="portable"), tmp_path / "npz.edgedyn",
                   lambda name, data: _replace_npy_header(name, data, old, new))
    program = rt.load(path)
    with pytest.raises(rt.BundleError, match=message):
        program.verify()


def test_deflated_members_are_refused(export_example, tmp_path):
    source = export_example("tiny_cnn", backend="portable")
    path = reseal(source, tmp_path / "deflated.edgedyn", deflate=("specs/0/reference.npz",))
    with pytest.raises(rt.BundleError, match="reference.npz is compressed"):
        rt.load(path)


def test_overlapping_directory_entries_cost_nothing_before_they_are_refused(export_example, tmp_path):
    """2,000 directory entries pointing at one member: refused from the directory alone."""
    import struct
    import tracemalloc

    data = export_example("tiny_cnn", backend="portable").read_bytes()
    end = data.rfind(b"PK\x05\x06")
    count, size, offset = struct.unpack_from("<HLL", data, end + 10)
    directory = data[offset:offset + size]
    name_length = struct.unpack_from("<H", directory, 28)[0]
    first = directory[:46 + name_length + sum(struct.unpack_from("<2H", directory, 30))]
    copies = [first[:46 + name_length - 4] + "{:04d}".format(i).encode() + first[46 + name_length:]
              for i in range(2000)]
    record = bytearray(data[end:])
    struct.pack_into("<HHLL", record, 8, count + 2000, count + 2000, size + sum(map(len, copies)), offset)
    path = tmp_path / "overlap.edgedyn"
    path.write_bytes(data[:offset] + directory + b"".join(copies) + bytes(record))
    tracemalloc.start()
    try:
        with pytest.raises(rt.BundleError, match="overlap"):
            rt.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * path.stat().st_size


def test_many_unlisted_members_give_a_short_message(export_example, tmp_path):
    path = reseal(export_example("loop_example", backend="portable"), tmp_path / "many.edgedyn",
                   extra=[("unlisted/{:05d}".format(i), b"") for i in range(3000)])
    with pytest.raises(rt.BundleError, match="and 2996 more") as info:
        rt.load(path)
    assert len(str(info.value)) < 500


def test_a_huge_argument_gives_a_short_guard_message(export_example):
    program = rt.load(export_example("loop_example", backend="portable"))
    with pytest.raises(rt.GuardError) as info:
        program(np.random.rand(2, 3).astype(np.float32), b"\x00" * (588 << 10))
    assert len(str(info.value)) < 1000


def test_a_tampered_onnx_model_is_a_bundle_error_naming_the_member(export_example, tmp_path):
    path = reseal(export_example("tiny_cnn", backend="onnxruntime"), tmp_path / "onnx.edgedyn",
                   lambda name, data: data[:len(data) // 3] if name.endswith(".onnx") else data)
    with pytest.raises(rt.BundleError, match=r"model\.onnx\) does not load"):
        rt.load(path)


def test_a_tflite_tensor_grown_by_tampering_is_refused_before_litert_allocates(export_example, tmp_path):
    import importlib
    import struct

    def grow_first_shape(name, data):
        if not name.endswith(".tflite"):
            return data
        model = importlib.import_module("tflite.Model").Model.GetRootAs(data)
        tensors = model.Subgraphs(0)
        tensor = next(tensors.Tensors(i) for i in range(tensors.TensorsLength()) if tensors.Tensors(i).ShapeLength())
        start = tensor._tab.Vector(tensor._tab.Offset(4))  # Tensor.shape, field 0
        return data[:start] + struct.pack("<i", 1 << 28) + data[start + 4:]

    path = reseal(export_example("tiny_cnn", backend="tflite"), tmp_path / "grown.edgedyn", grow_first_shape)
    with pytest.raises(rt.BundleError, match=r"model\.tflite declares tensors of \d+ bytes, far above"):
        rt.load(path)


def test_a_tflite_reverse_without_an_axis_is_refused_before_litert_crashes_on_it(export_example, tmp_path):
    """LiteRT 2.x segfaults on a REVERSE_V2 whose axis tensor has no element (found by crafting the integer inputs
    of reversals, transposes, reshapes, slices, gathers, pads, tiles, means and concatenations: the one crash)."""
    from edgedyn.backends.tflite.writer import ModelWriter

    def reverse_nothing(name, data):
        if not name.endswith(".tflite"):
            return data
        writer = ModelWriter()
        x, out = writer.tensor("x", [1, 3, 64, 64]), writer.tensor("out", [1, 3, 64, 64])
        writer.operator("REVERSE_V2", [x, writer.constant(np.zeros(0, np.int32))], [out])
        return writer.finish([x], [out], "crafted", None)

    path = reseal(export_example("tiny_cnn", backend="tflite"), tmp_path / "crafted.edgedyn", reverse_nothing)
    with pytest.raises(rt.BundleError, match=r"model\.tflite has a REVERSE_V2 with no axis \(subgraph 0, operator 0\) "
                                             r"\(LiteRT would crash on it\)"):
        rt.load(path)


# ---- signatures: only bundles signed by a trusted key open, checked before anything is parsed ---------------------
def _signed_copy(source: Path, tmp_path: Path, name: str = "signed.edgedyn"):
    from edgedyn.bundle import sign_bundle
    from edgedyn.runtime import signing

    pem, public = signing.generate()
    (tmp_path / "key").write_bytes(pem)
    (tmp_path / "key.pub").write_text(public + "\n")
    target = tmp_path / name
    target.write_bytes(source.read_bytes())
    sign_bundle(target, tmp_path / "key")
    return target, tmp_path / "key.pub"


def test_a_signed_bundle_opens_with_its_key_and_keeps_its_manifest_bytes(export_example, tmp_path):
    source = export_example("tiny_cnn", backend="portable")
    signed, public = _signed_copy(source, tmp_path)
    with zipfile.ZipFile(source) as a, zipfile.ZipFile(signed) as b:
        assert a.read(MANIFEST_NAME) == b.read(MANIFEST_NAME)
    program = rt.load(signed, trusted_keys=[public])
    assert program.bundle.signed_by == public.read_text().strip()
    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.testing.assert_array_equal(program(x), rt.load(source)(x))


def test_unsigned_wrongly_signed_and_tampered_bundles_are_refused(export_example, tmp_path, monkeypatch):
    from edgedyn.runtime import signing

    source = export_example("tiny_cnn", backend="tvm")
    signed, public = _signed_copy(source, tmp_path)
    with pytest.raises(signing.SignatureError, match="is not signed"):
        rt.load(source, trusted_keys=[public])
    other = tmp_path / "other"
    other.mkdir()
    _, stranger = _signed_copy(source, other)
    with pytest.raises(signing.SignatureError, match="not trusted here"):
        rt.load(signed, trusted_keys=[stranger])
    # Members tampered with the manifest resealed to match: checksums agree, the signature does not. The manifest
    # here is not even JSON any more: the refusal comes before it is parsed (and before model.so is dlopened).
    with zipfile.ZipFile(signed) as archive:
        members = [(info.filename, archive.read(info.filename)) for info in archive.infolist()]
    tampered = tmp_path / "tampered.edgedyn"
    with zipfile.ZipFile(tampered, "w") as archive:
        for name, data in members:
            archive.writestr(name, b"{not json" if name == MANIFEST_NAME else data)
    monkeypatch.setenv(signing.ENVIRONMENT, str(public))
    with pytest.raises(signing.SignatureError, match="does not match the manifest"):
        rt.load(tampered)
    assert rt.load(signed).bundle.signed_by  # the environment's key, no argument


# ---- 0-d arrays keep their shape: a weight folded to a scalar, a 0-d argument ------------------------------------
def test_packed_arrays_keep_their_shape_zero_d_included():
    arrays = {"scalar": np.float32(1.5) * np.ones((), np.float32), "strided": np.arange(12.0).reshape(3, 4)[:, ::2]}
    read = read_npz(pack_arrays(arrays), "test")
    assert read["scalar"].shape == () and read["scalar"] == 1.5
    np.testing.assert_array_equal(read["strided"], arrays["strided"])


ZERO_D_BACKENDS = {"onnxruntime": ("onnx", "onnxruntime"), "tflite": ("tflite", "ai_edge_litert"), "tvm": ("tvm",),
                   "openvino": ("onnx", "openvino"), "ncnn": ("onnx", "pnnx", "ncnn")}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_zero_d_weights_and_arguments_reach_every_backend_as_zero_d(backend, tmp_path):
    # np.ascontiguousarray makes a 0-d array 1-d: TVM refused such a weight (a ViT's folded attention scale:
    # "Mismatched p__edgedyn_folded_6.ndim") and TVM and LiteRT such an argument.
    import torch

    import edgedyn

    for module in ZERO_D_BACKENDS.get(backend, ()):
        require_module(module)

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor(0.75))

        def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            return x * (self.scale * 2.0) + s * torch.full((), 3.0)

    model = Scaled().eval()
    if backend == "ncnn":  # ncnn blobs have 1 to 4 axes: a 0-d argument is refused at export, with the way out
        from edgedyn.errors import BackendError

        with pytest.raises(BackendError, match="input 's' of shape \\[\\].*\\n.*hint: try --backend"):
            edgedyn.export(model, (torch.randn(2, 3), torch.tensor(0.5)), board="x86-64", backend=backend,
                           output=tmp_path / "scaled.edgedyn")
        return
    program = rt.load(edgedyn.export(model, (torch.randn(2, 3), torch.tensor(0.5)), board="x86-64", backend=backend,
                                     output=tmp_path / "scaled.edgedyn"))
    rng = np.random.default_rng(5)
    x, s = rng.standard_normal((2, 3)).astype(np.float32), np.asarray(rng.standard_normal(), np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x), torch.from_numpy(s)).numpy()
    np.testing.assert_allclose(program(x, s), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_no_module_uses_ascontiguousarray():
    # Note: np.ascontiguousarray returns at least 1-d; np.asarray(a, order="C") keeps a 0-d array 0-d.
    users = [str(path.relative_to(REPO)) for path in (REPO / "edgedyn").rglob("*.py")
             if "ascontiguousarray" in path.read_text()]
    assert not users, "use np.asarray(a, order='C'): {}".format(users)


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
