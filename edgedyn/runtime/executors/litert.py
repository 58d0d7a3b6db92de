"""Runs a .tflite model with LiteRT (`ai-edge-litert`, XNNPACK on by default), or `tflite-runtime` with numpy < 2."""
import contextlib
import os
import struct
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from edgedyn.runtime import precision as precisions
from edgedyn.runtime import profiling, schema
from edgedyn.runtime.format import host_arch
from edgedyn.runtime.errors import BundleError, MissingDependencyError

_HINT = "pip install 'edgedyn[litert]'"
NO_OP_PROFILER = ("LiteRT's Python API (ai-edge-litert, tflite-runtime) offers no per-operator profiler, and XNNPACK "
                  "runs the graph as one delegated node: the row is the whole invoke(); for per-operator times run "
                  "TFLite's benchmark_model --enable_op_profiling=true on the bundle's .tflite member")
# The manifest's fact for a file with a REVERSE_V2 over several axes (a mirrored input, a torch.flip: backends/tflite),
# which tflite-runtime computes wrong: 2.13 reverses only the first axis, and says nothing.
REVERSES_AT_ONCE = "tflite_reverses_axes_at_once"
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


class _Interpreter:
    """One interpreter with its tensors allocated, and the input and output indices in the model's order."""

    def __init__(self, interpreter_class: Any, model: bytes, threads: int) -> None:
        self.interpreter = interpreter_class(model_content=model, num_threads=threads)
        self.interpreter.allocate_tensors()
        # each input in the model's own type: float32 data, int64 token ids (the guards checked the dtypes)
        self.inputs = [(d["index"], d["dtype"]) for d in self.interpreter.get_input_details()]
        self.outputs = [d["index"] for d in self.interpreter.get_output_details()]

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        for (index, dtype), array in zip(self.inputs, inputs):
            self.interpreter.set_tensor(index, np.asarray(array, dtype=dtype, order="C"))
        self.interpreter.invoke()
        return [self.interpreter.get_tensor(index) for index in self.outputs]


class LiteRtExecutor:
    """One LiteRT interpreter over the bundle's .tflite member; inputs and outputs in the torch model's layout.

    An interpreter holds the tensors of the call in flight, so calls take a lock. Measured with 8 threads x 100 calls
    on 2 cores, one locked interpreter took 29 ms (tiny_cnn) and 45 ms (transformer_block), an interpreter per thread
    34 ms and 88 ms: XNNPACK already spreads one call over every core (num_threads), and per-thread interpreters
    only add copies of the tensors and compete for the same cores.
    """

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        interpreter_class, self._package = _interpreter_class()
        if artifact.get(REVERSES_AT_ONCE) and self._package != "ai-edge-litert":
            raise MissingDependencyError(
                "this bundle's TFLite file reverses several axes in one REVERSE_V2, which {} computes wrong (it "
                "reverses only the first)".format(self._package),
                hint="run it with ai-edge-litert (Python >= 3.10: {}), or export it for this board".format(_HINT))
        self._model = bundle.read(artifact["files"]["model"])  # kept alive: the interpreter reads it in place
        _check_model(self._model, options.get("declared_bytes"), bundle, artifact["files"]["model"])
        self._threads = int(options.get("threads") or os.cpu_count() or 1)
        with _quiet_native_stderr():
            self._interpreter = _Interpreter(interpreter_class, self._model, self._threads)
        self._lock = threading.Lock()
        self.artifact = artifact
        requested = artifact.get("precision", precisions.FP32)
        if requested not in precisions.PRECISIONS:
            raise BundleError("artifact precision {} is not one of {}".format(
                schema.short(requested), ", ".join(precisions.PRECISIONS)), hint=schema.HINT)
        # XNNPACK decides by itself from the model's reduced_precision_support metadata and the CPU (see
        # backends/tflite): the same rule as runtime/precision.py's, which says what it will do here.
        self._precision = precisions.effective(requested, host_arch())

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        with self._lock:
            return self._interpreter.run(inputs)

    def profile(self, inputs: List[np.ndarray], runs: int,
                between: Callable[[], None] = profiling.nothing) -> Dict[str, Any]:
        """Each of `runs` calls split into setting the inputs, invoke() as a whole and reading the outputs: LiteRT's
        Python API has no per-operator profiler (see NO_OP_PROFILER)."""
        clock = time.perf_counter
        interpreter = self._interpreter.interpreter
        self.run(inputs)  # warm-up
        walls, samples = [], []  # type: List[float], List[List[float]]
        for _ in range(runs):
            with self._lock:  # per run: `between` may call run(), which takes the lock
                started = clock()
                for (index, dtype), array in zip(self._interpreter.inputs, inputs):
                    interpreter.set_tensor(index, np.asarray(array, dtype=dtype, order="C"))
                inputs_set = clock()
                interpreter.invoke()
                invoked = clock()
                for index in self._interpreter.outputs:
                    interpreter.get_tensor(index)
                ended = clock()
                walls.append((ended - started) * 1000.0)
                samples.append([(inputs_set - started) * 1000.0, (invoked - inputs_set) * 1000.0,
                                (ended - invoked) * 1000.0])
            between()
        with self._lock:
            counts = {}  # type: Dict[str, int]
            for op in interpreter._get_ops_details():  # the model's operators, as written into the .tflite
                counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
        ops = [{"name": "set_tensor (inputs)", "type": "copy", "calls": len(self._interpreter.inputs)},
               {"name": "invoke ({} operators, not split)".format(sum(counts.values())), "type": "whole graph",
                "calls": 1},
               {"name": "get_tensor (outputs)", "type": "copy", "calls": len(self._interpreter.outputs)}]
        return {"source": "invoke() timed as a whole", "note": NO_OP_PROFILER, "graph_ops": counts, "ops": ops,
                "wall_ms": walls, "samples_ms": samples, "unattributed": "the clock readings between the three parts"}

    def precision(self) -> Tuple[str, Optional[str]]:
        """(the precision XNNPACK computes in here, why it is not the artifact's or None)."""
        return self._precision

    def describe(self) -> Dict[str, Any]:
        described = {"executor": "litert", "device": "cpu", "runtime": self._package, "threads": self._threads,
                     "version": _version(self._package), "calls": "serialized (one interpreter, locked)",
                     "precision": self._precision[0]}
        if self._precision[1]:
            described["precision_note"] = self._precision[1]
        return described


def _check_model(model: bytes, declared: Optional[int], bundle: Any, member: str) -> None:
    """LiteRT allocates every tensor the flatbuffer declares: a damaged or edited shape could ask for gigabytes and
    still run. The declared total must stay near what the manifest says the graph needs (its unplanned tensors,
    plus the weights the file itself holds; measured 1.5x and 1.9x on tiny_cnn and transformer_block). And no
    operator LiteRT is known to crash on."""
    try:
        needed, crash = read_tflite(model)
    except (ValueError, IndexError, struct.error) as error:
        raise BundleError("bundle {}: {} is not a readable TFLite flatbuffer ({})".format(
            bundle.path, member, schema.short(str(error))), hint=schema.HINT)
    if crash:
        raise BundleError("bundle {}: {} has {} (LiteRT would crash on it)".format(bundle.path, member, crash),
                          hint=schema.HINT)
    limit = 4 * ((declared if declared is not None else 16 * len(model)) + len(model)) + (1 << 20)
    if needed > limit:
        raise BundleError("bundle {}: {} declares tensors of {} bytes, far above the {} its manifest allows".format(
            bundle.path, member, needed, limit), hint=schema.HINT)


# The TFLite flatbuffer read before LiteRT sees it: what its tensors will allocate.
# Bytes per element of each TFLite TensorType (schema.fbs order); unknown types count as 16 bytes.
_TFLITE_ITEM = (4, 2, 4, 1, 8, 1, 1, 2, 8, 1, 8, 16, 8, 1, 1, 4, 2, 1)
_REVERSE_V2 = 105  # BuiltinOperator: LiteRT 2.x dereferences past the axis tensor when it has no element


def read_tflite(data: bytes) -> Tuple[int, Optional[str]]:
    """The bytes every tensor of every subgraph declares (shape x type), or the first operator LiteRT is known to
    crash on (a REVERSE_V2 without an axis: found by crafting each op's integer inputs) in words, read straight from
    the flatbuffer with each offset bounds-checked; raises ValueError for a file whose tables point outside it."""
    def u32(position: int) -> int:
        return struct.unpack_from("<I", data, position)[0]

    def field(table: int, index: int) -> int:
        vtable = table - struct.unpack_from("<i", data, table)[0]
        length = struct.unpack_from("<H", data, vtable)[0]
        if 4 + 2 * index >= length:
            return 0
        offset = struct.unpack_from("<H", data, vtable + 4 + 2 * index)[0]
        return table + offset if offset else 0

    def vector(position: int) -> Tuple[int, int]:
        start = position + u32(position)
        count = u32(start)
        if start + 4 + 4 * count > len(data):
            raise ValueError("a vector runs past the end of the file")
        return start + 4, count

    def tables(table: int, index: int) -> List[int]:
        position = field(table, index)
        if not position:
            return []
        start, count = vector(position)
        return [start + 4 * i + u32(start + 4 * i) for i in range(count)]

    def ints(position: int, most: int) -> List[int]:
        """The int32 vector at `position`, refused before it is read when longer than `most`."""
        if not position:
            return []
        start, count = vector(position)
        if count > most:
            raise ValueError("a vector of {} where at most {} belong".format(count, most))
        return [struct.unpack_from("<i", data, start + 4 * i)[0] for i in range(count)]

    # OperatorCode.builtin_code (an int32), else its deprecated byte for files that predate it
    codes = [struct.unpack_from("<i", data, field(code, 3))[0] if field(code, 3) else
             (data[field(code, 0)] if field(code, 0) else 0) for code in tables(u32(0), 1)]
    total = 0
    for number, subgraph in enumerate(tables(u32(0), 2)):  # Model.subgraphs
        empty = set()  # tensors with no element
        for index, tensor in enumerate(tables(subgraph, 0)):  # SubGraph.tensors
            shape, kind = ints(field(tensor, 0), schema.MAX_RANK), field(tensor, 1)
            if 0 in shape:
                empty.add(index)
            count = 1
            for dim in shape:
                count *= max(dim, 1)
            item = data[kind] if kind else 0
            total += count * (_TFLITE_ITEM[item] if item < len(_TFLITE_ITEM) else 16)
        for position, operator in enumerate(tables(subgraph, 3)):  # SubGraph.operators
            opcode, inputs = field(operator, 0), field(operator, 1)
            index = u32(opcode) if opcode else 0  # a flatbuffer leaves a field at its default (0) out
            if index >= len(codes) or codes[index] != _REVERSE_V2 or not inputs:
                continue
            start, count = vector(inputs)
            if count > 1 and struct.unpack_from("<i", data, start + 4)[0] in empty:  # its axis tensor
                return total, "a REVERSE_V2 with no axis (subgraph {}, operator {})".format(number, position)
    return total, None


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
