"""The `edgedyn` command end to end, in fresh interpreters: what a user types and what they read back."""
import json
import zipfile

import numpy as np
import pytest

import edgedyn.runtime as rt
from edgedyn.bundle import BundleWriter
from edgedyn.runtime.format import MANIFEST_NAME, pack_arrays

from conftest import EXAMPLES, foreign_board


def test_export_verify_inspect_tiny_cnn(run_cli, tmp_path):
    bundle = tmp_path / "tiny.edgedyn"
    exported = run_cli("export", str(EXAMPLES / "tiny_cnn.py") + ":TinyCNN", "--board", "x86-64",
                       "--input", "x=1x3x64x64", "--backend", "tvm", "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == str(bundle)  # data on stdout, progress on stderr
    assert "exported TinyCNN for x86-64 (tvm): 1 specialization(s) [x=1x3x64x64]" in exported.stderr

    verified = run_cli("verify", str(bundle))
    assert verified.returncode == 0, verified.stderr
    assert "verified 1 output(s) of 1 specialization(s) on x86_64" in verified.stderr
    assert "output_0" in verified.stdout and "ok" in verified.stdout

    shown = run_cli("inspect", str(bundle))
    assert shown.returncode == 0, shown.stderr
    import torch

    for text in ("board      x86-64", "x.shape[0] == 1", "x float32[1x3x64x64]", "tvm", "x86-64-v2",
                 "torch " + torch.__version__):
        assert text in shown.stdout

    manifest = json.loads(run_cli("inspect", "--json", str(bundle)).stdout)
    assert manifest["board"]["name"] == "x86-64"
    assert manifest["specializations"][0]["artifacts"][0]["backend"] == "tvm"
    assert manifest["bundle"]["size"] == bundle.stat().st_size


def test_verify_json_reports_errors_per_output(run_cli, export_example):
    result = run_cli("verify", "--json", str(export_example("mlp")))
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"]
    assert [r["specialization"] for r in report["results"]] == ["x=1x64", "x=8x64"]
    assert all(r["max_rel"] < 1e-4 for r in report["results"])


def test_verify_exits_1_when_outputs_differ(run_cli, export_example, tmp_path):
    source = export_example("loop_example")
    with zipfile.ZipFile(source) as archive:
        manifest = json.loads(archive.read(MANIFEST_NAME))
        members = {name: archive.read(name) for name in manifest["members"]}
    spec = manifest["specializations"][0]
    reference = rt.Bundle(source).arrays(spec["reference"])
    reference["output.0"] = reference["output.0"] * 1.01  # as if the backend were off by 1%
    members[spec["reference"]] = pack_arrays(reference)
    writer = BundleWriter()
    writer.members.update(members)
    wrong = writer.write(tmp_path / "wrong.edgedyn", manifest)

    result = run_cli("verify", str(wrong))
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout
    assert "error: 1 of 1 outputs differ from torch eager beyond tolerance" in result.stderr


@pytest.mark.parametrize("args, error, hint", [
    (["export", "examples/tiny_cnn.py:TinyCNN", "--board", "jetson-nan"],
     "error: unknown board 'jetson-nan'; choose from: jetson-nano, jetson-orin-nano", "hint: did you mean 'jetson-nano'?"),
    (["export", "examples/tiny_cnn.py:TinyCNN", "--input", "x=1x3xx"],
     "error: cannot read --input x=1x3xx", "hint: give a shape like x=1x3x224x224"),
    (["export", "examples/nothing.py:Net"], "error: model file examples/nothing.py does not exist", "hint:"),
    (["export", "examples/tiny_cnn.py:TinyCNN", "--backend", "tvmm"],
     "error: unknown backend 'tvmm'; choose from: auto, ncnn, onnxruntime, openvino, portable, tflite, tvm",
     "hint: did you mean 'tvm'?"),
    (["export", "examples/tiny_cnn.py:TinyCNN", "--device", "gpu"],
     "error: --device gpu needs a board with a GPU and a backend that builds GPU code (tvm)", "hint: use --board jetson"),
    (["export", "examples/tiny_cnn.py:TinyCNN", "--precision", "bf16", "--backend", "tvm"],
     "error: backend tvm does not compute bf16 on a x86_64 CPU; backends that do: openvino",
     "hint: use --backend openvino or --precision auto"),
    (["export", "examples/tiny_cnn.py:TinyCNN", "--precision", "fp16", "--board", "raspberry-pi-4"],
     "error: raspberry-pi-4's CPU has no fp16 arithmetic (it needs fphp+asimdhp", "hint: use --precision auto"),
    (["verify", "missing.edgedyn"], "error: bundle missing.edgedyn does not exist", "hint: create one with"),
])
def test_user_errors_are_one_line_without_traceback(run_cli, args, error, hint):
    result = run_cli(*args)
    assert result.returncode == 2
    assert error in result.stderr
    if hint:
        assert hint in result.stderr
    assert "Traceback" not in result.stderr


def test_edgedyn_debug_shows_the_traceback(run_cli):
    result = run_cli("verify", "missing.edgedyn", env={"EDGEDYN_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_foreign_bundle_is_refused_by_verify(run_cli, export_example):
    board, arch = foreign_board()  # on x86: raspberry-pi-4, aarch64
    result = run_cli("verify", str(export_example("tiny_cnn", board=board)))
    assert result.returncode == 2
    refusal = "was built for {} (board {}), but this machine is {}".format(arch, board, rt.format.host_arch())
    assert refusal in result.stderr
    if arch == "aarch64":  # an aarch64 bundle can be checked here, on the board emulated under qemu
        assert "hint: " in result.stderr and " --emulate" in result.stderr


def test_usage_error_exits_2(run_cli):
    result = run_cli("export")
    assert result.returncode == 2 and "Missing argument" in result.stderr


def test_python_api_returns_the_bundle_path(tmp_path):
    import torch

    import edgedyn

    path = edgedyn.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),), board="x86-64", output=tmp_path / "lin.edgedyn")
    assert path == tmp_path / "lin.edgedyn"
    x = np.random.rand(3, 4).astype(np.float32)
    assert rt.load(path)(x).shape == (3, 2)


def test_keygen_sign_and_verify_with_trusted_keys(run_cli, export_example, tmp_path):
    made = run_cli("keygen", str(tmp_path / "key"))
    assert made.returncode == 0, made.stderr
    public = tmp_path / "key.pub"
    assert made.stdout.strip() == public.read_text().strip() and len(made.stdout.strip()) == 64
    again = run_cli("keygen", str(tmp_path / "key"))
    assert again.returncode == 2 and "never overwrites a key" in again.stderr

    bundle = tmp_path / "signed.edgedyn"
    exported = run_cli("export", str(EXAMPLES / "loop_example.py") + ":loop_example", "--input", "x=2x3",
                       "--input", "n=4", "--backend", "portable", "--sign", str(tmp_path / "key"), "-o", str(bundle))
    assert exported.returncode == 0, exported.stderr
    verified = run_cli("verify", str(bundle), "--trusted-keys", str(public))
    assert verified.returncode == 0, verified.stderr
    assert "signature ok: signed by trusted key {}".format(public.read_text()[:16]) in verified.stderr

    unsigned = run_cli("verify", str(export_example("loop_example", backend="portable")), "--trusted-keys", str(public))
    assert unsigned.returncode == 2 and "Traceback" not in unsigned.stderr
    assert "is not signed" in unsigned.stderr and "hint: sign it at export with" in unsigned.stderr


def test_library_warnings_read_as_warning_lines_and_python_keeps_its_own(monkeypatch, capsys):
    """A warning raised while a command runs (GPU fallback, tuning records left out) prints as `warning: ...`;
    main() called in-process gives Python's warning display back afterwards."""
    import warnings

    from edgedyn.cli import boards as boards_command
    from edgedyn.cli.main import main

    real = boards_command.list_boards
    before = warnings.showwarning

    def warn_then_list(*args, **kwargs):
        warnings.warn("no GPU code in this bundle, it runs on the CPU: planted", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(boards_command, "list_boards", warn_then_list)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as exited:
            main(["boards"])
    assert exited.value.code in (0, None)
    err = capsys.readouterr().err
    assert "warning: no GPU code in this bundle, it runs on the CPU: planted\n" in err
    assert "UserWarning" not in err and ".py:" not in err
    assert warnings.showwarning is before
