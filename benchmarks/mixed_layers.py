"""Which layers a reduced precision needs in fp32, and what keeping them costs: OpenVINO bf16/fp16, per group.

    python benchmarks/mixed_layers.py --model tv-deeplabv3_mobilenet_v3_large --precision bf16 --threads 2

A mixed artifact (docs/precision.md, "Mixed") keeps a prefix of its IR's layers in fp32. This measures whether a
prefix is the right choice: the model is exported as edgedyn ships it for OpenVINO (`--backend openvino --precision
fp32`: the IR a mixed artifact marks), its computing layers cut into the groups the backend may mark
(`computing_groups`: a convolution or matrix product with what follows it up to the next), and then

- each group alone in fp32: the cosine to torch eager it gains over the all-reduced IR (mean over --inputs fresh
  random inputs drawn like the example), in one process (accuracy does not depend on the machine's load);
- the first k groups in fp32 for a few k: the cosine, and the time per call, each variant in its own worker process,
  rounds alternating the order; the median and the best round (this VM's two-thread times are bimodal, each
  process landing in a fast or a slow mode: benchmarks/README.md).

JSON: benchmarks/results/mixed-layers-DATE.json with the CPU model and flags. Needs the openvino extra and the
model's library (benchmarks/fullsize.py).
"""
import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the models, the CPU record and where results go)

PREFIXES = (1, 2, 4, 6, 8, 10, 14, 20)


def ir_of(model: Any, inputs: tuple, folder: Path) -> bytes:
    """The fp32 IR edgedyn's openvino backend writes for `model` (its weights beside it as weights.bin)."""
    import edgedyn

    bundle = edgedyn.export(model, inputs, board="x86-64", backend="openvino", precision="fp32",
                            output=str(folder / "model.edgedyn"))
    with zipfile.ZipFile(str(bundle)) as archive:
        names = archive.namelist()
        xml = archive.read(next(n for n in names if n.endswith("model.xml")))
        (folder / "weights.bin").write_bytes(archive.read(next(n for n in names if n.endswith("weights.bin"))))
    return xml


def marked(xml: bytes, groups: List[int]) -> bytes:
    """`xml` with the groups numbered in `groups` marked to stay fp32."""
    import xml.etree.ElementTree as ElementTree

    from edgedyn.backends.openvino_marks import computing_groups, mark_fp32

    root = ElementTree.fromstring(xml)
    found = computing_groups(root)
    mark_fp32([layer for index in groups for layer in found[index]])
    return ElementTree.tostring(root, encoding="utf-8")


def compiled(xml: bytes, weights: Path, precision: str, threads: int) -> Any:
    import numpy as np
    import openvino

    core = openvino.Core()
    model = core.read_model(model=xml.decode("utf-8"),
                            weights=openvino.Tensor(np.fromfile(str(weights), dtype=np.uint8)))
    hint = {"bf16": "bf16", "fp16": "f16", "fp32": "f32"}[precision]
    return core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads,
                                             "PERFORMANCE_HINT": "LATENCY"})


def mean_cosine(model: Any, samples: List[tuple], references: List[Any]) -> float:
    import numpy as np

    request = model.create_infer_request()
    cosines = []
    for sample, reference in zip(samples, references):
        out = np.asarray(request.infer([s.numpy() for s in sample])[0], np.float64).ravel()
        cosines.append(float(out @ reference / (np.linalg.norm(out) * np.linalg.norm(reference))))
    return float(np.mean(cosines))


def worker(task_path: str) -> None:
    """Times one marked IR as speed.py's workers time a variant (speed.timed_calls) and prints its RESULT line."""
    import numpy as np

    task = json.loads(Path(task_path).read_text())
    model = compiled(Path(task["xml"]).read_bytes(), Path(task["weights"]), task["precision"], task["threads"])
    request = model.create_infer_request()
    inputs = [np.load(task["inputs"])["arg{}".format(i)] for i in range(task["arity"])]
    for _ in range(5):
        request.infer(inputs)
    print("RESULT " + json.dumps(speed.timed_calls(lambda: request.infer(inputs), task["seconds"])))


def timed(task: Dict[str, Any], folder: Path) -> float:
    """The median ms of one marked IR, in its own process (speed.run_worker)."""
    result = speed.run_worker(task, folder, script=__file__)
    if "error" in result:
        raise RuntimeError(result["error"])
    return result["median_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tv-deeplabv3_mobilenet_v3_large", help="a benchmarks/fullsize.py name")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--inputs", type=int, default=6, help="fresh random inputs the cosine is the mean over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per worker")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    import numpy as np
    import torch

    from edgedyn.backends.openvino_marks import computing_groups
    import xml.etree.ElementTree as ElementTree

    model, inputs, _ = speed.build_model(args.model)
    generator = torch.Generator().manual_seed(7)
    samples = [tuple(torch.randn(t.shape, generator=generator) for t in inputs) for _ in range(args.inputs)]
    with torch.no_grad():
        references = [np.asarray(model(*s).detach(), np.float64).ravel() for s in samples]
    results = dict(speed.run_header(args.threads, args.rounds), model=args.model, precision=args.precision)
    with tempfile.TemporaryDirectory(prefix="edgedyn-mixed-") as name:
        folder = Path(name)
        xml, weights = ir_of(model, inputs, folder), folder / "weights.bin"
        groups = computing_groups(ElementTree.fromstring(xml))
        results["groups"] = [{"first": g[0].get("type"), "layers": len(g)} for g in groups]
        base = mean_cosine(compiled(xml, weights, args.precision, args.threads), samples, references)
        # The same IR in fp32: how far torch's own fp32 rounding is from any other order of the same sums. A model
        # that amplifies rounding (timm's LeViT with random weights: 0.9996 on some fresh inputs) reads far from
        # 1 here, and then every cosine below measures the model as much as the reduced precision.
        exact = mean_cosine(compiled(xml, weights, "fp32", args.threads), samples, references)
        results["all_reduced_cosine"], results["fp32_cosine"] = base, exact
        print("{}: {} computing layers in {} groups; every layer {}: cosine {:.5f} (the IR in fp32: {:.7f})".format(
            args.model, sum(len(g) for g in groups), len(groups), args.precision, base, exact))
        if exact < 0.99999:
            print("warning: the fp32 IR itself is only {:.5f} from torch on these inputs: the model amplifies "
                  "rounding, so the gains below are not the reduced precision's alone".format(exact))
        single = []
        for index in range(len(groups)):
            cosine = mean_cosine(compiled(marked(xml, [index]), weights, args.precision, args.threads), samples,
                                 references)
            single.append({"group": index, "first": groups[index][0].get("type"), "cosine": cosine,
                           "gain": cosine - base})
        results["single_group_fp32"] = single
        prefixes = [0] + [k for k in PREFIXES if k < len(groups)]
        np.savez(str(folder / "inputs.npz"), **{"arg{}".format(i): t.numpy() for i, t in enumerate(inputs)})
        rows = {k: {"groups": k, "layers": sum(len(g) for g in groups[:k])} for k in prefixes}
        for k in prefixes:
            text = marked(xml, list(range(k)))
            (folder / "prefix-{}.xml".format(k)).write_bytes(text)
            rows[k]["cosine"] = mean_cosine(compiled(text, weights, args.precision, args.threads), samples,
                                            references)
            rows[k]["rounds_ms"] = []
        for round_ in range(args.rounds):
            for k in (prefixes if round_ % 2 == 0 else prefixes[::-1]):
                rows[k]["rounds_ms"].append(timed({
                    "xml": str(folder / "prefix-{}.xml".format(k)), "weights": str(weights),
                    "precision": args.precision, "threads": args.threads, "inputs": str(folder / "inputs.npz"),
                    "arity": len(inputs), "seconds": args.seconds}, folder))
        for row in rows.values():
            row["median_ms"], row["best_ms"] = float(np.median(row["rounds_ms"])), float(min(row["rounds_ms"]))
        results["prefixes"] = list(rows.values())
    print("\n| group | first layer | cosine with it alone in fp32 | gain |\n|---:|---|---:|---:|")
    for row in sorted(single, key=lambda r: -r["gain"])[:12]:
        print("| {group} | {first} | {cosine:.5f} | {gain:+.5f} |".format(**row))
    later = [row["gain"] for row in single[10:]]
    if later:
        print("(groups 10 and later: largest gain {:+.5f})".format(max(later)))
    zero = rows[0]
    print("\n| first groups in fp32 | layers | cosine | ms, median of rounds | ms, best round | vs every layer {}"
          " (median, best) |".format(args.precision))
    print("|---:|---:|---:|---:|---:|---:|")
    for row in results["prefixes"]:
        print("| {} | {} | {:.5f} | {:.3f} | {:.3f} | {:.2f}x, {:.2f}x |".format(
            row["groups"], row["layers"], row["cosine"], row["median_ms"], row["best_ms"],
            row["median_ms"] / zero["median_ms"], row["best_ms"] / zero["best_ms"]))
    out = speed.results_path("mixed-layers")
    out.write_text(json.dumps(results, indent=1))
    print("results: {}".format(out))


if __name__ == "__main__":
    main()
