"""Apache TVM (0.27, Relax): compile the graph for the board's CPU, cross-linking for aarch64 boards."""
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, List

from edgedyn.backends import Artifact
from edgedyn.boards import Board, Target
from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.runtime.format import host_arch, pack_arrays

TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}


def _import_tvm() -> Any:
    try:
        import tvm
        from tvm import relax  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("the TVM backend needs apache-tvm ({})".format(error),
                                     hint="pip install 'edgedyn[tvm]'")
    return tvm


def lower(program: Any, board: Board, target: Target, tensor_inputs: List[str]) -> Artifact:
    """Imports the program into Relax, builds it for `target` and returns the shared library and weights."""
    tvm = _import_tvm()
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from edgedyn.frontend import quiet_torch

    try:
        with quiet_torch():
            module = from_exported_program(program, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    except Exception as error:
        raise BackendError("TVM's torch frontend cannot import this graph: {}".format(_first_line(error)),
                           hint="try --backend with another backend, or report the operator named above")
    module, params = relax.frontend.detach_params(module)
    weights = [p.numpy() for p in params.get("main", [])]
    module = relax.transform.DecomposeOpsForInference()(module)
    tvm_target = target.tvm_target()
    with tvm_target:
        executable = tvm.compile(module, tvm_target, relax_pipeline=relax.get_default_pipeline(tvm_target))
    library = _export_library(tvm, executable, target)
    order = ["w{:04d}".format(i) for i in range(len(weights))]
    return Artifact(
        backend="tvm",
        executor="tvm",
        device=target.kind,
        arch=target.arch,
        target=target.name,
        files={"library": library, "weights": pack_arrays(dict(zip(order, weights)))},
        file_names={"library": "model.so", "weights": "weights.npz"},
        meta={"weight_order": order, "tvm_target": target.to_dict()["tvm"], "tolerance": dict(TOLERANCE),
              "requires": {"python": ["apache-tvm"]}},
    )


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

