"""Builds one TVM CUDA artifact in a fresh process: `python -m edgedyn.backends.gpu_worker REQUEST.json`.

Note: TVM generates device code at build time only when its CUDA runtime library loads, and that library links
the NVIDIA driver (libcuda.so.1) and libcudart.so.13. A build machine without a GPU has neither, and TVM then
silently ships CUDA *source* for the board to compile. So this worker loads the real driver where there is one,
or a stub that answers "no device" to every call (compiled here from the symbols TVM's library imports), before
TVM is imported; the device code itself is compiled to PTX by NVRTC. A separate process keeps the stub out of
the user's process (where it would shadow a real driver) and works even when the caller imported TVM already.

Each TIR function gets the first dlight GPU rule that schedules it: TVM's own ApplyDefaultSchedule lets one rule's
assertion (Matmul on a convolution fused with a following pad, as in transformers' MobileNetV2) end the whole
build, although a later rule would have scheduled that function. Which rule each function got, and why earlier
ones failed, goes into result.json; a function no rule schedules ends the build with failure.json saying so.
"""
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

# dlight's GPU rules in TVM's default order (relax/backend/cuda/pipeline.py); Fallback schedules any function
# that fits the GPU's thread limits, so it comes last.
RULES = ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")
# Tries only these rules (comma-separated, in RULES' order): to see what a rule does alone, and for tests that
# need a rule to fail on a real graph.
RULES_VARIABLE = "EDGEDYN_DLIGHT_RULES"


def rules() -> Tuple[str, ...]:
    """RULES, or the subset RULES_VARIABLE names; an unknown name is an error that lists the valid ones."""
    given = os.environ.get(RULES_VARIABLE, "").strip()
    if not given:
        return RULES
    chosen = tuple(name.strip() for name in given.split(",") if name.strip())
    unknown = [name for name in chosen if name not in RULES]
    if unknown:
        raise ValueError("{}: unknown dlight rule {}; choose from: {}".format(
            RULES_VARIABLE, ", ".join(unknown), ", ".join(RULES)))
    return tuple(name for name in RULES if name in chosen)


class ScheduleFailure(Exception):
    """Some function could not be scheduled by any rule: the GPU build cannot produce device code for it.
    `functions` maps each such TIR function to {rule: why it failed}, for the manifest."""

    def __init__(self, functions: Dict[str, Dict[str, str]]) -> None:
        super().__init__(_unscheduled_reason(functions))
        self.functions = functions

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
    import edgedyn.frontend.nms  # noqa: F401  (registers edgedyn::nms, which a detector's saved program holds)
    from edgedyn.backends import tvm_nms

    program = torch.export.load(request["program"])
    module = from_exported_program(program, keep_params_as_input=True, unwrap_unit_return_tuple=True,
                                   custom_convert_map=tvm_nms.convert_map())
    module, params = relax.frontend.detach_params(module)
    weights = [p.numpy() for p in params.get("main", [])]
    module = relax.transform.DecomposeOpsForInference()(module)
    if request["precision"] == "fp16":
        module = relax.transform.ToMixedPrecision(out_dtype="float32")(module)
    target = tvm.target.Target(request["target"]["tvm"], host=tvm.target.Target(request["target"]["tvm_host"]))
    schedules = new_schedules()
    with target:
        try:
            executable = tvm.compile(module, target, relax_pipeline=_cuda_pipeline(tvm, relax, target, schedules))
        except Exception as error:
            # TVM's FFI re-raises what a pass raised as a plain RuntimeError: the record says whether it was ours
            if schedules["unscheduled"] or schedules["no_rule"]:
                raise ScheduleFailure(_without_gpu_code(schedules, error)) from error
            raise
    del schedules["unscheduled"], schedules["no_rule"]
    library = out / "model.so"
    if request.get("cross_compiler"):
        from tvm.support import cc

        executable.export_library(str(library), fcompile=cc.cross_compiler(request["cross_compiler"]))
    else:
        executable.export_library(str(library))
    (out / "kernels.ptx").write_bytes(b"\n".join(kernels))
    order = ["w{:04d}".format(i) for i in range(len(weights))]
    (out / "weights.npz").write_bytes(pack_arrays(dict(zip(order, weights))))
    result = {"driver": driver, "weight_order": order, "nvrtc": nvrtc.version(), "kernel_modules": len(kernels),
              "schedules": schedules}
    if request["precision"] == "fp16" and request.get("reference"):
        result["accuracy"] = _fp16_accuracy_on_cpu(module, request, np)
    return result


def new_schedules() -> Dict[str, Dict[str, Any]]:
    """The record `_first_working_rule` fills: each function's rule, the rules that failed before it, and the
    functions left without GPU code (every rule failed / no rule applies), which stop the build."""
    return {"rules": {}, "rule_failures": {}, "unscheduled": {}, "no_rule": {}}


def _cuda_pipeline(tvm: Any, relax: Any, target: Any, schedules: Dict[str, Dict[str, Any]]) -> Any:
    """TVM's default CUDA pipeline with its ApplyDefaultSchedule replaced by `_first_working_rule`."""
    from tvm.relax.backend.cuda import pipeline

    legalize = [p for p in pipeline.legalize_passes(target) if p.info.name != "ApplyDefaultSchedule"]

    @tvm.transform.module_pass(opt_level=0, name="EdgedynFirstWorkingRule")
    def schedule(mod: Any, _ctx: Any) -> Any:
        return _first_working_rule(tvm, mod, target, schedules)

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        with target:
            return tvm.transform.Sequential(
                pipeline.library_dispatch_passes(target) + legalize + [schedule]
                + pipeline.dataflow_lower_passes(target) + pipeline.finalize_passes(target))(mod)

    return _pipeline


def _first_working_rule(tvm: Any, mod: Any, target: Any, schedules: Dict[str, Dict[str, Any]]) -> Any:
    """Schedules every unscheduled TIR function with the first rule of RULES that succeeds, recording which;
    a function that every applicable rule failed on stops the build (recorded in schedules["unscheduled"])."""
    unscheduled = schedules["unscheduled"]
    for g_var, func in list(mod.functions_items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
            continue
        name = g_var.name_hint
        rule, scheduled, failures = _schedule_function(func, target)
        if failures:
            schedules["rule_failures"][name] = failures
        if scheduled is None:
            if failures:
                unscheduled[name] = failures
            else:  # when no rule even applies, TVM's pass leaves the function as it is too
                schedules["no_rule"][name] = True
            continue
        schedules["rules"][name] = rule
        mod[g_var] = scheduled.with_attr("tirx.is_scheduled", True)
    if unscheduled:
        raise ScheduleFailure(_without_gpu_code(schedules))
    return mod


def _without_gpu_code(schedules: Dict[str, Dict[str, Any]], error: Any = None) -> Dict[str, Dict[str, str]]:
    """Every function the build stopped without GPU code for: each rule's failure, or that no rule applies
    (TVM leaves such a function unscheduled and then fails without naming it: `error` is that failure)."""
    functions = {name: dict(failures) for name, failures in schedules["unscheduled"].items()}
    then = "; then TVM failed with {}".format(_one_line(error)) if error is not None and not functions else ""
    functions.update({name: {"dlight": "no GPU rule applies" + then} for name in schedules["no_rule"]})
    return functions


def _unscheduled_reason(unscheduled: Dict[str, Dict[str, str]], shown: int = 3) -> str:
    """The first few functions no rule scheduled, each with every rule's failure (those a rule failed on first,
    then those no rule applies to); a count for the rest."""
    names = sorted(unscheduled, key=lambda name: (list(unscheduled[name]) == ["dlight"], name))
    text = "; ".join("{} ({})".format(name, ", ".join("{}: {}".format(rule, why) for rule, why in sorted(
        unscheduled[name].items()))) for name in names[:shown])
    return text + ("; and {} more".format(len(names) - shown) if len(names) > shown else "")


def _schedule_function(func: Any, target: Any) -> Tuple[str, Any, Dict[str, str]]:
    """(rule name, scheduled function or None, {rule: why it failed}) for the first rule that schedules `func`.
    A rule that does not apply returns None and is skipped silently; one that raises is recorded."""
    from tvm.s_tir import dlight

    failures = {}  # type: Dict[str, str]
    for rule in rules():
        try:
            space = getattr(dlight.gpu, rule)().apply(func, target, False)
        except Exception as error:  # noqa: BLE001 (a rule's internal assertion must not end the build)
            failures[rule] = _one_line(error)
            continue
        if space is None:
            continue
        space = space if isinstance(space, list) else [space]
        return rule, space[0].mod["main"], failures
    return "", None, failures


def _is_scheduled(func: Any) -> bool:
    return "tirx.is_scheduled" in func.attrs and int(func.attrs["tirx.is_scheduled"]) == 1


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return "{}: {}".format(type(error).__name__, lines[-1] if lines else "")[:300]


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


def _write_json(out: str, name: str, data: Dict[str, Any]) -> None:
    handle, partial = tempfile.mkstemp(dir=out)
    with os.fdopen(handle, "w") as stream:
        json.dump(data, stream)
    os.replace(partial, str(Path(out) / name))


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    try:
        result = build(request)
    except ScheduleFailure as error:
        # A known cause, in words, for the parent's message (anything else: the parent shows stderr's tail).
        _write_json(request["out"], "failure.json",
                    {"reason": "no dlight GPU schedule works for: {}".format(error), "functions": error.functions})
        sys.exit(1)
    _write_json(request["out"], "result.json", result)


if __name__ == "__main__":
    main()
