"""Runs a TVM Relax VM executable (`.so` built by edgedyn's TVM backend) with weights from an `.npz` member."""
import os
import sys
from typing import Any, Dict, List

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
        self._mains = PerThread(lambda: runtime_vm.VirtualMachine(library, self._device)["main"])
        self.artifact = artifact

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        args = [self._tvm.runtime.tensor(array, self._device) for array in inputs]
        result = self._mains.get()(*args, *self._weights)
        if isinstance(result, self._tvm.runtime.Tensor):
            return [result.numpy()]
        return [item.numpy() for item in _flatten(result)]

    def describe(self) -> Dict[str, Any]:
        return {
            "executor": "tvm",
            "device": str(self._device),
            "tvm": getattr(self._tvm, "__version__", "unknown"),
            "runtime_only": "tvm.relax" not in sys.modules,
        }


def _flatten(result: Any) -> List[Any]:
    items = []
    for item in result:
        if hasattr(item, "numpy"):
            items.append(item)
        else:
            items.extend(_flatten(item))
    return items
