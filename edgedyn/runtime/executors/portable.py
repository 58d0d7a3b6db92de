"""Runs a portable graph (edgedyn's own format, see edgedyn/backends/portable.py) with numpy kernels.

Every input, intermediate, output and kernel scratch buffer is a view of one arena allocated when the bundle is
loaded, at the offsets the memory plan chose; each step is prepared once (views, reshapes), so a call copies the
inputs in, runs the steps and copies the outputs out: no allocation for intermediates.
Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
import json
import time
from typing import Any, Callable, Dict, List

import numpy as np

from edgedyn.runtime import kernels
from edgedyn.runtime.errors import BundleError

# The graph.json format this executor reads; the portable backend writes it with these constants.
GRAPH_FORMAT = "edgedyn-portable-graph"
GRAPH_FORMAT_VERSION = 1


class PortableExecutor:
    """One arena, one list of prepared kernel calls."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        files = artifact["files"]
        graph = json.loads(bundle.read(files["graph"]).decode("utf-8"))
        if graph.get("format") != GRAPH_FORMAT or graph.get("format_version") != GRAPH_FORMAT_VERSION:
            raise BundleError("bundle {}: portable graph has format {!r} version {!r}, this runtime reads {} {}".format(
                bundle.path, graph.get("format"), graph.get("format_version"), GRAPH_FORMAT, GRAPH_FORMAT_VERSION),
                hint="install the edgedyn version that made the bundle on the board")
        self.weights = bundle.arrays(files["weights"])
        alignment = int(graph.get("alignment", 64))
        raw = np.zeros(int(graph["arena_bytes"]) + alignment, np.uint8)
        start = (-raw.ctypes.data) % alignment
        self.arena = raw[start:start + int(graph["arena_bytes"])]
        self.values = [self._view(record) for record in graph["values"]]
        self.inputs = [self.values[i] for i in graph["inputs"]]
        self.outputs = [self.values[i] for i in graph["outputs"]]
        self.steps = [self._prepare(step) for step in graph["steps"]]  # type: List[Callable[[], None]]
        self.graph = graph
        self.artifact = artifact

    def _view(self, record: Dict[str, Any]) -> np.ndarray:
        dtype = np.dtype(record["dtype"])
        strides = [s * dtype.itemsize for s in record["strides"]]
        if "weight" in record:
            base = self.weights[record["weight"]]
            return np.ndarray(record["shape"], dtype, buffer=base, offset=record["offset"] * dtype.itemsize,
                              strides=strides)
        return np.ndarray(record["shape"], dtype, buffer=self.arena, offset=record["offset_bytes"], strides=strides)

    def _scratch(self, record: Dict[str, Any], dtype: Any) -> np.ndarray:
        return np.ndarray(record["shape"], dtype, buffer=self.arena, offset=record["offset_bytes"])

    def _prepare(self, step: Dict[str, Any]) -> Callable[[], None]:
        outs = [self.values[i] if i is not None else None for i in step["outputs"]]
        dtype = next(o for o in outs if o is not None).dtype
        scratch = [self._scratch(record, dtype) for record in step["scratch"]]
        return kernels.KERNELS[step["op"]](outs, self._decode(step["args"]),
                                         {key: self._decode(item) for key, item in step["kwargs"].items()}, scratch)

    def _decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._decode(item) for item in value]
        if isinstance(value, dict):
            if set(value) == {"value"}:
                return self.values[value["value"]]
            if set(value) == {"dtype"}:
                return np.dtype(value["dtype"])
            if set(value) == {"enum"}:
                return value["enum"]
            return {key: self._decode(item) for key, item in value.items()}
        return value

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        for target, array in zip(self.inputs, inputs):
            np.copyto(target, array, casting="same_kind")
        with np.errstate(over="ignore", under="ignore"):  # exp(-x) overflowing to inf in sigmoid is expected
            for step in self.steps:
                step()
        return [np.array(output, order="C") for output in self.outputs]

    def profile(self, inputs: List[np.ndarray], runs: int) -> Dict[str, Any]:
        """Each step's median time over `runs` calls (see edgedyn/runtime/bench.py for the report it feeds)."""
        for target, array in zip(self.inputs, inputs):
            np.copyto(target, array, casting="same_kind")
        samples = [[] for _ in self.steps]  # type: List[List[float]]
        clock = time.perf_counter
        with np.errstate(over="ignore", under="ignore"):
            for _ in range(runs):
                for index, step in enumerate(self.steps):
                    started = clock()
                    step()
                    samples[index].append(clock() - started)
        ops = [{"name": record["name"], "type": record["op"], "ms": float(np.median(times)) * 1000.0, "calls": 1,
                "bytes": self._bytes_touched(record)} for record, times in zip(self.graph["steps"], samples)]
        return {"source": "portable executor timers (perf_counter around each kernel call)", "runs": runs,
                "ops": ops}

    def _bytes_touched(self, step: Dict[str, Any]) -> int:
        """Bytes a step reads and writes: its argument and output arrays and its scratch, each counted once."""
        indices = set(i for i in step["outputs"] if i is not None)
        indices.update(_value_indices(step["args"]))
        indices.update(_value_indices(step["kwargs"]))
        return int(sum(self.values[i].nbytes for i in indices) + sum(
            int(np.prod(record["shape"])) * self.values[next(i for i in step["outputs"] if i is not None)].itemsize
            for record in step["scratch"]))

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "portable",
            "device": "cpu",
            "numpy": np.__version__,
            "arena_bytes": int(self.arena.nbytes),
            "weights_bytes": int(sum(array.nbytes for array in self.weights.values())),
            "steps": len(self.steps),
            "allocates_intermediates": False,
        }


def _value_indices(encoded: Any) -> List[int]:
    """The graph value indices an encoded step argument refers to (`{"value": i}` at any depth)."""
    if isinstance(encoded, list):
        return [i for item in encoded for i in _value_indices(item)]
    if isinstance(encoded, dict):
        if set(encoded) == {"value"}:
            return [int(encoded["value"])]
        return [i for item in encoded.values() for i in _value_indices(item)]
    return []
