"""Builds one TVM CUDA artifact in a fresh process: `python -m edgedyn.backends.gpu_worker REQUEST.json`.

Note: TVM generates device code at build time only when its CUDA runtime library loads, and that library links
the NVIDIA driver (libcuda.so.1) and libcudart.so.13. A build machine without a GPU has neither, and TVM then
silently ships CUDA *source* for the board to compile. So this worker loads the real driver where there is one,
or a stub that answers "no device" to every call (compiled here from the symbols TVM's library imports), before
TVM is imported; the device code itself is compiled to PTX by NVRTC. A separate process keeps the stub out of
the user's process (where it would shadow a real driver) and works even when the caller imported TVM already.
"""
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

_STUB_SOURCE = """/* edgedyn build stub for libcuda.so.1: no GPU here, every driver call reports CUDA_ERROR_NO_DEVICE. */
static const char no_device[] = "CUDA_ERROR_NO_DEVICE (edgedyn build stub: no GPU on this machine)";
int cuGetErrorName(int error, const char **text) { if (text) *text = no_device; return 0; }
int cuGetErrorString(int error, const char **text) { if (text) *text = no_device; return 0; }
"""
_STUB_FUNCTION = "int {}(void) {{ return 100; }}\n"


def _tvm_lib_dir() -> Path:
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("apache-tvm is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def _driver_symbols(library: Path) -> List[str]:
    listing = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in listing.stdout.splitlines() if line.split()]
    return sorted(n for n in names if n.startswith("cu") and n[2:3].isupper())


def _stub_driver(cache: Path) -> Path:
    """Compiles (once per TVM build) a libcuda.so.1 exporting what TVM's CUDA runtime links."""
    symbols = _driver_symbols(_tvm_lib_dir() / "libtvm_runtime_cuda.so")
    source = _STUB_SOURCE + "".join(_STUB_FUNCTION.format(s) for s in symbols
                                    if s not in ("cuGetErrorName", "cuGetErrorString"))
    import hashlib

    directory = cache / "cuda-stub" / hashlib.sha256(source.encode()).hexdigest()[:16]
    library = directory / "libcuda.so.1"
    if not library.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "stub.c").write_text(source)
        partial = directory / ".libcuda.so.1.partial"
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(partial),
                        str(directory / "stub.c")], check=True, capture_output=True)
        os.replace(str(partial), str(library))
    return library


def _cudart() -> str:
    """libcudart.so.13 from NVIDIA's pip wheel, a CUDA toolkit, or the loader's search path."""
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec and spec.submodule_search_locations else []):
        candidates.append(Path(root) / "cu13" / "lib" / "libcudart.so.13")
    candidates += [Path("/usr/local/cuda/lib64/libcudart.so.13")]
    for path in candidates:
        if path.is_file():
            return str(path)
    return "libcudart.so.13"


def load_driver(cache: Path) -> str:
    """Loads the real CUDA driver if present, else the stub; returns which. Must run before `import tvm`."""
    ctypes.CDLL(_cudart(), mode=ctypes.RTLD_GLOBAL)
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return "real"
    except OSError:
        ctypes.CDLL(str(_stub_driver(cache)), mode=ctypes.RTLD_GLOBAL)
        return "stub"


def build(request: Dict[str, Any]) -> Dict[str, Any]:
    out = Path(request["out"])
    driver = load_driver(Path(request["cache"]))
    kernels = []  # type: List[bytes]

    import numpy as np
    import torch
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from edgedyn.backends import nvrtc
    from edgedyn.runtime.format import pack_arrays

    arch = request["target"]["tvm"]["arch"]

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code: str, *unused: Any) -> bytes:
        kernels.append(nvrtc.compile_to_ptx(code, arch))
        return kernels[-1]

    if not tvm.runtime.enabled("cuda"):
        raise RuntimeError("TVM's CUDA runtime did not load (driver: {}); GPU code would not be compiled".format(driver))
    program = torch.export.load(request["program"])
    module = from_exported_program(program, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    module, params = relax.frontend.detach_params(module)
    weights = [p.numpy() for p in params.get("main", [])]
    module = relax.transform.DecomposeOpsForInference()(module)
    if request["precision"] == "fp16":
        module = relax.transform.ToMixedPrecision(out_dtype="float32")(module)
    target = tvm.target.Target(request["target"]["tvm"], host=tvm.target.Target(request["target"]["tvm_host"]))
    with target:
        executable = tvm.compile(module, target, relax_pipeline=relax.get_default_pipeline(target))
    library = out / "model.so"
    if request.get("cross_compiler"):
        from tvm.support import cc

        executable.export_library(str(library), fcompile=cc.cross_compiler(request["cross_compiler"]))
    else:
        executable.export_library(str(library))
    (out / "kernels.ptx").write_bytes(b"\n".join(kernels))
    order = ["w{:04d}".format(i) for i in range(len(weights))]
    (out / "weights.npz").write_bytes(pack_arrays(dict(zip(order, weights))))
    result = {"driver": driver, "weight_order": order, "nvrtc": nvrtc.version(), "kernel_modules": len(kernels)}
    if request["precision"] == "fp16" and request.get("reference"):
        result["accuracy"] = _fp16_accuracy_on_cpu(module, request, np)
    return result


def _fp16_accuracy_on_cpu(module: Any, request: Dict[str, Any], np: Any) -> List[Dict[str, float]]:
    """Runs the mixed-precision graph on this machine's CPU against torch's fp32 outputs: what fp16 costs."""
    import tvm
    from tvm import relax

    target = tvm.target.Target({"kind": "llvm"})
    executable = tvm.compile(module, target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    with np.load(request["reference"], allow_pickle=False) as data:
        inputs = [data["input." + name] for name in request["tensor_inputs"]]
        expected = [data[k] for k in sorted((k for k in data.files if k.startswith("output.")),
                                            key=lambda k: int(k.split(".")[1]))]
    with np.load(str(Path(request["out"]) / "weights.npz"), allow_pickle=False) as data:
        weights = [data[k] for k in sorted(data.files)]
    result = vm["main"](*[tvm.runtime.tensor(a) for a in inputs + weights])
    actual = [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]
    report = []
    for got, want in zip(actual, expected):
        got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
        cosine = float(np.dot(got, want) / (np.linalg.norm(got) * np.linalg.norm(want) + 1e-30))
        report.append({"max_abs_error": float(np.max(np.abs(got - want))), "cosine": cosine,
                       "max_rel_error": float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))})
    return report


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    result = build(request)
    handle, partial = tempfile.mkstemp(dir=request["out"])
    with os.fdopen(handle, "w") as stream:
        json.dump(result, stream)
    os.replace(partial, str(Path(request["out"]) / "result.json"))


if __name__ == "__main__":
    main()
