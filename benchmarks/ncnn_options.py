"""ncnn's convolution options on the emulated board: does any set execute fewer instructions than ncnn's defaults?

    python benchmarks/ncnn_options.py --model tv-resnet18 --board raspberry-pi-5

edgedyn's ncnn artifacts run with ncnn's default convolution choices (a board file may override them: the runtime's
OPTION_CHOICES). Whether `auto` should also search over them is a measurement: this script converts the model as
NCNN's users do (pnnx from the torch module, arm.py's `_ncnn`) and counts it on the emulated board once per option
set with arm.py's ncnn harness (one thread, ncnn's default precision for that CPU, the variant's options on top),
each with its cosine to torch eager on the same input.
Counts as arm.py counts (edgedyn/emulate/instructions.py); JSON goes to benchmarks/results/ncnn-options-*.json.
"""
import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List  # noqa: F401 (type comments)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm  # noqa: E402
import fullsize  # noqa: E402

# Each variant: the ncnn Option attributes it sets (on top of ncnn's defaults).
VARIANTS = {
    "default": {},
    "no-winograd63": {"use_winograd63_convolution": False},
    "no-winograd43": {"use_winograd43_convolution": False},
    "winograd23-only": {"use_winograd63_convolution": False, "use_winograd43_convolution": False},
    "no-winograd": {"use_winograd_convolution": False},
    "no-sgemm": {"use_sgemm_convolution": False},
    "no-packing": {"use_packing_layout": False},
}

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tv-resnet18", choices=sorted(fullsize.MODELS))
    parser.add_argument("--board", default="raspberry-pi-5")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    args = parser.parse_args()
    import numpy as np
    import torch

    import edgedyn
    from edgedyn.emulate.board import prepare
    from edgedyn.emulate.instructions import LABEL
    from edgedyn.registry import BACKENDS

    model, inputs, _ = fullsize.MODELS[args.model]()
    with torch.no_grad():
        reference = model(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    result = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "model": args.model, "board": args.board, "calls": arm.CALLS, "edgedyn_commit": arm.commit(),
              "variants": {}}  # type: Dict[str, Any]
    with tempfile.TemporaryDirectory(prefix="edgedyn-ncnn-options-") as folder:
        work = Path(folder)
        # any bundle for the board prepares its emulated rootfs with the runtimes; the portable one builds fastest
        bundle = edgedyn.export(model, inputs, board=args.board, backend="portable", output=work / "b.edgedyn")
        extras = sorted({extra for record in BACKENDS.values() for extra in record.board_extra.split(",") if extra})
        board = prepare(bundle, extras=extras)
        saved = work / "inputs.npz"
        np.savez(str(saved), **{"{:03d}".format(i): t.numpy() for i, t in enumerate(inputs)})
        path = arm.convert_peer("ncnn-default", model, inputs, work)
        result["label"] = LABEL.format(board=board.name, cpu=board.qemu_cpu)
        for name in [v for v in args.variants.split(",") if v]:
            outputs = work / "{}.npz".format(name)
            entry = arm.count_peer(board, "ncnn-default", path, saved, outputs, ncnn_options=VARIANTS[name])
            with np.load(str(outputs)) as got:
                computed = [got["output.{}".format(i)] for i in range(len(got.files))]
            entry.update(options=VARIANTS[name], cosine=arm.cosine(computed[:1], [reference[0].numpy()]))
            result["variants"][name] = entry
            print("{}: {:,.0f} instructions per call, cosine {:.6f} ({})".format(
                name, entry["per_call"], entry["cosine"], entry["ran"]), flush=True)
    base = result["variants"].get("default", {}).get("per_call")
    print("\n| options | instructions per call | vs default | cosine to torch |\n|---|---:|---:|---:|")
    for name, entry in result["variants"].items():
        print("| {} | {:,.0f} | {} | {:.6f} |".format(name, entry["per_call"], "{:.3f}x".format(
            entry["per_call"] / base) if base else "-", entry["cosine"]))
    arm.RESULTS.mkdir(parents=True, exist_ok=True)
    out = arm.RESULTS / "ncnn-options-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(result, indent=1))
    print("results:", out.relative_to(REPO))


if __name__ == "__main__":
    main()
