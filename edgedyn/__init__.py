"""edgedyn: take an unmodified PyTorch model to an embedded board, fast, small and checked.

Host side: `edgedyn.export(model, example_inputs, board="raspberry-pi-4", output="m.edgedyn")`.
Board side: `edgedyn.runtime.load("m.edgedyn")`. Importing `edgedyn` loads neither torch nor a compiler:
the host API is imported on first use.
"""
from typing import Any

from edgedyn.version import __version__

__all__ = ["__version__", "capture", "export"]


def __getattr__(name: str) -> Any:
    if name == "export":
        from edgedyn.exporter import export

        return export
    if name == "capture":
        from edgedyn.frontend import capture

        return capture
    raise AttributeError("module 'edgedyn' has no attribute {!r}".format(name))

# Note: the torch side lives in edgedyn/frontend/ and edgedyn/exporter.py rather than in modules named
# `capture` and `export`, because importing a submodule rebinds the package attribute of the same name and
# would shadow the `edgedyn.capture(...)` and `edgedyn.export(...)` functions.
