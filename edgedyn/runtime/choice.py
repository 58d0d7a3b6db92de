"""Which artifact of a specialization runs on this machine, and why the others do not (nothing is loaded here).

A specialization's artifacts are tried in manifest order: GPU code first, then the CPU artifact the export kept,
then, after a reduced precision that the board file does not promise, the export's fastest fp32 candidate
(edgedyn/selection.py `_fp32_fallback`). Standard library only, Python 3.8 syntax: this runs on the board.
"""
from typing import Any, Dict, List, Optional

from edgedyn.runtime.devices import gpu_unusable_reason
from edgedyn.runtime.format import host_arch
from edgedyn.runtime.precision import FP32, REDUCED, effective, missing_words


def artifact_label(artifact: Dict[str, Any]) -> str:
    gpu = artifact.get("gpu", {}).get("arch")
    return "{}-{}".format(artifact["backend"], artifact["device"]) + (" ({})".format(gpu) if gpu else "")


def unusable_reason(artifact: Dict[str, Any], arch: str, device: str, last: bool = True,
                    fallbacks: bool = False) -> Optional[str]:
    """None when the artifact may run on this machine under the --device choice, else why not. One that is not the
    `last` is also passed over where its reduced precision is not native, or when the caller asks for the
    `fallbacks` (fallback_reason)."""
    if artifact.get("arch") not in (None, arch):
        return "built for {}, this machine is {}".format(artifact["arch"], arch)
    on_gpu = artifact.get("device", "cpu") != "cpu"
    if device == "cpu" and on_gpu:
        return "--device cpu"
    if device == "gpu" and not on_gpu:
        return "--device gpu"
    return gpu_unusable_reason(artifact) if on_gpu else None if last else fallback_reason(artifact, arch, fallbacks)


def fallback_reason(artifact: Dict[str, Any], arch: str, asked: bool = False) -> Optional[str]:
    """Why a CPU artifact that has another after it is passed over: its reduced precision is not native on this CPU
    (the export put its fastest fp32 candidate after it for such a CPU), or the caller `asked` for the fp32
    fallbacks (`edgedyn verify` checks them so on a CPU that runs the reduced precision); else None. An int8
    artifact's precision is that of its float layers, never the reason for a fallback."""
    precision = artifact.get("precision", FP32)
    if precision not in REDUCED or "quantization" in artifact:
        return None
    if asked:
        return "passed over to check the fp32 artifact after it"
    if effective(precision, arch)[0] == precision:  # the same test the executors make (precision.effective)
        return None
    return "its {} needs {}, which this CPU lacks: the fp32 artifact after it runs".format(
        precision, missing_words(precision, arch))


def would_run(record: Dict[str, Any]) -> Dict[str, Any]:
    """Which artifact of a specialization's manifest record this machine would run under --device auto (nothing is
    loaded), and why it would skip the ones before it: {"would_run": label or None, "skipped": [[label, why]]}."""
    skipped = []  # type: List[List[str]]
    for index, artifact in enumerate(record["artifacts"]):
        reason = unusable_reason(artifact, host_arch(), "auto", index == len(record["artifacts"]) - 1)
        if reason is None:
            return {"would_run": artifact_label(artifact), "skipped": skipped}
        skipped.append([artifact_label(artifact), reason])
    return {"would_run": None, "skipped": skipped}
