"""A bundle's board, emulated: its Debian root filesystem, this edgedyn's wheel with the bundle's runtimes, qemu.

`prepare(bundle)` reads what the bundle needs (its board's [emulation] table, the board extra of each artifact's
backend), builds or reuses the cached root filesystem and the install of this edgedyn's wheel, and returns the
board to run `python3 -m edgedyn ...` on. Timings under qemu-user mean nothing: this checks correctness.
"""
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from edgedyn.boards import board_names, load_board
from edgedyn.emulate.rootfs import SUITES, BoardImage, EmulationError, check_tools, default_cache_dir, ensure_rootfs
from edgedyn.emulate.rootfs import cpu_words, emulated_words, run_on_board
from edgedyn.emulate.wheels import host_wheel, install_wheel
from edgedyn.registry import backend_of_executor
from edgedyn.runtime.format import read_manifest

Say = Callable[[str], None]


def to_stderr(message: str) -> None:
    sys.stderr.write("emulate: {}\n".format(message))
    sys.stderr.flush()


@dataclass(frozen=True)
class EmulatedBoard:
    """One board under qemu-user: a root filesystem with this edgedyn installed beside it."""

    name: str
    qemu_cpu: str
    image: BoardImage
    rootfs: Path
    site: Path  # the folder holding this edgedyn and the dependencies the board lacks

    def describe(self) -> Dict[str, Any]:
        """What `--json` reports under "emulation"."""
        return {"board": self.name, "qemu_cpu": self.qemu_cpu, "debian_suite": self.image.suite,
                "python": self.image.python, "extras": list(self.image.extras), "rootfs": str(self.rootfs)}

    def banner(self) -> str:
        """The line that says where the command ran."""
        return ("ran on an emulated {}: Debian {} arm64, Python {}, under qemu-aarch64-static -cpu {} "
                "(a check of correctness; timings under emulation mean nothing)").format(
                    self.name, self.image.suite, self.image.python, cpu_words(self.qemu_cpu))

    def run_edgedyn(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
                    timeout: float = 3600) -> "subprocess.CompletedProcess[str]":
        """Run the board's python3 with `argv` and this edgedyn on its path; the bundle cache is per run."""
        with tempfile.TemporaryDirectory(prefix="edgedyn-emulate-") as cache:
            # The libraries a run extracts go to a fresh cache, never into the shared rootfs.
            environment = {"EDGEDYN_CACHE": cache}
            environment.update(env or {})
            # Run from the install folder: `-m` puts the working directory first on sys.path, and from a source
            # checkout that would import its tree instead of the wheel.
            return run_on_board(self.rootfs, list(argv), cpu=self.qemu_cpu, env=environment, pythonpath=[self.site],
                                cwd=self.site.parent, timeout=timeout)


def emulation_of(manifest: Mapping[str, Any]) -> Tuple[str, str, str]:
    """(board name, qemu CPU, Debian suite) for the board a bundle was exported for."""
    board = manifest.get("board") or {}
    name = str(board.get("name"))
    table = board.get("emulation") or {}
    cpu, suite = table.get("qemu_cpu"), table.get("debian_suite")
    if (cpu is None or suite is None) and name in board_names():  # exported before the board file named a suite
        shipped = load_board(name)
        cpu, suite = cpu or shipped.qemu_cpu, suite or shipped.debian_suite
    if board.get("arch") != "aarch64" or cpu is None or suite is None:
        raise EmulationError(
            "board '{}' ({}) has no emulated form: its board file names no [emulation] qemu_cpu and "
            "debian_suite".format(name, board.get("arch")),
            hint="an x86_64 bundle runs here as is: drop --emulate" if board.get("arch") == "x86_64" else
            "add [emulation] qemu_cpu and debian_suite to the board file (see boards/raspberry-pi-4.toml) and "
            "export again")
    if suite not in SUITES:
        raise EmulationError("board '{}' names Debian suite '{}'; the emulator knows: {}".format(
            name, suite, ", ".join(sorted(SUITES))), hint="set [emulation] debian_suite to one of those and export again")
    return name, str(cpu), str(suite)


def board_extras(manifest: Mapping[str, Any]) -> Tuple[str, ...]:
    """The pip extras the board needs to run every artifact of the bundle (from each backend's registry record)."""
    extras = set()
    for spec in manifest["specializations"]:
        for artifact in spec["artifacts"]:
            backend = backend_of_executor(artifact["executor"])
            if backend is not None and backend.board_extra:
                extras.update(backend.board_extra.split(","))
    return tuple(sorted(extras))


def image_for(suite: str, extras: Sequence[str]) -> BoardImage:
    """A stock Debian board of `suite`: python3 and the C++ runtime; everything else comes with edgedyn's wheel."""
    return BoardImage(suite, extras=tuple(extras))


def prepare(bundle: Path, say: Say = to_stderr, cache_dir: Optional[Path] = None,
            extras: Optional[Sequence[str]] = None) -> EmulatedBoard:
    """The emulated board for `bundle`, built (rootfs, then this edgedyn's install) once and reused; with the
    runtimes of the bundle's backends, or `extras` (auto's candidates share one board: edgedyn/onboard.py)."""
    manifest = read_manifest(bundle)
    name, cpu, suite = emulation_of(manifest)
    return prepare_board(name, cpu, suite, board_extras(manifest) if extras is None else extras, say, cache_dir)


def prepare_board(name: str, cpu: str, suite: str, extras: Sequence[str], say: Say = to_stderr,
                  cache_dir: Optional[Path] = None) -> EmulatedBoard:
    """The emulated board `name` (Debian `suite` under qemu -cpu `cpu`) with this edgedyn and the runtimes of
    `extras` installed, built once and reused (prepare() for a bundle; benchmarks/arm.py's peers for a board)."""
    check_tools()
    image = image_for(suite, tuple(sorted(extras)))
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    rootfs = boards / "{}-{}".format(image.suite, image.key())
    if not rootfs.is_dir():
        say("building the Debian {} arm64 root filesystem once (minutes; cached in {})".format(suite, boards))
    rootfs = ensure_rootfs(image, boards)
    with tempfile.TemporaryDirectory(prefix="edgedyn-wheel-") as folder:
        wheel = host_wheel(Path(folder))
        say("installing {} with [{}] on the board (once per wheel; cached)".format(
            wheel.name, ",".join(image.extras)))
        site = install_wheel(rootfs, wheel, image, boards)
    return EmulatedBoard(name=name, qemu_cpu=cpu, image=image, rootfs=rootfs, site=site)


def run_command(board: EmulatedBoard, command: str, bundle: Path, options: List[str],
                say: Say = to_stderr) -> "subprocess.CompletedProcess[str]":
    """`python3 -m edgedyn COMMAND BUNDLE OPTIONS` on the board; a crash of the board's Python is an error."""
    say("running edgedyn {} on {}".format(command, emulated_words(board.name, board.qemu_cpu)))
    result = board.run_edgedyn(["-m", "edgedyn", command, str(Path(bundle).resolve()), *options])
    # 0 ok, 1 mismatch, 2 a user error the board's edgedyn explained: all reported by the board itself.
    if result.returncode not in (0, 1, 2):
        raise EmulationError("edgedyn {} on the emulated {} exited {}:\n{}".format(
            command, board.name, result.returncode, result.stderr[-3000:]),
            hint="a negative status is a signal (-11: the board's python3 crashed under qemu)")
    return result
