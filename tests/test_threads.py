"""Program.__call__ from many threads at once gives, on every backend, exactly what single-threaded calls give."""
import threading
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn.runtime as rt

THREADS = 8
CALLS = 200
BACKENDS = ("onnxruntime", "openvino", "ncnn", "tflite", "tvm", "portable")
# Each backend's second model: ncnn cannot hold the transformer block (tests/test_ncnn_backend.py), so the MLP.
CASES = [(backend, model) for backend in BACKENDS
         for model in ("tiny_cnn", "mlp" if backend == "ncnn" else "transformer_block")]


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


@pytest.mark.parametrize("backend, model", CASES)
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_are_the_callers_and_inputs_are_left_alone(export_example: Any, backend: str) -> None:
    """Executors may read the caller's arrays in place and hand back their own memory (OpenVINO's shared tensors):
    a call's outputs must survive the next call, the inputs must be unchanged, and read-only or strided inputs
    must compute what contiguous copies do."""
    program = rt.load(export_example("tiny_cnn", backend=backend))
    first, second = _inputs(program, 1), _inputs(program, 2)
    kept = {name: np.array(value) for name, value in first.items()}
    out = program(**first)
    out_copy = np.array(out)
    again = program(**second)
    assert np.array_equal(out, out_copy), "the second call changed the first call's outputs"
    assert not np.array_equal(again, out_copy), "two different inputs gave the same outputs"
    assert all(np.array_equal(first[name], kept[name]) for name in kept), "the call changed its inputs"
    odd = {}
    for name, value in first.items():
        if isinstance(value, np.ndarray) and value.ndim:
            wide = np.zeros(value.shape[:-1] + (2 * value.shape[-1],), value.dtype)
            wide[..., ::2] = value
            odd[name] = wide[..., ::2]  # strided: not contiguous
            odd[name].flags.writeable = False
        else:
            odd[name] = value
    assert np.array_equal(program(**odd), out_copy)
