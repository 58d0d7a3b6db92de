"""Errors a person can act on.

`EdgedynError` is a user mistake or an environment problem: the CLI prints it as `error: ...` plus
`hint: ...` without a traceback. Anything else is a bug in edgedyn and keeps its traceback.
The runtime defines its own errors (edgedyn/runtime/errors.py) so the device side imports nothing from here;
they share this base through `edgedyn.runtime.errors.RuntimeUserError`, re-exported as EdgedynError.
"""
import importlib
from typing import Dict, Optional

from edgedyn.runtime.errors import EdgedynError, MissingDependencyError

__all__ = ["EdgedynError", "MissingDependencyError", "CaptureError", "BackendError", "GpuBuildError", "BoardError",
           "GateMissError", "require_modules"]


class CaptureError(EdgedynError):
    """The model could not be captured at the given example inputs."""


class BackendError(EdgedynError):
    """A backend could not compile the captured graph."""


class GpuBuildError(BackendError):
    """GPU code could not be built for this graph (a scheduling rule, the CUDA compiler): the CPU artifact can
    still ship, so under --device auto the exporter turns this into a warning. `functions` names the kernels
    that got no GPU code, each with every scheduling rule's reason, when the failure is per function."""

    def __init__(self, message: str, hint: Optional[str] = None,
                 functions: Optional[Dict[str, Dict[str, str]]] = None) -> None:
        super().__init__(message, hint)
        self.functions = dict(functions or {})


class BoardError(EdgedynError):
    """An unknown or malformed board or target description."""


class GateMissError(EdgedynError):
    """A candidate's numbers miss its accuracy gate (or, in a reduced precision, leave that precision's range): a
    verdict on its arithmetic, which keeping more layers in fp32 may change (candidates.missed_gate), not a
    build that failed."""


def require_modules(needs: Dict[str, str], what: str, extra: str) -> None:
    """Imports each module of `needs` ({module: what it is for}) and fails naming every missing one and the extra
    that installs them: for what a library imports only once it runs (in a worker process, where a missing module
    would end the worker, not tell the user)."""
    missing = []
    for module, why in needs.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append("{} (for {})".format(module, why))
    if missing:
        raise MissingDependencyError("{} needs what is not installed here: {}".format(what, ", ".join(missing)),
                                     hint="pip install 'edgedyn[{}]'".format(extra))
