"""Single-operator TFLite files with crafted integer inputs (axes, permutations, shapes, slice bounds, indices,
pads, multiples, operator options), each run by LiteRT in a process of its own: which ones crash LiteRT, and
whether the runtime's flatbuffer reader (runtime/executors/litert.py) refuses every one that does before LiteRT
sees it. scripts/fuzz.py mutates whole bundles' bytes; this crafts what an edited file would say on purpose.

    python3 scripts/fuzz_tflite_ops.py [--ops REVERSE_V2,TRANSPOSE,...] [--files N] [--seed S]

Exit status 1 when a file crashed LiteRT and the reader let it through. docs/robustness.md has the last campaign.
"""
import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPE = [1, 3, 4, 5]
RUN = """
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
interpreter = Interpreter(model_path=sys.argv[1]); interpreter.allocate_tensors()
interpreter.set_tensor(interpreter.get_input_details()[0]["index"], np.ones({}, np.float32)); interpreter.invoke()
interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
""".format(SHAPE)


def _ints(r: random.Random, low: int, high: int, longest: int) -> List[int]:
    return [r.randint(low, high) for _ in range(r.randint(0, longest))]


def _operators() -> Dict[str, Callable[[random.Random], Tuple[List[Any], str, Dict[str, Any]]]]:
    """op -> (random) -> (its inputs after the image: int32 arrays, options table, option fields)."""
    def array(values: List[int], *shape: int) -> np.ndarray:
        return np.asarray(values, np.int32).reshape(shape or (-1,))

    def sliced(r: random.Random) -> Tuple[List[Any], str, Dict[str, Any]]:
        n = r.choice([3, 4, 4, 5])
        bounds = [array([r.randint(-8, 8) for _ in range(n)]) for _ in range(2)]
        return bounds + [array([r.randint(-3, 3) for _ in range(n)])], "StridedSliceOptions", {
            "begin_mask": r.randint(0, 31), "end_mask": r.randint(0, 31),
            "shrink_axis_mask": r.randint(0, 31) if r.random() < 0.3 else 0}

    return {
        "REVERSE_V2": lambda r: ([array(_ints(r, -6, 8, 5))], "", {}),
        "TRANSPOSE": lambda r: ([array(_ints(r, -2, 5, 6))], "TransposeOptions", {}),
        "RESHAPE": lambda r: ([array(_ints(r, -3, 70, 5))], "", {}),
        "MEAN": lambda r: ([array(_ints(r, -6, 8, 5))], "ReducerOptions", {"keep_dims": r.random() < 0.5}),
        "GATHER": lambda r: ([array(_ints(r, -10, 10, 4))], "GatherOptions",
                             {"axis": r.randint(-5, 5), "batch_dims": r.randint(-1, 2)}),
        "TILE": lambda r: ([array(_ints(r, -2, 4, 5))], "", {}),
        "PAD": lambda r: ([array([r.randint(-3, 5) for _ in range(2 * r.choice([3, 4, 4, 5]))], -1, 2)], "", {}),
        "CONCATENATION": lambda r: ([], "ConcatenationOptions", {"axis": r.randint(-6, 6)}),
        "STRIDED_SLICE": sliced,
    }


def crafted(op: str, r: random.Random) -> bytes:
    from edgedyn.backends.tflite.writer import ModelWriter

    arrays, options, fields = _operators()[op](r)
    writer = ModelWriter()
    image = writer.tensor("x", SHAPE)
    out = writer.tensor("out", SHAPE)
    inputs = [image] + ([image] if op == "CONCATENATION" else []) + [writer.constant(a) for a in arrays]
    writer.operator(op, inputs, [out], options or None, **fields)
    return writer.finish([image], [out], "crafted", None)


def main() -> int:
    from edgedyn.runtime.executors.litert import read_tflite

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(_operators()), help="operator kinds, comma-separated")
    parser.add_argument("--files", type=int, default=25, help="crafted files per kind")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    missed = 0
    with tempfile.TemporaryDirectory(prefix="edgedyn-tflite-ops-") as scratch:
        path = Path(scratch) / "crafted.tflite"
        for op in args.ops.split(","):
            crashed, refused = [], 0
            for number in range(args.files):
                data = crafted(op, random.Random("{}-{}-{}".format(args.seed, op, number)))
                path.write_bytes(data)
                run = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True, timeout=120)
                if run.returncode < 0:  # killed by a signal: LiteRT crashed
                    crashed.append(number)
                    refused += bool(read_tflite(data)[1])
            missed += len(crashed) - refused
            print("{:<14} {:>4} files  {:>3} crashed LiteRT  {:>3} of those refused by edgedyn's reader{}".format(
                op, args.files, len(crashed), refused, "" if refused == len(crashed) else "  <- NOT REFUSED"),
                flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
