"""Boards and compile targets: boards/*.toml and targets/*.toml loaded into frozen dataclasses.

Used on the host and on the board (every bundle manifest carries a board snapshot), so this module keeps
Python 3.8 syntax and the standard library (plus `tomli` where `tomllib` is missing); TVM is imported only
inside `Target.tvm_target()`.
"""
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from edgedyn import _schema
from edgedyn._schema import boolean, choice, fail, integer, key, names, plain, text
from edgedyn.registry import backend_names, gpu_backends as gpu_backend_names
from edgedyn.errors import BoardError, MissingDependencyError
from edgedyn.runtime.executors.onnxruntime import (DEFAULT_SESSION, EXECUTION_MODES, GRAPH_OPTIMIZATIONS,
                                                  MAX_INTRA_OP_THREADS)
from edgedyn.runtime.format import host_arch

__all__ = [
    "ARCHES", "DEVICES", "TARGET_KINDS", "Board", "Gpu", "Target",
    "board_names", "boards_dir", "host_arch", "list_boards", "load_board", "load_target",
    "target_names", "targets_dir",
]

ARCHES = ("aarch64", "x86_64")
TARGET_KINDS = ("cpu", "cuda")
DEVICES = ("cpu", "gpu")

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


@dataclass(frozen=True)
class Target:
    """One compile target: a TVM target (dict form, as TVM 0.27 wants) and the toolchain to link it.

    `arch` is the CPU architecture the compiled code runs on; for a cuda target that is the host's.
    """

    name: str = key("", "name", text(_NAME, "a lower-case name like 'cortex-a72'"))
    description: str = key("", "description", text())
    kind: str = key("", "kind", choice(TARGET_KINDS))
    arch: str = key("", "arch", choice(ARCHES))
    tvm: Mapping[str, Any] = key("", "tvm", free_table=True)
    tvm_host: Optional[Mapping[str, Any]] = key("", "tvm_host", default=None, omit_none=True, free_table=True)
    cross_compiler: Optional[str] = key("toolchain", "cross_compiler", text(), default=None, omit_none=True)
    path: Path

    def __post_init__(self) -> None:
        where = str(self.path)
        _schema.check_fields(self, where)
        if self.kind == "cpu":
            self._check_llvm("tvm", self.tvm)
            if self.tvm_host is not None:
                fail(where, "tvm_host", "no [tvm_host] table for a cpu target", plain(self.tvm_host))
        else:
            if not isinstance(self.tvm, Mapping) or self.tvm.get("kind") != "cuda":
                fail(where, "tvm.kind", "'cuda' for a cuda target",
                     self.tvm.get("kind") if isinstance(self.tvm, Mapping) else self.tvm)
            text(_SM_ARCH, "a CUDA arch like 'sm_53'")(where, "tvm.arch", self.tvm.get("arch"))
            if self.tvm_host is None:
                fail(where, "tvm_host", "a [tvm_host] table (the LLVM target of the board's CPU)", None)
            self._check_llvm("tvm_host", self.tvm_host)

    def _check_llvm(self, name: str, table: Any) -> None:
        where = str(self.path)
        if not isinstance(table, Mapping):
            fail(where, name, "a table", table)
        if table.get("kind") != "llvm":
            fail(where, name + ".kind", "'llvm' for code that runs on the CPU", table.get("kind"))
        triple = table.get("mtriple")
        text(expected="an LLVM triple like 'aarch64-linux-gnu'")(where, name + ".mtriple", triple)
        if triple.split("-")[0] != self.arch:
            fail(where, name + ".mtriple", "a triple for arch '{}' like '{}-linux-gnu'".format(self.arch, self.arch),
                 triple)
        text(expected="an LLVM CPU name like 'cortex-a72'")(where, name + ".mcpu", table.get("mcpu"))
        mattr = table.get("mattr", ())
        if not isinstance(mattr, tuple) or not all(isinstance(a, str) and a[:1] in "+-" and a[1:] for a in mattr):
            fail(where, name + ".mattr", "a list of LLVM features like ['+neon', '-aes']", plain(mattr))

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
            return tvm.target.Target(plain(self.tvm))
        return tvm.target.Target(plain(self.tvm), host=tvm.target.Target(plain(self.tvm_host)))

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready, in the layout of the target's TOML file."""
        return _schema.to_dict(self)


@dataclass(frozen=True)
class Gpu:
    """A board's GPU as CUDA sees it (the board file's [gpu] table)."""

    name: str = key("", "name", text())
    arch: str = key("", "arch", text(_SM_ARCH, "a CUDA arch like 'sm_53'"))
    compute_capability: str = key("", "compute_capability", text(re.compile(r"^\d+\.\d$"), "a version like '5.3'"))
    cuda_cores: int = key("", "cuda_cores", integer(1))

    def __post_init__(self) -> None:
        # The loader puts the file name in front of these messages.
        _schema.check_fields(self, "gpu")
        if self.arch != "sm_" + self.compute_capability.replace(".", ""):
            fail("gpu", "arch", "'sm_{}' to match compute_capability {}".format(
                self.compute_capability.replace(".", ""), self.compute_capability), self.arch)


@dataclass(frozen=True)
class OnnxruntimeSession:
    """How onnxruntime opens the board's session (the board file's [onnxruntime] table), recorded in the artifact;
    the choices and defaults are the runtime's, which checks and applies them on the board (defaults measured on
    x86: benchmarks/README.md, onnxruntime session settings)."""

    graph_optimization: str = key("", "graph_optimization", choice(tuple(GRAPH_OPTIMIZATIONS)),
                                  default=DEFAULT_SESSION["graph_optimization"])
    # 0: the runtime's thread setting, else one per physical core (runtime/executors/onnxruntime.py)
    intra_op_threads: int = key("", "intra_op_threads", integer(0, MAX_INTRA_OP_THREADS),
                                default=DEFAULT_SESSION["intra_op_threads"])
    allow_spinning: bool = key("", "allow_spinning", boolean(), default=DEFAULT_SESSION["allow_spinning"])
    execution_mode: str = key("", "execution_mode", choice(tuple(EXECUTION_MODES)),
                              default=DEFAULT_SESSION["execution_mode"])

    def __post_init__(self) -> None:
        _schema.check_fields(self, "onnxruntime")


@dataclass(frozen=True)
class Board:
    """What edgedyn needs to know about one board: CPU, memory, GPU, OS, targets, backends.

    Each field says where it lives in the board's TOML file; missing optional values are None in `to_dict`.
    """

    name: str = key("", "name", text(_NAME, "a lower-case name like 'raspberry-pi-4'"))
    description: str = key("", "description", text())
    arch: str = key("", "arch", choice(ARCHES))
    notes: Tuple[str, ...] = key("", "notes", names(), default=())
    cpu_model: str = key("cpu", "model", text())
    cpu_cores: int = key("cpu", "cores", integer(1, 1024))
    cpu_features: Tuple[str, ...] = key("cpu", "features", names(), default=())
    ram_mb: int = key("memory", "ram_mb", integer(16))
    ram_budget_mb: int = key("memory", "budget_mb")  # checked against ram_mb in __post_init__
    gpu: Optional[Gpu] = key("", "gpu", default=None, record=Gpu)
    os: str = key("os", "name", text())
    python: str = key("os", "python", text(_VERSION, "a version like '3.8'"))
    cuda: Optional[str] = key("os", "cuda", text(_VERSION, "a version like '10.2'"), default=None)
    jetpack: Optional[str] = key("os", "jetpack", text(_VERSION, "a version like '4.6'"), default=None)
    glibc: str = key("os", "glibc", text(_VERSION, "a version like '2.31'"))
    cpu_target: str = key("targets", "cpu_target", text(expected="the name of a target, e.g. 'cortex-a72'"))
    gpu_target: Optional[str] = key("targets", "gpu_target",
                                    text(expected="the name of a cuda target, e.g. 'cuda-sm53'"), default=None)
    # A qemu -cpu model, or a core qemu lacks that edgedyn runs on the model with its ISA (emulate/rootfs.py SAME_ISA).
    qemu_cpu: Optional[str] = key("emulation", "qemu_cpu", text(expected="a CPU from `qemu-aarch64-static -cpu help`"),
                                  default=None)
    # The Debian release whose arm64 packages make the emulated board's root filesystem (edgedyn/emulate):
    # the one the board's own OS is built on, or the closest with the board's Python or newer.
    debian_suite: Optional[str] = key("emulation", "debian_suite", text(_NAME, "a Debian suite like 'bookworm'"),
                                      default=None)
    # The CPU artifact's backends, best first (`auto` for another board takes the first that builds).
    backends: Tuple[str, ...] = key("backends", "preference", names(backend_names, allow_empty=False))
    # The GPU artifact's backends, best first: a separate choice, since the best GPU code generator (TVM) is the
    # worst CPU one untuned. Default: every registered backend that builds CUDA code.
    gpu_backends: Tuple[str, ...] = key("backends", "gpu_preference", names(gpu_backend_names), default=())
    # onnxruntime execution providers to try on the board, best first (TensorRT and CUDA on a Jetson).
    onnxruntime_providers: Tuple[str, ...] = key("backends", "onnxruntime_providers", names(allow_empty=False),
                                                 default=("CPUExecutionProvider",))
    onnxruntime_session: OnnxruntimeSession = key("", "onnxruntime", record=OnnxruntimeSession,
                                                  default=_schema.parse(OnnxruntimeSession, {}, "onnxruntime"))
    # OpenVINO CPU plugin properties for this board ([openvino] table: PERFORMANCE_HINT, NUM_STREAMS, ...), recorded in
    # each openvino artifact; the runtime's PROPERTY_CHOICES says which and what values.
    openvino_properties: Optional[Mapping[str, Any]] = key("", "openvino", default=None, omit_none=True,
                                                           free_table=True)
    # ncnn options for this board ([ncnn] table: lightmode, use_winograd_convolution, ...), recorded in each ncnn
    # artifact; the runtime's OPTION_CHOICES says which and what values.
    ncnn_options: Optional[Mapping[str, Any]] = key("", "ncnn", default=None, omit_none=True, free_table=True)
    path: Path

    def __post_init__(self) -> None:
        where = str(self.path)
        _schema.check_fields(self, where)
        ram = self.ram_mb if type(self.ram_mb) is int else 0
        integer(1, ram, "an integer from 1 to ram_mb ({}), leaving room for the OS".format(ram))(
            where, "memory.budget_mb", self.ram_budget_mb)
        if self.gpu_target is not None and (self.gpu is None or self.cuda is None):
            fail(where, "targets.gpu_target", "no gpu_target on a board without [gpu] and os.cuda", self.gpu_target)
        if self.openvino_properties is not None:
            _check_openvino(where, self.openvino_properties)
        if self.ncnn_options is not None:
            _check_ncnn(where, self.ncnn_options)
        if (self.qemu_cpu is None) != (self.debian_suite is None):
            fail(where, "emulation", "both qemu_cpu and debian_suite, or no [emulation] table",
                 "qemu_cpu={!r}, debian_suite={!r}".format(self.qemu_cpu, self.debian_suite))

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
        """JSON-ready, in the layout of the board's TOML file; written into every bundle manifest."""
        return _schema.to_dict(self)


def _check_openvino(where: str, table: Any) -> None:
    """The [openvino] table holds only properties the runtime accepts (runtime/executors/openvino.py)."""
    from edgedyn.runtime.errors import BundleError
    from edgedyn.runtime.executors.openvino import PROPERTY_CHOICES, properties

    try:
        properties({"openvino": {"properties": plain(table)}})
    except BundleError:
        fail(where, "openvino", "CPU plugin properties drawn from {}".format(", ".join(sorted(PROPERTY_CHOICES))),
             plain(table))


def _check_ncnn(where: str, table: Any) -> None:
    """The [ncnn] table holds only options the runtime accepts (runtime/executors/ncnn.py)."""
    from edgedyn.runtime.errors import BundleError
    from edgedyn.runtime.executors.ncnn import OPTION_CHOICES, options

    try:
        options({"ncnn": {"options": plain(table)}})
    except BundleError:
        fail(where, "ncnn", "options drawn from {}".format(", ".join(sorted(OPTION_CHOICES))), plain(table))


# --- reading files ---

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


def _load_record(cls: type, path: Path, what: str) -> Any:
    data = _read_toml(path, what)
    _schema.check_layout(data, cls, str(path))
    return _schema.parse(cls, data, str(path), path=path)


def _check_board_targets(board: Board) -> None:
    """A board's targets exist and fit it: same CPU arch, cuda target for the GPU's arch."""
    where = str(board.path)
    cpu = _board_target(board, "targets.cpu_target", board.cpu_target)
    if cpu.kind != "cpu" or cpu.arch != board.arch:
        fail(where, "targets.cpu_target", "a cpu target for {}".format(board.arch),
             "{} ({} target for {})".format(board.cpu_target, cpu.kind, cpu.arch))
    if board.gpu_target is None or board.gpu is None:
        return
    gpu = _board_target(board, "targets.gpu_target", board.gpu_target)
    if gpu.kind != "cuda" or gpu.arch != board.arch or gpu.tvm.get("arch") != board.gpu.arch:
        fail(where, "targets.gpu_target", "a cuda target for {} with a {} host".format(board.gpu.arch, board.arch),
             "{} ({} target, {} host, {})".format(board.gpu_target, gpu.kind, gpu.arch, gpu.tvm.get("arch")))


def _board_target(board: Board, name: str, target: str) -> Target:
    try:
        return load_target(target, relative_to=board.path.parent)
    except BoardError as error:
        if error.message.startswith("unknown target"):
            raise BoardError("{}: {}: {}".format(board.path, name, error.message), error.hint) from None
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
    board = _load_record(Board, path, "board")  # type: Board
    _check_board_targets(board)
    return board


def list_boards() -> List[Board]:
    """Every shipped board, sorted by name."""
    return [load_board(name) for name in board_names()]


# Targets are immutable and every board call reaches them (`Board.target()`, each export, each fit check):
# each file is read once per process, keyed by its resolved path (a failed read is not kept, so a fixed
# file loads on the next call).
_TARGETS = {}  # type: Dict[Path, Target]


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
    resolved = path.resolve()
    if resolved not in _TARGETS:
        _TARGETS[resolved] = _load_record(Target, path, "target")
    return _TARGETS[resolved]
