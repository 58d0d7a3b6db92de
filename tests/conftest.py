"""Shared fixtures: example models and bundles exported once per test session."""
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# The examples every backend must handle: (model reference, --input options).
EXAMPLE_MODELS = {
    "loop_example": ("loop_example.py:loop_example", ("x=2x3", "n=4")),
    "tiny_cnn": ("tiny_cnn.py:TinyCNN", ("x=1x3x64x64",)),
    "mlp": ("mlp.py:MLP", ("x=1x64", "x=8x64")),
}


@pytest.fixture(scope="session")
def export_example(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Exports an example once per (example, board, backend) and returns the bundle path."""
    cache = {}  # type: Dict[Tuple[str, str, str], Path]
    directory = tmp_path_factory.mktemp("bundles")

    def export(example: str, board: str = "x86-64", backend: str = "tvm") -> Path:
        key = (example, board, backend)
        if key not in cache:
            import edgedyn

            reference, inputs = EXAMPLE_MODELS[example]
            cache[key] = edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board=board, backend=backend,
                                        output=directory / "{}-{}-{}.edgedyn".format(*key))
        return cache[key]

    return export


@pytest.fixture
def run_cli() -> Callable[..., "subprocess.CompletedProcess[str]"]:
    """Runs `python -m edgedyn ARGS` in a fresh interpreter, as a user would."""
    import subprocess

    def run(*args: str, cwd: Path = REPO, env: Dict[str, str] = None) -> "subprocess.CompletedProcess[str]":
        environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
        environment.update(env or {})
        return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(cwd), env=environment,
                              capture_output=True, text=True, timeout=600)

    return run
