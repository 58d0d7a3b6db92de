"""The emulated board's root filesystem: a cached arm64 Debian tree run under qemu-user.

Nothing here needs privileges: mmdebstrap writes a tarball that we unpack as the current user, and qemu-user
runs the board's own /usr/bin/python3 with `-L ROOT`, so the board sees its own libraries while every other host
path (bundles, the user's files) is visible as it is. Host side only: the board never imports this.
"""
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from edgedyn.errors import EdgedynError
from edgedyn.runtime.format import cache_dir

# Note: the host tools the emulated board needs, and the Debian packages that provide them (scripts/install.sh
# installs them for a checkout). Non-root mmdebstrap runs in a user namespace, which needs newuidmap from uidmap.
HOST_TOOLS = ("qemu-aarch64-static", "mmdebstrap")
HOST_PACKAGES = ("qemu-user-static", "mmdebstrap", "debian-archive-keyring", "uidmap")
INSTALL_HINT = "sudo apt-get install {} (in a source checkout: bash scripts/install.sh)".format(" ".join(HOST_PACKAGES))
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the build recipe changes, so existing caches are rebuilt instead of silently reused.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class Suite:
    """What a Debian release offers a board: its Python and its glibc."""

    python: str  # "3.11"
    glibc_minor: int  # glibc 2.<minor>: the newest manylinux tag its loader accepts


SUITES: Dict[str, Suite] = {
    "bookworm": Suite(python="3.11", glibc_minor=36),
    "bullseye": Suite(python="3.9", glibc_minor=31),
}


@dataclass(frozen=True)
class BoardImage:
    """What goes into one cached arm64 root filesystem."""

    suite: str = "bookworm"
    debs: Tuple[str, ...] = ("python3", "libstdc++6", "libgomp1")
    wheels: Tuple[str, ...] = ()
    # The edgedyn extras a user of this board installs with the wheel (`pip install 'edgedyn[tvm]'`). Not in
    # the rootfs key: they change what is installed beside the rootfs, never the rootfs itself.
    extras: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ValueError(f"unknown suite {self.suite!r}; choose from: {', '.join(sorted(SUITES))}")
        # Lists would make the image unhashable and the key order-dependent on the caller's type.
        object.__setattr__(self, "debs", tuple(self.debs))
        object.__setattr__(self, "wheels", tuple(self.wheels))
        object.__setattr__(self, "extras", tuple(self.extras))
        if "python3" not in self.debs:
            raise ValueError(f"BoardImage.debs must include 'python3' (the board runs it); got {self.debs}")

    @property
    def python(self) -> str:
        """The board's Python version, e.g. "3.11"."""
        return SUITES[self.suite].python

    def key(self) -> str:
        """A stable hash of everything that goes into the root filesystem."""
        recipe = {"recipe": RECIPE_VERSION, "suite": self.suite, "debs": sorted(self.debs), "wheels": list(self.wheels)}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]

    def site_dir(self, rootfs: Path) -> Path:
        """Where the wheels go: the folder `pip install` uses on a Debian board, on the board's sys.path."""
        return rootfs / "usr" / "local" / "lib" / f"python{self.python}" / "dist-packages"


# onnxruntime segfaults on import under qemu-user without an aarch64 /proc/cpuinfo; qemu's -L finds this
# file at ROOT/proc/cpuinfo first. It describes a Pi 4 whatever -cpu says.
_CPUINFO_CORE = """processor\t: {index}
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3

"""


FAKE_CPUINFO = "".join(_CPUINFO_CORE.format(index=i) for i in range(4)) + (
    "Hardware\t: BCM2835\nRevision\t: c03111\nModel\t\t: Raspberry Pi 4 Model B Rev 1.1\n"
)


class EmulationError(EdgedynError):
    """The emulated board cannot be made or run on this host (a missing tool, an unknown suite)."""


class BoardBuildError(EmulationError):
    """A step of building the emulated board's root filesystem failed."""

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message, hint or "the board is made from the Debian mirror and the Python package index: "
                         "check that both are reachable (EDGEDYN_DEBIAN_MIRROR names another mirror)")


def missing_tools() -> List[str]:
    """Which of the host tools the emulated board needs are not on PATH."""
    return [tool for tool in HOST_TOOLS if shutil.which(tool) is None]


def check_tools() -> None:
    """Fail with the install command when a host tool the emulated board needs is missing."""
    missing = missing_tools()
    if missing:
        raise EmulationError("the emulated board needs {}, not found on PATH".format(", ".join(missing)),
                             hint=INSTALL_HINT)


def default_cache_dir() -> Path:
    """The folder holding the cached root filesystems: edgedyn's cache (EDGEDYN_CACHE, XDG_CACHE_HOME) + boards."""
    return cache_dir() / "boards"


def ensure_rootfs(image: BoardImage, cache_dir: Optional[Path] = None) -> Path:
    """Return the root filesystem for `image`, building it once and reusing it afterwards."""
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(boards / f"{image.suite}-{image.key()}", lambda partial: _build(image, partial))


def run_on_board(
    rootfs: Path,
    argv: Sequence[str],
    cpu: str = "cortex-a72",
    env: Optional[Mapping[str, str]] = None,
    pythonpath: Sequence[Path] = (),
    cwd: Optional[Path] = None,
    timeout: float = 900,
) -> "subprocess.CompletedProcess[str]":
    """Run the board's python3 with `argv` under qemu-user and capture its text output."""
    return subprocess.run(
        board_command(rootfs, argv, cpu),
        env=_board_env(Path(rootfs), env, pythonpath),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# CPU models qemu 7.2 lacks, run on the qemu model with the same user-space ISA: Cortex-A78AE (the Jetson Orin's)
# executes what Cortex-A76 does (Armv8.2-A with fp16, dot product, RCpc, SSBS; its safety features are not
# visible to user code). The guest still sees its own core: a counted process's /proc/cpuinfo gives its part
# number (emulate/cpus.py), which XNNPACK, for one, picks kernels by.
SAME_ISA = {"cortex-a78ae": "cortex-a76"}


def qemu_model(cpu: str) -> str:
    """The qemu -cpu model that runs `cpu`: itself, or the one of SAME_ISA."""
    return SAME_ISA.get(cpu, cpu)


def cpu_words(cpu: str) -> str:
    """What follows '-cpu' in a label: 'cortex-a76', or 'cortex-a76 shown as cortex-a78ae' for one of SAME_ISA."""
    return cpu if qemu_model(cpu) == cpu else "{} shown as {}".format(qemu_model(cpu), cpu)


def emulated_words(board: str, cpu: str) -> str:
    """'the emulated raspberry-pi-5 (qemu -cpu cortex-a76)', as messages say where a command ran."""
    return "the emulated {} (qemu -cpu {})".format(board, cpu_words(cpu))


def board_command(rootfs: Path, argv: Sequence[str], cpu: str = "cortex-a72") -> List[str]:
    """The qemu-user command line that runs the board's python3 with `argv` (for a process that keeps running,
    such as a served board, start it with `board_environment`)."""
    rootfs = Path(rootfs)
    python = rootfs / "usr" / "bin" / "python3"
    if not python.exists():
        raise EmulationError(f"no usr/bin/python3 in {rootfs}", hint="build the board first with ensure_rootfs()")
    check_tools()
    # Always a real CPU model: qemu's default `max` gave wrong int8 results under XNNPACK (docs/stack-notes.md).
    return ["qemu-aarch64-static", "-L", str(rootfs), "-cpu", qemu_model(cpu), str(python), *argv]


def board_environment(rootfs: Path, env: Optional[Mapping[str, str]] = None,
                      pythonpath: Sequence[Path] = ()) -> Dict[str, str]:
    """The environment of a process started with `board_command`."""
    return _board_env(Path(rootfs), env, pythonpath)


def _board_env(rootfs: Path, extra: Optional[Mapping[str, str]], pythonpath: Sequence[Path]) -> Dict[str, str]:
    """A small fixed environment, so nothing from the host's Python setup reaches the board."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        # A host path, so writes land in this rootfs rather than the host's home (qemu -L only redirects
        # paths that already exist under ROOT).
        "HOME": str(rootfs / "root"),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        # The rootfs is precompiled and shared between runs; runs must not change it (or the repo).
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env.update(extra or {})
    return env


def _build(image: BoardImage, target: Path) -> None:
    """Build the root filesystem for `image` into the empty folder `target`."""
    target.mkdir(parents=True)
    _extract_debs(image, target)
    _link_blas(target)
    (target / "proc").mkdir(exist_ok=True)
    (target / "proc" / "cpuinfo").write_text(FAKE_CPUINFO)
    (target / "root").mkdir(exist_ok=True)
    installed = _install_wheels(image, target) if image.wheels else []
    _precompile(image, target)
    # What the requirements resolved to, for whoever wonders which numpy the board has.
    manifest = {"suite": image.suite, "python": image.python, "debs": list(image.debs),
                "wheels": list(image.wheels), "installed_wheels": installed}
    (target / ".edgedyn-board.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _extract_debs(image: BoardImage, target: Path) -> None:
    """Unpack the Debian packages (and their dependencies) for arm64 without running their scripts."""
    tarball = target / "debs.tar"
    try:
        # A tarball unpacked by us, not a directory written by mmdebstrap: as a normal user mmdebstrap
        # runs in a user namespace and its files would belong to a subuid we could not write or delete.
        run_step(
            ["mmdebstrap", "--quiet", "--variant=extract", "--architectures=arm64",
             f"--include={','.join(image.debs)}", image.suite, str(tarball), _debian_mirror()],
            f"downloading the {image.suite} arm64 packages (is {_debian_mirror()} reachable? "
            "set EDGEDYN_DEBIAN_MIRROR to use another mirror)",
        )
        # Device nodes cannot be made without privileges; without ROOT/dev the board uses the host's /dev.
        run_step(["tar", "-x", "-f", str(tarball), "-C", str(target), "--no-same-owner", "--exclude=./dev/*"],
             "unpacking the root filesystem")
    finally:
        tarball.unlink(missing_ok=True)


def _link_blas(rootfs: Path) -> None:
    """Add the libblas.so.3/liblapack.so.3 links that Debian's alternatives would make at install time."""
    libdir = rootfs / "usr" / "lib" / "aarch64-linux-gnu"
    for name in ("libblas.so.3", "liblapack.so.3"):
        providers = sorted(libdir.glob(f"*/{name}"))
        if providers and not (libdir / name).exists():
            # Relative, so it resolves inside the rootfs and not against the host's /usr.
            (libdir / name).symlink_to(providers[0].relative_to(libdir))


def _install_wheels(image: BoardImage, rootfs: Path) -> List[str]:
    """Resolve the image's wheels for the board's Python and glibc, and unpack them into its site dir."""
    return install_for_board(image, image.wheels, [], image.site_dir(rootfs), rootfs)


def wheel_target_args(suite: Suite) -> List[str]:
    """pip options that select wheels the board can load: its Python, aarch64, its glibc or older."""
    # Newest first: pip prefers the earlier tags. Nothing newer than the board's glibc can load there.
    platforms = [f"manylinux_2_{minor}_aarch64" for minor in range(suite.glibc_minor, 16, -1)]
    args = ["--only-binary=:all:", "--python-version", suite.python, "--implementation", "cp"]
    for tag in platforms + ["manylinux2014_aarch64"]:
        args += ["--platform", tag]
    return args


def install_for_board(image: BoardImage, requirements: Sequence[str], local_wheels: Sequence[Path], site: Path,
                       scratch: Path) -> List[str]:
    """Download `requirements` for the board, then unpack them and `local_wheels` (without deps) into `site`."""
    suite = SUITES[image.suite]
    target_args = wheel_target_args(suite)
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix=".wheels-", dir=scratch) as wheel_dir:
        # Two steps: `pip install --python-version` checks Requires-Python against the host's Python (pypa/pip
        # #12216, pip 23.2) and put typer 0.27 (>=3.10) on the 3.9 board; `pip download` checks the board's.
        if requirements:
            run_step([*pip, "download", "--quiet", "--dest", wheel_dir, *target_args, *requirements],
                 f"resolving wheels for Python {suite.python} aarch64: {' '.join(requirements)}")
        wheels = sorted(str(p) for p in Path(wheel_dir).glob("*.whl")) + [str(w) for w in local_wheels]
        run_step([*pip, "install", "--quiet", "--target", str(site), "--no-deps", "--no-index",
              "--ignore-requires-python", "--no-compile", "--no-warn-conflicts", *target_args, *wheels],
             f"installing wheels into {site}")
    return [Path(wheel).name for wheel in wheels]


def _precompile(image: BoardImage, rootfs: Path) -> None:
    """Compile the board's stdlib and packages with its own Python, so runs never write into the cache."""
    folders = [rootfs / "usr" / "lib" / f"python{image.python}", rootfs / "usr" / "lib" / "python3" / "dist-packages"]
    if image.wheels:
        folders.append(image.site_dir(rootfs))
    compile_on_board(rootfs, folders)


def compile_on_board(rootfs: Path, folders: Sequence[Path]) -> None:
    """Compile `folders` with the board's own Python, so runs find bytecode and never write it."""
    result = run_on_board(rootfs, ["-m", "compileall", "-q", "-j", "0", *map(str, folders)])
    # Exit status 1 means some file did not compile (e.g. a template in a package): it is then compiled
    # on import instead, which is harmless. Anything else means the board's Python itself is broken.
    if result.returncode not in (0, 1):
        raise BoardBuildError(f"the board's python3 failed to run compileall (exit {result.returncode}):\n"
                              f"{result.stderr[-3000:]}")


def _debian_mirror() -> str:
    """The Debian mirror: $EDGEDYN_DEBIAN_MIRROR, else the host's own Debian mirror, else deb.debian.org."""
    if os.environ.get("EDGEDYN_DEBIAN_MIRROR"):
        return os.environ["EDGEDYN_DEBIAN_MIRROR"]
    # A Debian host may only reach its configured mirror (or a proxy of it); elsewhere use the public one.
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and line.split()[1:]:
                uri = line.split()[1]
                if uri.rstrip("/").endswith("/debian"):
                    return uri
    return DEFAULT_MIRROR


def run_step(command: Sequence[str], what: str) -> None:
    """Run a build step, raising BoardBuildError with its output when it fails."""
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-3000:]
        raise BoardBuildError(f"{what} failed (exit {result.returncode}): {' '.join(command)}\n{output}")


def build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """`final`, made by `build(partial)` under a lock and renamed into place, unless it already exists."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with locked(final.parent / f"{final.name}.lock"):
        if final.is_dir():  # another process built it while we waited for the lock
            return final
        # Only a crashed build leaves these behind: we hold the lock, so nobody is writing them.
        for stale in final.parent.glob(f".{final.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        partial = final.parent / f".{final.name}.partial-{os.getpid()}"
        try:
            build(partial)
            # Renaming is atomic, so a folder named like a finished build always is one.
            partial.rename(final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return final


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`, so two processes never build the same rootfs at once."""
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
