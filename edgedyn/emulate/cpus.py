"""The emulated board's CPU as the guest sees it: a root filesystem view whose /proc/cpuinfo names the -cpu model.

qemu-user 7.2 passes the host's /proc/cpuinfo through unless the `-L` root has its own, and the shared rootfs
holds one describing a Cortex-A72 (onnxruntime needs an aarch64 one to start). XNNPACK reads the core's part
number there to pick its kernels (MobileNetV2 under LiteRT and -cpu cortex-a76: 9.17 M instructions per call
with an A76 cpuinfo, 9.40 M with the A72 one), so a count under `-cpu cortex-a76` runs in a view of the rootfs
whose cpuinfo says Cortex-A76, with the features qemu gives that model (read from the guest's own HWCAP). The
view is a copy of the rootfs made of hard links (seconds, no space) with its own proc/, cached beside the rootfs:
the shared rootfs itself is never changed.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Tuple

from edgedyn.boards import board_names, load_board
from edgedyn.emulate.rootfs import BoardBuildError, EmulationError, build_once, default_cache_dir, run_on_board

# MIDR_EL1 of each qemu CPU model a board uses (qemu's target/arm/cpu64.c): implementer, variant, part, revision.
MIDR = {
    "cortex-a57": (0x41, 0x1, 0xD07, 0x0),
    "cortex-a72": (0x41, 0x0, 0xD08, 0x3),
    "cortex-a76": (0x41, 0x4, 0xD0B, 0x1),
    "cortex-a78ae": (0x41, 0x0, 0xD42, 0x1),  # r0p1, as a Jetson Orin's cpuinfo shows; run on cortex-a76 (SAME_ISA)
}
# The kernel's names for AT_HWCAP bits, in /proc/cpuinfo's order (arch/arm64/kernel/cpuinfo.c).
HWCAP_NAMES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
               "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg").split()
CORES = 4  # every emulated board is shown with four cores, as the shared rootfs's cpuinfo always did
# Bump when what a view holds changes.
VIEW_VERSION = 2

_PROBE = """
import ctypes
libc = ctypes.CDLL(None)
libc.getauxval.restype = ctypes.c_ulong
libc.getauxval.argtypes = [ctypes.c_ulong]
print(libc.getauxval(16))
"""


def board_cpus() -> Tuple[str, ...]:
    """The qemu CPU models the shipped boards are emulated with (the CPUs a count may run under)."""
    cpus = {load_board(name).qemu_cpu for name in board_names()}
    return tuple(sorted(cpu for cpu in cpus if cpu is not None))


def check_cpu(cpu: str) -> str:
    """`cpu` when a board is emulated with it (and its cpuinfo is known), else an error listing the choices."""
    choices = [c for c in board_cpus() if c in MIDR]
    if cpu not in choices:
        raise EmulationError("unknown qemu CPU '{}' for the emulated boards; choose from: {}".format(
            cpu, ", ".join(choices)), hint="each board file's [emulation] qemu_cpu names its CPU (edgedyn boards)")
    return cpu


def cpuinfo_text(cpu: str, hwcap: int, cores: int = CORES) -> str:
    """/proc/cpuinfo of an aarch64 Linux with `cores` cores of the qemu model `cpu` and the given AT_HWCAP."""
    implementer, variant, part, revision = MIDR[cpu]
    features = " ".join(name for bit, name in enumerate(HWCAP_NAMES) if hwcap >> bit & 1)
    core = ("processor\t: {}\nBogoMIPS\t: 108.00\nFeatures\t: {}\nCPU implementer\t: 0x{:02x}\n"
            "CPU architecture: 8\nCPU variant\t: 0x{:x}\nCPU part\t: 0x{:03x}\nCPU revision\t: {}\n\n")
    return "".join(core.format(index, features, implementer, variant, part, revision) for index in range(cores))


def guest_hwcap(rootfs: Path, cpu: str) -> int:
    """The AT_HWCAP a guest process sees under `-cpu cpu` (what qemu says the model implements)."""
    result = run_on_board(rootfs, ["-c", _PROBE], cpu=cpu, timeout=300)
    if result.returncode != 0:
        raise BoardBuildError("reading the guest's HWCAP under -cpu {} failed (exit {}):\n{}".format(
            cpu, result.returncode, result.stderr[-2000:]))
    return int(result.stdout.split()[-1])


def cpu_view(rootfs: Path, cpu: str, cache_dir: Optional[Path] = None) -> Path:
    """A view of `rootfs` (for qemu's -L) whose /proc/cpuinfo describes `cpu`; built once, cached."""
    rootfs = Path(rootfs)
    check_cpu(cpu)
    recipe = {"view": VIEW_VERSION, "rootfs": str(rootfs), "cpu": cpu, "midr": MIDR[cpu], "cores": CORES}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(boards / "views" / "{}-{}-{}".format(rootfs.name, cpu, key),
                      lambda partial: _build_view(rootfs, cpu, partial))


def _build_view(rootfs: Path, cpu: str, target: Path) -> None:
    # A tree of hard links, not links to the rootfs's top folders: the guest sees symbolic links (lstat, readlink),
    # and realpath() would follow /tmp or /root in the view to the rootfs's own folders on the host, where the
    # host's /tmp/bundle or ~/.cache/edgedyn/... are not.
    shutil.copytree(rootfs, target, symlinks=True, copy_function=_link_or_copy,
                    ignore=lambda folder, names: ["proc"] if Path(folder) == rootfs else [])
    (target / "proc").mkdir()
    (target / "proc" / "cpuinfo").write_text(cpuinfo_text(cpu, guest_hwcap(rootfs, cpu)))


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # a filesystem without hard links
        shutil.copy2(source, destination)


def describe(view: Path) -> Dict[str, str]:
    """The cpuinfo a view shows, in brief (what --json reports)."""
    first = (Path(view) / "proc" / "cpuinfo").read_text().split("\n\n")[0]
    fields = dict((part.strip() for part in line.split(":", 1)) for line in first.splitlines() if ":" in line)
    return {"cpu_part": fields["CPU part"], "features": fields["Features"]}
