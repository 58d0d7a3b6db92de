"""Runs a .tflite model with LiteRT (`ai-edge-litert`, XNNPACK on by default), or `tflite-runtime` with numpy < 2."""
import os
from typing import Any, Dict, List

import numpy as np

from edgedyn.runtime.errors import MissingDependencyError

_HINT = "pip install 'edgedyn[litert]'"


def _interpreter_class() -> Any:
    """LiteRT's Interpreter, else tflite-runtime's where it works; which one, for describe()."""
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter, "ai-edge-litert"
    except ImportError as error:
        litert_error = error
    # tflite-runtime 2.14 imports beside numpy 2 but its Interpreter() then fails (_ARRAY_API not found):
    # only offer it where numpy is older, as on Python 3.8 boards that have no ai-edge-litert wheel.
    if int(np.__version__.split(".")[0]) < 2:
        try:
            from tflite_runtime.interpreter import Interpreter

            return Interpreter, "tflite-runtime"
        except ImportError:
            pass
    raise MissingDependencyError(
        "this bundle runs on LiteRT, but ai-edge-litert is not installed ({})".format(litert_error),
        hint="{}  (on Python < 3.10 with numpy < 2: pip install tflite-runtime)".format(_HINT))


class LiteRtExecutor:
    """One LiteRT interpreter over the bundle's .tflite member; inputs and outputs in the torch model's layout."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        interpreter_class, self._package = _interpreter_class()
        self._model = bundle.read(artifact["files"]["model"])  # kept alive: the interpreter reads it in place
        self._threads = int(options.get("threads") or os.cpu_count() or 1)
        self._interpreter = interpreter_class(model_content=self._model, num_threads=self._threads)
        self._interpreter.allocate_tensors()
        # each input in the model's own type: float32 data, int64 token ids (the guards checked the dtypes)
        self._inputs = [(d["index"], d["dtype"]) for d in self._interpreter.get_input_details()]
        self._outputs = [d["index"] for d in self._interpreter.get_output_details()]
        self.artifact = artifact

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        for (index, dtype), array in zip(self._inputs, inputs):
            self._interpreter.set_tensor(index, np.ascontiguousarray(array, dtype=dtype))
        self._interpreter.invoke()
        return [self._interpreter.get_tensor(index) for index in self._outputs]

    def describe(self) -> Dict[str, Any]:
        return {"executor": "litert", "device": "cpu", "runtime": self._package, "threads": self._threads,
                "version": _version(self._package)}


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # metadata missing in a vendored install: the version is only informative
        return "unknown"
