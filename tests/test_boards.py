"""Boards and targets: the shipped files load and agree with public specs, with LLVM and with qemu;
bad files give errors that name the field; `edgedyn boards` lists and shows them."""
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgedyn.boards import (
    Board, board_names, boards_dir, host_arch, list_boards, load_board, load_target,
    target_names,
)
from edgedyn.cli.main import app
from edgedyn.emulate.rootfs import qemu_model
from edgedyn.errors import BoardError
from edgedyn.registry import backend_names

from conftest import require_module

BOARDS = ["jetson-nano", "jetson-orin-nano", "jetson-xavier-nx", "raspberry-pi-4", "raspberry-pi-5", "x86-64"]
TARGETS = ["carmel", "cortex-a57", "cortex-a72", "cortex-a76", "cortex-a78ae", "cuda-sm53", "cuda-sm72",
           "cuda-sm87", "x86-64-v2"]

# Public specs (docs/stack-notes.md, "Boards"): the files must say the same.
FACTS = [
    # name, arch, cores, gpu arch, cuda, python, cpu target, gpu target, qemu cpu
    ("jetson-nano", "aarch64", 4, "sm_53", "10.2", "3.8", "cortex-a57", "cuda-sm53", "cortex-a57"),
    ("jetson-xavier-nx", "aarch64", 6, "sm_72", "11.4", "3.8", "carmel", "cuda-sm72", "cortex-a76"),
    ("jetson-orin-nano", "aarch64", 6, "sm_87", "12.6", "3.10", "cortex-a78ae", "cuda-sm87", "cortex-a78ae"),
    ("raspberry-pi-4", "aarch64", 4, None, None, "3.11", "cortex-a72", None, "cortex-a72"),
    ("raspberry-pi-5", "aarch64", 4, None, None, "3.11", "cortex-a76", None, "cortex-a76"),
    ("x86-64", "x86_64", 4, None, None, "3.11", "x86-64-v2", None, None),
]

# CPU features as boards name them -> LLVM's names. Only instruction-set features: a target must enable
# exactly the ones its board lists (one the board lacks is SIGILL; one it has but we leave off is lost speed).
ISA_FEATURES = {
    "aarch64": {"neon": "neon", "crc": "crc", "aes": "aes", "sha2": "sha2", "lse": "lse", "rdm": "rdm",
                "fp16": "fullfp16", "dotprod": "dotprod", "rcpc": "rcpc", "i8mm": "i8mm", "bf16": "bf16",
                "sve": "sve"},
    "x86_64": {"sse4.2": "sse4.2", "ssse3": "ssse3", "popcnt": "popcnt", "cx16": "cx16", "avx": "avx",
               "avx2": "avx2", "fma": "fma", "avx512f": "avx512f"},
}

GOOD_BOARD = """
name = "my-board"
description = "A Pi 4 with 2 GB"
arch = "aarch64"

[cpu]
model = "Cortex-A72"
cores = 4
features = ["neon", "crc"]

[memory]
ram_mb = 2048
budget_mb = 1536

[os]
name = "Raspberry Pi OS bookworm"
python = "3.11"
glibc = "2.36"

[targets]
cpu_target = "cortex-a72"

[emulation]
qemu_cpu = "cortex-a72"
debian_suite = "bookworm"

[backends]
preference = ["onnxruntime", "tvm"]
"""

runner = CliRunner()


def write(tmp_path: Path, text: str, name: str = "board.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the shipped files ---

def test_names():
    assert board_names() == BOARDS
    assert target_names() == TARGETS
    assert [b.name for b in list_boards()] == BOARDS


@pytest.mark.parametrize("name", BOARDS)
def test_board_loads_and_file_name_matches(name):
    board = load_board(name)
    assert board.name == name == board.path.stem
    assert 0 < board.ram_budget_mb < board.ram_mb
    assert board.target("cpu").kind == "cpu"
    json.dumps(board.to_dict())


@pytest.mark.parametrize("name", TARGETS)
def test_target_file_name_matches(name):
    target = load_target(name)
    assert target.name == name == target.path.stem
    assert (target.cross_compiler == "aarch64-linux-gnu-g++") == (target.arch == "aarch64")
    json.dumps(target.to_dict())


@pytest.mark.parametrize("name,arch,cores,gpu_arch,cuda,python,cpu_target,gpu_target,qemu_cpu", FACTS)
def test_board_facts(name, arch, cores, gpu_arch, cuda, python, cpu_target, gpu_target, qemu_cpu):
    board = load_board(name)
    assert (board.arch, board.cpu_cores, board.cuda, board.python) == (arch, cores, cuda, python)
    assert (board.gpu.arch if board.gpu else None) == gpu_arch
    assert (board.cpu_target, board.gpu_target, board.qemu_cpu) == (cpu_target, gpu_target, qemu_cpu)
    if gpu_target is not None:
        gpu = board.target("gpu")
        assert gpu.kind == "cuda" and gpu.tvm["arch"] == gpu_arch
        assert gpu.tvm_host["mcpu"] == board.target("cpu").tvm["mcpu"]


def test_nano_says_why_tvm_gpu_bundles_do_not_run():
    board = load_board("jetson-nano")
    assert board.gpu.cuda_cores == 128 and board.gpu.compute_capability == "5.3"
    assert board.ram_mb == 4096
    assert any("CUDA 12" in note and "10.2" in note for note in board.notes)
    assert board.backends[0] != "tvm"  # the pip TVM needs Python >= 3.10 and CUDA 12; the Nano has neither


def test_every_board_prefers_onnxruntime_for_its_cpu_artifact():
    # backends.preference picks the CPU artifact, the one every board can run: untuned TVM is ~40x slower there
    # than onnxruntime, so it is never first, not even on a Jetson (where TVM builds the GPU code).
    for name in board_names():
        assert load_board(name).backends[0] == "onnxruntime", name


def test_jetsons_prefer_tvm_for_gpu_code_and_other_boards_name_none():
    for name in board_names():
        board = load_board(name)
        assert board.gpu_backends == (("tvm",) if board.gpu_target else ()), name


def test_gpu_preference_names_only_backends_that_build_gpu_code(tmp_path):
    text = (boards_dir() / "jetson-orin-nano.toml").read_text().replace(
        'gpu_preference = ["tvm"]', 'gpu_preference = ["onnxruntime"]')
    path = tmp_path / "orin.toml"
    path.write_text(text)
    with pytest.raises(BoardError, match=r"backends.gpu_preference: expected a list drawn from tvm"):
        load_board(str(path))


@pytest.mark.parametrize("machine,arch", [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64"),
                                          ("aarch64", "aarch64"), ("riscv64", "riscv64"),
                                          ("armv8l", "armv8l")])  # a 32-bit userland: no aarch64 code
def test_host_arch(monkeypatch, machine, arch):
    monkeypatch.setattr("platform.machine", lambda: machine)
    assert host_arch() == arch


# --- agreement with TVM and LLVM ---

@pytest.mark.parametrize("name", TARGETS)
def test_target_builds_in_tvm_and_llvm_knows_its_cpu(name):
    tvm = require_module("tvm")
    from tvm.target import codegen

    target = load_target(name)
    built = target.tvm_target()
    assert built.kind.name == target.tvm["kind"]
    cpu_side = built if target.kind == "cpu" else built.host
    assert cpu_side is not None and cpu_side.kind.name == "llvm"
    # An unknown -mcpu only logs a warning and falls back to `generic`: ask LLVM directly.
    assert codegen.llvm_is_valid_cpu(target.mcpu, str(cpu_side.attrs["mtriple"]))
    if target.kind == "cuda":
        assert str(built.attrs["arch"]) == target.tvm["arch"]
        assert isinstance(built, tvm.target.Target)


@pytest.mark.parametrize("name", [n for n in TARGETS if not n.startswith("cuda")])
def test_cpu_target_reaches_llvm_codegen(name):
    tvm = require_module("tvm")
    from tvm import te

    target = load_target(name)
    a = te.placeholder((64,), "float32", name="a")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="b")
    built = tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, b])}), target=target.tvm_target())
    ir = built.mod.inspect_source("ll")
    assert '"target-cpu"="{}"'.format(target.mcpu) in ir
    for attr in target.tvm.get("mattr", ()):
        assert attr in ir


def _llvm_isa(triple, mcpu, mattr=()):
    tvm = require_module("tvm")
    from tvm.target import codegen

    spec = {"kind": "llvm", "mtriple": triple, "mcpu": mcpu}
    if mattr:
        spec["mattr"] = list(mattr)
    return set(codegen.llvm_get_cpu_features(tvm.target.Target(spec)))


@pytest.mark.parametrize("name", BOARDS)
def test_board_features_are_what_llvm_enables_for_its_target(name):
    board = load_board(name)
    target = board.target("cpu")
    vocabulary = ISA_FEATURES[board.arch]
    assert set(board.cpu_features) <= set(vocabulary), "add new features to ISA_FEATURES"
    enabled = _llvm_isa(target.tvm["mtriple"], target.mcpu, target.tvm.get("mattr", ()))
    assert {f for f, llvm in vocabulary.items() if llvm in enabled} == set(board.cpu_features)


@pytest.mark.parametrize("name", [b for b in BOARDS if load_board(b).qemu_cpu])
def test_qemu_cpu_runs_everything_the_target_emits(name):
    board = load_board(name)
    target = board.target("cpu")
    isa = set(ISA_FEATURES["aarch64"].values())
    needed = _llvm_isa(target.tvm["mtriple"], target.mcpu, target.tvm.get("mattr", ())) & isa
    emulated = _llvm_isa(target.tvm["mtriple"], qemu_model(board.qemu_cpu)) & isa  # the model qemu runs
    assert needed <= emulated, "qemu -cpu {} lacks {}".format(qemu_model(board.qemu_cpu), sorted(needed - emulated))


# The Debian release each emulated board's root filesystem is made of: Raspberry Pi OS bookworm is Debian
# bookworm; no Debian matches L4T's Ubuntu, and bookworm is what the Jetson board tests have always run on.
DEBIAN_SUITES = {"jetson-nano": "bookworm", "jetson-orin-nano": "bookworm", "jetson-xavier-nx": "bookworm",
                 "raspberry-pi-4": "bookworm", "raspberry-pi-5": "bookworm", "x86-64": None}


@pytest.mark.parametrize("name", BOARDS)
def test_emulated_boards_name_a_debian_suite_the_emulator_knows(name):
    from edgedyn.emulate.rootfs import SUITES

    board = load_board(name)
    assert board.debian_suite == DEBIAN_SUITES[name]
    assert (board.debian_suite is None) == (board.qemu_cpu is None) == (board.arch == "x86_64")
    if board.debian_suite is not None:
        assert board.debian_suite in SUITES
        assert board.to_dict()["emulation"] == {"qemu_cpu": board.qemu_cpu, "debian_suite": board.debian_suite}


# --- user files and errors ---

def test_unknown_board_lists_valid_names():
    with pytest.raises(BoardError) as caught:
        load_board("jetson-nan")
    assert caught.value.message == "unknown board 'jetson-nan'; choose from: " + ", ".join(BOARDS)
    assert "did you mean 'jetson-nano'?" in caught.value.hint
    assert "pass the path to your copy" in caught.value.hint


def test_unknown_target_lists_valid_names():
    with pytest.raises(BoardError, match="unknown target 'cortex-a99'; choose from: carmel, cortex-a57"):
        load_target("cortex-a99")


def test_user_board_file(tmp_path):
    board = load_board(str(write(tmp_path, GOOD_BOARD)))
    assert isinstance(board, Board)
    assert (board.name, board.ram_mb, board.gpu, board.notes) == ("my-board", 2048, None, ())
    assert board.target().name == "cortex-a72"
    assert board.to_dict()["memory"] == {"ram_mb": 2048, "budget_mb": 1536}


def test_user_board_with_its_own_target_file(tmp_path):
    write(tmp_path, load_target("cortex-a72").path.read_text().replace('name = "cortex-a72"', 'name = "mine"'),
          "mine.toml")
    path = write(tmp_path, GOOD_BOARD.replace('cpu_target = "cortex-a72"', 'cpu_target = "mine.toml"'))
    assert load_board(str(path)).target().name == "mine"


BAD_BOARDS = [
    # (edit to GOOD_BOARD, field named in the error, words the error must contain)
    (('budget_mb = 1536', 'budget_mb = 4096'), "memory.budget_mb", "expected an integer from 1 to ram_mb (2048)"),
    (('cores = 4', 'cores = "four"'), "cpu.cores", "got 'four'"),
    (('arch = "aarch64"', 'arch = "arm64"'), "arch", "expected one of aarch64, x86_64, got 'arm64'"),
    (('python = "3.11"\n', ''), "os.python", "the field is required"),
    (('["onnxruntime", "tvm"]', '["onnxrutime"]'), "backends.preference", ", ".join(backend_names())),
    (('qemu_cpu = "cortex-a72"', 'qemu-cpu = "cortex-a72"'), "emulation.qemu-cpu", "unknown field"),
    (('cpu_target = "cortex-a72"', 'cpu_target = "cortex-a99"'), "targets.cpu_target",
     "unknown target 'cortex-a99'; choose from"),
    (('cpu_target = "cortex-a72"', 'cpu_target = "x86-64-v2"'), "targets.cpu_target", "a cpu target for aarch64"),
    (('[targets]\n', '[targets]\ngpu_target = "cuda-sm53"\n'), "targets.gpu_target", "without [gpu]"),
    (('[memory]', '[memory]\nram = 1'), "memory.ram", "unknown field"),
    (('debian_suite = "bookworm"', 'debian_suite = "Bookworm 12"'), "emulation.debian_suite",
     "expected a Debian suite like 'bookworm', got 'Bookworm 12'"),
    (('debian_suite = "bookworm"\n', ''), "emulation", "expected both qemu_cpu and debian_suite, or no [emulation]"),
]


@pytest.mark.parametrize("edit,field,words", BAD_BOARDS, ids=[case[1] for case in BAD_BOARDS])
def test_bad_board_names_file_and_field(tmp_path, edit, field, words):
    old, new = edit
    assert old in GOOD_BOARD
    path = write(tmp_path, GOOD_BOARD.replace(old, new, 1))
    with pytest.raises(BoardError) as caught:
        load_board(str(path))
    message = caught.value.message
    assert message.startswith("{}: {}: ".format(path, field)), message
    assert words in message


def test_bad_gpu_names_file_and_field(tmp_path):
    text = GOOD_BOARD + '\n[gpu]\nname = "x"\narch = "sm_53"\ncompute_capability = "7.2"\ncuda_cores = 128\n'
    path = write(tmp_path, text)
    with pytest.raises(BoardError, match=re.escape("{}: gpu.arch: expected 'sm_72' to match".format(path))):
        load_board(str(path))


def test_malformed_toml_names_file(tmp_path):
    path = write(tmp_path, GOOD_BOARD.replace('cores = 4', 'cores = '))
    with pytest.raises(BoardError, match=re.escape(str(path)) + ": not valid TOML"):
        load_board(str(path))


def test_missing_file(tmp_path):
    with pytest.raises(BoardError, match="board file '.*nope.toml' not found"):
        load_board(str(tmp_path / "nope.toml"))


def test_gpu_device_on_board_without_gpu():
    with pytest.raises(BoardError, match="board 'raspberry-pi-4' has no GPU target") as caught:
        load_board("raspberry-pi-4").target("gpu")
    assert "jetson-nano" in caught.value.hint
    with pytest.raises(BoardError, match="unknown device 'npu'; choose from: cpu, gpu"):
        load_board("raspberry-pi-4").target("npu")


def test_boards_are_immutable():
    board = load_board("x86-64")
    with pytest.raises(AttributeError):
        board.ram_mb = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        board.target().tvm["mcpu"] = "native"  # type: ignore[index]


def test_shipped_files_are_in_the_repo_data_dir():
    assert (boards_dir() / "jetson-nano.toml").is_file()


# --- the CLI ---

def test_cli_table_lists_every_board():
    result = runner.invoke(app, ["boards"])
    assert result.exit_code == 0, result.output
    for name in BOARDS:
        assert name in result.output
    assert "sm_53" in result.output and "cortex-a78ae" in result.output


def test_cli_json():
    result = runner.invoke(app, ["boards", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [b["name"] for b in data] == BOARDS
    assert data[0]["gpu"]["arch"] == "sm_53"


def test_cli_show_nano_mentions_cuda_note():
    result = runner.invoke(app, ["boards", "show", "jetson-nano"])
    assert result.exit_code == 0, result.output
    assert "CUDA 10.2" in result.output and "cuLaunchKernelEx" in result.output
    assert "cuda-sm53" in result.output and "qemu-aarch64-static -cpu cortex-a57" in result.output


def test_cli_show_json_includes_targets():
    result = runner.invoke(app, ["boards", "show", "jetson-orin-nano", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["board"]["name"] == "jetson-orin-nano"
    assert data["targets"]["gpu"]["tvm"]["arch"] == "sm_87"
    assert data["targets"]["gpu"]["tvm_host"]["mcpu"] == "cortex-a78ae"


def test_cli_show_user_file(tmp_path):
    result = runner.invoke(app, ["boards", "show", str(write(tmp_path, GOOD_BOARD))])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("my-board: A Pi 4 with 2 GB")


def test_cli_unknown_board_prints_error_and_hint(capsys):
    from edgedyn.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["boards", "show", "jetson-nan"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "error: unknown board 'jetson-nan'; choose from: jetson-nano," in err
    assert "hint: did you mean 'jetson-nano'?" in err


# --- one schema: parsing and writing back agree ---

def _without_none(data):
    """A to_dict result as a TOML file could hold it (TOML has no null)."""
    if isinstance(data, dict):
        return {k: _without_none(v) for k, v in data.items() if v is not None}
    return data


@pytest.mark.parametrize("name", BOARDS)
def test_to_dict_parses_back_to_the_same_board(name):
    from edgedyn import _schema

    board = load_board(name)
    data = _without_none(board.to_dict())
    _schema.check_layout(data, Board, str(board.path))
    assert _schema.parse(Board, data, str(board.path), path=board.path) == board


@pytest.mark.parametrize("name", TARGETS)
def test_target_to_dict_parses_back_to_the_same_target(name):
    from edgedyn import _schema
    from edgedyn.boards import Target

    target = load_target(name)
    data = target.to_dict()
    _schema.check_layout(data, Target, str(target.path))
    again = _schema.parse(Target, data, str(target.path), path=target.path)
    assert again.to_dict() == data and again.name == target.name and again.mcpu == target.mcpu


def test_optional_fields_default_and_missing_ones_are_none_in_to_dict(tmp_path):
    board = load_board(str(write(tmp_path, GOOD_BOARD)))
    assert board.onnxruntime_providers == ("CPUExecutionProvider",) and board.cpu_features == ("neon", "crc")
    data = board.to_dict()
    assert data["gpu"] is None and data["os"]["cuda"] is None and data["targets"]["gpu_target"] is None
    assert "toolchain" in load_target("cortex-a72").to_dict() and "tvm_host" not in load_target("cortex-a72").to_dict()


def test_unknown_top_level_field_lists_fields_and_tables(tmp_path):
    path = write(tmp_path, "colour = 'red'\n" + GOOD_BOARD)
    with pytest.raises(BoardError) as caught:
        load_board(str(path))
    assert caught.value.message.startswith("{}: colour: expected one of name, description, arch, notes, [cpu], "
                                           "[memory], [gpu], [os]".format(path)), caught.value.message


def test_gpu_missing_field_names_file_and_field(tmp_path):
    path = write(tmp_path, GOOD_BOARD + '\n[gpu]\nname = "x"\narch = "sm_53"\ncuda_cores = 128\n')
    with pytest.raises(BoardError, match=re.escape("{}: gpu.compute_capability: expected a value".format(path))):
        load_board(str(path))


def test_each_target_file_is_read_once(monkeypatch):
    import edgedyn.boards as boards

    board = load_board("jetson-orin-nano")
    reads = []
    real = boards._read_toml
    monkeypatch.setattr(boards, "_read_toml", lambda path, what: reads.append(path) or real(path, what))
    assert board.target("gpu") is board.target("gpu") and board.target() is load_target("cortex-a78ae")
    assert board.targets()["gpu"].tvm["arch"] == "sm_87"
    assert reads == []  # load_board already read both targets
