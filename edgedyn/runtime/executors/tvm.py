"""Runs a TVM Relax VM executable (`.so` built by edgedyn's TVM backend) with weights from an `.npz` member."""
import os
import re
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np

from edgedyn.runtime.errors import MissingDependencyError
from edgedyn.runtime.threads import PerThread


def _import_tvm() -> Any:
    # Note: on the board only the TVM runtime library is needed; TVM_USE_RUNTIME_LIB=1 skips loading the compiler
    # (five times faster to import under emulation). The CLI's device commands set it; a process that also
    # compiles must not, so it is only a default when nothing imported tvm yet and the caller asked for it.
    try:
        import tvm
        from tvm.runtime import vm  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError(
            "this bundle runs on TVM, but the TVM runtime is not installed ({})".format(error),
            hint="pip install 'edgedyn[tvm]'  (or the apache-tvm wheel for this board's Python)",
        )
    return tvm


class TvmExecutor:
    """A Relax VM per calling thread over one shared library extracted from the bundle."""

    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        tvm = _import_tvm()
        from tvm.runtime import vm as runtime_vm

        files = artifact["files"]
        threads = options.get("threads")
        if threads:
            os.environ["TVM_NUM_THREADS"] = str(int(threads))
        self._tvm = tvm
        if artifact.get("device", "cpu") == "cpu":
            self._device = tvm.cpu(0)
        else:
            if not tvm.runtime.enabled("cuda"):
                raise MissingDependencyError(
                    "the installed TVM runtime has no CUDA support",
                    hint="install a TVM runtime built with CUDA for this board (see the README's Jetson notes)")
            self._device = tvm.cuda(0)
        library = tvm.runtime.load_module(str(bundle.extract(files["library"])))
        weights = bundle.arrays(files["weights"])
        order = artifact["weight_order"]
        # The weights are read-only device tensors, shared; a VM keeps the registers of the call in flight, so each
        # calling thread gets its own (sharing one crashed TVM with two threads).
        self._weights = [tvm.runtime.tensor(weights[key], self._device) for key in order]
        self._vms = PerThread(lambda: _vm_and_main(runtime_vm.VirtualMachine(library, self._device)))
        self.artifact = artifact

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        args = [self._tvm.runtime.tensor(array, self._device) for array in inputs]
        result = self._vms.get()[1](*args, *self._weights)
        if isinstance(result, self._tvm.runtime.Tensor):
            return [result.numpy()]
        return [item.numpy() for item in _flatten(result)]

    def profile(self, inputs: List[np.ndarray], runs: int) -> Dict[str, Any]:
        """Time per VM call: each kernel's median over `runs` replays where it ran; each VM builtin as it ran once.

        TVM 0.27's Relax VM has no `profile()` any more (nor the profiler executable behind it); its instrument hook
        calls back before and after every Call instruction. Timing kernels across that hook measures the hook too:
        between two kernels the Python callback lets TVM's worker threads fall asleep, and each kernel then pays
        their wake-up (3x the real latency on a small CNN). So, right after a kernel ran, the hook calls it once
        more to wake the threads and then `runs` times back to back on the same arguments, still intact then (later
        kernels reuse their storage: replaying afterwards would read garbage, denormals included, and run slow).
        """
        args = [self._tvm.runtime.tensor(array, self._device) for array in inputs] + self._weights
        vm, main = self._vms.get()  # this thread's VM: the instrument hook is set on it alone
        main(*args)  # warm-up: first-call allocations stay out of the profile
        totals = {}  # type: Dict[str, Dict[str, Any]]
        started = []  # type: List[float]
        clock = time.perf_counter

        def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *call_args: Any) -> int:
            if before_run:
                started.append(clock())
                return 0
            elapsed = clock() - started.pop()
            if symbol.startswith("vm.builtin."):
                _add(totals, symbol, elapsed)
                return 0
            func(*call_args)
            self._device.sync()
            times = []
            for _ in range(runs):
                before = clock()
                func(*call_args)
                self._device.sync()
                times.append(clock() - before)
            _add(totals, symbol, float(np.median(times)))
            return 0

        vm.set_instrument(instrument)
        try:
            main(*args)
        finally:
            vm.set_instrument(None)
        return {"source": "TVM Relax VM instrument hook, each kernel replayed back to back", "runs": runs,
                "ops": list(totals.values())}

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "tvm",
            "device": str(self._device),
            "tvm": getattr(self._tvm, "__version__", "unknown"),
            "runtime_only": "tvm.relax" not in sys.modules,
        }


def _vm_and_main(vm: Any) -> Tuple[Any, Any]:
    """A VM and its `main` function, looked up once (each call would otherwise look it up again)."""
    return vm, vm["main"]


def _flatten(result: Any) -> List[Any]:
    items = []
    for item in result:
        if hasattr(item, "numpy"):
            items.append(item)
        else:
            items.extend(_flatten(item))
    return items


def _add(totals: Dict[str, Dict[str, Any]], symbol: str, seconds: float) -> None:
    """One call of `symbol` in the profiled run: copies of one builtin add up into one row."""
    record = totals.setdefault(symbol, {"name": symbol, "type": _op_type(symbol), "ms": 0.0, "calls": 0})
    record["ms"] += seconds * 1000.0
    record["calls"] += 1


def _op_type(symbol: str) -> str:
    """`fused_conv2d1_add1_relu1` -> `fused_conv2d_add_relu`: TVM numbers each part of a kernel's name apart from
    the copies before it."""
    if symbol.startswith("vm.builtin."):
        return symbol
    return "_".join(re.sub(r"(?<=[a-z])\d+$", "", part) for part in symbol.split("_"))
