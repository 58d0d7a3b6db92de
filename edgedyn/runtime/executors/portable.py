"""Runs a portable graph (edgedyn's own format, see edgedyn/backends/portable.py) with numpy kernels.

Every input, intermediate, output and kernel scratch buffer is a view of one arena (one per calling thread, the
first built when the bundle is loaded), at the offsets the memory plan chose; each step is prepared once (views, reshapes), so a call copies the
inputs in, runs the steps and copies the outputs out: no allocation for intermediates.
Standard library and numpy >= 1.19 only, Python 3.8 syntax: this file runs on the board.
"""
import time
from typing import Any, Callable, Dict, List

import numpy as np

from edgedyn.runtime import graph_schema, kernels, profiling, schema
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.threads import PerThread

# The graph.json format this executor reads (checked in runtime/graph_schema.py); the portable backend writes it with
# these constants.
GRAPH_FORMAT = graph_schema.PORTABLE_FORMAT
GRAPH_FORMAT_VERSION = graph_schema.PORTABLE_VERSION


def _arena_limit(artifact: Dict[str, Any]) -> int:
    """The most arena a graph may ask for: what the manifest planned when it says, never more than this machine's
    memory (an arena per calling thread is allocated from this number)."""
    physical = schema.machine_memory()
    planned = artifact.get("memory", {}).get("arena_bytes") if isinstance(artifact.get("memory"), dict) else None
    return min(planned, physical) if isinstance(planned, int) and planned >= 0 else physical


class _Arena:
    """One arena with every value viewed in it and every step prepared over those views (one per thread)."""

    def __init__(self, graph: Dict[str, Any], weights: Dict[str, np.ndarray], checker: schema.Checker,
                 pool: Any = None) -> None:
        self.weights = weights
        self.checker = checker
        if pool is not None:  # the buckets of a group share this thread's buffer (runtime/buckets.py ArenaPool)
            self.arena = pool.get(int(graph["arena_bytes"]))[:int(graph["arena_bytes"])]
        else:
            alignment = int(graph.get("alignment", 64))
            raw = np.zeros(int(graph["arena_bytes"]) + alignment, np.uint8)
            start = (-raw.ctypes.data) % alignment
            self.arena = raw[start:start + int(graph["arena_bytes"])]
        self.values = [self._view(record) for record in graph["values"]]
        self.inputs = [self.values[i] for i in graph["inputs"]]
        self.outputs = [self.values[i] for i in graph["outputs"]]
        self.steps = [self._prepare(step, "steps[{}]".format(i))
                      for i, step in enumerate(graph["steps"])]  # type: List[Callable[[], None]]

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

    def _prepare(self, step: Dict[str, Any], where: str) -> Callable[[], None]:
        outs = [self.values[i] if i is not None else None for i in step["outputs"]]
        dtype = next(o for o in outs if o is not None).dtype
        args = self._decode(step["args"])
        kwargs = {key: self._decode(item) for key, item in step["kwargs"].items()}
        graph_schema.check_step_views(self.checker, where, step["op"], outs, args, kwargs, step["scratch"], kernels)
        scratch = [self._scratch(record, dtype) for record in step["scratch"]]
        try:
            return kernels.KERNELS[step["op"]](outs, args, kwargs, scratch)
        except Exception as error:  # arguments of the wrong kind or shape for this op
            raise self.checker.fail(where, "{} cannot be prepared ({})".format(step["op"], schema.short(str(error))))

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



class PortableExecutor:
    """The graph and weights, read once; an arena per calling thread (threads.PerThread), since a call writes
    every intermediate into its arena."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        files = artifact["files"]
        for role in ("graph", "weights"):
            if role not in files:
                raise BundleError("bundle {}: the portable artifact names no {} member".format(bundle.path, role))
        graph = bundle.json(files["graph"])
        self.weights = bundle.arrays(files["weights"])
        graph_schema.check_portable_graph(graph, bundle.path, files["graph"], self.weights, kernels,
                                          _arena_limit(artifact))
        checker = schema.Checker(bundle.path, files["graph"])
        pool = options.get("arena_pool")
        if pool is not None:
            pool.reserve(int(graph["arena_bytes"]))
        self._arenas = PerThread(lambda: _Arena(graph, self.weights, checker, pool))
        self.shared_arena = pool is not None
        self.graph = graph
        self.artifact = artifact

    @property
    def arena(self) -> np.ndarray:
        """This thread's arena."""
        return self._arenas.get().arena

    @property
    def outputs(self) -> List[np.ndarray]:
        """This thread's output views in its arena."""
        return self._arenas.get().outputs

    @property
    def values(self) -> List[np.ndarray]:
        """This thread's views of every graph value (graph.json's `values`, in order)."""
        return self._arenas.get().values

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        return self._arenas.get().run(inputs)

    def profile(self, inputs: List[np.ndarray], runs: int,
                between: Callable[[], None] = profiling.nothing) -> Dict[str, Any]:
        """Each step timed in every one of `runs` calls in this thread's arena, with the copies in and out as rows
        of their own, less the timer's own cost (runtime/profiling.py sums them)."""
        arena = self._arenas.get()
        clock = time.perf_counter
        overhead_ms = profiling.clock_overhead_s(clock) * 1000.0
        walls, samples = [], []  # type: List[float], List[List[float]]
        with np.errstate(over="ignore", under="ignore"):
            for _ in range(runs):
                times = []
                started = clock()
                for target, array in zip(arena.inputs, inputs):
                    np.copyto(target, array, casting="same_kind")
                times.append(clock())
                for step in arena.steps:
                    step()
                    times.append(clock())
                for output in arena.outputs:
                    np.array(output, order="C")  # the copy run() returns
                ended = clock()
                times.append(ended)
                walls.append((ended - started) * 1000.0)
                marks = [started] + times
                samples.append([max(0.0, (after - before) * 1000.0 - overhead_ms)
                                for before, after in zip(marks, marks[1:])])
                between()
        ops = ([{"name": "inputs in", "type": "copy", "calls": 1}] +
               [{"name": record["name"], "type": record["op"], "calls": 1,
                 "bytes": _bytes_touched(arena.values, record)} for record in self.graph["steps"]] +
               [{"name": "outputs out", "type": "copy", "calls": 1}])
        return {"source": "portable executor timers (perf_counter between kernel calls, less {:.2f} us each for "
                          "the clock itself)".format(overhead_ms * 1000.0),
                "ops": ops, "wall_ms": walls, "samples_ms": samples,
                "unattributed": "the loop between steps and the timer's own cost (subtracted from each step)"}

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "portable",
            "device": "cpu",
            "numpy": np.__version__,
            "arena_bytes": int(self.arena.nbytes),
            "weights_bytes": int(sum(array.nbytes for array in self.weights.values())),
            "steps": len(self.graph["steps"]),
            "allocates_intermediates": False,
            "arena_per_thread": True,
            "arena_shared_by_buckets": self.shared_arena,
        }


def _bytes_touched(values: List[np.ndarray], step: Dict[str, Any]) -> int:
    """Bytes a step reads and writes: its argument and output arrays and its scratch, each counted once."""
    indices = set(i for i in step["outputs"] if i is not None)
    indices.update(_value_indices(step["args"]))
    indices.update(_value_indices(step["kwargs"]))
    itemsize = values[next(i for i in step["outputs"] if i is not None)].itemsize
    return int(sum(values[i].nbytes for i in indices) + sum(int(np.prod(record["shape"])) * itemsize
                                                           for record in step["scratch"]))


def _value_indices(encoded: Any) -> List[int]:
    """The graph value indices an encoded step argument refers to (`{"value": i}` at any depth)."""
    if isinstance(encoded, list):
        return [i for item in encoded for i in _value_indices(item)]
    if isinstance(encoded, dict):
        if set(encoded) == {"value"}:
            return [int(encoded["value"])]
        return [i for item in encoded.values() for i in _value_indices(item)]
    return []
