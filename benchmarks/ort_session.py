"""onnxruntime session settings against each other on edgedyn's own .onnx files: what a board's [onnxruntime] table
should say, measured rather than guessed.

    python benchmarks/ort_session.py                                  # mobilenet_v2 and zoo:distilbert
    python benchmarks/ort_session.py --models mobilenet_v2 --rounds 3 --seconds 2

Each model is exported once (--backend onnxruntime for x86-64); every setting then runs in its own process (a
spinning onnxruntime thread pool slows whatever shares the cores), settings alternating, for `--rounds` rounds.
Per setting: the median of the per-round median call times, and calls per second of wall time (which a spinning
pool that steals the caller's core lowers even when single calls look fast).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (label, settings as the board file's [onnxruntime] table writes them)
SETTINGS = [
    ("default (all, sequential, spinning)", {}),
    ("allow_spinning = false", {"allow_spinning": False}),
    ("intra_op_threads = 1", {"intra_op_threads": 1}),
    ("intra_op_threads = 2", {"intra_op_threads": 2}),
    ("execution_mode = parallel", {"execution_mode": "parallel"}),
    ("graph_optimization = extended", {"graph_optimization": "extended"}),
]


def export(model: str, workdir: Path) -> Path:
    """The onnxruntime artifact's model.onnx for a name of speed.py's MODELS or zoo:NAME."""
    import edgedyn
    from edgedyn.runtime.format import Bundle

    if model.startswith("zoo:"):
        from edgedyn import zoo

        reference, inputs = zoo.build(model[4:]), zoo.input_options(model[4:])
    else:
        reference, inputs = str(REPO / "examples" / "{}.py:{}".format(*_EXAMPLES[model])), [_EXAMPLES[model][2]]
    path = edgedyn.export(reference, inputs=inputs, backend="onnxruntime", verify=False,
                          output=workdir / "{}.edgedyn".format(model.replace(":", "-")))
    bundle = Bundle(path)
    artifact = bundle.manifest["specializations"][0]["artifacts"][-1]
    onnx_path = workdir / "{}.onnx".format(model.replace(":", "-"))
    onnx_path.write_bytes(bundle.read(artifact["files"]["model"]))
    return onnx_path


_EXAMPLES = {"mobilenet_v2": ("mobilenet_v2", "MobileNetV2", "x=1x3x96x96"), "tiny_cnn": ("tiny_cnn", "TinyCNN",
                                                                                          "x=1x3x64x64")}


def child(path: str, settings: Dict[str, Any], seconds: float) -> Dict[str, float]:
    """In the child process: open the session as the runtime does with these settings, time calls."""
    import time

    import numpy as np
    import onnxruntime as ort

    from edgedyn.runtime.executors.onnxruntime import DEFAULT_SESSION, _session_options

    session = ort.InferenceSession(path, _session_options(ort, dict(DEFAULT_SESSION, **settings), None),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: (rng.integers(0, 100, i.shape).astype(np.int64) if "int64" in i.type
                      else rng.standard_normal(i.shape).astype(np.float32)) for i in session.get_inputs()}
    for _ in range(20):
        session.run(None, feeds)
    times = []  # type: List[float]
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        before = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - before)
    wall = time.perf_counter() - started
    return {"median_ms": float(np.median(times)) * 1000.0, "calls_per_s": len(times) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet_v2,zoo:distilbert")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per setting and round")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], json.loads(args.child[1]), args.seconds)))
        return
    from edgedyn.runtime import sysinfo

    print("| model | setting | median ms | calls/s | vs default |", "|---|---|---:|---:|---:|", sep="\n")
    with tempfile.TemporaryDirectory(prefix="edgedyn-ort-session-") as workdir:
        for model in args.models.split(","):
            path = export(model, Path(workdir))
            runs = {label: [] for label, _ in SETTINGS}  # type: Dict[str, List[Dict[str, float]]]
            for _ in range(args.rounds):
                for label, settings in SETTINGS:
                    out = subprocess.run([sys.executable, __file__, "--seconds", str(args.seconds), "--child",
                                          str(path), json.dumps(settings)], check=True, capture_output=True,
                                         text=True).stdout
                    runs[label].append(json.loads(out.strip().splitlines()[-1]))
            base = _median([r["median_ms"] for r in runs[SETTINGS[0][0]]])
            for label, _ in SETTINGS:
                median = _median([r["median_ms"] for r in runs[label]])
                print("| {} | {} | {:.4f} | {:.0f} | {:.2f}x |".format(
                    model, label, median, _median([r["calls_per_s"] for r in runs[label]]), base / median))
    print("{}, load average {:.2f}".format(sysinfo.environment().get("cpu_model"), os.getloadavg()[0]),
          file=sys.stderr)


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


if __name__ == "__main__":
    main()
