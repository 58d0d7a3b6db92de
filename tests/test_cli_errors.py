"""Every bad command line prints `error:` and `hint:`, exits 2 and shows no traceback."""
from pathlib import Path
from typing import Any, Callable, List

import pytest

from conftest import EXAMPLES, REPO

TINY = str(EXAMPLES / "tiny_cnn.py") + ":TinyCNN"


def _model_file(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / "{}.py".format(name)
    path.write_text(body)
    return str(path)


def _raising_model(tmp_path: Path) -> List[str]:
    source = _model_file(tmp_path, "raising", "import torch\n\n\nclass Net(torch.nn.Module):\n"
                                              "    def forward(self, x):\n"
                                              "        return x.view(7, -1) + 1  # 6 elements cannot be 7 rows\n")
    return ["export", source + ":Net", "--input", "x=2x3", "-o", str(tmp_path / "out.edgedyn")]


def _syntax_error(tmp_path: Path) -> List[str]:
    source = _model_file(tmp_path, "broken", "import torch\n\ndef f(x)\n    return x\n")
    return ["export", source + ":f", "--input", "x=2x3", "-o", str(tmp_path / "out.edgedyn")]


def _board_without_memory(tmp_path: Path) -> List[str]:
    text = (REPO / "boards" / "x86-64.toml").read_text()
    start = text.index("[memory]")
    end = text.find("\n[", start + 1)
    board = tmp_path / "no-memory.toml"
    board.write_text(text[:start] + (text[end + 1:] if end >= 0 else ""))
    return ["export", TINY, "--board", str(board), "--input", "x=1x3x64x64", "-o", str(tmp_path / "out.edgedyn")]


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file.txt"
    path.write_text("not a folder\n")
    return path


EXPORT_CASES = {
    "model raises in forward": (_raising_model, "raising.py:6"),
    "impossible shape": (lambda t: ["export", TINY, "--input", "x=99999999x99999999", "-o", str(t / "o.edgedyn")],
                         "99999999x99999999"),
    "wrong rank": (lambda t: ["export", TINY, "--input", "x=1x64", "-o", str(t / "o.edgedyn")], "tiny_cnn.py"),
    "zero size": (lambda t: ["export", TINY, "--input", "x=0x3", "-o", str(t / "o.edgedyn")], "zero"),
    "syntax error": (_syntax_error, "broken.py"),
    "board without [memory]": (_board_without_memory, "memory"),
    "-o is a folder": (lambda t: ["export", TINY, "--input", "x=1x3x64x64", "-o", str(t)], "is a folder"),
    "-o under a file": (lambda t: ["export", TINY, "--input", "x=1x3x64x64", "-o", str(_file(t) / "o.edgedyn")],
                        "is not a folder"),
}


def _assert_user_error(result: Any, expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert any(line.startswith("error: ") for line in lines), result.stderr[-2000:]
    assert any(line.startswith("hint: ") for line in lines), result.stderr[-2000:]
    assert expected in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_bad_export_command_lines(run_cli: Callable[..., Any], tmp_path: Path, case: str) -> None:
    build, expected = EXPORT_CASES[case]
    _assert_user_error(run_cli(*build(tmp_path)), expected)


DEVICE_CASES = {
    "verify --threads -3": (lambda b, t: ["verify", b, "--threads", "-3"], "--threads"),
    "verify --threads 0": (lambda b, t: ["verify", b, "--threads", "0"], "--threads"),
    "bench --threads 0": (lambda b, t: ["bench", b, "--threads", "0", "--iterations", "1"], "--threads"),
    "bench --json under a file": (lambda b, t: ["bench", b, "--iterations", "1", "--duration", "0",
                                                "--json", str(_file(t) / "report.json")], "is not a folder"),
    "inspect --picture-dir on a file": (lambda b, t: ["inspect", b, "--memory", "--picture-dir", str(_file(t))],
                                        "is not a folder"),
    "verify a folder": (lambda b, t: ["verify", str(t)], "is a folder"),
    "bench --instructions without --emulate": (lambda b, t: ["bench", b, "--instructions"], "it needs --emulate"),
    "bench --cpu without --instructions": (lambda b, t: ["bench", b, "--emulate", "--cpu", "cortex-a72"],
                                           "--cpu applies to counting instructions"),
    "bench --instructions --cpu unknown": (lambda b, t: ["bench", b, "--emulate", "--instructions", "--cpu", "a76"],
                                           "unknown qemu CPU 'a76' for the emulated boards; choose from: cortex-a57, "
                                           "cortex-a72, cortex-a76, cortex-a78ae"),
    "bench --instructions --calls 0": (lambda b, t: ["bench", b, "--emulate", "--instructions", "--calls", "0"],
                                       "calls: expected an integer >= 1, got 0"),
    "bench --instructions --threads 4": (lambda b, t: ["bench", b, "--emulate", "--instructions", "--threads", "4"],
                                         "--instructions counts on one thread"),
}


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
def test_bad_device_command_lines(run_cli: Callable[..., Any], export_example: Any, tmp_path: Path,
                                  case: str) -> None:
    build, expected = DEVICE_CASES[case]
    bundle = str(export_example("tiny_cnn", backend="tflite"))
    _assert_user_error(run_cli(*build(bundle, tmp_path)), expected)
