"""A camera frame to a detector's input: edgedyn's in-bundle letterbox (`export --preprocess`) against the
pre-processing users run beside other runtimes, per frame size.

    python benchmarks/frames.py                          # 640x480, 1280x720, 1920x1080 frames to 640x640; 5 rounds
    python benchmarks/frames.py --size 320 --rounds 3

Variants, each from a decoded uint8 frame (decoding is the same for all and left out) to a float32 1x3xSxS input
scaled to 0-1:
- `edgedyn-frames`: `Frames.prepare` (edgedyn/runtime/frames.py), what `program(frame)` does before the model:
  ultralytics' LetterBox arithmetic, bilinear in numpy, BGR to RGB, / 255, NCHW. Numpy only, as on a board.
- `ultralytics-cv2`: ultralytics' predictor steps: `LetterBox(auto=False)` (cv2.resize, cv2.copyMakeBorder), then
  BGR to RGB, NCHW, / 255 in torch (engine/predictor.py `preprocess`).
- `pil-stretch`: what `edgedyn run` did before --preprocess: PIL resize to SxS (no letterbox), / 255, NCHW.
Each variant runs in its own process, in rounds that rotate the order; a cell is the median over rounds of each
process's median of 50 calls. Ratios: the variant's time over edgedyn-frames' (> 1: edgedyn is faster). Agreement:
edgedyn-frames' input against ultralytics-cv2's, the largest difference in grey levels (OpenCV interpolates in fixed
point). JSON: benchmarks/results/frames-<date>.json, with the CPU model and flags.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List  # noqa: F401 (type comments)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import results_path, run_header  # noqa: E402

VARIANTS = ("edgedyn-frames", "ultralytics-cv2", "pil-stretch")
FRAMES = ((480, 640), (720, 1280), (1080, 1920))  # height, width
CALLS = 50


def frame(height: int, width: int) -> Any:
    """A deterministic BGR frame with structure at every scale (as a camera's), uint8."""
    import numpy as np

    rng = np.random.default_rng(height * 7 + width)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255.0 / (width - 1), y * 255.0 / (height - 1),
                       127.5 + 127.5 * np.sin(x / 9.0 + y / 13.0)], axis=2)
    return np.clip(smooth + rng.normal(0, 30, smooth.shape), 0, 255).astype(np.uint8)


def preparer(variant: str, size: int) -> Callable[[Any], Any]:
    """The variant's frame -> input function."""
    if variant == "edgedyn-frames":
        from edgedyn.runtime.frames import Frames

        frames = Frames({"input": "x", "resize": "letterbox", "size": [size, size], "pad": 114, "normalize": "unit",
                         "order": "bgr", "max_frame": [4096, 4096]}, [{"name": "x", "kind": "tensor"}])
        return lambda image: frames.prepare(image)[0]
    if variant == "ultralytics-cv2":
        import torch
        from ultralytics.data.augment import LetterBox

        letterbox = LetterBox((size, size), auto=False, stride=32)

        def ultralytics(image: Any) -> Any:
            padded = letterbox(image=image)
            batch = torch.from_numpy(padded).unsqueeze(0).permute(0, 3, 1, 2).contiguous().flip(1)
            return batch.float().div_(255).numpy()
        return ultralytics
    if variant == "pil-stretch":
        import numpy as np
        from PIL import Image

        def pil(image: Any) -> Any:
            rgb = Image.fromarray(np.ascontiguousarray(image[:, :, ::-1])).resize((size, size), Image.BILINEAR)
            return np.ascontiguousarray((np.asarray(rgb, np.float32) / 255.0).transpose(2, 0, 1)[None])
        return pil
    raise ValueError(variant)


def worker(variant: str, size: int, out: str) -> None:
    """One variant, every frame size, in this process: medians of CALLS calls after warm-up; the inputs saved."""
    import numpy as np

    prepare = preparer(variant, size)
    result = {}  # type: Dict[str, Any]
    arrays = {}
    for height, width in FRAMES:
        image = frame(height, width)
        for _ in range(3):
            prepare(image)
        times = []
        for _ in range(CALLS):
            started = time.perf_counter()
            arrays["{}x{}".format(width, height)] = prepare(image)
            times.append((time.perf_counter() - started) * 1000.0)
        result["{}x{}".format(width, height)] = statistics.median(times)
    np.savez(out, **arrays)
    print("RESULT " + json.dumps(result))


def run(variant: str, size: int, out: Path) -> Dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, __file__, "--worker", variant, "--size", str(size), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not line:
        raise RuntimeError("{} failed: {}".format(variant, done.stderr[-2000:]))
    return json.loads(line[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.size, args.out)
        return
    import tempfile

    import numpy as np

    folder = Path(tempfile.mkdtemp(prefix="edgedyn-frames-"))
    rounds = []  # type: List[Dict[str, Dict[str, float]]]
    for number in range(args.rounds):
        order = VARIANTS[number % len(VARIANTS):] + VARIANTS[:number % len(VARIANTS)]
        rounds.append({variant: run(variant, args.size, folder / "{}.npz".format(variant)) for variant in order})
    keys = ["{}x{}".format(w, h) for h, w in FRAMES]
    medians = {v: {k: statistics.median(r[v][k] for r in rounds) for k in keys} for v in VARIANTS}
    with np.load(str(folder / "edgedyn-frames.npz")) as ours, np.load(str(folder / "ultralytics-cv2.npz")) as theirs:
        agreement = {k: float(np.abs(ours[k] - theirs[k]).max() * 255.0) for k in keys}
    results = dict(run_header(1, args.rounds), size=args.size, rounds_ms=rounds, median_ms=medians,
                   max_grey_levels=agreement)
    print("{} (flags {}), 1 thread, frames to 1x3x{s}x{s}, median ms over {} rounds".format(
        results["cpu"], " ".join(results["cpu_features"]), args.rounds, s=args.size))
    print("| frame | " + " | ".join(VARIANTS) + " | edgedyn vs ultralytics-cv2, max grey levels |")
    print("|---" * (len(VARIANTS) + 2) + "|")
    for key in keys:
        base = medians["edgedyn-frames"][key]
        cells = ["{:.2f}".format(base)] + ["{:.2f} ({:.2f}x)".format(medians[v][key], medians[v][key] / base)
                                           for v in VARIANTS[1:]]
        print("| {} | {} | {:.0f} |".format(key, " | ".join(cells), agreement[key]))
    path = results_path("frames")
    path.write_text(json.dumps(results, indent=1))
    print("results: {}".format(path.relative_to(REPO)))


if __name__ == "__main__":
    main()
