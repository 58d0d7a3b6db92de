"""edgedyn's device commands as functions returning JSON-ready dicts: the local CLI and the RPC server share them.

Board side: standard library, numpy and edgedyn.runtime only, Python 3.8 syntax.
"""
import io
import platform
from typing import Any, Dict, Optional, Sequence

import numpy as np

from edgedyn.runtime import sysinfo
from edgedyn.runtime.bench import BenchConfig, run_benchmark
from edgedyn.runtime.format import Bundle, host_arch
from edgedyn.runtime.choice import artifact_label, would_run
from edgedyn.runtime.program import flatten_outputs, load


def verify_report(path: str, threads: Optional[int] = None, device: str = "auto",
                  trusted_keys: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
    """`edgedyn verify --json`'s report: every specialization on its reference inputs against torch eager, and the
    fp32 fallback of each that carries one (runtime/choice.py) where this CPU ran the reduced precision before it.

    `trusted_keys` as for edgedyn.runtime.load (EDGEDYN_TRUSTED_KEYS applies when None); `signed_by` says which key
    signed the bundle, when one did."""
    program = load(path, threads=threads, device=device, trusted_keys=trusted_keys)
    results, using = program.verify(), [spec.selection() for spec in program.specializations]
    if device != "gpu" and any(spec.artifact is not spec.record["artifacts"][-1] and spec.artifact["device"] == "cpu"
                               for spec in program.specializations):
        # a reduced precision ran, and an fp32 fallback for CPUs without it follows: checked here as well
        fallbacks = load(path, threads=threads, device="cpu", trusted_keys=trusted_keys, fallbacks=True)
        seen = {(r["specialization"], r["artifact"]) for r in results}
        results += [r for r in fallbacks.verify() if (r["specialization"], r["artifact"]) not in seen]
        ran = {spec.name: artifact_label(spec.artifact) for spec in program.specializations}
        using += [spec.selection() for spec in fallbacks.specializations
                  if artifact_label(spec.artifact) != ran[spec.name]]
    return {"bundle": str(path), "ok": all(r["ok"] for r in results), "arch": host_arch(), "results": results,
            "signed_by": program.bundle.signed_by, "using": using,
            "selection": {s.name: {"artifact": s.artifact, "skipped": s.skipped} for s in program.specializations}}


def bench_report(path: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """`edgedyn bench --json`'s report; `options` are BenchConfig's fields."""
    return run_benchmark(path, BenchConfig(**options))


def inspect_report(path: str) -> Dict[str, Any]:
    """The manifest, and which artifact of each specialization this machine would run (nothing is loaded)."""
    bundle = Bundle(path)
    here = {spec["name"]: would_run(spec) for spec in bundle.manifest["specializations"]}
    return {"manifest": bundle.manifest, "sha256": bundle.sha256, "this_machine": here}


def run_arrays(path: str, inputs_npz: bytes, threads: Optional[int] = None) -> bytes:
    """Calls the bundle once on the arrays of an .npz (one per argument name); returns its outputs as an .npz
    (`output.0`, `output.1`, ... in the bundle's output order)."""
    program = load(path, threads=threads)
    with np.load(io.BytesIO(inputs_npz), allow_pickle=False) as data:
        values = {name: data[name] for name in data.files}
    spec, result = program.run_routed(*program.route_call((), values))
    outputs = flatten_outputs(spec.output_tree, result)
    buffer = io.BytesIO()
    np.savez(buffer, **{"output.{}".format(i): np.asarray(o) for i, o in enumerate(outputs)})
    return buffer.getvalue()


def board_environment() -> Dict[str, Any]:
    """The board's own environment block (CPU, clocks, Python, numpy), its host name, and the emulator it runs
    under (None on real hardware)."""
    return dict(sysinfo.environment(), hostname=platform.node(), arch=host_arch(), emulated_by=emulator())


def emulator() -> Optional[str]:
    """The process name when this process is qemu-user running the board's Python (as the emulated boards of
    edgedyn.emulate are: `qemu-aarch64-st`), else None. qemu-user shows the guest's /proc/self/exe and cmdline,
    but not the name the kernel keeps for the process (its own, cut to 15 characters)."""
    try:
        with open("/proc/self/comm") as handle:
            name = handle.read().strip()
    except OSError:
        return None
    return name if name.startswith("qemu-") else None
