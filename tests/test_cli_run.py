"""`edgedyn run` on your own data, and the command line's small promises: --version, -h, completion, one
meaning of --json everywhere, progress lines, hints in the caller's syntax, calibration arrays by name."""
import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgedyn import calibration
from edgedyn.errors import EdgedynError

from conftest import EXAMPLES, REPO, RTOL, torch_model


def _torch(name: str, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch_model(name)(torch.from_numpy(x)).numpy()


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * float(np.abs(expected).max()))


def test_run_npy_to_npz_matches_torch(run_cli, export_example, tmp_path):
    x = np.random.default_rng(21).standard_normal((8, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = run_cli("run", str(export_example("mlp")), "--input", "x={}".format(tmp_path / "x.npy"),
                     "-o", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    assert "using x=8x64" in result.stderr  # the batch-8 specialization was dispatched to
    with np.load(tmp_path / "out.npz") as outputs:
        assert outputs.files == ["output_0"]
        _close(outputs["output_0"], _torch("mlp", x))


def test_run_reads_stdin_and_writes_stdout_for_pipes(export_example, tmp_path):
    x = np.random.default_rng(22).standard_normal((1, 3, 64, 64)).astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, x)
    result = subprocess.run([sys.executable, "-m", "edgedyn", "run", str(export_example("tiny_cnn", backend="onnxruntime")),
                             "-i", "x=-", "-o", "-"], input=buffer.getvalue(), capture_output=True, cwd=str(REPO),
                            timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    with np.load(io.BytesIO(result.stdout)) as outputs:
        _close(outputs["output_0"], _torch("tiny_cnn", x))


def _png(path: Path, rng: np.random.Generator, size: int = 80) -> np.ndarray:
    from PIL import Image

    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(str(path))
    return pixels


def test_run_an_image_through_a_classifier_prints_the_top_classes(run_cli, export_example, tmp_path):
    from PIL import Image  # the [images] extra, part of [all]

    _png(tmp_path / "cat.png", np.random.default_rng(23))
    result = run_cli("run", str(export_example("tiny_cnn", backend="onnxruntime")), "-i",
                     "x={}".format(tmp_path / "cat.png"), "--print-top", "3", "--json", str(tmp_path / "top.json"))
    assert result.returncode == 0, result.stderr
    # The same preprocessing by hand: resize to 64x64, scale to 0-1, ImageNet mean and std, NCHW.
    with Image.open(str(tmp_path / "cat.png")) as image:
        pixels = np.asarray(image.convert("RGB").resize((64, 64), Image.BILINEAR), np.float32) / 255.0
    x = ((pixels - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32).transpose(2, 0, 1)[None]
    logits = _torch("tiny_cnn", np.ascontiguousarray(x))[0]
    top = json.loads((tmp_path / "top.json").read_text())["outputs"]["output_0"]["top"]
    assert [item["class"] for item in top] == list(np.argsort(-logits)[:3])
    assert top[0]["score"] == pytest.approx(float(logits.max()), rel=1e-4, abs=1e-4 * float(np.abs(logits).max()))
    assert re.search(r"#1 class {} +score".format(top[0]["class"]), result.stdout)


def test_run_an_image_through_a_zoo_classifier_prints_its_top_classes(run_cli, tmp_path):
    # A transformers ResNet as users hold it (edgedyn.zoo): its output is named `logits`, its input `pixel_values`.
    import torch
    from PIL import Image

    import edgedyn
    from edgedyn import zoo

    model = zoo.build("resnet")
    bundle = edgedyn.export(model, zoo.example_inputs("resnet", seed=0), board="x86-64", backend="onnxruntime",
                            output=tmp_path / "resnet.edgedyn")
    _png(tmp_path / "dog.png", np.random.default_rng(5), size=96)
    result = run_cli("run", str(bundle), "-i", "pixel_values={}".format(tmp_path / "dog.png"), "--print-top", "5",
                     "--json", str(tmp_path / "top.json"))
    assert result.returncode == 0, result.stderr
    with Image.open(str(tmp_path / "dog.png")) as image:
        pixels = np.asarray(image.convert("RGB").resize((64, 64), Image.BILINEAR), np.float32) / 255.0
    x = ((pixels - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32).transpose(2, 0, 1)[None]
    with torch.no_grad():
        logits = model(pixel_values=torch.from_numpy(np.ascontiguousarray(x))).logits[0].numpy()
    top = json.loads((tmp_path / "top.json").read_text())["outputs"]["logits"]["top"]
    assert [item["class"] for item in top] == list(np.argsort(-logits)[:5])
    assert re.search(r"#1 class {} +score".format(top[0]["class"]), result.stdout)


def test_an_image_without_pillow_names_the_install(run_cli, export_example, tmp_path):
    blocker = tmp_path / "no_pillow" / "PIL"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named PIL')\n")
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    result = run_cli("run", str(export_example("tiny_cnn", backend="onnxruntime")), "-i",
                     "x={}".format(tmp_path / "x.png"), env={"PYTHONPATH": str(blocker.parent)})
    assert result.returncode == 2
    assert "error: reading x.png needs Pillow, which is not installed" in result.stderr
    assert "hint: pip install 'edgedyn[images]'" in result.stderr and "Traceback" not in result.stderr


def test_float64_input_hints_the_cast_in_cli_form(run_cli, export_example, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(24).standard_normal((8, 64)))  # numpy's default: float64
    result = run_cli("run", str(export_example("mlp")), "-i", "x={}".format(tmp_path / "x.npy"))
    assert result.returncode == 2
    assert "input 'x' dtype: expected float32, got float64" in result.stderr
    assert "hint: save 'x' as float32: numpy.save(path, array.astype(numpy.float32)); or, if the model should " \
           "take that dtype, export again with --input x=8x64:float64" in result.stderr


@pytest.mark.parametrize("args, error", [
    (["-i", "y=x.npy"], "error: --input y=x.npy: the model has no argument 'y'; its arguments are: x"),
    ([], "error: no --input for x; the model's tensor inputs are: x"),
    (["-i", "x=missing.npy"], "error: --input x=missing.npy: no such file"),
    (["-i", "x=-", "-o", "-", "--json"], "error: -o - and --json both want stdout"),
])
def test_run_user_errors(run_cli, export_example, args, error):
    result = run_cli("run", str(export_example("mlp")), *args)
    assert result.returncode == 2 and error in result.stderr and "Traceback" not in result.stderr


def test_version_short_help_and_completion(run_cli):
    from edgedyn.version import __version__

    assert run_cli("--version").stdout.strip() == "edgedyn {}".format(__version__)
    for args in (["-h"], ["run", "-h"], ["boards", "show", "-h"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "Usage: edgedyn" in result.stdout, args
    # typer detects the shell from the process tree (shellingham), which has no shell under nohup or some CI
    # runners; its test switch makes the option take the shell named here instead.
    completion = run_cli("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert completion.returncode == 0 and "_edgedyn_completion" in completion.stdout
    assert "--install-completion" in run_cli("--help").stdout


@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["bench", "--iterations", "2", "--duration", "0"]])
def test_json_means_the_same_on_every_command(run_cli, export_example, tmp_path, command):
    bundle = str(export_example("mlp"))
    alone = run_cli(command[0], "--json", bundle, *command[1:])  # bare --json before the bundle: stdout
    assert alone.returncode == 0, alone.stderr
    assert isinstance(json.loads(alone.stdout), dict)
    path = tmp_path / "report.json"
    beside = run_cli(command[0], bundle, *command[1:], "--json", str(path))
    assert beside.returncode == 0, beside.stderr
    assert json.loads(path.read_text()) and not beside.stdout.lstrip().startswith("{")  # the table on stdout
    assert "wrote {}".format(path) in beside.stderr


def test_boards_json_bare_and_to_a_file(run_cli, tmp_path):
    assert [b["name"] for b in json.loads(run_cli("boards", "--json").stdout)][0] == "jetson-nano"
    result = run_cli("boards", "show", "x86-64", "--json={}".format(tmp_path / "b.txt"))
    assert result.returncode == 0 and json.loads((tmp_path / "b.txt").read_text())["board"]["name"] == "x86-64"


def test_progress_lines_show_elapsed_seconds_not_a_source_line(run_cli, tmp_path):
    result = run_cli("export", str(EXAMPLES / "mlp.py") + ":MLP", "--input", "x=1x64", "--backend", "portable",
                     "-o", str(tmp_path / "mlp.edgedyn"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("export: ")]
    assert len(lines) >= 3
    assert all(re.fullmatch(r"export: .+ \(\d+\.\d s\)", line) for line in lines), lines
    assert "common.py" not in result.stderr


def test_calibration_npz_arrays_are_matched_by_name(tmp_path):
    rng = np.random.default_rng(25)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    np.savez(tmp_path / "swapped.npz", b=b, a=a)  # the other order than the model takes them
    samples = calibration.load(str(tmp_path / "swapped.npz"))
    batch = calibration.batches(samples, [[1, 3], [1, 5]], [np.float32, np.float32], names=["a", "b"])[0]
    np.testing.assert_array_equal(batch[0], a[:1])
    np.testing.assert_array_equal(batch[1], b[:1])
    held_out = calibration.split(samples)[1]
    assert calibration.batches(held_out, [[1, 3], [1, 5]], [np.float32] * 2, names=["a", "b"])[0][0].shape == (1, 3)

    np.savez(tmp_path / "wrong.npz", a=a, c=b)
    with pytest.raises(EdgedynError) as info:
        calibration.batches(calibration.load(str(tmp_path / "wrong.npz")), [[1, 3], [1, 5]], [np.float32] * 2,
                            names=["a", "b"])
    assert "has array(s) c that name no input; has no array for b; the model's tensor inputs are: a, b" in str(
        info.value)
    assert "numpy.savez(path, a=..., b=...)" in info.value.hint


# Two inputs of different widths: a sample matched by position the wrong way round cannot fit, so an export that
# succeeds with the arrays given in the other order proves they were matched by name.
TWO_INPUTS = """
import torch


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fa, self.fb = torch.nn.Linear(3, 8), torch.nn.Linear(5, 8)

    def forward(self, a, b):
        return torch.relu(self.fa(a) + self.fb(b))
"""


def _two_input_samples(count: int = 12) -> list:
    rng = np.random.default_rng(26)
    return [{"b": rng.standard_normal((1, 5)).astype(np.float32), "a": rng.standard_normal((1, 3)).astype(np.float32)}
            for _ in range(count)]


def _write_sources(folder: Path, samples: list, names: dict) -> tuple:
    """The samples as an .npz and as a folder per sample, each array saved under names[input]."""
    np.savez(folder / "samples.npz", **{names[k]: np.concatenate([s[k] for s in samples]) for k in ("b", "a")})
    for i, sample in enumerate(samples):
        (folder / "samples" / "{:03d}".format(i)).mkdir(parents=True)
        for key, array in sample.items():
            np.save(folder / "samples" / "{:03d}".format(i) / (names[key] + ".npy"), array)
    return folder / "samples.npz", folder / "samples"


def test_calibration_sources_are_matched_by_name_through_the_cli(run_cli, tmp_path):
    (tmp_path / "two.py").write_text(TWO_INPUTS)
    model = "{}:TwoInputs".format(tmp_path / "two.py")
    samples = _two_input_samples()
    right = tmp_path / "right"
    right.mkdir()
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for source in _write_sources(right, samples, {"a": "a", "b": "b"}):  # b before a: not the model's order
        result = run_cli("export", model, "-i", "a=1x3", "-i", "b=1x5", "--backend", "onnxruntime", "--quantize",
                         "int8", "--calibration", str(source), "-o", str(tmp_path / "two.edgedyn"))
        assert result.returncode == 0, result.stderr
    for source in _write_sources(wrong, samples, {"a": "a", "b": "c"}):
        result = run_cli("export", model, "-i", "a=1x3", "-i", "b=1x5", "--backend", "onnxruntime", "--quantize",
                         "int8", "--calibration", str(source), "-o", str(tmp_path / "never.edgedyn"))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "has array(s) c that name no input; has no array for b; the model's tensor inputs are: a, b" in \
            result.stderr
        assert "hint: save one array per input under its name: numpy.savez(path, a=..., b=...), or a folder per " \
            "sample holding a.npy, b.npy" in result.stderr
        assert not (tmp_path / "never.edgedyn").exists()


def test_calibration_by_name_through_the_api(tmp_path):
    import edgedyn

    (tmp_path / "two.py").write_text(TWO_INPUTS)
    model = "{}:TwoInputs".format(tmp_path / "two.py")
    samples = _two_input_samples()
    _, folder = _write_sources(tmp_path, samples, {"a": "a", "b": "b"})
    for source in (str(folder), samples):  # a folder per sample, and {name: array} dicts in another order
        bundle = edgedyn.export(model, inputs=["a=1x3", "b=1x5"], backend="onnxruntime", quantize="int8",
                                calibration=source, output=tmp_path / "two.edgedyn")
        assert bundle.is_file()
    loaded = calibration.load(str(folder))
    assert loaded.names == ("a", "b") and loaded.samples[0][0].shape == (1, 3)
    with pytest.raises(EdgedynError) as info:
        edgedyn.export(model, inputs=["a=1x3", "b=1x5"], backend="onnxruntime", quantize="int8",
                       calibration=[{"a": s["a"], "x": s["b"]} for s in samples], output=tmp_path / "never.edgedyn")
    assert "has array(s) x that name no input; has no array for b; the model's tensor inputs are: a, b" in str(
        info.value)
    # Position only where nothing is named: a flat folder of .npy files, one sample each, and tuples.
    flat = tmp_path / "flat"
    flat.mkdir()
    np.save(flat / "000.npy", samples[0]["a"])
    assert calibration.load(str(flat)).names == () and calibration.load([(samples[0]["a"],)]).names == ()
    (folder / "000" / "a.npy").rename(folder / "000" / "z.npy")
    with pytest.raises(EdgedynError, match="sample folder 001 holds a, b, but 000 holds b, z"):
        calibration.load(str(folder))


def test_calibration_random_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="edgedyn"):
        assert calibration.load("random").random
    assert "warning: --calibration random: int8 scales from random normal inputs" in caplog.text


def test_calibration_random_warns_once_on_the_command_line(run_cli, tmp_path):
    result = run_cli("export", str(EXAMPLES / "mlp.py") + ":MLP", "-i", "x=1x64", "--backend", "onnxruntime",
                     "--quantize", "int8", "--calibration", "random", "-o", str(tmp_path / "r.edgedyn"))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "--calibration random" in line]
    assert warnings == [calibration.RANDOM_WARNING], result.stderr


def test_the_arena_picture_says_whose_memory_it_is(run_cli, export_example, tmp_path):
    for backend, label in (("onnxruntime", "planned, not used by onnxruntime"),
                           ("portable", "used by the portable executor")):
        bundle = export_example("tiny_cnn", backend=backend)
        result = run_cli("inspect", "--memory", str(bundle), "--picture-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
        assert label in result.stdout
        svg = (tmp_path / "{}.memory-0.svg".format(bundle.name.rsplit(".", 1)[0])).read_text()
        assert label in svg


def test_docs_agree_that_tflite_has_int8():
    tflite = (REPO / "docs" / "tflite.md").read_text()
    assert "No int8" not in tflite and "--quantize int8" in tflite


def test_the_cli_needs_no_click_of_its_own():
    """Typer 0.29 vendors Click and does not install it: importing click directly broke a fresh install."""
    code = "import sys; sys.modules['click'] = None; import edgedyn.cli.main"
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
