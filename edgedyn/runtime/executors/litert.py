"""Runs a .tflite model with LiteRT (`ai-edge-litert`, XNNPACK on by default), or `tflite-runtime` with numpy < 2."""
import contextlib
import os
import tempfile
import time
from typing import Any, Dict, Iterator, List

import numpy as np

from edgedyn.runtime.errors import MissingDependencyError

_HINT = "pip install 'edgedyn[litert]'"
NO_OP_PROFILER = ("LiteRT's Python API (ai-edge-litert, tflite-runtime) offers no per-operator profiler, and XNNPACK "
                  "runs the graph as one delegated node: the row is the whole invoke(); for per-operator times run "
                  "TFLite's benchmark_model --enable_op_profiling=true on the bundle's .tflite member")
# Printed by LiteRT's native code on fd 2 when it applies XNNPACK; it is not edgedyn's to show the user.
_LITERT_CHATTER = (b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)


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
        with _quiet_native_stderr():
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

    def profile(self, inputs: List[np.ndarray], runs: int) -> Dict[str, Any]:
        """Whole-graph invoke times: LiteRT's Python API has no per-operator profiler (see NO_OP_PROFILER)."""
        for (index, dtype), array in zip(self._inputs, inputs):
            self._interpreter.set_tensor(index, np.ascontiguousarray(array, dtype=dtype))
        self._interpreter.invoke()  # warm-up
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            self._interpreter.invoke()
            times.append(time.perf_counter() - started)
        counts = {}  # type: Dict[str, int]
        for op in self._interpreter._get_ops_details():  # the model's operators, as written into the .tflite
            counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
        return {"source": "invoke() timed as a whole", "runs": runs, "note": NO_OP_PROFILER,
                "graph_ops": counts,
                "ops": [{"name": "invoke ({} operators)".format(sum(counts.values())), "type": "whole graph",
                         "ms": float(np.median(times)) * 1000.0, "calls": 1}]}

    def describe(self) -> Dict[str, Any]:
        return {"executor": "litert", "device": "cpu", "runtime": self._package, "threads": self._threads,
                "version": _version(self._package)}


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # metadata missing in a vendored install: the version is only informative
        return "unknown"


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Drops LiteRT's own INFO lines, written by C++ straight to fd 2 (so sys.stderr cannot catch them); any
    other line written meanwhile (a real native error) is passed on."""
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (a daemon): nothing to keep quiet
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(True)
                    if not line.strip().startswith(_LITERT_CHATTER)]
            if kept:
                os.write(2, b"".join(kept))
