"""ExecuTorch as a peer on the emulated Arm boards (benchmarks/arm.py's `executorch-xnnpack-fp32` and `-fp16`).

ExecuTorch's Python runtime on aarch64 links libtorch, and the aarch64 torch on PyPI is a CUDA build whose import
needs NVIDIA's libraries, so the board cannot run it from Python. Its C++ runtime needs no torch: ExecuTorch's own
aarch64 wheel (the version speed.py's x86 peer uses) ships libexecutorch.so, its XNNPACK backend, its optimized
kernels and their headers. This module downloads that wheel for the board's Python and glibc (no dependencies),
compiles `executorch_runner.cpp` against it with the cross-compiler scripts/install.sh brings
(aarch64-linux-gnu-g++), and counts the runner on the emulated board the way arm.py counts every other peer
(marks around the calls after a warm-up call, one thread: the runner holds ExecuTorch's thread pool off).

The program is what an ExecuTorch user writes on the host: `torch.export` + `to_edge_transform_and_lower` with
XNNPACK's partitioner (speed.py's `_executorch`); the fp16 variant lowers the module and its inputs cast to fp16,
as ExecuTorch's documentation does for half precision on XNNPACK.
"""
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List

EXECUTORCH = "executorch==1.5.1"  # pyproject's bench extra: the same release as the x86 peer
RUNNER_SOURCE = Path(__file__).resolve().with_name("executorch_runner.cpp")
CXX = "aarch64-linux-gnu-g++"
PEERS = ("executorch-xnnpack-fp32", "executorch-xnnpack-fp16")
# Not in arm.py's default peers (it needs calibration data, as edgedyn's --quantize int8 does): `--peers ...,
# executorch-xnnpack-int8`, PT2E with XNNPACK's quantizer on 16 random calibration samples (speed.py's int8 peer).
INT8 = "executorch-xnnpack-int8"
# What the runner prints as an output's dtype: ExecuTorch's ScalarType codes of the two it can return here.
DTYPES = {6: "float32", 5: "float16"}


def runner(suite: str) -> Path:
    """The runner for a board of Debian `suite` (its Python and glibc pick the wheel), built once and cached:
    FOLDER/runner with its libraries in FOLDER/lib."""
    from edgedyn.emulate.rootfs import build_once, default_cache_dir

    recipe = {"executorch": EXECUTORCH, "suite": suite,
              "source": hashlib.sha256(RUNNER_SOURCE.read_bytes()).hexdigest()}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    folder = build_once(default_cache_dir() / "executorch" / "runner-{}".format(key), lambda t: _build(t, suite))
    return folder / "runner"


def _build(target: Path, suite: str) -> None:
    from edgedyn.emulate.rootfs import SUITES, wheel_target_args

    if shutil.which(CXX) is None:
        raise RuntimeError("{} not found: the ExecuTorch peer is compiled for the board with it "
                           "(bash scripts/install.sh installs it)".format(CXX))
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="edgedyn-executorch-") as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", scratch,
                        *wheel_target_args(SUITES[suite]), EXECUTORCH], check=True)
        wheel = next(Path(scratch).glob("executorch-*.whl"))
        with zipfile.ZipFile(str(wheel)) as archive:
            for member in archive.namelist():
                for prefix, into in (("executorch/lib/", "lib"), ("executorch/include/", "include")):
                    if member.startswith(prefix) and not member.endswith("/"):
                        path = target / into / member[len(prefix):]
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(archive.read(member))
        (target / "wheel.txt").write_text(wheel.name + "\n")
    shutil.copyfile(str(RUNNER_SOURCE), str(target / RUNNER_SOURCE.name))
    include = target / "include"
    command = [CXX, "-std=c++17", "-O2", "-Wall", "-DC10_USING_CUSTOM_GENERATED_MACROS", "-I", str(include),
               "-I", str(include / "executorch" / "runtime" / "core" / "portable_type" / "c10"),
               "-o", str(target / "runner"), str(target / RUNNER_SOURCE.name), "-L", str(target / "lib"),
               # --no-as-needed: the XNNPACK backend and the kernels register themselves when loaded.
               "-Wl,--no-as-needed", "-lexecutorch_backend_xnnpack", "-lexecutorch_kernels_optimized",
               "-lexecutorch_threadpool", "-lexecutorch", "-Wl,-rpath,$ORIGIN/lib"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError("compiling the ExecuTorch runner failed: {}\n{}".format(" ".join(command),
                                                                                  result.stderr[-3000:]))


def convert(peer: str, model: Any, inputs: tuple, kind: str, folder: Path) -> Path:
    """The peer's program, lowered to XNNPACK on this host as its users do; fp16: the module and inputs cast;
    int8: quantized through PT2E."""
    import copy

    import torch
    from speed import _executorch

    path = folder / "{}.pte".format(peer)
    if peer.endswith("fp16"):
        model, inputs = copy.deepcopy(model).to(torch.float16), tuple(_half(t) for t in inputs)
    with torch.no_grad():
        _executorch(model, inputs, kind, peer == INT8, str(path))
    return path


def _half(tensor: Any) -> Any:
    import torch

    return tensor.to(torch.float16) if tensor.is_floating_point() else tensor


def count(peer: str, board: Any, program: Path, inputs: tuple, folder: Path, calls: int) -> Dict[str, Any]:
    """The runner's instructions per call on the emulated `board` and its outputs (float32 arrays)."""
    import numpy as np

    from edgedyn.emulate.cpus import cpu_view
    from edgedyn.emulate.instructions import COUNT_ENV, MARK_MAGIC, MARK_SYSCALL, count_program

    files: List[str] = []
    for i, tensor in enumerate(inputs):
        tensor = _half(tensor) if peer.endswith("fp16") else tensor
        path = folder / "{}-input{}.bin".format(peer, i)
        path.write_bytes(np.ascontiguousarray(tensor.numpy()).tobytes())
        files.append(str(path))
    prefix = folder / "{}-output".format(peer)
    binary = runner(board.image.suite)
    run = count_program(binary, [str(program), str(prefix), str(calls), str(MARK_SYSCALL), str(MARK_MAGIC), *files],
                        board.qemu_cpu, root=cpu_view(board.rootfs, board.qemu_cpu), env=dict(COUNT_ENV))
    # The runner cuts ExecuTorch's pool to one thread before it marks; the workers the pool started first (one per
    # core the guest sees) only start and stop (13K instructions on a one-convolution model). A worker that ran any
    # kernel during the calls would execute millions.
    others = sum(run.per_vcpu[1:])
    if others > 100000:
        raise RuntimeError("threads other than the runner's executed {:,} instructions against {:,} per call: the "
                           "count would not be per core".format(others, run.per_call(calls)))
    described = json.loads(run.stdout.strip().splitlines()[-1])["outputs"]
    outputs = [np.frombuffer(Path("{}.{}.bin".format(prefix, i)).read_bytes(), DTYPES[o["dtype"]])
               .reshape(o["shape"]).astype(np.float32) for i, o in enumerate(described)]
    return {"per_call": run.per_call(calls), "ran": "{} ({}), XNNPACK, {}".format(
        (binary.parent / "wheel.txt").read_text().strip(), "C++ runtime", peer.rsplit("-", 1)[1]),
        "wall_s": round(run.wall_s, 1), "other_threads": others, "outputs": outputs}
