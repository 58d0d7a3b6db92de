"""The call fast path (`FastDispatch` in runtime/program.py): positional arrays of exactly one specialization's dtype
and shape skip binding, and give the same results as the general path; everything else takes the general path,
with the same error messages."""
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import edgedyn
import edgedyn.runtime as rt
from edgedyn.runtime.errors import GuardError

from conftest import assert_matches_torch

pytestmark = pytest.mark.requires("onnxruntime")


def two_inputs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(a * b) + a


@pytest.fixture(scope="module")
def two_input_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-input function at two batch sizes: two specializations the fast path must tell apart."""
    path = tmp_path_factory.mktemp("fast") / "two.edgedyn"
    return edgedyn.export(two_inputs, [(torch.randn(1, 16), torch.randn(1, 16)), (torch.randn(4, 16), torch.randn(4, 16))],
                          board="x86-64", backend="onnxruntime", output=path)


@pytest.fixture(scope="module")
def onnx_example(export_example: Callable[..., Path]) -> Callable[[str], Path]:
    return lambda name: export_example(name, backend="onnxruntime")


def _fresh(shape, seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_positional_arrays_take_the_fast_path_to_the_matching_specialization(two_input_bundle):
    program = rt.load(two_input_bundle)
    for batch, spec in zip((1, 4), program.specializations):
        a, b = _fresh((batch, 16), batch), _fresh((batch, 16), batch + 10)
        chosen, arrays = program._fast.match((a, b))
        assert chosen is spec and arrays[0] is a and arrays[1] is b
        fast = program(a, b)
        want = two_inputs(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
        np.testing.assert_array_equal(fast, program(a=a, b=b))  # the general path (keywords) gives the same


@pytest.mark.parametrize("args", [
    pytest.param(lambda a, b: (a.astype(np.float64), b), id="dtype"),
    pytest.param(lambda a, b: (a[:, :8], b), id="shape"),
    pytest.param(lambda a, b: (a, b[None]), id="rank"),
    pytest.param(lambda a, b: (a.tolist(), b), id="list"),
    pytest.param(lambda a, b: (np.asfortranarray(np.repeat(a, 4, 0)), np.repeat(b, 4, 0)), id="not-contiguous"),
    pytest.param(lambda a, b: (a,), id="missing"),
])
def test_anything_else_takes_the_general_path(two_input_bundle, args):
    program = rt.load(two_input_bundle)
    values = args(_fresh((1, 16), 3), _fresh((1, 16), 4))
    assert program._fast.match(values) is None
    try:
        expected = program.dispatch(*values)[0]
    except GuardError as error:
        with pytest.raises(GuardError) as raised:
            program(*values)
        assert raised.value.message == error.message and raised.value.hint == error.hint
        return
    # Accepted by the guards (a list, a Fortran-ordered array): the general path runs it, with the right result.
    a, b = (np.ascontiguousarray(np.asarray(v, np.float32)) for v in values)
    want = two_inputs(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert expected.name
    np.testing.assert_allclose(program(*values), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_a_wrong_shape_gives_the_general_paths_message(two_input_bundle):
    program = rt.load(two_input_bundle)
    with pytest.raises(GuardError) as raised:
        program(_fresh((2, 16), 5), _fresh((2, 16), 6))
    assert "no specialization of two_inputs matches these arguments" in raised.value.message
    assert "input 'a' dim 0: expected 1, got 2" in raised.value.message
    assert "input 'a' dim 0: expected 4, got 2" in raised.value.message


def test_specialized_constants_are_checked_on_the_fast_path(onnx_example):
    program = rt.load(onnx_example("loop_example"))
    x = _fresh((2, 3), 7)
    assert program._fast.match((x, 4)) is not None
    np.testing.assert_allclose(program(x, 4), x * 24, rtol=1e-6)
    assert program._fast.match((x, 4.0)) is None and program._fast.match((x, True)) is None
    with pytest.raises(GuardError, match="captured with n == 4, got 5"):
        program(x, 5)
    assert_matches_torch(program, "loop_example", seed=3100)


def test_fast_calls_from_many_threads_each_get_their_own_result(two_input_bundle):
    program = rt.load(two_input_bundle)
    inputs = [(_fresh((1, 16), 100 + i), _fresh((1, 16), 200 + i)) for i in range(8)]
    wanted = [two_inputs(torch.from_numpy(a), torch.from_numpy(b)).numpy() for a, b in inputs]
    failures = []

    def work(index: int) -> None:
        for _ in range(200):
            got = program(*inputs[index])
            if not np.allclose(got, wanted[index], rtol=1e-4, atol=1e-5):
                failures.append(index)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_cpu_sessions_call_onnxruntime_natively_with_the_same_results(two_input_bundle):
    program = rt.load(two_input_bundle)
    executor = program.specializations[0].executor
    assert executor._native_run() is not None  # a CPU-only session on an onnxruntime that has one
    a, b = _fresh((1, 16), 41), _fresh((1, 16), 42)
    public = executor._session.run(executor._outputs, {"a": a, "b": b})
    np.testing.assert_array_equal(executor.run([a, b])[0], public[0])


def test_rows_sharing_the_first_arguments_shape_are_told_apart_by_the_rest_in_order():
    """The fast path looks a call up by its first tensor's dtype and shape, then checks the rest row by row in
    manifest order, as dispatch does: specializations that share the first argument's shape stay distinct."""
    from types import SimpleNamespace

    from edgedyn.runtime.fastpath import FastDispatch

    def spec(name: str, a: tuple, b: tuple) -> SimpleNamespace:
        guards = []
        for input_, shape in (("a", a), ("b", b)):
            guards += [{"kind": "tensor", "input": input_}, {"kind": "dtype", "input": input_, "expected": "float32"},
                       {"kind": "rank", "input": input_, "expected": len(shape)}]
            guards += [{"kind": "dim", "input": input_, "index": i, "expected": n} for i, n in enumerate(shape)]
        return SimpleNamespace(name=name, guards=guards, inputs=["a", "b"])

    specs = [spec("wide", (1, 16), (1, 16)), spec("narrow", (1, 16), (1, 1)), spec("batch", (4, 16), (4, 16))]
    fast = FastDispatch([{"name": "a"}, {"name": "b"}], specs)
    for a, b, name in (((1, 16), (1, 16), "wide"), ((1, 16), (1, 1), "narrow"), ((4, 16), (4, 16), "batch")):
        chosen, arrays = fast.match((_fresh(a, 1), _fresh(b, 2)))
        assert chosen.name == name and arrays[0].shape == a and arrays[1].shape == b
    assert fast.match((_fresh((1, 16), 1), _fresh((1, 2), 2))) is None
    assert fast.match((_fresh((2, 16), 1), _fresh((2, 16), 2))) is None
    assert fast.match((_fresh((1, 16), 1, np.float64), _fresh((1, 16), 2))) is None
