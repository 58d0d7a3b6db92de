"""Board tests: everything here runs on the emulated aarch64 board and carries the `board` marker."""
from pathlib import Path
from typing import List

import pytest

from conftest import require

from .emulator import BULLSEYE_OLD, INSTALL_HINT, PI_BOOKWORM, ensure_rootfs, missing_tools

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook applies `-m` to the markers
def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Mark every test under tests/board with `board`."""
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.board)


@pytest.fixture(scope="session", autouse=True)
def board_tools() -> None:
    """Skip the board tests when qemu or mmdebstrap is missing; in CI, fail instead of skipping."""
    missing = missing_tools()
    require(not missing, f"the emulated board needs {', '.join(missing)}", f"install with: {INSTALL_HINT}")


@pytest.fixture(scope="session")
def pi_rootfs(board_tools: None) -> Path:
    """The Raspberry Pi OS bookworm-like board: Python 3.11, numpy, the TVM runtime."""
    return ensure_rootfs(PI_BOOKWORM)


@pytest.fixture(scope="session")
def bullseye_rootfs(board_tools: None) -> Path:
    """The old board: Python 3.9 with Debian's numpy 1.19."""
    return ensure_rootfs(BULLSEYE_OLD)
