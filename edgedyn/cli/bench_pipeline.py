"""`edgedyn bench` on a detector or with --image: where a call's time goes (pre-processing, the network, NMS)."""
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from edgedyn.errors import EdgedynError
from edgedyn.runtime.detections import groups

PREPROCESS_RUNS = 20  # `edgedyn bench --image`: how often the pre-processing is timed


def pipeline_rows(pipeline: Optional[Dict[str, Any]]) -> List[Any]:
    """Where a detector's time goes: pre-processing (with --image), the call, the NMS inside it."""
    if not pipeline:
        return []
    rows = []
    pre = pipeline.get("preprocess")
    if pre is not None:
        rows.append(("pre-processing", "{:.3f} ms median ({} of {}, {} runs; {})".format(
            pre["median_ms"], pre["steps"], Path(pre["image"]).name, pre["runs"],
            "the bundle's part runs in its call, timed apart here" if pre["preprocess"] == "in the bundle" else
            "before the bundle is called")))
    if "model_and_nms_ms" in pipeline:
        nms = pipeline.get("nms_ms")
        rows.append(("model + NMS", "{:.3f} ms median (the bundle's call)".format(pipeline["model_and_nms_ms"])))
        rows.append(("  of which NMS", "{:.3f} ms ({:.1%} of the profiled call; {})".format(
            nms, pipeline["nms_share"] or 0.0, pipeline["nms_source"]) if nms is not None else
            "not measured: {}".format(pipeline["why"])))
    if pre is not None and "model_and_nms_ms" in pipeline:
        rows.append(("pipeline", "{:.3f} ms: pre-processing {:.0%}, model + NMS {:.0%}".format(
            pre["median_ms"] + pipeline["model_and_nms_ms"],
            pre["median_ms"] / (pre["median_ms"] + pipeline["model_and_nms_ms"]),
            pipeline["model_and_nms_ms"] / (pre["median_ms"] + pipeline["model_and_nms_ms"]))))
    return rows


def _time_frames(frames: Any, image: Path, preprocess: str, name: str) -> Any:
    """time_preprocessing for a bundle exported with --preprocess: decoding, then the bundle's own resize and
    scaling (which its call does; timed here apart, as it is, so the model's column is the model's)."""
    import tempfile
    import time

    from edgedyn.cli.run import read_frame, refuse_preprocess

    refuse_preprocess(frames, preprocess, name)
    times = []
    for _ in range(PREPROCESS_RUNS):
        started = time.perf_counter()
        frame = read_frame(image)
        tensor, _ = frames.prepare(frame)
        times.append((time.perf_counter() - started) * 1000.0)
    path = Path(tempfile.mkdtemp(prefix="edgedyn-bench-")) / "image.npz"
    np.savez(str(path), **{frames.input: tensor})
    record = {"image": str(image), "preprocess": "in the bundle", "runs": PREPROCESS_RUNS,
              "median_ms": float(np.median(times)), "steps": "decode {}x{}, the bundle's {} to {}x{}".format(
                  frame.shape[1], frame.shape[0], frames.record["resize"], frames.size[0], frames.size[1])}
    return record, path


def time_preprocessing(bundle: Path, image: Path, preprocess: str, specialization: Optional[str]) -> Any:
    """(the pre-processing's timing record, an .npz holding the image as the bundle's input): `edgedyn run`'s
    image reading, timed over PREPROCESS_RUNS runs."""
    import tempfile
    import time

    from edgedyn.cli.run import PREPROCESS, read_image
    from edgedyn.runtime.format import read_manifest
    from edgedyn.runtime.frames import frames_of

    if preprocess not in PREPROCESS:
        raise EdgedynError("unknown --preprocess '{}'; choose from: {}".format(preprocess, ", ".join(PREPROCESS)))
    if not image.is_file():
        raise EdgedynError("--image {}: no such file".format(image), hint="give a .jpg or .png")
    manifest = read_manifest(bundle)
    frames = frames_of(manifest)
    if frames is not None:
        return _time_frames(frames, image, preprocess, bundle.name)
    specs = manifest["specializations"]
    spec = next((s for s in specs if specialization in (None, s["name"])), specs[0])
    tensors = [record for record in spec["inputs"] if len(record["shape"]) == 4 and record["shape"][1] in (1, 3)]
    if len(spec["inputs"]) != 1 or not tensors:
        raise EdgedynError("--image needs a bundle with one image input (Nx3xHxW); {} takes {}".format(
            bundle.name, ", ".join(r["name"] for r in spec["inputs"])), hint="time it with --inputs FILE.npz")
    detector = bool(groups([record["name"] for record in spec["outputs"]]))
    mode = ("unit" if detector else "imagenet") if preprocess == "auto" else preprocess
    shape = tuple(tensors[0]["shape"])
    times = []
    for _ in range(PREPROCESS_RUNS):
        started = time.perf_counter()
        array = read_image(image, shape, mode)
        times.append((time.perf_counter() - started) * 1000.0)
    folder = tempfile.mkdtemp(prefix="edgedyn-bench-")
    path = Path(folder) / "image.npz"
    np.savez(str(path), **{tensors[0]["name"]: array})
    record = {"image": str(image), "preprocess": mode, "runs": PREPROCESS_RUNS,
              "median_ms": float(np.median(times)), "steps": "decode, resize to {}x{}, {}".format(
                  shape[2], shape[3], {"unit": "scale to 0-1", "imagenet": "ImageNet normalization",
                                       "none": "0-255 floats"}[mode])}
    return record, path
