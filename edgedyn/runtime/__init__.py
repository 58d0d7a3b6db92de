"""edgedyn's device runtime: load a bundle, check it, call it.

    import edgedyn.runtime as rt
    model = rt.load("tiny.edgedyn")
    y = model(x)                      # numpy in, numpy out; guards checked on every call

Standard library and numpy only, Python 3.8 syntax. It imports nothing else from edgedyn, and backend runtimes
(TVM, onnxruntime, LiteRT) only when a bundle needs them.
"""
from edgedyn.runtime.errors import (
    BundleError,
    ChecksumError,
    EdgedynError,
    ExecutionError,
    GuardError,
    MissingDependencyError,
    PlatformError,
)
from edgedyn.runtime.format import Bundle, read_manifest
from edgedyn.runtime.program import Program, load

__all__ = [
    "Bundle",
    "BundleError",
    "ChecksumError",
    "EdgedynError",
    "ExecutionError",
    "GuardError",
    "MissingDependencyError",
    "PlatformError",
    "Program",
    "load",
    "read_manifest",
]
