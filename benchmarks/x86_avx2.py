"""An x86 CPU without bf16, measured without one: guest instructions per call under qemu-x86_64 -cpu Haswell-v4.

    python benchmarks/x86_avx2.py                                  # the models below
    python benchmarks/x86_avx2.py --models tv-resnet18 --summarize benchmarks/results/x86-avx2-*.json

The x86 hosts here have AVX-512, VNNI and AVX512_BF16, where edgedyn's default export computes in bf16 (OpenVINO).
Most x86 boxes a user deploys to have none of them (mini PCs, Haswell to Alder Lake cores, Zen 2/3): AVX2 and FMA.
qemu-user's TCG emulates exactly that CPU (`-cpu Haswell-v4`: AVX2, FMA, F16C; it has no AVX-512 at all), and
every runtime here picks its kernels from the CPUID it sees, so under it each runs the code it would run on such a
CPU. The counting plugin of the Arm boards (edgedyn/emulate/instructions.py) counts its instructions: deterministic,
independent of this host's load, blind to memory stalls and per-instruction cost (docs/emulate.md).

Per model, the same input, one thread, marks around CALLS calls after a warm-up call:
- edgedyn's default bundle as exported on this bf16 host (`edgedyn.export(model, board="x86-64")`), run on the
  emulated CPU: what a user who exports on one machine and deploys to an older one gets; the runtime's own line
  says what it runs there (a bf16 winner carries the fastest fp32 candidate for such a CPU, edgedyn/selection.py);
  and, when it carries one, its kept artifact exported alone ("kept alone"), which computes in fp32 itself there;
- edgedyn's `--precision fp32` bundle and each fp32 backend exported alone: what `auto` chooses among on a host
  without bf16 (it times them there; here the count ranks them);
- the peers a user of that CPU would pick, converted as their users do (benchmarks/arm.py): onnxruntime-direct,
  OpenVINO's default (f32 on this CPU) and OpenVINO f32;
each with its cosine to torch eager on the same input, computed on the emulated CPU. JSON goes to
benchmarks/results/x86-avx2-*.json.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence  # noqa: F401 (type comments)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm  # noqa: E402
import fullsize  # noqa: E402

QEMU = "qemu-x86_64"
CPU = "Haswell-v4"  # AVX2 + FMA + F16C, no AVX-512, no bf16; qemu 7.2's TCG has every feature it names but TSX
MODELS = ["tv-resnet18", "tv-mobilenet_v2", "yolo11n"]
PEERS = ("onnxruntime-direct", "openvino-default", "openvino-f32")
# The default's kept artifact exported alone (no fp32 fallback after it): on this CPU it computes in fp32 itself.
KEPT_ALONE = "kept alone"
BACKENDS = ("onnxruntime", "openvino", "ncnn", "tflite")  # fp32 candidates (TVM untuned: 10-40x more, docs/backends.md)

# Runs under qemu: one bundle's outputs on the saved inputs (uncounted), as the runtime computes them there.
_OUTPUTS = r"""
import json, sys
import numpy as np
from edgedyn.runtime.program import load
bundle, inputs_path, outputs_path = sys.argv[1:4]
program = load(bundle, threads=1, device="cpu")
inputs = [a for _, a in sorted(np.load(inputs_path).items())]
outputs = program(*inputs)
outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
np.savez(outputs_path, **{"output.{}".format(i): np.asarray(o) for i, o in enumerate(outputs)})
spec = program.route(*inputs)[0]
print(json.dumps({"selection": spec.selection()}))
"""


def _count(argv: Sequence[str]) -> Any:
    """The count of this Python's `python ARGV` under qemu-x86_64 -cpu CPU (the checkout's edgedyn first)."""
    from edgedyn.emulate.instructions import COUNT_ENV, count_program

    with tempfile.TemporaryDirectory(prefix="edgedyn-x86-") as home:
        env = dict(COUNT_ENV, PATH=os.environ.get("PATH", "/usr/bin:/bin"), HOME=home, PYTHONPATH=str(REPO),
                   EDGEDYN_CACHE=str(Path(home) / "cache"))
        return count_program(Path(sys.executable), argv, CPU, env=env, qemu=QEMU)


def _cosine(outputs: Path, reference: List[Any]) -> float:
    import numpy as np

    with np.load(str(outputs)) as saved:
        got = [saved["output.{}".format(i)] for i in range(len(saved.files))]
    return arm.cosine(got[:1], [reference[0].numpy()])


def count_bundle(bundle: Path, inputs_path: Path, reference: List[Any]) -> Dict[str, Any]:
    """One edgedyn bundle on the emulated CPU: per-call count, what it ran, its cosine there."""
    import numpy as np

    from edgedyn.emulate.instructions import _GUEST, MARKS
    from edgedyn.runtime import read_manifest

    named = bundle.with_suffix(".inputs.npz")  # `edgedyn bench --inputs` names each array by its argument
    with np.load(str(inputs_path)) as saved:
        arrays = [a for _, a in sorted(saved.items())]
    np.savez(str(named), **{p["name"]: a for p, a in zip(read_manifest(bundle)["signature"], arrays)})
    options = json.dumps({"specialization": None, "random_inputs": False, "inputs": str(named)})
    run = _count(["-c", _GUEST, str(bundle), "1", str(arm.CALLS), options, MARKS])
    outputs = bundle.with_suffix(".outputs.npz")
    said = _count(["-c", _OUTPUTS, str(bundle), str(inputs_path), str(outputs)])
    selection = json.loads(said.stdout.strip().splitlines()[-1])["selection"]
    return {"per_call": run.per_call(arm.CALLS), "selection": selection, "cosine": _cosine(outputs, reference),
            "wall_s": round(run.wall_s, 1)}


def count_peer(peer: str, path: str, inputs_path: Path, outputs: Path, reference: List[Any]) -> Dict[str, Any]:
    from edgedyn.emulate.instructions import MARKS

    run = _count(["-c", arm._GUEST, peer, path, str(inputs_path), str(outputs), str(arm.CALLS), MARKS, "{}"])
    return {"per_call": run.per_call(arm.CALLS), "ran": json.loads(run.stdout.strip().splitlines()[-1])["ran"],
            "cosine": _cosine(outputs, reference), "wall_s": round(run.wall_s, 1)}


def bench_model(name: str, workdir: Path, say: Callable[[str], None]) -> Dict[str, Any]:
    import numpy as np
    import torch

    import edgedyn
    from edgedyn.runtime import read_manifest
    from edgedyn.runtime.format import kept_artifact

    model, inputs, kind = fullsize.MODELS[name]()
    with torch.no_grad():
        reference = model(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    inputs_path = workdir / "inputs.npz"
    np.savez(str(inputs_path), **{"{:03d}".format(i): t.numpy() for i, t in enumerate(inputs)})
    record = {"kind": kind, "edgedyn": {}, "peers": {}}  # type: Dict[str, Any]
    queue = [("default", {}), ("fp32", {"precision": "fp32"})] + [
        ("{}:fp32".format(backend), {"backend": backend, "precision": "fp32"}) for backend in BACKENDS]
    while queue:
        label, options = queue.pop(0)
        say("[{}] edgedyn {}: exporting on this host".format(name, label))
        try:
            bundle = edgedyn.export(model, inputs, board="x86-64", output=workdir / "{}.edgedyn".format(
                label.replace(":", "-")), **options)
            record_ = read_manifest(bundle)["specializations"][0]
            chosen, last = kept_artifact(record_), record_["artifacts"][-1]
            say("[{}] edgedyn {}: counting on the emulated {}".format(name, label, CPU))
            entry = count_bundle(bundle, inputs_path, reference)
            entry.update(exported=chosen["selection"].get("candidate") or chosen["backend"],
                         precision_exported=chosen.get("precision", "fp32"),
                         fallback=last["selection"]["candidate"] if last is not chosen else None)
        except Exception as error:  # one export or count that fails is reported, the run goes on
            entry = {"error": "{}: {}".format(type(error).__name__, str(error).strip()[-400:])}
        record["edgedyn"][label] = entry
        say("[{}] edgedyn {}: {}".format(name, label, _said(entry)))
        if label == "default" and entry.get("fallback"):  # what the same bundle ran before it carried a fallback
            queue.insert(0, (KEPT_ALONE, {"backend": chosen["backend"], "precision": chosen["precision"]}))
    for peer in PEERS:
        folder = workdir / peer.split("-")[0]
        folder.mkdir(exist_ok=True)
        try:
            path = arm.convert_peer(peer, model, inputs, folder)
            entry = count_peer(peer, path, inputs_path, workdir / "{}-outputs.npz".format(peer), reference)
        except Exception as error:
            entry = {"error": "{}: {}".format(type(error).__name__, str(error).strip()[-400:])}
        record["peers"][peer] = entry
        say("[{}] {}: {}".format(name, peer, _said(entry)))
    return record


def _said(entry: Dict[str, Any]) -> str:
    if "per_call" not in entry:
        return "failed: " + entry.get("error", "?")
    return "{:,.0f} instructions per call, cosine {:.6f} ({})".format(
        entry["per_call"], entry["cosine"], entry.get("selection") or entry.get("ran"))


def table(results: Dict[str, Any]) -> str:
    """Millions of guest instructions per call (cosine to torch), and each edgedyn row's ratio to the fewest peer
    (> 1: edgedyn executes fewer)."""
    labels = ["default", KEPT_ALONE, "fp32"] + ["{}:fp32".format(b) for b in BACKENDS]
    lines = ["", "x86-64 without AVX-512 or bf16 (qemu-x86_64 -cpu {}), millions of guest instructions per call, "
             "one thread:".format(results["cpu"]), "",
             "| model | " + " | ".join("edgedyn " + label for label in labels) + " | " + " | ".join(PEERS) +
             " | default vs fewest peer |", "|---|" + "---:|" * (len(labels) + len(PEERS) + 1)]

    def cell(entry: Dict[str, Any]) -> str:
        if not entry:
            return "-"
        return "{:.1f} ({:.5f})".format(entry["per_call"] / 1e6, entry["cosine"]) if "per_call" in entry else "failed"

    for name, record in results["models"].items():
        peers = [e["per_call"] for e in record["peers"].values() if "per_call" in e]
        default = record["edgedyn"].get("default", {}).get("per_call")
        lines.append("| {} | {} | {} | {} |".format(
            name, " | ".join(cell(record["edgedyn"].get(label, {})) for label in labels),
            " | ".join(cell(record["peers"].get(peer, {})) for peer in PEERS),
            "{:.2f}x".format(min(peers) / default) if peers and default else "-"))
    for name, record in results["models"].items():
        for label in labels:
            entry = record["edgedyn"].get(label, {})
            if "selection" in entry:
                lines.append("- {} {}: exported as {} ({}{}); on the emulated CPU: {}".format(
                    name, label, entry["exported"], entry["precision_exported"], ", fp32 fallback {}".format(
                        entry["fallback"]) if entry.get("fallback") else "", entry["selection"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, from benchmarks/fullsize.py")
    parser.add_argument("--summarize", nargs="+", metavar="RESULTS.json")
    args = parser.parse_args()
    if arm.summarized(args.summarize, table):
        return
    import speed
    from edgedyn.emulate.instructions import LABEL

    results = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "cpu": CPU, "qemu": QEMU, "exported_on": {"cpu_model": speed.cpu_model(),
                                                         "cpu_flags": speed.cpu_features()},
               "edgedyn_commit": arm.commit(),
               "label": LABEL.format(board="x86-64 CPU without AVX-512", cpu=CPU), "calls": arm.CALLS,
               "models": {}}  # type: Dict[str, Any]
    arm.RESULTS.mkdir(parents=True, exist_ok=True)
    out = arm.RESULTS / "x86-avx2-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    for name in [m for m in args.models.split(",") if m]:
        with tempfile.TemporaryDirectory(prefix="edgedyn-x86-avx2-") as workdir:
            results["models"][name] = bench_model(name, Path(workdir), arm.say)
        out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(table(results))
    print("results: {}".format(out.relative_to(REPO)))


if __name__ == "__main__":
    main()
