"""Errors raised on the device. Standard library only, Python 3.8 syntax."""
from typing import Optional


class EdgedynError(Exception):
    """A mistake the user can fix: printed as `error: ...` and `hint: ...`, without a traceback."""

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return "{}\nhint: {}".format(self.message, self.hint)
        return self.message


class BundleError(EdgedynError):
    """The bundle file is unreadable, truncated, of an unknown format version, or was tampered with."""


class ChecksumError(BundleError):
    """A bundle member does not match the SHA-256 recorded in the manifest."""


class PlatformError(EdgedynError):
    """The bundle was built for another CPU architecture or needs something this machine lacks."""


class ExecutionError(EdgedynError):
    """An artifact failed while running a call whose arguments passed every guard (a damaged or edited bundle)."""


class GuardError(EdgedynError):
    """The call's arguments match none of the bundle's specializations."""


class MissingDependencyError(EdgedynError):
    """An optional package needed for this step is not installed."""
