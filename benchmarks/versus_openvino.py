"""edgedyn's default export against OpenVINO's own default, in one process, alternating, on any fullsize.py model.

    python benchmarks/versus_openvino.py --models timm-convnext_tiny,tv-shufflenet_v2_x1_0 --threads 2

A quick check across many architectures, beside speed.py's full run: each model is exported as a user would
(`edgedyn.export(model, inputs, board="x86-64")`: `auto` over backend x precision x threads, its float gate) and
converted as an OpenVINO user would (`openvino.convert_model(model, example_input=...)`, compiled for the CPU with
its defaults: bf16 on AVX512_BF16/AMX CPUs), then both are timed in one process, alternating `--rounds` rounds of
`--calls` calls on the same input (this VM's processes land in fast or slow modes: benchmarks/README.md), the
median of round medians. Each one's cosine to torch eager is on a fresh input; what `auto` kept, its own timings
and why, and what it rejected come from the bundle's record. JSON: benchmarks/results/versus-openvino-DATE.json,
with the CPU model and flags.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List  # noqa: F401 (List: type comments)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the models, the CPU record and where results go)


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def alternated(calls: Dict[str, Callable[[], Any]], rounds: int, per_round: int) -> Dict[str, float]:
    """Median over rounds of each call's median ms, the order flipping every round, after 5 warm-up calls each."""
    for call in calls.values():
        for _ in range(5):
            call()
    medians = {name: [] for name in calls}  # type: Dict[str, List[float]]
    names = list(calls)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            times = []
            for _ in range(per_round):
                started = time.perf_counter()
                calls[name]()
                times.append((time.perf_counter() - started) * 1000.0)
            medians[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in medians.items()}


def one(name: str, threads: int, rounds: int, per_round: int) -> Dict[str, Any]:
    import openvino
    import torch

    import edgedyn
    import edgedyn.runtime as rt

    model, inputs, _ = speed.MODELS[name]()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgedyn-vs-ov-") as folder:
        path = edgedyn.export(model, inputs, board="x86-64", output=str(Path(folder) / "m.edgedyn"))
        exported_s = time.perf_counter() - started
        selection = rt.read_manifest(path)["specializations"][0]["artifacts"][0]["selection"]
        bundle = rt.load(path, threads=threads)
        compiled = openvino.Core().compile_model(openvino.convert_model(model, example_input=inputs), "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
        request = compiled.create_infer_request()
        fresh = [torch.randn_like(t) for t in inputs]
        arrays = [t.numpy() for t in fresh]
        with torch.no_grad():
            want = model(*fresh)
        record = {"exported_s": round(exported_s, 1), "kept": selection.get("candidate"),
                  "why": selection.get("why"), "rejected": selection.get("rejected", {}),
                  "edgedyn_cosine": cosine(bundle(*arrays), want),
                  "openvino_cosine": cosine(request.infer(arrays)[0], want)}  # type: Dict[str, Any]
        times = alternated({"edgedyn": lambda: bundle(*arrays), "openvino": lambda: request.infer(arrays)},
                           rounds, per_round)
    record.update(edgedyn_ms=times["edgedyn"], openvino_ms=times["openvino"],
                  ratio=times["openvino"] / times["edgedyn"])
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tv-shufflenet_v2_x1_0,timm-convnext_tiny,timm-vit_small_patch16_224,"
                        "timm-efficientvit_b0,timm-regnety_004,timm-fastvit_t8,timm-ghostnet_100")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    args = parser.parse_args()
    results = dict(speed.run_header(args.threads, args.rounds), calls_per_round=args.calls, models={})
    out = speed.results_path("versus-openvino")
    print("| model | edgedyn kept | edgedyn ms (cosine) | OpenVINO default ms (cosine) | edgedyn's speed-up |")
    print("|---|---|---:|---:|---:|")
    for name in [m for m in args.models.split(",") if m]:
        try:
            record = one(name, args.threads, args.rounds, args.calls)
            print("| {} | {} | {:.3g} ({:.5f}) | {:.3g} ({:.5f}) | {:.2f}x |".format(
                name, record["kept"], record["edgedyn_ms"], record["edgedyn_cosine"], record["openvino_ms"],
                record["openvino_cosine"], record["ratio"]), flush=True)
        except Exception as error:  # one model's failure is a row, not the end of the run
            record = {"error": "{}: {}".format(type(error).__name__, error), "traceback": traceback.format_exc()}
            print("| {} | failed: {} | | | |".format(name, record["error"][:200]), flush=True)
        results["models"][name] = record
        out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print("{} [{}], {} threads; results: {}".format(results["cpu"], " ".join(results["cpu_features"]),
                                                    args.threads, out.relative_to(speed.REPO)))


if __name__ == "__main__":
    main()
