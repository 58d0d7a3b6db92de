"""A detector end to end: edgedyn's YOLO11n bundle (NMS inside) against torch eager and ultralytics' own exports.

    python benchmarks/detection.py                                   # YOLO11n at 640 and 320, 2 threads, 3 rounds
    python benchmarks/detection.py --sizes 320 --rounds 1 --quick    # a smoke run, a few minutes
    python benchmarks/detection.py --summarize benchmarks/results/detection-*.json

Per image the pipeline has three parts, timed apart and together: pre-processing (decode a 1280x720 JPEG, resize
to the input, scale to 0-1), the model, and NMS/post-processing (boxes back to the frame). Variants, each with its
own pre- and post-processing as its users run it:

- `torch-eager`: ultralytics' `DetectionModel("yolo11n.yaml")` in eval mode (the zoo's random weights,
  edgedyn.zoo.detectors), ultralytics' predictor steps around it: `cv2.imread`, `LetterBox(auto=False)`, BGR to
  RGB / 255 in torch; `ultralytics.utils.nms.non_max_suppression` and `ops.scale_boxes`.
- `ultralytics-onnx`, `-openvino`, `-ncnn`: `YOLO("yolo11n.yaml").export(format=...)` of the same weights, run with
  the runtime's own Python API set as ultralytics' AutoBackend sets it (onnxruntime CPU session; OpenVINO
  `PERFORMANCE_HINT=LATENCY`; ncnn without Vulkan), with the predictor's torch pre- and post-processing above.
- `edgedyn`: `edgedyn.export(..., board="x86-64", nms="iou=0.45,conf=0.25,max_det=300",
  preprocess="letterbox,order=bgr")` (backend auto), loaded with `edgedyn.runtime.load`: the bundle takes the
  decoded frame (`cv2.imread`, as ultralytics decodes) and letterboxes and scales it itself (numpy,
  edgedyn/runtime/frames.py: the pre-processing column is decode + that), its NMS is inside the call (the model and
  NMS columns split the call by the executor's per-operator profile, as `edgedyn bench` reports it), and it maps
  the boxes back to the frame (the post-processing column).

Agreement: every variant's model + NMS runs on one shared input (the JPEG letterboxed as ultralytics does) and its
valid rows are matched against torch eager's (`edgedyn.runtime.detections.compare_group`: same label, IoU >= 0.99,
score within tolerance), so a fast variant that detects differently shows. Each variant is timed in its own worker
process, in rounds that rotate the order; a column's number is the median over rounds of each worker's median
(`edgedyn.runtime.bench.time_calls`). Ratios are speed-ups against the fastest non-edgedyn variant of that column
(> 1 is faster). JSON: benchmarks/results/detection-<date>.json.
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's edgedyn, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import print_run, results_path, run_header, run_worker  # noqa: E402

# ultralytics must never try to pip-install a missing exporter dependency (no network here, and a benchmark must
# not change its environment): YOLO_OFFLINE makes its online check false, YOLO_AUTOINSTALL=0 turns AutoUpdate off.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "0")

MODEL = "yolo11n"
NMS = {"conf": 0.25, "iou": 0.45, "max_det": 300}
VARIANTS = ("torch-eager", "ultralytics-onnx", "ultralytics-openvino", "ultralytics-ncnn", "edgedyn")
REFERENCE = "torch-eager"
COLUMNS = ("pre_ms", "model_ms", "post_ms", "end_to_end_ms")
FRAME = (1280, 720)  # width, height of the test JPEG


# --- inputs ---

def test_image(path: Path) -> Path:
    """A deterministic 1280x720 JPEG: smooth noise with filled shapes, so decoding and resizing do real work."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    width, height = FRAME
    coarse = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(FRAME, Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x, y = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
        w, h = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x, y, x + w, y + h], fill=fill)
    image.save(str(path), quality=90)
    return path


def letterbox(size: int) -> Any:
    """ultralytics' predictor letterbox for a fixed-size export (`auto=False`: padded to size x size)."""
    from ultralytics.data.augment import LetterBox

    return LetterBox((size, size), auto=False, stride=32)


def ultralytics_preprocess(image: Path, size: int) -> Callable[[], Any]:
    """ultralytics' predictor pre-processing (engine/predictor.py `preprocess`): decode, letterbox, to RGB 0-1."""
    import cv2
    import torch

    transform = letterbox(size)

    def pre() -> Any:
        frame = cv2.imread(str(image))
        padded = transform(image=frame)
        batch = torch.from_numpy(padded).unsqueeze(0).permute(0, 3, 1, 2).contiguous().flip(1)
        return batch.float().div_(255)
    return pre


# --- building each variant's files (in this process) ---

@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """ultralytics writes a yaml model's exports into the current directory."""
    previous = os.getcwd()
    os.chdir(str(path))
    try:
        yield
    finally:
        os.chdir(previous)


def prepare(variant: str, size: int, model: Any, weights: Path, workdir: Path) -> Dict[str, Any]:
    """Writes what the worker of `variant` loads; returns its task fields."""
    task = {"variant": variant, "size": size, "weights": str(weights)}  # type: Dict[str, Any]
    if variant.startswith("ultralytics-"):
        import torch
        from ultralytics import YOLO

        folder = workdir / variant
        folder.mkdir()
        yolo = YOLO(MODEL + ".yaml")
        yolo.model.load_state_dict(torch.load(str(weights)))
        with working_directory(folder):
            exported = yolo.export(format=variant.split("-", 1)[1], imgsz=size, batch=1, device="cpu", verbose=False)
        task["file"] = str(folder / exported)
    elif variant == "edgedyn":
        import torch

        import edgedyn
        from edgedyn.runtime import read_manifest
        from edgedyn.runtime.format import kept_artifact

        nms = ",".join("{}={}".format(k, v) for k, v in sorted(NMS.items()))
        path = edgedyn.export(model, (torch.rand(1, 3, size, size),), board="x86-64", nms=nms,
                              preprocess="letterbox,order=bgr",
                              output=str(workdir / "{}-{}.edgedyn".format(MODEL, size)))
        task["bundle"] = str(path)
        artifact = kept_artifact(read_manifest(path)["specializations"][0])
        task["recorded"] = {"backend": artifact["backend"], "selection": artifact.get("selection")}
    elif variant != "torch-eager":
        raise ValueError("unknown variant {!r}".format(variant))
    return task


# --- the worker: one variant, one process ---

class Pipeline:
    """One variant's three steps: `pre()` -> input, `model(input)` -> raw output, `post(raw)` -> boxes in the
    frame; `detect(x)`: model + NMS on a given input, as padded (boxes, scores, labels, count) in input pixels."""

    def __init__(self, pre: Callable[[], Any], model: Callable[[Any], Any], post: Callable[[Any], Any],
                 detect: Callable[[Any], Dict[str, Any]], nms_ms: Optional[Callable[[Any], Optional[float]]] = None):
        self.pre, self.model, self.post, self.detect, self.nms_ms = pre, model, post, detect, nms_ms


def padded(rows: Any, size: int) -> Dict[str, Any]:
    """ultralytics' NMS rows [n, 6] (x1, y1, x2, y2, score, class) as the bundle's padded outputs, batch 1."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.float32)
    boxes = np.zeros((1, size, 4), np.float32)
    scores = np.zeros((1, size), np.float32)
    labels = np.zeros((1, size), np.int64)
    count = min(len(rows), size)
    boxes[0, :count], scores[0, :count], labels[0, :count] = rows[:count, :4], rows[:count, 4], rows[:count, 5]
    return {"boxes": boxes, "scores": scores, "labels": labels, "count": np.array([count], np.int64)}


def ultralytics_pipeline(task: Dict[str, Any], threads: int) -> Pipeline:
    import numpy as np
    import torch
    from ultralytics.utils import nms, ops

    torch.set_num_threads(threads)
    size = task["size"]
    variant = task["variant"]
    if variant == "torch-eager":
        from ultralytics.nn.tasks import DetectionModel

        network = DetectionModel(MODEL + ".yaml", verbose=False)
        network.load_state_dict(torch.load(task["weights"]))
        network.eval()

        def run(batch: Any) -> Any:
            with torch.inference_mode():
                return network(batch)[0]
    elif variant == "ultralytics-onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(task["file"], options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name

        def run(batch: Any) -> Any:
            return torch.from_numpy(session.run(None, {name: batch.numpy()})[0])
    elif variant == "ultralytics-openvino":
        import openvino

        core = openvino.Core()
        xml = next(Path(task["file"]).glob("*.xml"))
        compiled = core.compile_model(core.read_model(str(xml)), "CPU",
                                      {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})

        def run(batch: Any) -> Any:
            return torch.from_numpy(np.asarray(next(iter(compiled(batch.numpy()).values()))))
    elif variant == "ultralytics-ncnn":
        import ncnn

        net = ncnn.Net()
        net.opt.use_vulkan_compute = False
        net.opt.num_threads = threads
        param = next(Path(task["file"]).glob("*.param"))
        net.load_param(str(param))
        net.load_model(str(param.with_suffix(".bin")))

        def run(batch: Any) -> Any:
            with net.create_extractor() as extractor:
                extractor.input(net.input_names()[0], ncnn.Mat(batch.numpy()[0]))
                first = sorted(net.output_names())[0]
                return torch.from_numpy(np.array(extractor.extract(first)[1])[None])
    else:
        raise ValueError("unknown variant {!r}".format(variant))

    def suppress(raw: Any) -> Any:
        return nms.non_max_suppression(raw, NMS["conf"], NMS["iou"], max_det=NMS["max_det"])[0]

    height, width = FRAME[1], FRAME[0]

    def post(raw: Any) -> Any:
        rows = suppress(raw)
        rows[:, :4] = ops.scale_boxes((size, size), rows[:, :4], (height, width))
        return rows

    return Pipeline(ultralytics_preprocess(Path(task["image"]), size), run, post,
                    lambda x: padded(suppress(run(torch.from_numpy(x))).numpy(), NMS["max_det"]))


def edgedyn_pipeline(task: Dict[str, Any], threads: int) -> Pipeline:
    import cv2

    import edgedyn.runtime as rt
    from edgedyn.runtime.profiling import NMS_TYPES, profile_ops

    # Every core is the runtime's default: load as a user would, so the thread count `auto` recorded runs.
    program = rt.load(task["bundle"], threads=None if threads == os.cpu_count() else threads)
    frames = program.frames
    names = [record["name"] for record in program.specializations[0].outputs]
    placed = []  # the last frame's placement in the input, for post()

    def pre() -> Any:
        """Decoding, then the bundle's own letterbox (what program(frame) does before the model)."""
        tensor, placement = frames.prepare(cv2.imread(task["image"]))
        placed[:] = [placement]
        return tensor

    def post(out: Dict[str, Any]) -> Any:
        """The bundle's own mapping back to the frame (what program(frame) does after the model)."""
        restored = dict(zip(names, frames.restore(names, [out[name] for name in names], placed[0])))
        return restored["boxes"][0, :int(restored["count"][0])]

    def nms_ms(x: Any) -> Optional[float]:
        """The NMS op's share of a call, from the executor's profile (as `edgedyn bench` reports it)."""
        spec, values = program.dispatch(x)
        if getattr(spec.executor, "profile", None) is None or spec.artifact["executor"] == "litert":
            return None  # LiteRT times no single operator: the NMS stays in the model column
        ops = profile_ops(spec, values, 20, 0.0, 0.0)
        return sum(row["ms"] for row in ops["by_type"] if row["type"] in NMS_TYPES)

    return Pipeline(pre, program, post, lambda x: dict(program(x)), nms_ms)


def worker(task_path: str) -> None:
    from edgedyn.runtime.bench import StopRule, percentile, time_calls

    task = json.loads(Path(task_path).read_text())
    result = {}  # type: Dict[str, Any]
    try:
        build = edgedyn_pipeline if task["variant"] == "edgedyn" else ultralytics_pipeline
        pipeline = build(task, task["threads"])
        # At most 10 s a step: an OpenMP pool on a busy machine can take seconds a call, and must not stall the run.
        rule = StopRule(task["iterations"], task["seconds"], max(task["seconds"] * 10, 10.0))
        warm = StopRule(2, 0.0, 10.0)
        batch = pipeline.pre()
        raw = pipeline.model(batch)
        steps = {"pre_ms": pipeline.pre, "model_ms": lambda: pipeline.model(batch),
                 "post_ms": lambda: pipeline.post(raw),
                 "end_to_end_ms": lambda: pipeline.post(pipeline.model(pipeline.pre()))}
        for column, call in steps.items():
            time_calls(call, warm)
            result[column] = percentile(time_calls(call, rule), 50) * 1000.0
        if task.get("shared_input"):
            import numpy as np

            x = np.load(task["shared_input"])["x"]
            if pipeline.nms_ms is not None:
                result["nms_inside_ms"] = pipeline.nms_ms(x)
            found = pipeline.detect(x)
            result["detections"] = {key: np.asarray(found[key]).tolist() for key in ("boxes", "scores", "labels",
                                                                                      "count")}
    except Exception as error:  # a variant that fails is reported, the run goes on
        result = {"error": "{}: {}".format(type(error).__name__, (str(error).strip().splitlines() or [""])[0])}
    print("RESULT " + json.dumps(result))


def run_variant(task: Dict[str, Any], workdir: Path) -> Dict[str, Any]:
    """One worker process; OMP_NUM_THREADS too, for torch's and ncnn's OpenMP pools."""
    threads = str(task["threads"])
    return run_worker(task, workdir, __file__, 900, OMP_NUM_THREADS=threads, TVM_NUM_THREADS=threads)


# --- agreement and the table ---

def agreement(got: Dict[str, Any], want: Dict[str, Any]) -> Dict[str, Any]:
    """`got`'s detections against `want`'s as edgedyn verifies a bundle (matched rows, fp32 tolerance, the
    decisions NMS made at conf and max_det)."""
    import numpy as np

    from edgedyn.runtime.detections import KEYS, compare_group
    from edgedyn.runtime.program import FP32_TOLERANCE

    dtypes = {"boxes": np.float32, "scores": np.float32, "labels": np.int64, "count": np.int64}
    arrays = [[np.asarray(side[key], dtypes[key]) for key in KEYS] for side in (got, want)]
    result = compare_group({key: i for i, key in enumerate(KEYS)}, arrays[0], arrays[1], FP32_TOLERANCE,
                           {"score_threshold": NMS["conf"], "max_out": NMS["max_det"]})
    result.update(count=int(np.asarray(got["count"]).ravel()[0]), reference_count=int(np.asarray(want["count"]).ravel()[0]))
    return result


def add_ratios(variants: Dict[str, Dict[str, Any]]) -> None:
    """Per column, the fastest non-edgedyn time over this variant's (> 1: faster than every peer)."""
    for column in COLUMNS:
        peers = [v[column] for name, v in variants.items() if name != "edgedyn" and v.get(column)]
        for entry in variants.values():
            if column == "post_ms" and entry.get("nms_in_model_column"):
                continue  # its post-processing is only the boxes' scaling: no ratio to a peer's NMS
            if peers and entry.get(column):
                entry.setdefault("vs_best_peer", {})[column] = min(peers) / entry[column]


def table(results: Dict[str, Any]) -> str:
    lines = ["| model | variant | pre ms | model ms | NMS/post ms | end-to-end ms | agreement with torch eager |",
             "|---|---|---:|---:|---:|---:|---|"]
    # JSON keeps keys sorted: the table puts the larger input first and the variants in VARIANTS' order
    for model, record in sorted(results["models"].items(), key=lambda item: -item[1]["size"]):
        for name, entry in sorted(record["variants"].items(), key=lambda item: VARIANTS.index(item[0])):
            if "error" in entry and "end_to_end_ms" not in entry:
                lines.append("| {} | {} | failed: {} |||||".format(model, name, entry["error"][:160]))
                continue
            cells = []
            for column in COLUMNS:
                ratio = entry.get("vs_best_peer", {}).get(column)
                cells.append("{:.2f} ({:.2f}x)".format(entry[column], ratio) if ratio else "{:.2f}".format(entry[column]))
            if entry.get("nms_inside_ms") is not None:
                cells[2] += ", NMS op {:.2f}".format(entry["nms_inside_ms"])
            elif entry.get("nms_in_model_column"):
                cells[2] += " (NMS in the model column)"
            label = name + (" ({})".format(entry["recorded"]["backend"]) if entry.get("recorded") else "")
            lines.append("| {} | {} | {} | {} |".format(model, label, " | ".join(cells), describe(entry.get("agreement"))))
    return "\n".join(lines)


def describe(found: Optional[Dict[str, Any]]) -> str:
    if not found:
        return "-"
    if not found["ok"]:
        return "differs: {} (count {} vs {})".format(found["error"][:120], found["count"], found["reference_count"])
    return "{}/{} rows matched, {} borderline, min IoU {:.4f}".format(
        found["rows_matched"], found["reference_count"], found["rows_borderline"], found["min_iou"])


# --- the run ---

def bench_size(size: int, args: argparse.Namespace, workdir: Path, image: Path) -> Dict[str, Any]:
    import numpy as np
    import torch

    from edgedyn.zoo import detectors

    name = "{}-{}".format(MODEL, size)
    model = detectors.build(MODEL)
    shared_input = ultralytics_preprocess(image, size)()
    # Note: the zoo sets its heads' output statistics on random uniform images; on a JPEG (flat shapes, the
    # letterbox's grey border) those heads put every anchor's score at 1.0 (300 tied rows, nothing to compare).
    # The same targets set on this image give a detector's picture: tens of boxes, distinct scores below 1.
    detectors.spread_head_outputs(model, {"x": shared_input}, detectors.yolo_heads(model))
    weights = workdir / "weights.pt"
    torch.save(model.state_dict(), str(weights))
    shared = workdir / "shared.npz"
    np.savez(str(shared), x=shared_input.numpy())
    tasks, record = {}, {"size": size, "variants": {}}  # type: Dict[str, Dict[str, Any]], Dict[str, Any]
    for variant in args.variants:
        print("[{}] building {}".format(name, variant), file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            tasks[variant] = dict(prepare(variant, size, model, weights, workdir), image=str(image),
                                  threads=args.threads, iterations=args.iterations, seconds=args.seconds)
            tasks[variant]["build_s"] = round(time.perf_counter() - started, 1)
        except Exception as error:
            record["variants"][variant] = {"error": "{}: {}".format(type(error).__name__,
                                                                    (str(error).strip().splitlines() or [""])[0])}
    rounds = {variant: [] for variant in tasks}  # type: Dict[str, List[Dict[str, Any]]]
    order = list(tasks)
    for index in range(args.rounds):
        for variant in order[index % len(order):] + order[:index % len(order)]:
            task = dict(tasks[variant], shared_input=str(shared) if index == 0 else None)
            rounds[variant].append(run_variant(task, workdir))
            shown = {k: round(v, 3) for k, v in rounds[variant][-1].items() if k.endswith("_ms") and v is not None}
            print("[{}] round {} {}: {}".format(name, index + 1, variant, shown or rounds[variant][-1]),
                  file=sys.stderr, flush=True)
    for variant, results in rounds.items():
        entry = {"recorded": tasks[variant].get("recorded"), "build_s": tasks[variant]["build_s"],
                 "rounds": [{k: v for k, v in r.items() if k != "detections"} for r in results]}  # type: Dict[str, Any]
        for column in COLUMNS + ("nms_inside_ms",):
            values = [r[column] for r in results if r.get(column) is not None]
            if values:
                entry[column] = statistics.median(values)
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            entry["error"] = errors[0]
        if variant == "edgedyn" and "model_ms" in entry:
            # NMS runs inside the bundle's call: its op's profiled time moves from the model to the NMS column;
            # where the executor times no single op (LiteRT), it stays in the model column and says so.
            if entry.get("nms_inside_ms") is not None:
                entry["call_ms"] = entry["model_ms"]
                entry["model_ms"] -= entry["nms_inside_ms"]
                entry["post_ms"] += entry["nms_inside_ms"]
            else:
                entry["nms_in_model_column"] = True
        detections = next((r["detections"] for r in results if "detections" in r), None)
        if detections is not None:
            entry["detections"] = detections
        record["variants"][variant] = entry
    reference = record["variants"].get(REFERENCE, {}).get("detections")
    for entry in record["variants"].values():
        if reference is not None and "detections" in entry:
            entry["agreement"] = agreement(entry["detections"], reference)
        entry.pop("detections", None)
    add_ratios(record["variants"])
    return record


def versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("torch", "ultralytics", "onnxruntime", "openvino", "ncnn", "pnnx", "ai-edge-litert",
                    "apache-tvm", "opencv-python", "pillow", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="640,320", help="input sizes of YOLO11n, comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20, help="at least this many timed calls per step")
    parser.add_argument("--seconds", type=float, default=1.0, help="and at least this long per step")
    parser.add_argument("--quick", action="store_true", help="3 calls, 0.1 s per step: a smoke run")
    parser.add_argument("--summarize", metavar="RESULTS.json", help="print the table of an earlier run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.summarize:
        print(table(json.loads(Path(args.summarize).read_text())))
        return
    if args.quick:
        args.iterations, args.seconds = 3, 0.1
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error("unknown variant(s) {}; choose from: {}".format(", ".join(unknown), ", ".join(VARIANTS)))
    if REFERENCE not in args.variants:
        parser.error("the variants must include {} (the agreement reference)".format(REFERENCE))
    results = dict(run_header(args.threads, args.rounds),
                   **{"iterations": args.iterations, "seconds_per_step": args.seconds,
                      "image": "{}x{} JPEG (test_image)".format(*FRAME), "nms": NMS, "versions": versions(),
                      "models": {}})  # type: Dict[str, Any]
    out = results_path("detection")
    with tempfile.TemporaryDirectory(prefix="edgedyn-detection-") as folder:
        image = test_image(Path(folder) / "frame.jpg")
        for size in [int(s) for s in args.sizes.split(",") if s]:
            workdir = Path(folder) / str(size)
            workdir.mkdir()
            results["models"]["{}-{}".format(MODEL, size)] = bench_size(size, args, workdir, image)
            results["load_average"] = os.getloadavg()  # after each model: how busy the machine was while it ran
            out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print_run(results, table(results), out)


if __name__ == "__main__":
    main()
