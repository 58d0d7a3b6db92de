"""One edgedyn candidate against one peer on the emulated board, on the same input and in the same run: where
`arm.py` has already ranked the candidates and the question is the last few thousand instructions between edgedyn's
artifact and the peer's (the same runtime, converted by each from the model).

    python benchmarks/arm_pair.py --model yolo11n --candidate ncnn:fp16 --peer ncnn-default
    python benchmarks/arm_pair.py --model tv-resnet18 --board raspberry-pi-5

edgedyn's side is the artifact `edgedyn.export(model, board=B, backend=..., precision=...)` writes, counted as the
export's `auto` counts its candidates (edgedyn/onboard.py): the executor's run on the input, marks around CALLS
calls after a warm-up call, one thread, under the board's `-cpu`. The peer is arm.py's (its converter and harness).
Deterministic counts (docs/emulate.md); the peers' counts have moved by up to 2K instructions between runs of the
same command. JSON goes to benchmarks/results/arm-pair-*.json.
"""
import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict  # noqa: F401 (type comments)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm  # noqa: E402
import fullsize  # noqa: E402

# Runs on the board (Python 3.8): the bundle's one specialization's executor on the saved input, as onboard.py does.
_GUEST = """
import ctypes, json, sys
import numpy as np
from edgedyn.runtime.program import load
bundle, inputs, calls, marks = sys.argv[1:5]
spec = load(bundle, threads=1, device="cpu").specializations[0]
with np.load(inputs) as data:
    arrays = [data[key] for key in sorted(data.files)]
syscall, number, magic = ctypes.CDLL(None).syscall, int(marks.split(",")[0]), ctypes.c_long(int(marks.split(",")[1]))
spec.executor.run(arrays)
syscall(number, magic)
syscall(number, magic)
for _ in range(int(calls)):
    spec.executor.run(arrays)
syscall(number, magic)
print(json.dumps({"precision": spec.precision()[0]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yolo11n", choices=sorted(fullsize.MODELS))
    parser.add_argument("--board", default="raspberry-pi-5")
    parser.add_argument("--candidate", default="ncnn:fp16", help="BACKEND or BACKEND:PRECISION")
    parser.add_argument("--peer", default="ncnn-default", choices=arm.PEERS)
    args = parser.parse_args()
    import numpy as np

    import edgedyn
    from edgedyn.emulate.board import prepare
    from edgedyn.emulate.instructions import LABEL, MARKS, count_command
    from edgedyn.registry import BACKENDS

    backend, _, precision = args.candidate.partition(":")
    model, inputs, _ = fullsize.MODELS[args.model]()
    result = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "model": args.model, "board": args.board, "calls": arm.CALLS,
              "edgedyn_commit": arm.commit()}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-arm-pair-") as folder:
        work = Path(folder)
        reduced = precision not in ("", "fp32")  # a reduced precision at the gate the peers' defaults sit at
        bundle = edgedyn.export(model, inputs, board=args.board, backend=backend, precision=precision or "fp32",
                                max_accuracy_drop="cosine=0.99" if reduced else None, output=work / "edgedyn.edgedyn")
        extras = sorted({extra for record in BACKENDS.values() for extra in record.board_extra.split(",") if extra})
        board = prepare(bundle, extras=extras)
        saved = work / "inputs.npz"
        np.savez(str(saved), **{"{:03d}".format(i): t.numpy() for i, t in enumerate(inputs)})
        run = count_command(board, ["-c", _GUEST, str(bundle), str(saved), str(arm.CALLS), MARKS])
        ours = run.per_call(arm.CALLS)
        result["edgedyn"] = {"candidate": args.candidate, "per_call": ours,
                             "precision": json.loads(run.stdout.strip().splitlines()[-1])["precision"]}
        print("edgedyn {}: {:,.0f} instructions per call".format(args.candidate, ours), flush=True)
        peer_folder = work / "peer"
        peer_folder.mkdir()
        path = arm.convert_peer(args.peer, model, inputs, peer_folder)
        entry = arm.count_peer(board, args.peer, path, saved, work / "peer-outputs.npz")
        result["peer"] = dict(entry, name=args.peer)
        result["label"] = LABEL.format(board=board.name, cpu=board.qemu_cpu)
    result["ratio"] = ours / entry["per_call"]
    print("{}: {:,.0f} instructions per call; edgedyn / peer = {:.5f} ({:+,.0f})".format(
        args.peer, entry["per_call"], result["ratio"], ours - entry["per_call"]))
    arm.RESULTS.mkdir(parents=True, exist_ok=True)
    out = arm.RESULTS / "arm-pair-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(result, indent=1))
    print("results:", out)


if __name__ == "__main__":
    main()
