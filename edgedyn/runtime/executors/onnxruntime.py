"""Runs an ONNX model (`.onnx` written by edgedyn's onnxruntime backend) with onnxruntime."""
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from edgedyn.runtime.errors import MissingDependencyError

CPU = "CPUExecutionProvider"


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as error:
        raise MissingDependencyError(
            "this bundle runs on onnxruntime, which is not installed ({})".format(error),
            hint="pip install 'edgedyn[onnxruntime]'  (on a Jetson: the onnxruntime-gpu wheel for its JetPack)",
        )
    return onnxruntime


def usable_providers(wanted: List[str], available: List[str]) -> List[str]:
    """The artifact's providers that this onnxruntime offers, in the artifact's order, with CPU last."""
    return [name for name in wanted if name in available and name != CPU] + [CPU]


class OnnxRuntimeExecutor:
    """One onnxruntime InferenceSession over the bundle's model file."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        ort = _import_onnxruntime()
        session_options = ort.SessionOptions()
        # The file holds only the portable (basic) optimizations; the layout and fusion rewrites for this CPU and
        # these providers happen here, on the board.
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.log_severity_level = 3
        threads = options.get("threads")
        if threads:
            session_options.intra_op_num_threads = int(threads)
        self._requested = list(artifact.get("execution_providers", [CPU]))
        providers = usable_providers(self._requested, ort.get_available_providers())
        model = bundle.read(artifact["files"]["model"])
        self._session = ort.InferenceSession(model, session_options, providers=providers)
        self._inputs = list(artifact["input_names"])
        self._outputs = list(artifact["output_names"])
        self._threads = threads
        self._version = getattr(ort, "__version__", "unknown")
        self.artifact = artifact
        self._run = self._native_run() or (lambda feed: self._session.run(self._outputs, feed))

    def _native_run(self) -> Optional[Callable[[Dict[str, np.ndarray]], List[np.ndarray]]]:
        """The session's own (C++) run, for CPU-only sessions, when this onnxruntime has one."""
        # Note: onnxruntime's Python `run` re-validates the feed's names and its OrtValues' ownership on every call
        # (1-7 us measured on a 2-core x86 host, against ~5 us for a small model's whole call); this executor
        # always passes exactly the model's inputs as numpy arrays. Sessions with a GPU provider keep the public
        # `run`: it holds onnxruntime's retry on the CPU when a GPU provider fails.
        native = getattr(self._session, "_sess", None)
        if native is None or not hasattr(native, "run") or self._session.get_providers() != [CPU]:
            return None
        outputs = self._outputs
        return lambda feed: native.run(outputs, feed, None)

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        return list(self._run(dict(zip(self._inputs, inputs))))

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "onnxruntime",
            "device": "cpu" if self._session.get_providers()[0] == CPU else "gpu",
            "onnxruntime": self._version,
            "providers": self._session.get_providers(),
            "providers_requested": self._requested,
            "threads": self._threads,
        }
