"""The board tests' emulated boards: two images with what the low-level tests need, on the package's emulator.

The machinery is edgedyn.emulate (what `edgedyn verify --emulate` uses): `rootfs.py` makes the cached arm64
Debian tree and runs it under qemu-user, `wheels.py` installs a wheel of this checkout beside it. This module only
names the images the tests run and installs this checkout on them. Timings under emulation mean nothing.
"""
import contextlib
import json
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from edgedyn.emulate.rootfs import (INSTALL_HINT, SUITES, BoardBuildError, BoardImage, Suite, default_cache_dir,
                                    ensure_rootfs, missing_tools, run_on_board)
from edgedyn.emulate.wheels import build_wheel, host_wheel, install_wheel

__all__ = [
    "BULLSEYE_OLD",
    "INSTALL_HINT",
    "PI_BOOKWORM",
    "REPO",
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

# A Raspberry Pi 4/5 on Raspberry Pi OS bookworm: pyproject's base dependencies with numpy from the wheel,
# plus its [tvm] extra (apache-tvm-ffi is pinned: docs/stack-notes.md) and [onnxruntime] and [litert]
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


def image_of(rootfs: Path) -> BoardImage:
    """The image a cached rootfs was built from: a known one (with its extras), else the one its manifest names."""
    for image in (PI_BOOKWORM, BULLSEYE_OLD):
        if Path(rootfs).name == f"{image.suite}-{image.key()}":
            return image
    manifest = json.loads((Path(rootfs) / ".edgedyn-board.json").read_text())
    return BoardImage(manifest["suite"], tuple(manifest["debs"]), tuple(manifest["wheels"]))


@lru_cache(maxsize=None)
def installed_checkout(rootfs: Path) -> Path:
    """The site folder holding this checkout's edgedyn, installed from a freshly built wheel (once per process)."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-wheel-") as folder:
        return install_wheel(Path(rootfs), host_wheel(Path(folder)), image_of(Path(rootfs)))


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


@contextlib.contextmanager
def preference_decides() -> Iterator[None]:
    """Exports inside choose another board's backend by the board file's preference, as where qemu is not installed.

    Note: the default export for an Arm board counts every candidate's instructions on the emulated CPU: minutes per
    candidate for a full-size model. tests/board/test_onboard.py checks that mode on a small model; tests of what
    runs inside a board's bundle (a detector's NMS, a zoo model on the board's CPU) export this way."""
    import edgedyn.onboard

    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(edgedyn.onboard, "unavailable", lambda board: "not measured in this test")
        yield
