"""speed.py's report: per model, each variant's time and its speed-up over onnxruntime-direct, and the bars,
on the median of rounds and on each variant's best round. `python benchmarks/speed.py --summarize RESULTS.json
[MORE.json ...]` prints it for an earlier run, or for one run's models split over several files."""
from typing import Any, Dict, List, Optional

VARIANTS = ("edgedyn-default", "edgedyn-fp32", "edgedyn-int8", "onnxruntime-direct",
            "onnxruntime-transformer-optimizer", "openvino-default", "openvino-f32", "executorch-xnnpack-fp32",
            "executorch-xnnpack-int8", "torch-eager", "torch-compile")
FP32_PEERS = ("onnxruntime-direct", "onnxruntime-transformer-optimizer", "openvino-f32", "executorch-xnnpack-fp32",
              "torch-eager", "torch-compile")
# What a user would run instead of edgedyn's default export, at the peer's own default precision (OpenVINO's is bf16
# on AVX512_BF16/AMX CPUs and fp16 on Arm v8.2 cores).
PEERS = FP32_PEERS + ("openvino-default",)


def add_speedups(record: Dict[str, Any]) -> None:
    """Each timed variant of one model's record gets its speed-up over onnxruntime-direct, when that one ran."""
    direct = record["variants"].get("onnxruntime-direct", {}).get("median_ms")
    for entry in record["variants"].values():
        if direct and entry.get("median_ms"):
            entry["speedup_vs_onnxruntime_direct"] = direct / entry["median_ms"]


# What must agree before two result files are read as one run: ratios from another CPU, thread count or timing
# method are not comparable, however close the dates.
SAME_RUN = ("cpu", "cpu_features", "cores", "threads", "rounds", "seconds_per_worker", "edgedyn_backend", "versions")


def joined(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several result files read as one run (a long run that was stopped, then finished with the models it had not
    reached): their models in order, each run's start in `created`. Refuses files measured differently (SAME_RUN)
    or that time one model twice."""
    first = runs[0]
    for run in runs[1:]:
        differ = [key for key in SAME_RUN if run.get(key) != first.get(key)]
        if differ:
            raise ValueError("{} and {} were not measured the same way ({} differ): their ratios are not one "
                             "run's".format(first.get("created"), run.get("created"), ", ".join(differ)))
    models = {}  # type: Dict[str, Any]
    for run in runs:
        twice = sorted(set(models) & set(run["models"]))
        if twice:
            raise ValueError("{} timed in more than one file: {}".format(", ".join(twice), run.get("created")))
        models.update(run["models"])
    return dict(first, created=", ".join(str(run.get("created")) for run in runs), models=models,
                load_average=[run.get("load_average") for run in runs])


def table(results: Dict[str, Any]) -> str:
    """A markdown table: per model, each variant's median (ms) and its speed-up over onnxruntime-direct."""
    columns = [v for v in VARIANTS if any(v in r["variants"] for r in results["models"].values())]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, record in results["models"].items():
        cells = []
        for variant in columns:
            entry = record["variants"].get(variant)
            if entry is None:
                cells.append("-")
            elif "median_ms" not in entry:
                cells.append("failed")
            else:
                ratio = entry.get("speedup_vs_onnxruntime_direct")
                cells.append("{:.4g}{}".format(entry["median_ms"], " ({:.2f}x)".format(ratio) if ratio else ""))
        lines.append("| {} | {} |".format(name, " | ".join(cells)))
    return "\n".join(lines)


def best_rounds(results: Dict[str, Any]) -> Dict[str, Any]:
    """The results with each variant's time the fastest of its rounds (each round is one worker's median) instead
    of their median.

    Note: on the 2-vCPU VM these runs use, a 2-thread worker is sometimes 1.5-2.5x slower than the same worker a
    round later (zoo:vit's TFLite int8: 0.0985, 0.1004 and 0.0386 ms; hf-vit-tiny-4l's onnxruntime int8: 2.71,
    2.86, 1.64 ms), as if the second vCPU ran at a fraction of its speed; the best round shows each variant on
    the machine undisturbed, the median what a user of such a machine gets."""
    import copy

    best = copy.deepcopy(results)
    for record in best["models"].values():
        for entry in record["variants"].values():
            if entry.get("rounds_ms"):
                entry["median_ms"] = min(entry["rounds_ms"])
        add_speedups(record)
    return best


def summary(results: Dict[str, Any]) -> str:
    """The tables of a run: medians over rounds, the bars on them, then the same on each variant's best round."""
    best = best_rounds(results)
    return "\n\n".join(["Median of rounds (ms, speed-up over onnxruntime-direct):", table(results),
                         against_the_bars(results), "Best round:", table(best), against_the_bars(best)])


# The bars (precision issue): the speed-up each comparison must reach, by model kind (None: shown, no bar).
BARS = ("default vs fastest peer", "fp32 vs fastest fp32 peer", "int8 vs own fp32")
REDUCED_KINDS = ("cnn", "detector")


def bar_for(bar: str, name: str, kind: str) -> Optional[float]:
    if bar == "int8 vs own fp32":
        return 1.5 if kind in REDUCED_KINDS else None
    return 1.0


def against_the_bars(results: Dict[str, Any]) -> str:
    """The bars per model, as ratios (> 1: edgedyn faster): edgedyn's default export against the fastest peer of the
    run at any precision (OpenVINO's default included), `--precision fp32` against the fastest fp32 peer, and
    `--quantize int8` against edgedyn's own fp32; each with the range of its round-by-round ratios, the winner's
    precision and whether the bar was met, missed or is within the run's noise; then a count per bar, and each
    variant that failed, with why (an int8 export that misses its accuracy gate says so)."""
    def ms(record: Dict[str, Any], variant: str) -> Optional[float]:
        return record["variants"].get(variant, {}).get("median_ms")

    verdicts = {bar: {"met": 0, "within noise": 0, "missed": 0} for bar in BARS}
    lines = ["| model | " + " | ".join(BARS) + " |", "|---|" + "---:|" * len(BARS)]
    failures = []
    for name, record in results["models"].items():
        fastest = {}
        for group, peers in (("any", PEERS), ("fp32", FP32_PEERS)):
            timed = {v: ms(record, v) for v in peers if ms(record, v)}
            fastest[group] = min(timed, key=lambda v: timed[v]) if timed else None
        pairs = ((fastest["any"], "edgedyn-default"), (fastest["fp32"], "edgedyn-fp32"),
                 ("edgedyn-fp32", "edgedyn-int8"))
        cells = []
        for bar, (slower, faster) in zip(BARS, pairs):
            threshold = bar_for(bar, name, record.get("kind", ""))
            compared = paired_ratio(record, slower, faster, threshold or 1.0) if slower else None
            if compared is None:
                cells.append("-")
                continue
            cell = compared["text"] + (" {}".format(slower) if "peer" in bar else "")
            precision = ((record["variants"][faster].get("recorded") or {}).get("precision"))
            if faster == "edgedyn-default" and precision:
                cell += " ({})".format(precision)
            if faster == "edgedyn-int8" and _int8_not_kept(record):
                cell += " int8 not kept (not faster, or missed its gate, in the export)"
            elif threshold is not None:
                verdicts[bar][compared["verdict"]] += 1
                cell += " **{}** ({:.1f}x)".format(compared["verdict"], threshold)
            cells.append(cell)
        lines.append("| {} | {} |".format(name, " | ".join(cells)))
        failures += ["- {} {}: {}".format(name, variant, entry["error"])
                     for variant, entry in record["variants"].items() if "median_ms" not in entry and "error" in entry]
    counts = ["- {}: met on {met}, within the run's noise on {within noise}, missed on {missed}".format(bar, **v)
              for bar, v in verdicts.items() if sum(v.values())]
    return "\n".join(lines + [""] + counts + ([""] + failures if failures else []))


def _int8_not_kept(record: Dict[str, Any]) -> bool:
    """Whether the `--quantize int8` export kept its fp32 artifact (auto measured int8 no faster): the int8
    variant then times fp32, and an int8 bar has nothing to judge."""
    recorded = record["variants"].get("edgedyn-int8", {}).get("recorded") or {}
    return (recorded.get("selection") or {}).get("precision") not in (None, "int8")


def paired_ratio(record: Dict[str, Any], slower: str, faster: str, bar: float = 1.0) -> Optional[Dict[str, Any]]:
    """`slower`'s time over `faster`'s (> 1: `faster` wins), with the range of the same ratio round by round and a
    verdict against `bar`: met when every round's ratio reaches it, missed when none does, else within the run's
    noise.

    Note: each round runs every variant once, one after the other, so a round's two times saw nearly the same
    machine; their ratio is steadier than either time, and its range over rounds is how far the run's noise
    reaches. The ranges are only paired when both variants timed the same rounds (torch-compile runs fewer)."""
    entries = record["variants"].get(slower, {}), record["variants"].get(faster, {})
    if not all(entry.get("median_ms") for entry in entries):
        return None
    ratio = entries[0]["median_ms"] / entries[1]["median_ms"]
    rounds = [entry.get("rounds_ms") or [] for entry in entries]
    if len(rounds[0]) != len(rounds[1]) or len(rounds[0]) < 2:
        return {"ratio": ratio, "text": "{:.2f}x".format(ratio), "verdict": "met" if ratio >= bar else "missed"}
    per_round = [a / b for a, b in zip(*rounds)]
    low, high = min(per_round), max(per_round)
    verdict = "met" if low >= bar else "missed" if high < bar else "within noise"
    return {"ratio": ratio, "rounds": per_round, "verdict": verdict,
            "text": "{:.2f}x [{:.2f}-{:.2f}]".format(ratio, low, high)}
