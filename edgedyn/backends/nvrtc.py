"""CUDA C -> PTX with NVRTC from NVIDIA's pip wheels (no CUDA toolkit, no GPU needed).

NVRTC 12.6 still targets Maxwell (sm_53, Jetson Nano) and Volta (sm_72, Xavier NX), which the CUDA 13 nvcc
on our build machines rejects. Its PTX has ISA version 8.5, which a CUDA 12.6 driver (JetPack 6.1+) can JIT.
"""
import ctypes
import os
import re
from typing import List, Optional

from edgedyn.errors import BackendError, MissingDependencyError

_INSTALL_HINT = "pip install 'edgedyn[cuda]'  (NVRTC and CCCL headers from NVIDIA's CUDA 12 wheels)"

# PTX ISA version -> the oldest CUDA driver that can JIT it (PTX ISA release notes).
PTX_ISA_DRIVER = {"6.5": "10.2", "7.4": "11.4", "7.8": "11.8", "8.0": "12.0", "8.1": "12.1", "8.2": "12.2",
                  "8.3": "12.3", "8.4": "12.4", "8.5": "12.6", "8.7": "12.8", "8.8": "12.9"}


def _library() -> ctypes.CDLL:
    try:
        import nvidia.cuda_nvrtc as package
    except ImportError:
        raise MissingDependencyError("building GPU code needs NVRTC, which is not installed", hint=_INSTALL_HINT)
    directory = os.path.join(list(package.__path__)[0], "lib")
    names = sorted(n for n in os.listdir(directory) if n.startswith("libnvrtc.so"))
    if not names:
        raise MissingDependencyError("no libnvrtc.so in {}".format(directory), hint=_INSTALL_HINT)
    return ctypes.CDLL(os.path.join(directory, names[0]))


def _include_dirs() -> List[str]:
    try:
        import nvidia.cuda_cccl as cccl
        import nvidia.cuda_runtime as cudart
    except ImportError:
        raise MissingDependencyError("building GPU code needs the CUDA headers (cuda/std/..., cuda_fp16.h)",
                                     hint=_INSTALL_HINT)
    return [os.path.join(list(package.__path__)[0], "include") for package in (cccl, cudart)]


def ptxas_path() -> str:
    """ptxas from NVIDIA's nvcc wheel of the same CUDA release as NVRTC: assembles the PTX to check it (no GPU)."""
    try:
        import nvidia.cuda_nvcc as package
    except ImportError:
        raise MissingDependencyError("checking PTX needs ptxas from NVIDIA's nvcc wheel, which is not installed",
                                     hint=_INSTALL_HINT)
    path = os.path.join(list(package.__path__)[0], "bin", "ptxas")
    if not os.access(path, os.X_OK):
        raise MissingDependencyError("no executable ptxas at {}".format(path), hint=_INSTALL_HINT)
    return path


def version() -> str:
    lib = _library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return "{}.{}".format(major.value, minor.value)


def compile_to_ptx(source: str, arch: str, name: str = "edgedyn_kernels.cu") -> bytes:
    """Compiles CUDA C for `arch` ("sm_53") into PTX text (bytes, no trailing NUL)."""
    lib = _library()
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None), None)
    try:
        options = ["--gpu-architecture=compute_{}".format(arch.replace("sm_", "")), "-default-device", "-std=c++17"]
        options += ["-I" + path for path in _include_dirs()]
        encoded = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(program, len(options), encoded)
        if status != 0:
            raise BackendError("NVRTC could not compile the generated CUDA code for {}:\n{}".format(
                arch, _log(lib, program)))
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetPTXSize(program, ctypes.byref(size)), program)
        buffer = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(program, buffer), program)
        return buffer.raw[: size.value].rstrip(b"\0")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def ptx_facts(ptx: bytes) -> dict:
    """What a PTX module needs on the board: its ISA version, target arch, kernel count, oldest driver."""
    text = ptx.decode("utf-8", "replace")
    isa = _first(r"^\.version\s+(\d+\.\d+)", text)
    return {
        "ptx_isa": isa,
        "ptx_target": _first(r"^\.target\s+(\w+)", text),
        "kernels": len(re.findall(r"^\.(?:visible\s+)?\.entry\s", text, re.MULTILINE)),
        "min_cuda_driver": PTX_ISA_DRIVER.get(isa or "", "unknown (PTX ISA {})".format(isa)),
    }


def _first(pattern: str, text: str) -> Optional[str]:
    match = re.search(pattern, text, re.MULTILINE)
    return match.group(1) if match else None


def _log(lib: ctypes.CDLL, program: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    buffer = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, buffer)
    return buffer.value.decode("utf-8", "replace")


def _check(lib: ctypes.CDLL, status: int, program: Optional[ctypes.c_void_p]) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        detail = lib.nvrtcGetErrorString(status).decode()
        raise BackendError("NVRTC call failed: {}{}".format(detail, "\n" + _log(lib, program) if program else ""))
