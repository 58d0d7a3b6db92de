"""edgedyn's wheel on the emulated board: installed as `pip install 'WHEEL[extras]'` would install it there.

The wheel is that of the edgedyn running on the host (`host_wheel`): built from its source checkout as a release
would be, or, for an installed wheel, packed again from the installed distribution's own files. It goes with its
extras and only the dependencies the board lacks into a folder beside the shared rootfs (`install_wheel`, cached
by the wheel's SHA-256), so what runs is what the wheel ships (boards/, targets/) and what its dependency markers
select for the board's Python.
"""
import base64
import hashlib
import json
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from edgedyn.emulate.rootfs import (BoardBuildError, BoardImage, EmulationError, build_once, compile_on_board,
                                    default_cache_dir, install_for_board, locked, run_on_board, run_step)

# Bump when the way a wheel is installed on a board changes.
INSTALL_VERSION = 2
# Every change to edgedyn is a new wheel, so a new install beside the rootfs (~200 MB with its dependencies): a
# machine that ran CI on each commit held 41 GB of them and filled its disk. Per rootfs the installs used last stay,
# and an older one goes only once it has been unused this long (a campaign in flight keeps touching its own).
KEEP_INSTALLS = 6
IDLE_S = 3600


def build_wheel(source: Path, dest: Path) -> Path:
    """Build the wheel of the checkout at `source` into the empty folder `dest`, as a release would."""
    run_step([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(source)],
         f"building the wheel of {source}")
    wheels = sorted(Path(dest).glob("*.whl"))
    if len(wheels) != 1:
        raise BoardBuildError(f"building the wheel of {source} left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


PACKAGE = Path(__file__).resolve().parents[1]  # the edgedyn package that is running
# Written by the installer, not part of the wheel: a repacked wheel leaves them out (and writes its own RECORD).
_INSTALLER_FILES = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so the same files give the same wheel bytes (and the same install)


def host_wheel(dest: Path) -> Path:
    """The wheel of the edgedyn running here, written into the empty folder `dest`."""
    checkout = source_checkout()
    if checkout is not None:
        return build_wheel(checkout, dest)
    return repack_installed(PACKAGE.parent, dest)


def source_checkout() -> Optional[Path]:
    """The source checkout the running edgedyn comes from, or None when it runs from an installed wheel."""
    root = PACKAGE.parent
    project = root / "pyproject.toml"
    if project.is_file() and 'name = "edgedyn"' in project.read_text() and (root / "boards").is_dir():
        return root
    return None


def repack_installed(site: Path, dest: Path) -> Path:
    """Pack the edgedyn distribution installed in `site` into a wheel again, from the files its RECORD lists.

    `pip wheel` cannot rebuild an installed distribution (it has no source), but an installed wheel is the wheel's
    files unpacked: the package (with the boards and targets it ships) and its .dist-info.
    """
    from importlib import metadata

    found = [d for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "edgedyn"]
    if len(found) != 1 or not found[0].files:
        raise EmulationError(
            "the edgedyn running from {} is neither a source checkout nor an installed wheel, so there is no wheel "
            "of it to install on the emulated board".format(PACKAGE),
            hint="run edgedyn from a source checkout (git clone), or install it with pip install edgedyn")
    distribution = found[0]
    version = distribution.metadata["Version"]
    info, members = _wheel_members(distribution, site)
    wheel = Path(dest) / "edgedyn-{}-py3-none-any.whl".format(version)
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in sorted(members):
            data = path.read_bytes()
            archive.writestr(zipfile.ZipInfo(name, _ZIP_TIME), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("{},sha256={},{}".format(name, digest, len(data)))
        record.append("{}/RECORD,,".format(info))
        archive.writestr(zipfile.ZipInfo(info + "/RECORD", _ZIP_TIME), "\n".join(record) + "\n")
    return wheel


def _wheel_members(distribution: Any, site: Path) -> Tuple[str, List[Tuple[str, Path]]]:
    """The .dist-info folder's name, and (name in the wheel, file) for what the distribution took from its wheel."""
    members = []
    info = next(Path(str(e)).parts[0] for e in distribution.files if str(e).endswith(".dist-info/METADATA"))
    for entry in distribution.files:
        parts = Path(str(entry)).parts
        # The package and its metadata only: the `edgedyn` script is made from entry_points.txt at install time,
        # and so is the bytecode.
        if parts[0] not in ("edgedyn", info) or "__pycache__" in parts or parts[-1].endswith(".pyc"):
            continue
        if parts[0].endswith(".dist-info") and parts[-1] in _INSTALLER_FILES:
            continue
        members.append((Path(str(entry)).as_posix(), site / entry))
    return info, members


def install_wheel(rootfs: Path, wheel: Path, image: BoardImage, cache_dir: Optional[Path] = None) -> Path:
    """Install `wheel` for the board as `pip install 'WHEEL[extras]'` would there; return the site folder.

    The board's own packages count: a requirement it already satisfies (Debian's numpy 1.19 on bullseye) is
    not shadowed by a newer wheel. Installs sit beside the shared rootfs, never in it, keyed by the wheel's
    SHA-256, the rootfs and the extras, and are reused while the wheel's bytes stay the same.
    """
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    recipe = {"install": INSTALL_VERSION, "rootfs": Path(rootfs).name, "wheel": digest, "extras": list(image.extras)}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    installed = build_once(boards / "installs" / f"{Path(rootfs).name}-{key}",
                            lambda partial: _install_into(Path(rootfs), image, Path(wheel), partial, recipe))
    try:
        (installed / "used").touch()
        prune_installs(installed)
    except OSError:  # a cache this user may read but not write (shared, mounted read-only): nothing to keep tidy
        pass
    return installed / "site"


def prune_installs(current: Path, keep: int = KEEP_INSTALLS, idle_s: float = IDLE_S) -> List[Path]:
    """Removes the installs of `current`'s rootfs beyond the `keep` used last (`current` among them) that nobody
    has used for `idle_s`, each under its build lock; returns what it removed."""
    rootfs = current.name.rsplit("-", 1)[0]
    others = sorted((p for p in current.parent.glob(rootfs + "-*") if p.is_dir() and p != current),
                    key=_last_used, reverse=True)
    removed = []
    for stale in others[max(keep - 1, 0):]:
        if time.time() - _last_used(stale) < idle_s:
            continue
        with locked(stale.parent / f"{stale.name}.lock"):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.unlink(str(stale.parent / f"{stale.name}.lock"))
        except OSError:
            pass
        removed.append(stale)
    return removed


def _last_used(install: Path) -> float:
    used = install / "used"
    return (used if used.exists() else install).stat().st_mtime


def _install_into(rootfs: Path, image: BoardImage, wheel: Path, target: Path, recipe: Mapping[str, object]) -> None:
    """Install `wheel` with the dependencies the board lacks into `target`/site, and precompile it there."""
    target.mkdir(parents=True)
    wanted = _board_requirements(image, wheel)
    versions = _board_versions(rootfs, [r.name for r in wanted])
    missing = [f"{r.name}{r.specifier}" for r in wanted
               if versions[r.name] is None or not r.specifier.contains(versions[r.name], prereleases=True)]
    installed = install_for_board(image, missing, [wheel], target / "site", target)
    compile_on_board(rootfs, [target / "site"])
    manifest = dict(recipe, wheel_name=wheel.name, requirements=[str(r) for r in wanted], board_has=versions,
                    added_requirements=missing, installed_wheels=installed)
    (target / "install.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _board_requirements(image: BoardImage, wheel: Path) -> List[Any]:
    """The wheel's requirements (packaging Requirement objects) whose markers hold on the board, for the
    image's extras."""
    try:
        from packaging.requirements import Requirement  # host side only
    except ImportError:  # a bare virtual environment has pip, which carries its own copy
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

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
