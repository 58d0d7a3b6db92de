"""Boards and compile targets: boards/*.toml and targets/*.toml loaded into frozen dataclasses.

Used on the host and on the board (every bundle manifest carries a board snapshot), so this module keeps
Python 3.8 syntax and the standard library (plus `tomli` where `tomllib` is missing); TVM is imported only
inside `Target.tvm_target()`.
"""
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Tuple

from edgedyn.errors import BoardError, MissingDependencyError
from edgedyn.runtime.format import host_arch

__all__ = [
    "ARCHES", "BACKEND_NAMES", "DEVICES", "TARGET_KINDS", "Board", "Gpu", "Target",
    "board_names", "boards_dir", "host_arch", "list_boards", "load_board", "load_target",
    "target_names", "targets_dir",
]

ARCHES = ("aarch64", "x86_64")
TARGET_KINDS = ("cpu", "cuda")
DEVICES = ("cpu", "gpu")
# Note: these must be the names in edgedyn.backends.BACKENDS (tests/test_boards.py checks it). They are
# repeated here because this module also runs on the board, where the compiler backends are not installed.
BACKEND_NAMES = ("onnxruntime", "portable", "tflite", "tvm")

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_VERSION = re.compile(r"^\d+(\.\d+)+$")
_SM_ARCH = re.compile(r"^sm_\d{2,3}[a-z]?$")


def _data_dir(kind: str) -> Path:
    """The folder of shipped `kind` files: inside the wheel, or at the top of a source checkout."""
    installed = Path(__file__).parent / "_data" / kind
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[1] / kind


def boards_dir() -> Path:
    """The folder holding the shipped board descriptions."""
    return _data_dir("boards")


def targets_dir() -> Path:
    """The folder holding the shipped target descriptions."""
    return _data_dir("targets")


# --- validation helpers: every failure names the file, the field, what was given and what is expected ---

def _fail(where: str, key: str, expected: str, got: Any, hint: Optional[str] = None) -> None:
    raise BoardError("{}: {}: expected {}, got {!r}".format(where, key, expected, got), hint)


def _check_str(where: str, key: str, value: Any, optional: bool = False,
               pattern: Optional["re.Pattern[str]"] = None, expected: str = "a non-empty string") -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
        _fail(where, key, expected, value)


def _check_int(where: str, key: str, value: Any, low: int, high: Optional[int] = None,
               expected: Optional[str] = None) -> None:
    ok = type(value) is int and value >= low and (high is None or value <= high)
    if not ok:
        if expected is None:
            expected = "an integer >= {}".format(low) if high is None else "an integer from {} to {}".format(low, high)
        _fail(where, key, expected, value)


def _check_choice(where: str, key: str, value: Any, choices: Tuple[str, ...]) -> None:
    if value not in choices:
        _fail(where, key, "one of " + ", ".join(choices), value)


def _check_names(where: str, key: str, value: Any, choices: Optional[Tuple[str, ...]] = None,
                 allow_empty: bool = True) -> None:
    expected = "a list of strings" if choices is None else "a list drawn from " + ", ".join(choices)
    if not isinstance(value, tuple) or (not value and not allow_empty):
        _fail(where, key, ("a non-empty " + expected[2:]) if not allow_empty else expected, value)
    for item in value:
        if not isinstance(item, str) or not item or (choices is not None and item not in choices):
            _fail(where, key, expected, list(value))
    if len(set(value)) != len(value):
        _fail(where, key, "each entry once", list(value))


def _frozen(value: Any) -> Any:
    """A read-only copy of TOML data: dicts become mappings, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """The JSON-ready (and TVM-ready) form of `_frozen` data."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Target:
    """One compile target: a TVM target (dict form, as TVM 0.27 wants) and the toolchain to link it.

    `arch` is the CPU architecture the compiled code runs on; for a cuda target that is the host's.
    """

    name: str
    kind: str
    arch: str
    tvm: Mapping[str, Any] = field(hash=False)
    tvm_host: Optional[Mapping[str, Any]] = field(hash=False)
    cross_compiler: Optional[str]
    description: str
    path: Path

    def __post_init__(self) -> None:
        where = str(self.path)
        _check_str(where, "name", self.name, pattern=_NAME, expected="a lower-case name like 'cortex-a72'")
        _check_choice(where, "kind", self.kind, TARGET_KINDS)
        _check_choice(where, "arch", self.arch, ARCHES)
        _check_str(where, "description", self.description)
        _check_str(where, "toolchain.cross_compiler", self.cross_compiler, optional=True)
        object.__setattr__(self, "tvm", _frozen(self.tvm))
        object.__setattr__(self, "tvm_host", None if self.tvm_host is None else _frozen(self.tvm_host))
        if self.kind == "cpu":
            self._check_llvm("tvm", self.tvm)
            if self.tvm_host is not None:
                _fail(where, "tvm_host", "no [tvm_host] table for a cpu target", _plain(self.tvm_host))
        else:
            if not isinstance(self.tvm, Mapping) or self.tvm.get("kind") != "cuda":
                _fail(where, "tvm.kind", "'cuda' for a cuda target",
                      self.tvm.get("kind") if isinstance(self.tvm, Mapping) else self.tvm)
            _check_str(where, "tvm.arch", self.tvm.get("arch"), pattern=_SM_ARCH,
                       expected="a CUDA arch like 'sm_53'")
            if self.tvm_host is None:
                _fail(where, "tvm_host", "a [tvm_host] table (the LLVM target of the board's CPU)", None)
            self._check_llvm("tvm_host", self.tvm_host)

    def _check_llvm(self, key: str, table: Any) -> None:
        where = str(self.path)
        if not isinstance(table, Mapping):
            _fail(where, key, "a table", table)
        if table.get("kind") != "llvm":
            _fail(where, key + ".kind", "'llvm' for code that runs on the CPU", table.get("kind"))
        triple = table.get("mtriple")
        _check_str(where, key + ".mtriple", triple, expected="an LLVM triple like 'aarch64-linux-gnu'")
        if triple.split("-")[0] != self.arch:
            _fail(where, key + ".mtriple", "a triple for arch '{}' like '{}-linux-gnu'".format(self.arch, self.arch),
                  triple)
        _check_str(where, key + ".mcpu", table.get("mcpu"), expected="an LLVM CPU name like 'cortex-a72'")
        mattr = table.get("mattr", ())
        if not isinstance(mattr, tuple) or not all(isinstance(a, str) and a[:1] in "+-" and a[1:] for a in mattr):
            _fail(where, key + ".mattr", "a list of LLVM features like ['+neon', '-aes']", _plain(mattr))

    @property
    def mcpu(self) -> str:
        """The LLVM CPU name the code runs on (the host's for a cuda target)."""
        return str((self.tvm if self.tvm_host is None else self.tvm_host)["mcpu"])

    def tvm_target(self) -> Any:
        """The `tvm.target.Target` for this target, with its host for cuda."""
        try:
            import tvm
        except ImportError as error:
            raise MissingDependencyError(
                "target '{}' needs TVM, which is not installed ({})".format(self.name, error),
                "pip install 'edgedyn[tvm]'",
            ) from None
        if self.tvm_host is None:
            return tvm.target.Target(_plain(self.tvm))
        return tvm.target.Target(_plain(self.tvm), host=tvm.target.Target(_plain(self.tvm_host)))

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready, in the layout of the target's TOML file."""
        data = {"name": self.name, "description": self.description, "kind": self.kind, "arch": self.arch,
                "tvm": _plain(self.tvm)}  # type: Dict[str, Any]
        if self.tvm_host is not None:
            data["tvm_host"] = _plain(self.tvm_host)
        if self.cross_compiler is not None:
            data["toolchain"] = {"cross_compiler": self.cross_compiler}
        return data


@dataclass(frozen=True)
class Gpu:
    """A board's GPU as CUDA sees it."""

    name: str
    arch: str
    compute_capability: str
    cuda_cores: int

    def __post_init__(self) -> None:
        # The loader puts the file name in front of these messages.
        _check_str("gpu", "name", self.name)
        _check_str("gpu", "arch", self.arch, pattern=_SM_ARCH, expected="a CUDA arch like 'sm_53'")
        _check_str("gpu", "compute_capability", self.compute_capability, pattern=re.compile(r"^\d+\.\d$"),
                   expected="a version like '5.3'")
        if self.arch != "sm_" + self.compute_capability.replace(".", ""):
            _fail("gpu", "arch", "'sm_{}' to match compute_capability {}".format(
                self.compute_capability.replace(".", ""), self.compute_capability), self.arch)
        _check_int("gpu", "cuda_cores", self.cuda_cores, 1)


@dataclass(frozen=True)
class Board:
    """What edgedyn needs to know about one board: CPU, memory, GPU, OS, targets, backends."""

    name: str
    description: str
    arch: str
    cpu_model: str
    cpu_cores: int
    cpu_features: Tuple[str, ...]
    ram_mb: int
    ram_budget_mb: int
    gpu: Optional[Gpu]
    os: str
    python: str
    cuda: Optional[str]
    jetpack: Optional[str]
    glibc: str
    cpu_target: str
    gpu_target: Optional[str]
    qemu_cpu: Optional[str]
    backends: Tuple[str, ...]
    notes: Tuple[str, ...]
    path: Path
    # onnxruntime execution providers to try on the board, best first (TensorRT and CUDA on a Jetson).
    onnxruntime_providers: Tuple[str, ...] = ("CPUExecutionProvider",)

    def __post_init__(self) -> None:
        where = str(self.path)
        _check_str(where, "name", self.name, pattern=_NAME, expected="a lower-case name like 'raspberry-pi-4'")
        _check_str(where, "description", self.description)
        _check_choice(where, "arch", self.arch, ARCHES)
        _check_str(where, "cpu.model", self.cpu_model)
        _check_int(where, "cpu.cores", self.cpu_cores, 1, 1024)
        _check_names(where, "cpu.features", self.cpu_features)
        _check_int(where, "memory.ram_mb", self.ram_mb, 16)
        ram = self.ram_mb if type(self.ram_mb) is int else 0
        _check_int(where, "memory.budget_mb", self.ram_budget_mb, 1, ram,
                   expected="an integer from 1 to ram_mb ({}), leaving room for the OS".format(ram))
        if self.gpu is not None and not isinstance(self.gpu, Gpu):
            _fail(where, "gpu", "a [gpu] table", self.gpu)
        _check_str(where, "os.name", self.os)
        _check_str(where, "os.python", self.python, pattern=_VERSION, expected="a version like '3.8'")
        _check_str(where, "os.cuda", self.cuda, optional=True, pattern=_VERSION, expected="a version like '10.2'")
        _check_str(where, "os.jetpack", self.jetpack, optional=True, pattern=_VERSION,
                   expected="a version like '4.6'")
        _check_str(where, "os.glibc", self.glibc, pattern=_VERSION, expected="a version like '2.31'")
        _check_str(where, "targets.cpu_target", self.cpu_target, expected="the name of a target, e.g. 'cortex-a72'")
        _check_str(where, "targets.gpu_target", self.gpu_target, optional=True,
                   expected="the name of a cuda target, e.g. 'cuda-sm53'")
        if self.gpu_target is not None and (self.gpu is None or self.cuda is None):
            _fail(where, "targets.gpu_target", "no gpu_target on a board without [gpu] and os.cuda",
                  self.gpu_target)
        _check_str(where, "emulation.qemu_cpu", self.qemu_cpu, optional=True,
                   expected="a CPU from `qemu-aarch64-static -cpu help`")
        _check_names(where, "backends.preference", self.backends, BACKEND_NAMES, allow_empty=False)
        _check_names(where, "notes", self.notes)
        _check_names(where, "backends.onnxruntime_providers", self.onnxruntime_providers, allow_empty=False)

    def target(self, device: str = "cpu") -> Target:
        """The target that compiles for this board's `device` ("cpu" or "gpu")."""
        if device not in DEVICES:
            raise BoardError("unknown device '{}'; choose from: {}".format(device, ", ".join(DEVICES)))
        if device == "gpu":
            if self.gpu_target is None:
                raise BoardError("board '{}' has no GPU target".format(self.name),
                                 "use device 'cpu', or pick a board with a GPU: {}".format(
                                     ", ".join(b.name for b in list_boards() if b.gpu_target)))
            return load_target(self.gpu_target, relative_to=self.path.parent)
        return load_target(self.cpu_target, relative_to=self.path.parent)

    def targets(self) -> Dict[str, Target]:
        """The board's targets by device."""
        found = {"cpu": self.target("cpu")}
        if self.gpu_target is not None:
            found["gpu"] = self.target("gpu")
        return found

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready, in the layout of the board's TOML file (missing optional values as None);
        written into every bundle manifest."""
        return {
            "name": self.name,
            "description": self.description,
            "arch": self.arch,
            "notes": list(self.notes),
            "cpu": {"model": self.cpu_model, "cores": self.cpu_cores, "features": list(self.cpu_features)},
            "memory": {"ram_mb": self.ram_mb, "budget_mb": self.ram_budget_mb},
            "gpu": None if self.gpu is None else {
                "name": self.gpu.name, "arch": self.gpu.arch,
                "compute_capability": self.gpu.compute_capability, "cuda_cores": self.gpu.cuda_cores,
            },
            "os": {"name": self.os, "python": self.python, "cuda": self.cuda, "jetpack": self.jetpack,
                   "glibc": self.glibc},
            "targets": {"cpu_target": self.cpu_target, "gpu_target": self.gpu_target},
            "emulation": {"qemu_cpu": self.qemu_cpu},
            "backends": {"preference": list(self.backends),
                         "onnxruntime_providers": list(self.onnxruntime_providers)},
        }


# --- reading files ---

# The fields a board file may have, by section ("" is the top level).
_BOARD_FIELDS = {
    "": ("name", "description", "arch", "notes"),
    "cpu": ("model", "cores", "features"),
    "memory": ("ram_mb", "budget_mb"),
    "gpu": ("name", "arch", "compute_capability", "cuda_cores"),
    "os": ("name", "python", "cuda", "jetpack", "glibc"),
    "targets": ("cpu_target", "gpu_target"),
    "emulation": ("qemu_cpu",),
    "backends": ("preference", "onnxruntime_providers"),
}
_TARGET_FIELDS = {
    "": ("name", "description", "kind", "arch"),
    "toolchain": ("cross_compiler",),
}
_TARGET_TABLES = ("tvm", "tvm_host")  # free-form: passed to TVM as they are


def _read_toml(path: Path, what: str) -> Dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]  # novm
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise MissingDependencyError("reading {} files needs tomli on Python < 3.11".format(what),
                                         "pip install tomli") from None
    try:
        with open(str(path), "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise BoardError("{} file '{}' not found".format(what, path),
                         "give the path to an existing .toml file, or a name from {}".format(
                             _data_dir(what + "s"))) from None
    except OSError as error:
        raise BoardError("cannot read {} file '{}': {}".format(what, path, error.strerror or error)) from None
    except tomllib.TOMLDecodeError as error:
        raise BoardError("{}: not valid TOML: {}".format(path, error),
                         "compare with the files in {}".format(_data_dir(what + "s"))) from None


def _check_layout(data: Dict[str, Any], path: Path, fields: Mapping[str, Tuple[str, ...]],
                  free_tables: Tuple[str, ...] = ()) -> None:
    """Rejects unknown sections and keys, so a misspelt optional field is not silently ignored."""
    where = str(path)
    for key, value in data.items():
        if key in free_tables:
            continue
        if key in fields and key != "":
            if not isinstance(value, dict):
                _fail(where, key, "a [{}] table".format(key), value)
            for sub in value:
                if sub not in fields[key]:
                    _fail(where, "{}.{}".format(key, sub), "one of the fields " + ", ".join(fields[key]),
                          "unknown field")
        elif key not in fields[""]:
            known = list(fields[""]) + ["[{}]".format(s) for s in fields if s] + ["[{}]".format(s) for s in free_tables]
            _fail(where, key, "one of " + ", ".join(known), "unknown field")


def _field(data: Dict[str, Any], section: str, key: str) -> Any:
    table = data.get(section, {}) if section else data
    value = table.get(key) if isinstance(table, dict) else None
    return tuple(value) if isinstance(value, list) else value


def _require(data: Dict[str, Any], path: Path, section: str, key: str) -> Any:
    value = _field(data, section, key)
    if value is None:
        dotted = "{}.{}".format(section, key) if section else key
        _fail(str(path), dotted, "a value (the field is required)", None,
              hint="add {} to the [{}] table; `edgedyn boards show x86-64` and boards/*.toml show every "
                   "field".format(key, section) if section else "add {} at the top of the file".format(key))
    return value


def _parse_target(data: Dict[str, Any], path: Path) -> Target:
    _check_layout(data, path, _TARGET_FIELDS, _TARGET_TABLES)
    return Target(
        name=_require(data, path, "", "name"),
        kind=_require(data, path, "", "kind"),
        arch=_require(data, path, "", "arch"),
        tvm=_require(data, path, "", "tvm"),
        tvm_host=data.get("tvm_host"),
        cross_compiler=_field(data, "toolchain", "cross_compiler"),
        description=_require(data, path, "", "description"),
        path=path,
    )


def _parse_gpu(data: Dict[str, Any], path: Path) -> Optional[Gpu]:
    if "gpu" not in data:
        return None
    try:
        return Gpu(name=_require(data, path, "gpu", "name"), arch=_require(data, path, "gpu", "arch"),
                   compute_capability=_require(data, path, "gpu", "compute_capability"),
                   cuda_cores=_require(data, path, "gpu", "cuda_cores"))
    except BoardError as error:
        if error.message.startswith("gpu:"):
            raise BoardError("{}: {}".format(path, error.message.replace("gpu: ", "gpu.", 1)), error.hint) from None
        raise


def _parse_board(data: Dict[str, Any], path: Path) -> Board:
    _check_layout(data, path, _BOARD_FIELDS)
    return Board(
        name=_require(data, path, "", "name"),
        description=_require(data, path, "", "description"),
        arch=_require(data, path, "", "arch"),
        cpu_model=_require(data, path, "cpu", "model"),
        cpu_cores=_require(data, path, "cpu", "cores"),
        cpu_features=_field(data, "cpu", "features") or (),
        ram_mb=_require(data, path, "memory", "ram_mb"),
        ram_budget_mb=_require(data, path, "memory", "budget_mb"),
        gpu=_parse_gpu(data, path),
        os=_require(data, path, "os", "name"),
        python=_require(data, path, "os", "python"),
        cuda=_field(data, "os", "cuda"),
        jetpack=_field(data, "os", "jetpack"),
        glibc=_require(data, path, "os", "glibc"),
        cpu_target=_require(data, path, "targets", "cpu_target"),
        gpu_target=_field(data, "targets", "gpu_target"),
        qemu_cpu=_field(data, "emulation", "qemu_cpu"),
        backends=_require(data, path, "backends", "preference"),
        notes=_field(data, "", "notes") or (),
        path=path,
        onnxruntime_providers=_field(data, "backends", "onnxruntime_providers") or ("CPUExecutionProvider",),
    )


def _check_board_targets(board: Board) -> None:
    """A board's targets exist and fit it: same CPU arch, cuda target for the GPU's arch."""
    where = str(board.path)
    cpu = _board_target(board, "targets.cpu_target", board.cpu_target)
    if cpu.kind != "cpu" or cpu.arch != board.arch:
        _fail(where, "targets.cpu_target", "a cpu target for {}".format(board.arch),
              "{} ({} target for {})".format(board.cpu_target, cpu.kind, cpu.arch))
    if board.gpu_target is None or board.gpu is None:
        return
    gpu = _board_target(board, "targets.gpu_target", board.gpu_target)
    if gpu.kind != "cuda" or gpu.arch != board.arch or gpu.tvm.get("arch") != board.gpu.arch:
        _fail(where, "targets.gpu_target", "a cuda target for {} with a {} host".format(board.gpu.arch, board.arch),
              "{} ({} target, {} host, {})".format(board.gpu_target, gpu.kind, gpu.arch, gpu.tvm.get("arch")))


def _board_target(board: Board, key: str, name: str) -> Target:
    try:
        return load_target(name, relative_to=board.path.parent)
    except BoardError as error:
        if error.message.startswith("unknown target"):
            raise BoardError("{}: {}: {}".format(board.path, key, error.message), error.hint) from None
        raise


def _is_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path


def _unknown(what: str, name: str, choices: List[str], hint: str) -> BoardError:
    close = difflib.get_close_matches(name, choices, n=1)
    if close:
        hint = "did you mean '{}'? {}".format(close[0], hint)
    return BoardError("unknown {} '{}'; choose from: {}".format(what, name, ", ".join(choices)), hint)


def board_names() -> List[str]:
    """Names of the shipped boards, sorted."""
    return sorted(p.stem for p in boards_dir().glob("*.toml"))


def target_names() -> List[str]:
    """Names of the shipped targets, sorted."""
    return sorted(p.stem for p in targets_dir().glob("*.toml"))


def load_board(name_or_path: str) -> Board:
    """A shipped board by name (`jetson-nano`), or the user's own board file by path (`./my-board.toml`)."""
    if _is_path(name_or_path):
        path = Path(name_or_path).expanduser()
    else:
        path = boards_dir() / (name_or_path + ".toml")
        if not path.is_file():
            raise _unknown("board", name_or_path, board_names(),
                           "To describe another board, copy a file from {} and pass the path to your copy".format(
                               boards_dir()))
    board = _parse_board(_read_toml(path, "board"), path)
    _check_board_targets(board)
    return board


def list_boards() -> List[Board]:
    """Every shipped board, sorted by name."""
    return [load_board(name) for name in board_names()]


def load_target(name: str, relative_to: Optional[Path] = None) -> Target:
    """A shipped target by name (`cortex-a72`), or a target file by path (relative to `relative_to`)."""
    if _is_path(name):
        path = Path(name).expanduser()
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
    else:
        path = targets_dir() / (name + ".toml")
        if not path.is_file():
            raise _unknown("target", name, target_names(),
                           "To describe another target, copy a file from {} and give the path to your copy".format(
                               targets_dir()))
    return _parse_target(_read_toml(path, "target"), path)
