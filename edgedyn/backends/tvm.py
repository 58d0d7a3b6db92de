"""Apache TVM (0.27, Relax): compile the graph for the board's CPU, cross-linking for aarch64 boards."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from edgedyn.backends.artifact import Artifact, Build
from edgedyn.boards import Target
from edgedyn.backends import tuning_records as database
from edgedyn.backends import tvm_nms
from edgedyn.errors import BackendError, GpuBuildError, MissingDependencyError
from edgedyn.runtime.format import cache_dir, host_arch, pack_arrays
from edgedyn.runtime.program import FP32_TOLERANCE


def _import_tvm() -> Any:
    try:
        import tvm
        from tvm import relax  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("the TVM backend needs apache-tvm ({})".format(error),
                                     hint="pip install 'edgedyn[tvm]'")
    return tvm


def lower(build: Build) -> Artifact:
    """Imports the program into Relax, builds it for the build's target (CPU, or CUDA through `lower_cuda`) and
    returns the shared library and weights."""
    program, target = build.program, build.target
    if target.kind == "cuda":
        return lower_cuda(program, target, build.tensor_inputs, build.precision, build.reference)
    if build.precision != "fp32":
        raise BackendError("--precision {} is for GPU artifacts; the TVM CPU build computes in fp32".format(
            build.precision), hint="drop --precision, or export for a board with a GPU")
    tvm = _import_tvm()
    from tvm import relax

    module, weights = import_relax(program)
    tvm_target = target.tvm_target()
    tuning = database.describe(database.database_dir(target.name)) if build.tuning else None
    with tvm_target:
        if tuning is not None:
            module, tuning["tuned_functions"] = apply_tuning_records(module, tuning["database"])
        executable = tvm.compile(module, tvm_target, relax_pipeline=relax.get_default_pipeline(tvm_target))
    library = _export_library(tvm, executable, target)
    order = ["w{:04d}".format(i) for i in range(len(weights))]
    meta = {"weight_order": order, "tvm_target": target.to_dict()["tvm"], "tolerance": dict(FP32_TOLERANCE),
            "requires": {"python": ["apache-tvm"]}}
    if tuning is not None:
        meta["tuning"] = tuning
    return Artifact(
        backend="tvm",
        executor="tvm",
        device=target.kind,
        arch=target.arch,
        target=target.name,
        files={"library": library, "weights": pack_arrays(dict(zip(order, weights)))},
        file_names={"library": "model.so", "weights": "weights.npz"},
        meta=meta,
    )


def import_relax(program: Any) -> Tuple[Any, List[Any]]:
    """The program as a Relax module ready to build (weights as parameters after the inputs), and the weights."""
    _import_tvm()
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from edgedyn.torch_quiet import quiet_torch

    try:
        with quiet_torch():
            module = from_exported_program(program, keep_params_as_input=True, unwrap_unit_return_tuple=True,
                                           custom_convert_map=tvm_nms.convert_map())
    except Exception as error:
        raise BackendError("TVM's torch frontend cannot import this graph: {}".format(_first_line(error)),
                           hint="try --backend with another backend, or report the operator named above")
    module, params = relax.frontend.detach_params(module)
    weights = [p.numpy() for p in params.get("main", [])]
    return relax.transform.DecomposeOpsForInference()(module), weights


def tuning_passes() -> Any:
    """What `static_shape_tuning` does before tuning (under the target): the kernels it tunes are these."""
    from tvm import relax, transform

    return transform.Sequential([relax.transform.CanonicalizeBindings(), relax.get_pipeline("zero")])


def apply_tuning_records(module: Any, folder: str) -> Tuple[Any, int]:
    """Schedules the kernels that MetaSchedule's database in `folder` has records for (call under the target);
    returns the module and how many kernels took a tuned schedule."""
    from tvm import relax

    module = relax.transform.MetaScheduleApplyDatabase(folder)(tuning_passes()(module))
    tuned = sum(1 for _, function in module.functions.items()
                if function.attrs is not None and "tirx.is_scheduled" in function.attrs)  # TVM 0.27: tirx
    return module, tuned


def _export_library(tvm: Any, executable: Any, target: Target) -> bytes:
    """Links the executable into a shared library for the target CPU and returns its bytes, stripped."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-tvm-") as workdir:
        path = Path(workdir) / "model.so"
        if target.cross_compiler and target.arch != host_arch():
            if shutil.which(target.cross_compiler) is None:
                raise MissingDependencyError(
                    "building for {} needs the cross compiler {}, which is not on PATH".format(
                        target.arch, target.cross_compiler),
                    hint="apt-get install g++-aarch64-linux-gnu  (or: bash scripts/install.sh)")
            from tvm.support import cc

            executable.export_library(str(path), fcompile=cc.cross_compiler(target.cross_compiler))
        else:
            executable.export_library(str(path))
        _strip(path, target)
        return path.read_bytes()


def _strip(path: Path, target: Target) -> None:
    """Drops debug info and the build id, which carry temp-dir names and make identical builds differ."""
    strip = "strip"
    if target.cross_compiler and target.arch != host_arch():
        strip = target.cross_compiler.rsplit("-", 1)[0] + "-strip"
    if shutil.which(strip) is None:
        return
    result = subprocess.run([strip, "--strip-debug", "--remove-section=.note.gnu.build-id", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError("{} failed on the TVM library: {}".format(strip, result.stderr.strip()))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return "{}: {}".format(type(error).__name__, text.splitlines()[-1] if text else "")



def lower_cuda(program: Any, target: Target, tensor_inputs: List[str], precision: str,
               reference: Optional[bytes]) -> Artifact:
    """Builds GPU code for a CUDA target in a separate process (see gpu_worker.py) and checks it is really there."""
    import torch

    _require_gpu_toolchain()
    arch = target.tvm["arch"]
    with tempfile.TemporaryDirectory(prefix="edgedyn-cuda-") as workdir:
        work = Path(workdir)
        torch.export.save(program, str(work / "program.pt2"))
        if reference is not None:
            (work / "reference.npz").write_bytes(reference)
        cross = target.cross_compiler if target.cross_compiler and target.arch != host_arch() else None
        if cross and shutil.which(cross) is None:
            raise MissingDependencyError("building for {} needs the cross compiler {}".format(target.arch, cross),
                                         hint="apt-get install g++-aarch64-linux-gnu  (or: bash scripts/install.sh)")
        request = {"program": str(work / "program.pt2"), "out": str(work), "cache": str(cache_dir()),
                   "target": target.to_dict(), "cross_compiler": cross, "precision": precision,
                   "tensor_inputs": tensor_inputs,
                   "reference": str(work / "reference.npz") if reference is not None else None}
        (work / "request.json").write_text(json.dumps(request))
        env = dict(os.environ)
        env.pop("TVM_USE_RUNTIME_LIB", None)
        done = subprocess.run([sys.executable, "-m", "edgedyn.backends.gpu_worker", str(work / "request.json")],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0 or not (work / "result.json").is_file():
            raise _build_failure(arch, work, done.stderr)
        result = json.loads((work / "result.json").read_text())
        _strip(work / "model.so", target)
        library, ptx = (work / "model.so").read_bytes(), (work / "kernels.ptx").read_bytes()
        weights = (work / "weights.npz").read_bytes()
    facts = check_device_code(library, ptx, arch)
    gpu = dict(facts, arch=arch, code_format="ptx", nvrtc=result["nvrtc"], schedules=result["schedules"],
               runtime="apache-tvm built with CUDA (its CUDA runtime calls CUDA 12 driver functions)")
    meta = {"weight_order": result["weight_order"], "tvm_target": target.to_dict()["tvm"],
            "tvm_host": target.to_dict()["tvm_host"], "gpu": gpu, "precision": precision,
            "tolerance": dict(FP32_TOLERANCE) if precision == "fp32" else {"rtol": 1e-2, "atol": 1e-3},
            "requires": {"python": ["apache-tvm (with CUDA)"], "cuda_driver": facts["min_cuda_driver"],
                         "compute_capability": arch.replace("sm_", "")[:-1] + "." + arch[-1]}}
    if "accuracy" in result:
        meta["accuracy"] = {"measured_on": "host CPU running the mixed-precision graph", "outputs": result["accuracy"]}
    return Artifact(backend="tvm", executor="tvm", device="cuda", arch=target.arch, target=target.name,
                    files={"library": library, "weights": weights, "kernels": ptx},
                    file_names={"library": "model.so", "weights": "weights.npz", "kernels": "kernels.ptx"},
                    meta=meta)


def _build_failure(arch: str, work: Path, stderr: str) -> GpuBuildError:
    """The worker's own reason when it knows one (failure.json), else the end of its stderr: never a guess."""
    failure = work / "failure.json"
    if failure.is_file():
        failed = json.loads(failure.read_text())
        return GpuBuildError("the TVM CUDA build for {} failed: {}".format(arch, failed["reason"]),
                             hint="export with --device cpu for a CPU-only bundle, or --backend onnxruntime for its "
                                  "CUDA/TensorRT providers on the board", functions=failed.get("functions"))
    return GpuBuildError("the TVM CUDA build for {} failed:\n{}".format(arch, _tail(stderr)),
                         hint="export with --device cpu for a CPU-only bundle; EDGEDYN_DEBUG=1 shows more")


def _require_gpu_toolchain() -> None:
    import importlib.util

    for module, extra in (("tvm", "tvm"), ("nvidia.cuda_nvrtc", "cuda"), ("nvidia.cuda_cccl", "cuda"),
                          ("nvidia.cuda_runtime", "cuda")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            raise MissingDependencyError("building GPU code needs {}, which is not installed".format(module),
                                         hint="pip install 'edgedyn[{}]'".format(extra))


def check_device_code(library: bytes, ptx: bytes, arch: str) -> Dict[str, Any]:
    """Fails loudly unless the library embeds PTX for `arch` with at least one kernel (no silent host fallback)."""
    from edgedyn.backends import nvrtc

    facts = nvrtc.ptx_facts(ptx)
    if not ptx or facts["ptx_target"] != arch or facts["kernels"] == 0:
        raise GpuBuildError("the CUDA build for {} produced no device code for it (PTX target {}, {} kernels); "
                           "its kernels would run as host code or not at all".format(
                               arch, facts["ptx_target"], facts["kernels"]))
    if ptx[:4000] not in library:
        raise GpuBuildError("the built library does not embed the PTX compiled for {}".format(arch))
    return facts


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
