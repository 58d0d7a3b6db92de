"""What this machine offers a GPU artifact: the NVIDIA driver read through libcuda with ctypes (no CUDA toolkit).

Standard library only, Python 3.8 syntax. Nothing here raises: a missing driver is an answer, not an error.
"""
import ctypes
from typing import Any, Dict, List, Optional

_ATTRIBUTE_CC_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_ATTRIBUTE_CC_MINOR = 76

_cached = None  # type: Optional[Dict[str, Any]]


def cuda_driver() -> Dict[str, Any]:
    """{"available": bool, "reason": str, "driver_version": "12.6", "devices": [{"name", "compute_capability"}]}."""
    global _cached
    if _cached is None:
        _cached = _probe()
    return _cached


def _probe() -> Dict[str, Any]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {"available": False, "reason": "no NVIDIA driver (libcuda.so.1 not found)", "devices": []}
    try:
        if lib.cuInit(0) != 0:
            return {"available": False, "reason": "the NVIDIA driver found no usable GPU (cuInit failed)",
                    "devices": []}
        version = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(version))
        count = ctypes.c_int()
        lib.cuDeviceGetCount(ctypes.byref(count))
        devices = [_device(lib, index) for index in range(count.value)]
    except AttributeError as error:  # a libcuda.so.1 that lacks the basic entry points
        return {"available": False, "reason": "libcuda.so.1 is not a CUDA driver ({})".format(error), "devices": []}
    driver = "{}.{}".format(version.value // 1000, (version.value % 1000) // 10)
    if not devices:
        return {"available": False, "reason": "the CUDA driver ({}) reports no GPU".format(driver), "devices": [],
                "driver_version": driver}
    return {"available": True, "reason": "", "driver_version": driver, "devices": devices}


def _device(lib: Any, index: int) -> Dict[str, Any]:
    handle = ctypes.c_int()
    lib.cuDeviceGet(ctypes.byref(handle), index)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTRIBUTE_CC_MAJOR, handle)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTRIBUTE_CC_MINOR, handle)
    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, handle)
    return {"name": name.value.decode("utf-8", "replace"),
            "compute_capability": "{}.{}".format(major.value, minor.value)}


def _version_tuple(text: str) -> List[int]:
    return [int(part) for part in text.split(".") if part.isdigit()]


def gpu_unusable_reason(artifact: Dict[str, Any]) -> Optional[str]:
    """None when this machine's driver and GPU can run the GPU artifact, else why not, in words."""
    driver = cuda_driver()
    if not driver["available"]:
        return driver["reason"]
    requires = artifact.get("requires", {})
    needed = requires.get("cuda_driver")
    if needed and _version_tuple(driver["driver_version"]) < _version_tuple(needed):
        return "the CUDA driver here is {}, the GPU code ({} PTX ISA {}) needs {} or newer".format(
            driver["driver_version"], artifact.get("gpu", {}).get("arch"), artifact.get("gpu", {}).get("ptx_isa"),
            needed)
    wanted = requires.get("compute_capability")
    capability = driver["devices"][0]["compute_capability"]
    if wanted and _version_tuple(capability) < _version_tuple(wanted):
        return "the GPU here ({}, compute capability {}) is older than the code's {}".format(
            driver["devices"][0]["name"], capability, wanted)
    return None
