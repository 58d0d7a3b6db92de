"""Runs a TVM Relax VM executable (`.so` built by edgedyn's TVM backend) with weights from an `.npz` member."""
import os
import re
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from edgedyn.runtime import profiling
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


# The packed functions a TVM library calls for `edgedyn::nms` and top-k (edgedyn/backends/tvm_nms.py); registered
# here, before a library is loaded, as the portable executor's numpy kernels, so both run one definition.
NMS_FUNCTION = "edgedyn.nms"
TOPK_FUNCTION = "edgedyn.topk"


def register_kernels(tvm: Any) -> None:
    """Registers edgedyn's own ops as TVM packed functions (idempotent)."""
    from edgedyn.runtime.kernels.detection import nms
    from edgedyn.runtime.kernels.select import topk

    def run_nms(*arguments: Any) -> None:
        boxes, scores = arguments[0].numpy(), arguments[1].numpy()
        labels = arguments[2].numpy() if len(arguments) == 6 else None
        iou, keep, count = arguments[-3].numpy(), arguments[-2], arguments[-1]
        kept, found = nms(boxes, scores, labels, float(iou), int(keep.shape[0]))
        keep.copyfrom(kept)
        count.copyfrom(np.asarray(found, np.int64))

    def run_topk(x: Any, k: Any, dim: Any, largest: Any, values: Any, indices: Any) -> None:
        chosen, picked = topk(x.numpy(), int(k.numpy()), int(dim.numpy()), bool(largest.numpy()))
        values.copyfrom(np.asarray(picked, order="C"))
        indices.copyfrom(np.asarray(chosen, order="C"))

    tvm.register_global_func(NMS_FUNCTION, run_nms, override=True)
    tvm.register_global_func(TOPK_FUNCTION, run_topk, override=True)


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
        register_kernels(tvm)
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
        return [tensor.numpy() for tensor in _tensors(self._tvm, result)]

    def profile(self, inputs: List[np.ndarray], runs: int,
                between: Callable[[], None] = profiling.nothing) -> Dict[str, Any]:
        """Each VM call (kernel or builtin) timed where it ran, in each of `runs` calls, with the copies in and out
        as rows of their own.

        TVM 0.27's Relax VM has no `profile()` any more (nor the profiler executable behind it); its instrument hook
        calls back into Python before and after every Call instruction, and the time between the two callbacks is
        the call's. What the callbacks themselves take lands in the unattributed row, and the profiled runs'
        latency beside the plain one shows it (tiny_cnn on a 2-core x86 host: profiled runs 118% of the plain
        median with 1 thread, 119% with 2; replaying each kernel back to back instead left out the VM and the
        copies, and on a loaded machine the preemptions that a whole run suffers).
        """
        tvm, device = self._tvm, self._device
        vm, main = self._vms.get()  # this thread's VM: the instrument hook is set on it alone
        clock = time.perf_counter
        current = {}  # type: Dict[str, List[float]]
        # The calls in first-run order; a dict, since the hook looks a symbol up on every call.
        order = {}  # type: Dict[str, None]
        started = []  # type: List[float]

        on_gpu = self.artifact.get("device", "cpu") != "cpu"  # GPU kernels return at launch: wait for each

        def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *call_args: Any) -> int:
            if before_run:
                started.append(clock())
                return 0
            if on_gpu:
                device.sync()
            elapsed = (clock() - started.pop()) * 1000.0
            order.setdefault(symbol, None)
            current.setdefault(symbol, []).append(elapsed)
            return 0

        main(*[tvm.runtime.tensor(array, device) for array in inputs] + self._weights)  # first-call allocations
        walls, per_run = [], []  # type: List[float], List[Dict[str, Any]]
        try:
            for _ in range(runs):
                vm.set_instrument(instrument)  # only for the profiled run: `between` runs this VM unhooked
                current.clear()
                begin = clock()
                args = [tvm.runtime.tensor(array, device) for array in inputs]
                converted = clock()
                result = main(*args, *self._weights)
                device.sync()
                ran = clock()
                for output in _tensors(tvm, result):
                    output.numpy()
                ended = clock()
                walls.append((ended - begin) * 1000.0)
                per_run.append(dict(current, **{"inputs in": [(converted - begin) * 1000.0],
                                                "outputs out": [(ended - ran) * 1000.0]}))
                vm.set_instrument(None)
                between()
        finally:
            vm.set_instrument(None)
        names = ["inputs in"] + list(order) + ["outputs out"]
        ops = [{"name": name, "type": "copy" if name in ("inputs in", "outputs out") else _op_type(name),
                "calls": max(len(run.get(name, ())) for run in per_run)} for name in names]
        return {"source": "TVM Relax VM instrument hook, each call timed where it ran", "ops": ops,
                "wall_ms": walls, "samples_ms": [[sum(run.get(name, ())) for name in names] for run in per_run],
                "unattributed": "the VM between calls and the instrument hook's own Python callbacks"}

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


def _tensors(tvm: Any, result: Any) -> List[Any]:
    """The output tensors of a VM call: one tensor, or a (nested) tuple of them."""
    return [result] if isinstance(result, tvm.runtime.Tensor) else _flatten(result)


def _flatten(result: Any) -> List[Any]:
    items = []
    for item in result:
        if hasattr(item, "numpy"):
            items.append(item)
        else:
            items.extend(_flatten(item))
    return items


def _op_type(symbol: str) -> str:
    """`fused_conv2d1_add1_relu1` -> `fused_conv2d_add_relu`: TVM numbers each part of a kernel's name apart from
    the copies before it."""
    if symbol.startswith("vm.builtin."):
        return symbol
    return "_".join(re.sub(r"(?<=[a-z])\d+$", "", part) for part in symbol.split("_"))
