"""Executors run one artifact of a bundle. Each lives in its own module, imported only when a bundle needs it.

An executor is a class built as `Executor(bundle, artifact, options)` with
`run(inputs: List[np.ndarray]) -> List[np.ndarray]` (flat inputs and outputs in the manifest's order) and
`describe() -> Dict[str, Any]` (what it runs on, for inspect and bench), and optionally
`profile(inputs, runs) -> Dict[str, Any]` for `edgedyn bench --profile`: {"source", "runs", "ops": [{"name",
"type", "ms" (median per run), "calls" (per run), "bytes" (optional)}], "note" (optional)}.
"""
import importlib
from typing import Any

from edgedyn.runtime.errors import BundleError

# Note: module paths as strings, so that `import edgedyn.runtime` loads no backend runtime.
EXECUTORS = {
    "litert": "edgedyn.runtime.executors.litert:LiteRtExecutor",
    "onnxruntime": "edgedyn.runtime.executors.onnxruntime:OnnxRuntimeExecutor",
    "openvino": "edgedyn.runtime.executors.openvino:OpenVinoExecutor",
    "portable": "edgedyn.runtime.executors.portable:PortableExecutor",
    "tvm": "edgedyn.runtime.executors.tvm:TvmExecutor",
}


def executor_class(name: str) -> Any:
    """The executor class registered under `name`, imported on first use."""
    if name not in EXECUTORS:
        raise BundleError(
            "this bundle needs executor '{}', which this edgedyn runtime does not know; choose from: {}".format(
                name, ", ".join(sorted(EXECUTORS))),
            hint="install the edgedyn version that made the bundle on the board",
        )
    module_name, class_name = EXECUTORS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)

