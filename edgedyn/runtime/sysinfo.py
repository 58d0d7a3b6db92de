"""What machine a benchmark ran on: CPU model, cores, versions, clocks, and a Jetson's power mode.

Everything here is best effort: a file that is missing or unreadable leaves its field out, quietly.
`root` is "/" on a board; tests pass a fake tree. Standard library and numpy only, Python 3.8 syntax.
"""
import glob
import os
import platform
import shutil
import subprocess
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

# (implementer, part) from /proc/cpuinfo on ARM: the kernel prints numbers, people know names.
ARM_CPU_PARTS = {
    ("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd04"): "Cortex-A35", ("0x41", "0xd05"): "Cortex-A55",
    ("0x41", "0xd07"): "Cortex-A57", ("0x41", "0xd08"): "Cortex-A72", ("0x41", "0xd09"): "Cortex-A73",
    ("0x41", "0xd0a"): "Cortex-A75", ("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd0d"): "Cortex-A77", ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd41"): "Cortex-A78",
    ("0x41", "0xd42"): "Cortex-A78AE", ("0x41", "0xd44"): "Cortex-X1", ("0x41", "0xd46"): "Cortex-A510",
    ("0x41", "0xd47"): "Cortex-A710", ("0x41", "0xd4b"): "Cortex-A78C", ("0x4e", "0x004"): "NVIDIA Carmel",
}
# devfreq device names of Jetson GPUs (Nano gm20b at 57000000.gpu, TX2 gp10b, Xavier gv11b, Orin ga10b).
_JETSON_GPU_NAMES = ("gpu", "gm20b", "gp10b", "gv11b", "ga10b")


def environment(executor: Optional[Dict[str, Any]] = None, root: str = "/") -> Dict[str, Any]:
    """The machine, CPU, versions and (where readable) clocks, for a benchmark report."""
    env = {
        "machine": platform.machine(),
        "system": "{} {}".format(platform.system(), platform.release()),
        "cpu_model": cpu_model(_read(root, "proc/cpuinfo") or ""),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }  # type: Dict[str, Any]
    if hasattr(os, "sched_getaffinity"):
        env["cpus_usable"] = len(os.sched_getaffinity(0))
    model = _read(root, "proc/device-tree/model")
    if model:
        env["board_model"] = model.strip("\x00\n ")
    if executor is not None:
        env["executor"] = dict(executor)
        env["runtime_versions"] = runtime_versions(executor)
    clocks = cpu_clocks(root)
    if clocks:
        env["cpu_clocks"] = clocks
    jetson = jetson_info(root)
    if jetson is not None:
        env["jetson"] = jetson
    return env


def physical_cores(root: str = "/", usable: Optional[Iterable[int]] = None) -> int:
    """The physical cores among the CPUs this process may run on (`usable`: its affinity mask), hyperthreads of
    one core counting once; each CPU whose topology is unreadable counts as a core of its own."""
    if usable is None:
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in usable:
        siblings = _read(root, "sys/devices/system/cpu/cpu{}/topology/thread_siblings_list".format(cpu))
        cores.add(siblings.strip() if siblings and siblings.strip() else "cpu{}".format(cpu))
    return max(1, len(cores))


def runtime_versions(described: Dict[str, Any]) -> Dict[str, str]:
    """Package versions from an executor's describe(): `{"tvm": "0.27"}` or `{"runtime": name, "version": v}`."""
    if isinstance(described.get("runtime"), str) and isinstance(described.get("version"), str):
        return {described["runtime"]: described["version"]}
    return {key: value for key, value in described.items()
            if key not in ("executor", "device", "numpy") and isinstance(value, str)}


def cpu_model(cpuinfo: str) -> Optional[str]:
    """The CPU's name from /proc/cpuinfo text: `model name` on x86, the implementer and part on ARM."""
    fields = {}  # type: Dict[str, str]
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    implementer, part = fields.get("CPU implementer", "").lower(), fields.get("CPU part", "").lower()
    if (implementer, part) in ARM_CPU_PARTS:
        return ARM_CPU_PARTS[(implementer, part)]
    if "model name" in fields:
        return fields["model name"]
    if part:
        return "ARM implementer {} part {}".format(implementer or "?", part)
    return fields.get("Processor") or fields.get("cpu model") or None


def cpu_clocks(root: str = "/") -> Optional[Dict[str, Any]]:
    """Current and maximum clock of each CPU in MHz and the frequency governor, when cpufreq is exposed."""
    current, maximum, governors = [], [], set()
    for folder in sorted(glob.glob(os.path.join(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq")), key=_cpu_index):
        cur, top = _read_int(folder, "scaling_cur_freq"), _read_int(folder, "cpuinfo_max_freq")
        if cur is None:
            continue
        current.append(cur // 1000)
        if top is not None:
            maximum.append(top // 1000)
        governor = _read(folder, "scaling_governor")
        if governor:
            governors.add(governor.strip())
    if not current:
        return None
    return {"current_mhz": current, "max_mhz": maximum, "governor": ",".join(sorted(governors)) or None}


def jetson_info(root: str = "/") -> Optional[Dict[str, Any]]:
    """L4T release, nvpmodel power mode and GPU clock of a Jetson; None on any other machine."""
    release = _read(root, "etc/nv_tegra_release")
    model = (_read(root, "proc/device-tree/model") or "").lower()
    if release is None and "jetson" not in model:
        return None
    info = {}  # type: Dict[str, Any]
    if release:
        info["l4t"] = release.splitlines()[0].lstrip("# ").strip()
    mode = _power_mode(root)
    if mode:
        info["power_mode"] = mode
    for folder in sorted(glob.glob(os.path.join(root, "sys/class/devfreq/*"))):
        name = os.path.basename(folder)
        if any(tag in name for tag in _JETSON_GPU_NAMES):
            cur, top = _read_int(folder, "cur_freq"), _read_int(folder, "max_freq")
            if cur is not None:
                info["gpu_clock_mhz"] = cur // 1000000
                if top is not None:
                    info["gpu_max_clock_mhz"] = top // 1000000
                break
    return info


def _power_mode(root: str) -> Optional[str]:
    """`nvpmodel -q` says `NV Power Mode: MAXN`; without it, the status file holds `pmode:0000`."""
    if root == "/" and shutil.which("nvpmodel"):
        try:
            result = subprocess.run(["nvpmodel", "-q"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    universal_newlines=True, timeout=5)
            for line in result.stdout.splitlines():
                if "Power Mode" in line:
                    return line.split(":", 1)[1].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    status = _read(root, "var/lib/nvpmodel/status")
    if status and "pmode:" in status:
        return "mode " + str(int(status.split("pmode:", 1)[1].split()[0]))
    return None


def _cpu_index(folder: str) -> int:
    name = os.path.basename(os.path.dirname(folder))
    return int(name[3:]) if name[3:].isdigit() else 0


def _read(root: str, relative: str) -> Optional[str]:
    try:
        with open(os.path.join(root, relative), errors="replace") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


def _read_int(folder: str, name: str) -> Optional[int]:
    text = _read(folder, name)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def describe_clocks(env: Dict[str, Any]) -> List[str]:
    """Lines a person reads about clocks and power mode, for the summary table."""
    lines = []
    clocks = env.get("cpu_clocks")
    if clocks:
        lines.append("CPU clocks {}-{} MHz of max {} MHz ({})".format(
            min(clocks["current_mhz"]), max(clocks["current_mhz"]),
            max(clocks["max_mhz"]) if clocks["max_mhz"] else "?", clocks.get("governor") or "governor unknown"))
    jetson = env.get("jetson") or {}
    if jetson.get("power_mode"):
        lines.append("Jetson power mode {}".format(jetson["power_mode"]))
    if "gpu_clock_mhz" in jetson:
        lines.append("GPU clock {} MHz of max {} MHz".format(jetson["gpu_clock_mhz"], jetson.get("gpu_max_clock_mhz", "?")))
    return lines
