"""Speed on the Arm boards without the board: guest instructions per call on the emulated CPU, edgedyn against the
runtimes a user of that board would pick, each with its accuracy to torch eager on the same input.

    python benchmarks/arm.py                                      # every model below, the Pi 5's cortex-a76
    python benchmarks/arm.py --models tv-resnet18,yolo11n --boards raspberry-pi-5,raspberry-pi-4
    python benchmarks/arm.py --summarize benchmarks/results/arm-*.json

Per board: edgedyn's default export for it (`edgedyn.export(model, board=B)`: `auto` builds every backend and
precision the board's CPU can run, verifies each on the emulated board and keeps the one with the fewest
instructions; its record holds every candidate's count, so each backend and precision of edgedyn comes with it),
and the peers, converted as their users do and run on the same emulated board, one thread, spinning off:
onnxruntime-direct (`torch.onnx.export` + a default InferenceSession), OpenVINO (`openvino.convert_model` from the
torch module; its default precision, fp16 on Arm v8.2, and f32), NCNN (pnnx from the torch module; its default
options, fp16 arithmetic and storage on Arm v8.2, and fp32; `--peers ...,ncnn-fp16-storage` adds fp16 storage with
fp32 arithmetic, which tells ncnn's fp16 arithmetic from its fp16 storage). Each peer is counted as edgedyn is
(edgedyn/emulate/instructions.py): marks in one process around N calls after a warm-up call, under the board's
`-cpu`, the guest seeing that CPU in /proc/cpuinfo. Counts are deterministic and do not depend on this host's load;
they ignore memory stalls and per-instruction cost (docs/emulate.md). JSON goes to benchmarks/results/arm-*.json.
LiteRT as a peer would need a TensorFlow-free torch converter (litert-torch pulls jax and transformers: 2 GB);
edgedyn's own TFLite artifacts run LiteRT's XNNPACK and are in edgedyn's rows. ExecuTorch (XNNPACK, fp32 and
fp16) runs as its C++ users run it, from its own aarch64 wheel's libraries (benchmarks/arm_executorch.py: its
Python runtime needs the aarch64 torch, which the board cannot import).
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm_executorch  # noqa: E402
import fullsize  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
CALLS = 2  # counted calls after the warm-up call: counts are exact from run to run
MODELS = ["tv-resnet18", "tv-mobilenet_v2", "tv-mobilenet_v3_large", "timm-mobilenetv4_conv_small", "yolo11n"]
PEERS = ("onnxruntime-direct", "openvino-default", "openvino-f32", "ncnn-default", "ncnn-fp32",
         *arm_executorch.PEERS)
# The looser gate of the second export when a reduced precision missed the default one (see bench_model).
LOOSE_GATE = "cosine=0.995"

# Runs on the board: load one peer's model on one thread, run it on the inputs, save the outputs, then mark around
# CALLS more calls. Python 3.8 syntax.
_GUEST = r"""
import ctypes, json, sys
import numpy as np
kind, model, inputs_path, outputs_path, calls, marks, options = sys.argv[1:8]
inputs = [a for _, a in sorted(np.load(inputs_path).items())]
if kind == "onnxruntime-direct":
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    run = lambda: session.run(None, feed)
    ran = "onnxruntime " + ort.__version__
elif kind.startswith("openvino"):
    import openvino
    core = openvino.Core()
    config = {"INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if kind == "openvino-f32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(core.read_model(model), "CPU", config)
    request = compiled.create_infer_request()
    run = lambda: list(request.infer(inputs).values())
    ran = "openvino {} in {}".format(openvino.get_version(), compiled.get_property("INFERENCE_PRECISION_HINT"))
else:
    import ncnn
    names = json.loads(open(model + ".io.json").read())
    net = ncnn.Net()
    net.opt.num_threads = 1
    if kind == "ncnn-fp32":
        net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
    if kind == "ncnn-fp16-storage":
        net.opt.use_fp16_arithmetic = False
    for key, value in json.loads(options).items():  # ncnn_options.py's variants
        setattr(net.opt, key, value)
    net.load_param(model + ".param")
    net.load_model(model + ".bin")
    def run():
        extractor = net.create_extractor()
        for name, array in zip(names["inputs"], inputs):
            extractor.input(name, ncnn.Mat(np.ascontiguousarray(array[0])))
        return [np.array(extractor.extract(name)[1])[None] for name in names["outputs"]]
    ran = "ncnn fp16 arithmetic {}".format(net.opt.use_fp16_arithmetic)
outputs = run()
np.savez(outputs_path, **{"output.{}".format(i): np.asarray(o) for i, o in enumerate(outputs)})
syscall, number, magic = ctypes.CDLL(None).syscall, int(marks.split(",")[0]), ctypes.c_long(int(marks.split(",")[1]))
syscall(number, magic)
syscall(number, magic)
for _ in range(int(calls)):
    run()
syscall(number, magic)
print(json.dumps({"ran": ran}))
"""


def convert_peer(peer: str, model: Any, inputs: tuple, folder: Path) -> str:
    """The peer's model file(s) written into `folder`, as its users convert a torch module; returns the path the
    guest loads."""
    import torch

    if peer == "onnxruntime-direct":
        path = folder / "direct.onnx"
        with torch.no_grad():
            torch.onnx.export(model, inputs, str(path), dynamo=True, verbose=False)
        return str(path)
    if peer.startswith("openvino"):
        import openvino

        path = folder / "openvino.xml"
        if not path.exists():
            with torch.no_grad():
                openvino.save_model(openvino.convert_model(model, example_input=inputs), str(path))
        return str(path)
    return _ncnn(model, inputs, folder)


def _ncnn(model: Any, inputs: tuple, folder: Path) -> str:
    """pnnx from the torch module (TorchScript trace), as NCNN's users convert: model.ncnn.param/.bin."""
    import pnnx
    import torch

    stem = folder / "model"
    if not (folder / "model.ncnn.param").exists():
        with torch.no_grad():
            pnnx.export(model, str(stem) + ".pt", inputs, ncnnparam=str(stem) + ".ncnn.param",
                        ncnnbin=str(stem) + ".ncnn.bin", ncnnpy=str(folder / "ncnn_model.py"),
                        pnnxparam=str(folder / "pnnx.param"), pnnxbin=str(folder / "pnnx.bin"),
                        pnnxpy=str(folder / "pnnx_model.py"), pnnxonnx=str(folder / "pnnx.onnx"))
        param = (folder / "model.ncnn.param").read_text().split("\n")
        layers = [line.split() for line in param[2:] if line.strip()]
        produced = {blob for layer in layers for blob in layer[4 + int(layer[2]):4 + int(layer[2]) + int(layer[3])]}
        consumed = {blob for layer in layers for blob in layer[4:4 + int(layer[2])]}
        names = {"inputs": [layer[4 + int(layer[2])] for layer in layers if layer[0] == "Input"],
                 "outputs": sorted(produced - consumed)}
        (folder / "model.ncnn.io.json").write_text(json.dumps(names))
    return str(folder / "model.ncnn")


def count_peer(board: Any, peer: str, path: str, inputs_path: Path, outputs_path: Path,
               ncnn_options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One peer's instructions per call on the emulated board (its outputs saved to `outputs_path`); an ncnn peer
    with `ncnn_options` set on its Option as well."""
    from edgedyn.emulate.instructions import MARKS, count_command

    run = count_command(board, ["-c", _GUEST, peer, path, str(inputs_path), str(outputs_path), str(CALLS), MARKS,
                                json.dumps(ncnn_options or {})])
    return {"per_call": run.per_call(CALLS), "ran": json.loads(run.stdout.strip().splitlines()[-1])["ran"],
            "wall_s": round(run.wall_s, 1)}


def cosine(got: List[Any], want: List[Any]) -> float:
    import numpy as np

    a = np.concatenate([np.asarray(g, np.float64).ravel() for g in got])
    b = np.concatenate([np.asarray(w, np.float64).ravel() for w in want])
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def bench_model(name: str, board_name: str, peers: List[str], workdir: Path, say: Callable[[str], None],
                export: bool = True, loose: bool = True) -> Dict[str, Any]:
    import numpy as np
    import torch

    import edgedyn
    from edgedyn.boards import load_board
    from edgedyn.emulate.board import prepare_board
    from edgedyn.emulate.rootfs import cpu_words
    from edgedyn.registry import BACKENDS
    from edgedyn.runtime import read_manifest
    from edgedyn.runtime.format import kept_artifact

    model, inputs, kind = fullsize.MODELS[name]()
    with torch.no_grad():
        reference = model(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    record = {"kind": kind, "edgedyn": {}, "peers": {}}  # type: Dict[str, Any]
    if export:  # --peers-only: the peers alone (edgedyn's rows from an earlier run)
        say("[{}] edgedyn's default export for {}".format(name, board_name))
        bundle = edgedyn.export(model, inputs, board=board_name, output=workdir / "{}.edgedyn".format(name),
                                progress=lambda line: say("[{}] {}".format(name, line)))
        artifact = kept_artifact(read_manifest(bundle)["specializations"][0])
        selection = artifact["selection"]
        record["edgedyn"] = {"chosen": selection.get("candidate"), "precision": artifact.get("precision", "fp32"),
                             "mode": selection["mode"],
                             "instructions_per_call": selection.get("instructions_per_call"),
                             "rejected": selection.get("rejected"),
                             "accuracy": [o["cosine"] for o in (artifact.get("accuracy") or {}).get("outputs", [])]}
        missed = any("misses the float accuracy gate" in why for why in (selection.get("rejected") or {}).values())
        if loose and missed:
            # A reduced precision missed edgedyn's strict gate (cosine 0.999) where the peers keep theirs at whatever
            # it costs: the same export held to LOOSE_GATE shows edgedyn at the peers' accuracy.
            say("[{}] edgedyn with --max-accuracy-drop {}".format(name, LOOSE_GATE))
            loose = edgedyn.export(model, inputs, board=board_name,
                                   output=workdir / "{}-loose.edgedyn".format(name), max_accuracy_drop=LOOSE_GATE,
                                   progress=lambda line: say("[{}] {}".format(name, line)))
            chosen = kept_artifact(read_manifest(loose)["specializations"][0])
            record["edgedyn_loose"] = {"gate": LOOSE_GATE, "chosen": chosen["selection"].get("candidate"),
                                       "precision": chosen.get("precision", "fp32"),
                                       "instructions_per_call": chosen["selection"].get("instructions_per_call"),
                                       "accuracy": [o["cosine"] for o in
                                                    (chosen.get("accuracy") or {}).get("outputs", [])]}
    extras = sorted({extra for record_ in BACKENDS.values() for extra in record_.board_extra.split(",") if extra})
    shipped = load_board(board_name)
    board = prepare_board(board_name, shipped.qemu_cpu, shipped.debian_suite, extras)
    inputs_path = workdir / "inputs.npz"
    np.savez(str(inputs_path), **{"{:03d}".format(i): t.numpy() for i, t in enumerate(inputs)})
    for peer in peers:
        folder = workdir / peer.split("-")[0]
        folder.mkdir(exist_ok=True)
        try:
            say("[{}] {}: converting".format(name, peer))
            executorch = peer in (*arm_executorch.PEERS, arm_executorch.INT8)
            converted = (arm_executorch.convert(peer, model, inputs, kind, folder) if executorch
                         else convert_peer(peer, model, inputs, folder))
            say("[{}] {}: counting on the emulated {} (-cpu {})".format(name, peer, board.name,
                                                                        cpu_words(board.qemu_cpu)))
            if executorch:
                entry = arm_executorch.count(peer, board, converted, inputs, folder, CALLS)
                got = entry.pop("outputs")
            else:
                outputs = workdir / "{}-outputs.npz".format(peer)
                entry = count_peer(board, peer, converted, inputs_path, outputs)
                with np.load(str(outputs)) as saved:
                    got = [saved["output.{}".format(i)] for i in range(len(saved.files))]
            entry["cosine"] = cosine(got[:1], [reference[0].numpy()])
            record["peers"][peer] = entry
            say("[{}] {}: {:,.0f} instructions per call, cosine {:.6f}".format(name, peer, entry["per_call"],
                                                                             entry["cosine"]))
        except Exception as error:  # a peer that fails is reported, the run goes on
            record["peers"][peer] = {"error": "{}: {}".format(type(error).__name__, str(error).strip()[-400:])}
            if os.environ.get("EDGEDYN_DEBUG"):
                traceback.print_exc()
    return record


def commit() -> Any:
    """The checkout's commit (and whether it had changes), or None outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(REPO),
                               capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if head.returncode == 0 else None


STRICT_COSINE = 0.999  # edgedyn's default float gate (edgedyn/quantize/precision.py)


def _at_gate(peers: Dict[str, Any], min_cosine: float, count: Any) -> str:
    """The fewest instructions of the peers at least `min_cosine` to torch, over `count`, as "1.02x (peer)"."""
    fit = {name: e["per_call"] for name, e in peers.items() if "per_call" in e and e.get("cosine", 0) >= min_cosine}
    if not fit or not count:
        return "-"
    best = min(fit, key=lambda name: fit[name])
    return "{:.2f}x ({})".format(fit[best] / count, best)


def table(results: Dict[str, Any]) -> str:
    """Per board and model: edgedyn's default (and every candidate it counted), each peer, in millions of
    instructions per call, and the default's ratio to the fewest of the peers (> 1: edgedyn executes fewer), and to
    the fewest of the peers as accurate as edgedyn's gate demands (cosine to torch >= 0.999 for the default export,
    the looser gate's cosine for the second one): a peer whose fp16 output drifted further is faster at a cost
    edgedyn's gate refuses."""
    from edgedyn.emulate.rootfs import cpu_words

    lines = []
    extra = sorted({peer for models in results["boards"].values() for record in models.values()
                    for peer in record["peers"] if peer not in PEERS})  # --peers beyond the default ones
    columns = list(PEERS) + extra
    for board, models in results["boards"].items():
        lines += ["", "{} (qemu -cpu {}), millions of guest instructions per call, one thread:".format(
            board, cpu_words(results["cpus"][board])), "",
                  "| model | edgedyn default | edgedyn candidates | " + " | ".join(columns) +
                  " | default vs fewest peer | vs fewest peer at the gate |",
                  "|---|---|---|" + "---:|" * len(columns) + "---:|---:|"]
        for name, record in models.items():
            counts = record["edgedyn"].get("instructions_per_call") or {}
            chosen = record["edgedyn"].get("chosen")
            default = counts.get(chosen)
            cells = []
            for peer in columns:
                entry = record["peers"].get(peer, {})
                cells.append("{:.1f} ({:.5f})".format(entry["per_call"] / 1e6, entry["cosine"])
                             if "per_call" in entry else "failed" if "error" in entry else "-")
            peers = [e["per_call"] for e in record["peers"].values() if "per_call" in e]
            ratio = "{:.2f}x".format(min(peers) / default) if peers and default else "-"
            at_gate = _at_gate(record["peers"], STRICT_COSINE, default)
            others = ", ".join("{} {:.1f}".format(label, n / 1e6) for label, n in sorted(counts.items(),
                                                                                       key=lambda kv: kv[1]))
            lines.append("| {} | {} | {} | {} | {} | {} |".format(
                name, "{} {}".format(chosen, "{:.1f}".format(default / 1e6) if default else "-") if chosen else
                "not exported (--peers-only)", others, " | ".join(cells), ratio, at_gate))
            loose = record.get("edgedyn_loose")
            if loose:
                n = (loose.get("instructions_per_call") or {}).get(loose.get("chosen"))
                gate = float(loose["gate"].split("=")[1])
                lines.append("| {} at {} | {} {} ({}) | |{} {} | {} |".format(
                    name, loose["gate"], loose["chosen"], "{:.1f}".format(n / 1e6) if n else "-",
                    ", ".join("{:.5f}".format(c) for c in loose.get("accuracy") or []) or "fp32", " |" * len(columns),
                    "{:.2f}x".format(min(peers) / n) if peers and n else "-", _at_gate(record["peers"], gate, n)))
    return "\n".join(lines)


def summarized(paths: Optional[List[str]], table_of: Callable[[Dict[str, Any]], str]) -> bool:
    """--summarize: prints the table of each earlier results file; whether it was given."""
    for path in paths or []:
        print(table_of(json.loads(Path(path).read_text())))
    return bool(paths)


def say(line: str) -> None:
    """Progress, to stderr (stdout holds the table)."""
    print(line, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--boards", default="raspberry-pi-5")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--peers-only", action="store_true",
                        help="count the peers alone, without edgedyn's export (its rows from an earlier run)")
    parser.add_argument("--summarize", nargs="+", metavar="RESULTS.json")
    parser.add_argument("--strict-only", action="store_true",
                        help="no second export at the looser gate when a reduced precision missed the strict one")
    args = parser.parse_args()
    if summarized(args.summarize, table):
        return
    from edgedyn.boards import load_board

    boards = [b for b in args.boards.split(",") if b]
    results = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "method": "guest instructions per call under qemu-user, one thread, marks around {} calls after a "
                         "warm-up call".format(CALLS),
               "cpus": {b: load_board(b).qemu_cpu for b in boards}, "edgedyn_commit": commit(),
               "boards": {}}  # type: Dict[str, Any]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "arm-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    peers = [peer for peer in args.peers.split(",") if peer]  # --peers "": edgedyn's rows alone
    for board_name in boards:
        results["boards"][board_name] = {}
        for name in [m for m in args.models.split(",") if m]:
            with tempfile.TemporaryDirectory(prefix="edgedyn-arm-") as workdir:
                try:
                    results["boards"][board_name][name] = bench_model(name, board_name, peers, Path(workdir), say,
                                                                      not args.peers_only, not args.strict_only)
                except Exception as error:
                    results["boards"][board_name][name] = {"edgedyn": {"error": str(error)[-400:]}, "peers": {}}
                    if os.environ.get("EDGEDYN_DEBUG"):
                        traceback.print_exc()
            out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(table(results))
    print("results: {}".format(out.relative_to(REPO)))


if __name__ == "__main__":
    main()
