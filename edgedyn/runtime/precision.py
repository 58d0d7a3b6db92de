"""The float precisions a CPU artifact may compute in, and the CPU features that make each one native.

An artifact records the precision it was built and gated for (`"precision": "bf16"` in its manifest entry). On a
board whose CPU lacks the feature, the executor computes in fp32 instead, and says so (`effective`), as the runtime
says when GPU code falls back to the CPU. int8 is not a precision here: it is `--quantize`, which needs calibration.

Features are spelled as Linux reports them (`/proc/cpuinfo` flags on x86, HWCAP names on Arm: `fphp`, `asimdhp`);
board files list them in their own words (`fp16`, `avx512_bf16`), matched through BOARD_FEATURES.
Standard library only, Python 3.8 syntax: this runs on the board.
"""
import ctypes
import ctypes.util
import platform
from typing import Any, Dict, FrozenSet, Iterable, Optional, Tuple

FP32 = "fp32"
PRECISIONS = ("fp32", "bf16", "fp16")  # the CPU float precisions, in the order `auto` considers them
REDUCED = ("bf16", "fp16")

# Note: the one table of which CPU features make a reduced precision native, per CPU architecture: each entry is a
# tuple of alternatives, each alternative a tuple of features that must all be present. bf16 on x86: AVX512_BF16
# (Cooper Lake, Zen 4) or AMX-BF16 (Sapphire Rapids); fp16 on Arm: ARMv8.2-A half-precision arithmetic, scalar
# (fphp) and NEON (asimdhp): Cortex-A76 (Pi 5), A78AE (Orin), Carmel (Xavier); not the A72 (Pi 4) nor the A57 (Nano).
# fp16 on x86: AMX-FP16 (Granite Rapids). Not AVX512-FP16 alone: on a Sapphire Rapids (AVX512-FP16, AMX-BF16, no
# AMX-FP16) OpenVINO's f16, the one fp16 CPU path on x86 here, timed 1.3-1.6x the fastest fp32 candidate and
# 1.7-5.6x its bf16 at export on all five full-size models measured (benchmarks/README.md, "Sapphire Rapids"): a
# candidate that never wins, built and gated at every export.
NATIVE = {
    ("bf16", "x86_64"): (("avx512_bf16",), ("amx_bf16",)),
    ("fp16", "aarch64"): (("fphp", "asimdhp"),),
    ("fp16", "x86_64"): (("amx_fp16",),),
}  # type: dict
# A board file's words for the same features (boards/*.toml `[cpu] features`).
BOARD_FEATURES = {"fp16": ("fphp", "asimdhp")}

# AT_HWCAP bits of the Linux arm64 ABI (asm/hwcap.h): what the kernel (or qemu-user, for the CPU it emulates) says
# this CPU has. /proc/cpuinfo is not enough there: qemu-user shows the host's or a fixed file.
AT_HWCAP = 16
ARM64_HWCAP = {"fp": 0, "asimd": 1, "aes": 3, "crc32": 7, "atomics": 8, "fphp": 9, "asimdhp": 10, "asimdrdm": 12,
               "asimddp": 20, "sve": 22}


def native_options(precision: str, arch: str) -> Tuple[Tuple[str, ...], ...]:
    """The alternatives of features that make `precision` native on `arch`; () when none can (or fp32)."""
    return NATIVE.get((precision, arch), ())


def is_native(precision: str, arch: str, features: Iterable[str]) -> bool:
    """True for fp32, and for a reduced precision whose features `features` has (in Linux's or a board file's
    words)."""
    if precision == FP32:
        return True
    have = expand(features)
    return any(all(f in have for f in option) for option in native_options(precision, arch))


def expand(features: Iterable[str]) -> FrozenSet[str]:
    """Features with a board file's words (`fp16`) added in Linux's (`fphp`, `asimdhp`)."""
    have = set(features)
    for word, linux in BOARD_FEATURES.items():
        if word in have:
            have.update(linux)
    return frozenset(have)


def missing_words(precision: str, arch: str) -> str:
    """What a CPU needs for `precision`, in words: `avx512_bf16 or amx_bf16`."""
    options = native_options(precision, arch)
    if not options:
        return "no {} CPU computes {}".format(arch, precision)
    return " or ".join("+".join(option) for option in options)


_HOST = None  # type: Optional[FrozenSet[str]]


def host_features() -> FrozenSet[str]:
    """This CPU's features (x86: /proc/cpuinfo flags less those CPUID denies; aarch64: AT_HWCAP, which qemu-user
    sets for the emulated CPU, then /proc/cpuinfo); empty when neither can be read. Read once per process."""
    global _HOST
    if _HOST is None:
        features = set()  # type: set
        if platform.machine() in ("aarch64", "arm64"):
            features.update(_hwcap_features())
        features.update(_cpuinfo_features())
        if platform.machine() in ("x86_64", "AMD64"):
            features.difference_update(_cpuid_denied())
        _HOST = frozenset(features)
    return _HOST


# The flags of NATIVE as numpy's own CPUID reading names them (numpy's __cpu_features__, which its kernel dispatch
# reads). Where /proc/cpuinfo and CPUID disagree (qemu-user shows the host's cpuinfo to an emulated x86 CPU without
# AVX-512; a hypervisor may mask a flag), OpenVINO and ncnn go by CPUID, and so does the choice between artifacts.
CPUID_NAMES = {"avx512_bf16": "AVX512BF16", "avx512_fp16": "AVX512FP16"}
# numpy does not read AMX. oneDNN (OpenVINO's CPU kernels) uses AMX only on AVX-512 cores (its avx512_core_amx
# ISA), and every CPU with AMX has AVX-512: so where CPUID denies AVX512F, the AMX flags of cpuinfo are not this
# CPU's either (an emulated Haswell on a Sapphire Rapids host sees amx_bf16 in /proc/cpuinfo).
WITH_AVX512_ONLY = ("amx_bf16", "amx_fp16")


def _cpuid_denied() -> FrozenSet[str]:
    """The flags of CPUID_NAMES that numpy finds missing from this CPU's CPUID, and the AMX flags when it finds no
    AVX512F; none when numpy does not say."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found  # numpy 2
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as found  # numpy 1.x (the boards' Python 3.8)
        except ImportError:
            return frozenset()
    denied = {flag for flag, name in CPUID_NAMES.items() if found.get(name) is False}
    if found.get("AVX512F") is False:
        denied.update(WITH_AVX512_ONLY)
    return frozenset(denied)


def _cpuinfo_features(path: str = "/proc/cpuinfo") -> FrozenSet[str]:
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _hwcap_features() -> FrozenSet[str]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        getauxval = libc.getauxval
        getauxval.restype = ctypes.c_ulong
        getauxval.argtypes = [ctypes.c_ulong]
        hwcap = int(getauxval(AT_HWCAP))
    except (OSError, AttributeError):
        return frozenset()
    return frozenset(name for name, bit in ARM64_HWCAP.items() if hwcap & (1 << bit))


def effective(precision: str, arch: str, features: Optional[Iterable[str]] = None) -> Tuple[str, Optional[str]]:
    """(the precision an artifact built for `precision` computes in on this CPU, why it differs or None)."""
    if precision == FP32 or is_native(precision, arch, host_features() if features is None else features):
        return precision, None
    return FP32, "{} artifact computes in fp32 here: this CPU lacks {}".format(precision,
                                                                              missing_words(precision, arch))


def fp32_layers_words(artifact: Dict[str, Any]) -> Optional[str]:
    """"its first N of M layers in fp32" for a mixed artifact's manifest record (its backend's `fp32_layers`, e.g.
    OpenVINO's: edgedyn/candidates.py FP32_SHARES), None for any other."""
    record = artifact.get(artifact.get("backend", ""))
    kept = record.get("fp32_layers") if isinstance(record, dict) else None
    if not isinstance(kept, dict):
        return None
    if "layers" in kept:  # named by a probe on the board (edgedyn/layer_probe.py)
        return "{} of its {} layers in fp32 (those its reduced precision cost most accuracy in)".format(
            kept.get("layers", "?"), kept.get("of", "?"))
    return "its first {} of {} layers in fp32".format(kept.get("first", "?"), kept.get("of", "?"))
