"""Program.__call__ from many threads at once gives, on every backend, exactly what single-threaded calls give."""
import threading
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn.runtime as rt

THREADS = 8
CALLS = 200
BACKENDS = ("onnxruntime", "openvino", "tflite", "tvm", "portable")


def _inputs(program: rt.Program, seed: int) -> Dict[str, Any]:
    """Fresh random arguments for the first specialization, distinct for every seed."""
    spec = program.specializations[0]
    values = dict(spec.record["constants"])
    rng = np.random.default_rng(seed)
    for record in spec.record["inputs"]:
        values[record["name"]] = rng.standard_normal(record["shape"]).astype(np.float32)
    return values


def _run_threads(program: rt.Program) -> List[List[np.ndarray]]:
    """Each thread makes CALLS calls on its own inputs; all threads start together."""
    results = [[] for _ in range(THREADS)]  # type: List[List[np.ndarray]]
    errors = []  # type: List[BaseException]
    barrier = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        try:
            barrier.wait()
            for call in range(CALLS):
                results[thread].append(program(**_inputs(program, thread * CALLS + call)))
        except BaseException as error:  # re-raised in the main thread, where pytest sees it
            errors.append(error)

    workers = [threading.Thread(target=work, args=(index,)) for index in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("model", ["tiny_cnn", "transformer_block"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_match_single_threaded_calls(export_example: Any, model: str, backend: str) -> None:
    program = rt.load(export_example(model, backend=backend))
    concurrent = _run_threads(program)
    mismatches = []
    for thread in range(THREADS):
        for call in range(CALLS):
            expected = program(**_inputs(program, thread * CALLS + call))
            if not np.array_equal(concurrent[thread][call], expected):
                mismatches.append((thread, call))
    assert not mismatches, "{} of {} concurrent calls differ from single-threaded ones, first {}".format(
        len(mismatches), THREADS * CALLS, mismatches[:5])


def test_each_thread_has_its_own_portable_arena(export_example: Any) -> None:
    program = rt.load(export_example("tiny_cnn", backend="portable"))
    executor = program.specializations[0].executor
    arenas = []

    def grab() -> None:
        arenas.append(executor.arena)

    worker = threading.Thread(target=grab)
    worker.start()
    worker.join()
    assert arenas[0].ctypes.data != executor.arena.ctypes.data
