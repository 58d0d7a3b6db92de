"""Where bf16 changes a detector's boxes: the network's arithmetic, its decode, or NMS?

    python benchmarks/detector_bf16.py                    # the zoo's YOLO11n at 640, 6 inputs, needs AVX512_BF16
    python benchmarks/detector_bf16.py --inputs 3 --shares 0.5

edgedyn's float gate judges a detector with NMS inside by its matched rows (same label, IoU >= 0.5; 98% must
match: docs/precision.md), and OpenVINO's bf16 misses it on the zoo's YOLO11n. This script tells where the rows are
lost. It exports the raw head (no NMS: boxes decoded, 80 class scores per anchor) to an OpenVINO IR with edgedyn,
computes it in OpenVINO f32, in bf16, and in bf16 with the first shares of its layers kept fp32 (the marks edgedyn's
mixed artifacts use: backends/openvino_marks.py), and then applies the same fp32 NMS (torchvision's batched_nms at
the zoo's --nms thresholds) to every variant and to torch eager's head; a last row rounds torch eager's head
outputs to bf16 (every layer exact, only the decoded values rounded). Rows are compared with the gate's own
comparison (quantize.accuracy.compare_outputs). JSON goes to benchmarks/results/detector-bf16-*.json.
"""
import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm  # noqa: E402
RESULTS = REPO / "benchmarks" / "results"
NAMES = ["boxes", "scores", "labels", "count"]


def _nms(head: Any, options: Dict[str, float], bf16: bool = False) -> List[Any]:
    """torchvision's NMS in fp32 on a raw head [1, 4 + classes, anchors] (xywh, class scores), padded to max_det
    rows as edgedyn's detection outputs are; `bf16`: the head's values rounded to bf16 first."""
    import numpy as np
    import torch
    import torchvision

    rows = torch.from_numpy(np.asarray(head[0], np.float32)).T
    if bf16:
        rows = rows.to(torch.bfloat16).float()
    scores, labels = rows[:, 4:].max(1)
    keep = scores > options["conf"]
    xywh, scores, labels = rows[keep, :4], scores[keep], labels[keep]
    boxes = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
    kept = torchvision.ops.batched_nms(boxes, scores, labels, options["iou"])[:int(options["max_det"])]
    size, count = int(options["max_det"]), len(kept)
    out = [np.zeros((1, size, 4), np.float32), np.zeros((1, size), np.float32), np.zeros((1, size), np.int64)]
    out[0][0, :count], out[1][0, :count], out[2][0, :count] = (boxes[kept].numpy(), scores[kept].numpy(),
                                                               labels[kept].numpy())
    return out + [np.array([count], np.int64)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=6, help="random images (the zoo's example_inputs seeds)")
    parser.add_argument("--shares", default="0.1,0.35,0.5,0.7,0.9", help="shares of layers kept fp32 under bf16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import numpy as np
    import openvino
    import torch

    import edgedyn
    from edgedyn.backends.openvino_marks import keep_first_layers_fp32
    from edgedyn.quantize.accuracy import compare_outputs
    from edgedyn.runtime.format import Bundle
    from edgedyn.runtime.precision import host_features, is_native
    from edgedyn.zoo import detectors

    if not is_native("bf16", "x86_64", host_features()):
        sys.exit("error: this CPU has no bf16 arithmetic (AVX512_BF16 or AMX)\nhint: run it on such a CPU")
    model = detectors.build("yolo11n")
    options = {key: float(value) for key, value in
               (part.split("=") for part in detectors.get("yolo11n").nms.split(","))}
    inputs = [detectors.example_inputs("yolo11n", seed=seed)["x"].numpy() for seed in range(args.inputs)]
    with torch.no_grad():
        eager = [model(torch.from_numpy(x)) for x in inputs]
    eager = [np.asarray((e[0] if isinstance(e, (list, tuple)) else e).numpy()) for e in eager]
    want = [_nms(head, options) for head in eager]
    with tempfile.TemporaryDirectory(prefix="edgedyn-detector-bf16-") as folder:
        path = edgedyn.export(model, detectors.example_inputs("yolo11n"), backend="openvino", precision="fp32",
                              output=Path(folder) / "raw.edgedyn")
        bundle = Bundle(path)
        files = bundle.manifest["specializations"][0]["artifacts"][-1]["files"]
        xml, weights = bundle.read(files["model"]), bundle.read(files["weights"])
    core = openvino.Core()

    def heads(ir: bytes, hint: str) -> List[Any]:
        model_ = core.read_model(ir.decode("utf-8"), openvino.Tensor(np.frombuffer(weights, np.uint8)))
        request = core.compile_model(model_, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                     "INFERENCE_NUM_THREADS": args.threads}).create_infer_request()
        return [np.asarray(list(request.infer([x]).values())[0]) for x in inputs]

    def row(label: str, got_heads: List[Any], bf16: bool = False, **extra: Any) -> Dict[str, Any]:
        compared = compare_outputs(NAMES, [_nms(h, options, bf16) for h in got_heads], want)[0]
        entry = dict(extra, variant=label, head_cosine=arm.cosine(got_heads, eager),
                     **{key: compared[key] for key in ("rows_matched", "rows_expected", "rows_returned",
                                                       "row_agreement")})
        print("| {} | {:.6f} | {}/{} | {:.1%} |".format(label, entry["head_cosine"], entry["rows_matched"],
                                                        entry["rows_expected"], entry["row_agreement"]), flush=True)
        return entry

    print("| variant (then fp32 NMS) | raw head cosine to torch | rows matched | row agreement |\n|---|---:|---:|---:|")
    rows = [row("OpenVINO f32", heads(xml, "f32")), row("OpenVINO bf16", heads(xml, "bf16"))]
    for share in [float(s) for s in args.shares.split(",") if s]:
        marked, kept, total = keep_first_layers_fp32(xml, share)
        rows.append(row("OpenVINO bf16, first {} of {} layers fp32".format(kept, total), heads(marked, "bf16"),
                        share=share))
    rows.append(row("torch eager, head outputs rounded to bf16", eager, bf16=True))
    result = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "model": "zoo yolo11n 640 (raw head)", "nms": options, "inputs": args.inputs,
              "openvino": openvino.get_version(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "detector-bf16-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(result, indent=1))
    print("results:", out.relative_to(REPO))


if __name__ == "__main__":
    main()
