"""An emulated aarch64 board: a cached arm64 Debian root filesystem run under qemu-user.

Used by the board tests and the benchmarks. Nothing here needs privileges: mmdebstrap writes a tarball that
we unpack as the current user, and qemu-user runs the board's own /usr/bin/python3 with `-L ROOT`, so the
board sees its own libraries while every other host path (bundles, the repo) is visible as it is.
Timings under emulation mean nothing; use the board for correctness only.

edgedyn reaches the board the way a user's `pip install` puts it there: a wheel built from a checkout
(`build_wheel`), unpacked with its extras and any dependency the board lacks (`install_wheel`, cached by the
wheel's hash), so the shipped boards/ and targets/ and the dependency markers are what runs. Only
`installed_checkout` and `run_edgedyn` know about this repository; the rest takes paths and could serve a
`verify --emulate` in the package.
"""
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "BULLSEYE_OLD",
    "PI_BOOKWORM",
    "SUITES",
    "BoardBuildError",
    "BoardImage",
    "Suite",
    "build_wheel",
    "default_cache_dir",
    "ensure_rootfs",
    "image_of",
    "install_wheel",
    "installed_checkout",
    "missing_tools",
    "run_edgedyn",
    "run_on_board",
]

REPO = Path(__file__).resolve().parents[2]  # the checkout whose edgedyn the board runs

INSTALL_HINT = "bash scripts/install.sh"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the build recipe changes, so existing caches are rebuilt instead of silently reused.
RECIPE_VERSION = 1
# Bump when the way a wheel is installed on a board changes.
INSTALL_VERSION = 2


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


# A Raspberry Pi 4/5 on Raspberry Pi OS bookworm: pyproject's base dependencies with numpy from the wheel,
# plus its [tvm] extra (FACTS.md: apache-tvm-ffi 0.1.15 segfaults, hence the pin) and [onnxruntime] and [litert]
# extras.
PI_BOOKWORM = BoardImage(
    "bookworm",
    wheels=("numpy<2.3", "typer", "rich", "typing_extensions",
            "apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "onnxruntime>=1.16",
            "ai-edge-litert>=2.3"),
    extras=("tvm", "onnxruntime", "litert"),
)

# An old board: Python 3.9 with Debian's numpy 1.19. The other base dependencies are pure Python and resolve
# for 3.9 (typer 0.23 with click, rich 15, tomli because 3.9 has no tomllib); nothing compiled comes from
# the package index.
BULLSEYE_OLD = BoardImage(
    "bullseye",
    debs=("python3", "python3-numpy", "libstdc++6", "libgomp1"),
    wheels=("typer", "rich", "typing_extensions", "tomli"),
)

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


class BoardBuildError(RuntimeError):
    """A step of building the emulated board's root filesystem failed."""


def missing_tools() -> List[str]:
    """Which of the host tools the emulated board needs are not on PATH."""
    return [tool for tool in ("qemu-aarch64-static", "mmdebstrap") if shutil.which(tool) is None]


def default_cache_dir() -> Path:
    """The folder holding the cached root filesystems: $EDGEDYN_CACHE/boards or ~/.cache/edgedyn/boards."""
    root = os.environ.get("EDGEDYN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "edgedyn") / "boards"


def ensure_rootfs(image: BoardImage, cache_dir: Optional[Path] = None) -> Path:
    """Return the root filesystem for `image`, building it once and reusing it afterwards."""
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _build_once(boards / f"{image.suite}-{image.key()}", lambda partial: _build(image, partial))


def image_of(rootfs: Path) -> BoardImage:
    """The image a cached rootfs was built from: a known one (with its extras), else the one its manifest names."""
    for image in (PI_BOOKWORM, BULLSEYE_OLD):
        if Path(rootfs).name == f"{image.suite}-{image.key()}":
            return image
    manifest = json.loads((Path(rootfs) / ".edgedyn-board.json").read_text())
    return BoardImage(manifest["suite"], tuple(manifest["debs"]), tuple(manifest["wheels"]))


def build_wheel(source: Path, dest: Path) -> Path:
    """Build the wheel of the checkout at `source` into the empty folder `dest`, as a release would."""
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(source)],
         f"building the wheel of {source}")
    wheels = sorted(Path(dest).glob("*.whl"))
    if len(wheels) != 1:
        raise BoardBuildError(f"building the wheel of {source} left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def install_wheel(rootfs: Path, wheel: Path, image: Optional[BoardImage] = None,
                  cache_dir: Optional[Path] = None) -> Path:
    """Install `wheel` for the board as `pip install 'WHEEL[extras]'` would there; return the site folder.

    The board's own packages count: a requirement it already satisfies (Debian's numpy 1.19 on bullseye) is
    not shadowed by a newer wheel. Installs sit beside the shared rootfs, never in it, keyed by the wheel's
    SHA-256, the rootfs and the extras, and are reused while the wheel's bytes stay the same.
    """
    image = image or image_of(rootfs)
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    recipe = {"install": INSTALL_VERSION, "rootfs": Path(rootfs).name, "wheel": digest, "extras": list(image.extras)}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    installed = _build_once(boards / "installs" / f"{Path(rootfs).name}-{key}",
                            lambda partial: _install_into(Path(rootfs), image, Path(wheel), partial, recipe))
    return installed / "site"


@lru_cache(maxsize=None)
def installed_checkout(rootfs: Path) -> Path:
    """The site folder holding this checkout's edgedyn, installed from a freshly built wheel (once per process)."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-wheel-") as folder:
        return install_wheel(Path(rootfs), build_wheel(REPO, Path(folder)))


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
    rootfs = Path(rootfs)
    python = rootfs / "usr" / "bin" / "python3"
    if not python.exists():
        raise FileNotFoundError(f"no usr/bin/python3 in {rootfs}; build the board first with ensure_rootfs()")
    if shutil.which("qemu-aarch64-static") is None:
        raise FileNotFoundError(f"qemu-aarch64-static is not on PATH; install it with: {INSTALL_HINT}")
    # Always a real CPU model: qemu's default `max` gave wrong int8 results under XNNPACK (FACTS.md).
    command = ["qemu-aarch64-static", "-L", str(rootfs), "-cpu", cpu, str(python), *argv]
    return subprocess.run(
        command,
        env=_board_env(rootfs, env, pythonpath),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_edgedyn(rootfs: Path, argv: Sequence[str], cpu: str = "cortex-a72",
                env: Optional[Mapping[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    """Run the board's python3 with this checkout's edgedyn installed from its wheel, and its bundle cache
    inside the rootfs unless `env` names another."""
    site = installed_checkout(Path(rootfs))
    environment = {"EDGEDYN_CACHE": str(Path(rootfs) / "root" / "edgedyn-cache")}
    environment.update(env or {})
    # Run from the install folder: `-m` and `-c` put the working directory first on sys.path, and from the
    # checkout that would import its source tree instead of the wheel.
    return run_on_board(rootfs, argv, cpu=cpu, env=environment, pythonpath=[site], cwd=site.parent)


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
        _run(
            ["mmdebstrap", "--quiet", "--variant=extract", "--architectures=arm64",
             f"--include={','.join(image.debs)}", image.suite, str(tarball), _debian_mirror()],
            f"downloading the {image.suite} arm64 packages (is {_debian_mirror()} reachable? "
            "set EDGEDYN_DEBIAN_MIRROR to use another mirror)",
        )
        # Device nodes cannot be made without privileges; without ROOT/dev the board uses the host's /dev.
        _run(["tar", "-x", "-f", str(tarball), "-C", str(target), "--no-same-owner", "--exclude=./dev/*"],
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
    return _install_for_board(image, image.wheels, [], image.site_dir(rootfs), rootfs)


def _target_args(suite: Suite) -> List[str]:
    """pip options that select wheels the board can load: its Python, aarch64, its glibc or older."""
    # Newest first: pip prefers the earlier tags. Nothing newer than the board's glibc can load there.
    platforms = [f"manylinux_2_{minor}_aarch64" for minor in range(suite.glibc_minor, 16, -1)]
    args = ["--only-binary=:all:", "--python-version", suite.python, "--implementation", "cp"]
    for tag in platforms + ["manylinux2014_aarch64"]:
        args += ["--platform", tag]
    return args


def _install_for_board(image: BoardImage, requirements: Sequence[str], local_wheels: Sequence[Path], site: Path,
                       scratch: Path) -> List[str]:
    """Download `requirements` for the board, then unpack them and `local_wheels` (without deps) into `site`."""
    suite = SUITES[image.suite]
    target_args = _target_args(suite)
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix=".wheels-", dir=scratch) as wheel_dir:
        # Two steps: `pip install --python-version` checks Requires-Python against the host's Python (pypa/pip
        # #12216, pip 23.2) and put typer 0.27 (>=3.10) on the 3.9 board; `pip download` checks the board's.
        if requirements:
            _run([*pip, "download", "--quiet", "--dest", wheel_dir, *target_args, *requirements],
                 f"resolving wheels for Python {suite.python} aarch64: {' '.join(requirements)}")
        wheels = sorted(str(p) for p in Path(wheel_dir).glob("*.whl")) + [str(w) for w in local_wheels]
        _run([*pip, "install", "--quiet", "--target", str(site), "--no-deps", "--no-index",
              "--ignore-requires-python", "--no-compile", "--no-warn-conflicts", *target_args, *wheels],
             f"installing wheels into {site}")
    return [Path(wheel).name for wheel in wheels]


def _install_into(rootfs: Path, image: BoardImage, wheel: Path, target: Path, recipe: Mapping[str, object]) -> None:
    """Install `wheel` with the dependencies the board lacks into `target`/site, and precompile it there."""
    target.mkdir(parents=True)
    wanted = _board_requirements(image, wheel)
    versions = _board_versions(rootfs, [r.name for r in wanted])
    missing = [f"{r.name}{r.specifier}" for r in wanted
               if versions[r.name] is None or not r.specifier.contains(versions[r.name], prereleases=True)]
    installed = _install_for_board(image, missing, [wheel], target / "site", target)
    _compile_on_board(rootfs, [target / "site"])
    manifest = dict(recipe, wheel_name=wheel.name, requirements=[str(r) for r in wanted], board_has=versions,
                    added_requirements=missing, installed_wheels=installed)
    (target / "install.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _board_requirements(image: BoardImage, wheel: Path) -> List[Any]:
    """The wheel's requirements (packaging Requirement objects) whose markers hold on the board, for the
    image's extras."""
    from packaging.requirements import Requirement  # host side only; pip depends on it

    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode("utf-8").splitlines()
    requirements = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    environment = {"python_version": image.python, "python_full_version": image.python + ".0",
                   "platform_machine": "aarch64", "sys_platform": "linux", "platform_system": "Linux",
                   "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    return [r for r in requirements if r.marker is None
            or any(r.marker.evaluate(dict(environment, extra=extra)) for extra in ("",) + image.extras)]


def _board_versions(rootfs: Path, names: Sequence[str]) -> Dict[str, Optional[str]]:
    """The installed version of each distribution on the board itself (None when missing)."""
    code = """
import json, sys
from importlib import metadata
found = {}
for name in sys.argv[1:]:
    found[name] = None
    for spelling in (name, name.replace("-", "_")):  # Python < 3.10 does not normalize names
        try:
            found[name] = metadata.version(spelling)
            break
        except metadata.PackageNotFoundError:
            pass
print(json.dumps(found))
"""
    result = run_on_board(rootfs, ["-c", code, *names])
    if result.returncode != 0:
        raise BoardBuildError(f"asking the board which packages it has failed (exit {result.returncode}):\n"
                              f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def _precompile(image: BoardImage, rootfs: Path) -> None:
    """Compile the board's stdlib and packages with its own Python, so runs never write into the cache."""
    folders = [rootfs / "usr" / "lib" / f"python{image.python}", rootfs / "usr" / "lib" / "python3" / "dist-packages"]
    if image.wheels:
        folders.append(image.site_dir(rootfs))
    _compile_on_board(rootfs, folders)


def _compile_on_board(rootfs: Path, folders: Sequence[Path]) -> None:
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


def _run(command: Sequence[str], what: str) -> None:
    """Run a build step, raising BoardBuildError with its output when it fails."""
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-3000:]
        raise BoardBuildError(f"{what} failed (exit {result.returncode}): {' '.join(command)}\n{output}")


def _build_once(final: Path, build: Callable[[Path], None]) -> Path:
    """`final`, made by `build(partial)` under a lock and renamed into place, unless it already exists."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f"{final.name}.lock"):
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
def _locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`, so two processes never build the same rootfs at once."""
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
