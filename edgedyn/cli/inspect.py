"""`edgedyn inspect`: what a bundle holds, without running it (no backend runtime needed)."""
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import JsonOption, emit_json, human_bytes, out, output_folder
from edgedyn.runtime.executors.litert import REVERSES_AT_ONCE
from edgedyn.runtime.precision import fp32_layers_words


def inspect_command(
    bundle: Annotated[Path, typer.Argument(help="The .edgedyn bundle to describe.")],
    json_: JsonOption = None,
    memory: Annotated[bool, typer.Option("--memory", help="Print each specialization's memory plan and draw it "
                                                           "(arena over time) into BUNDLE.memory-N.svg.")] = False,
    picture_dir: Annotated[Optional[Path], typer.Option("--picture-dir", help="Folder for the --memory pictures "
                                                                              "(default: the current folder).")]
    = None,
) -> None:
    """Show the board, backend, guards and specializations, inputs and outputs, sizes and versions."""
    from edgedyn.runtime import guards
    from edgedyn.runtime.format import Bundle

    if picture_dir is not None:
        output_folder(picture_dir, "--picture-dir")
    opened = Bundle(bundle)
    manifest = opened.manifest
    if memory:
        from edgedyn.cli.memory import show_memory

        show_memory(opened, picture_dir or Path.cwd())
        return
    from edgedyn.runtime.choice import would_run

    here = {spec["name"]: would_run(spec) for spec in manifest["specializations"]}
    if emit_json(dict(manifest, bundle={"path": str(bundle), "sha256": opened.sha256, "size": bundle.stat().st_size},
                      this_machine=here), json_):
        return
    board = manifest["board"]
    out.print("{}  {}".format(bundle.name, human_bytes(bundle.stat().st_size)), style="bold")
    out.print("model      {}  ({})".format(manifest["model"]["name"], manifest["model"]["source"]))
    out.print("board      {}  ({}, {})".format(board["name"], board["arch"], board.get("description", "")))
    out.print("signature  {}".format(", ".join(_param(p) for p in manifest["signature"])))
    out.print("pipeline   {}: {}".format(manifest["pipeline"]["name"], ", ".join(manifest["pipeline"]["passes"]) or "-"))
    out.print("produced   {} by {}".format(manifest["created"], ", ".join(
        "{} {}".format(k, v) for k, v in sorted(manifest["producer"].items()))))
    out.print("sha256     {}".format(opened.sha256))
    for group in manifest.get("buckets", []):
        _buckets(group)
    if manifest.get("preprocess") is not None:
        from edgedyn.runtime.frames import frames_of

        frames = frames_of(manifest)
        out.print("frames     {}: {}; detections come back in the frame's pixels".format(
            frames.input, frames.describe()))  # type: ignore[union-attr]
    sizes = opened.member_sizes()
    for spec in manifest["specializations"]:
        out.print("")
        out.print("specialization {}  ({} ops captured, {} after passes)".format(
            spec["name"], spec["graph"]["ops_captured"], spec["graph"]["ops_optimized"]), style="bold")
        out.print("  guards   {}".format("; ".join(guards.describe(g) for g in spec["guards"])))
        out.print("  inputs   {}".format(", ".join(_tensor(t) for t in spec["inputs"]) or "-"))
        out.print("  outputs  {}".format(", ".join(_tensor(t) for t in spec["outputs"])))
        table = Table(box=None, pad_edge=False)
        for column in ("artifact", "device", "arch", "target", "files"):
            table.add_column(column)
        for artifact in spec["artifacts"]:
            files = ", ".join("{} {}".format(name, human_bytes(sizes[name])) for name in artifact["files"].values())
            table.add_row(artifact["backend"], artifact["device"], str(artifact["arch"] or "any"),
                          artifact["target"], files)
        out.print(table)
        for artifact in spec["artifacts"]:
            if "gpu" in artifact:
                _gpu(artifact)
            if "selection" in artifact:
                out.print("  chosen   {}".format(_selection(artifact["selection"])))
                if artifact["selection"].get("why"):
                    out.print("  why      {}".format(artifact["selection"]["why"]))
            if "quantization" in artifact:
                _quantization(artifact["quantization"])
            if artifact.get("device", "cpu") == "cpu" and artifact.get("precision", "fp32") != "fp32" \
                    and "quantization" not in artifact:  # int8's float layers: in its scheme line
                _reduced(artifact)
        if "no_gpu_code" in spec:
            _no_gpu_code(spec["no_gpu_code"])
        chosen = here[spec["name"]]
        out.print("  here     {}{}".format(
            "would run " + chosen["would_run"] if chosen["would_run"] else "nothing can run on this machine",
            "".join("; {} not used: {}".format(label, reason) for label, reason in chosen["skipped"])))


def _buckets(group: Dict[str, Any]) -> None:
    """A bucket group: which dims, the sizes, and the padding rules with their proof (docs/buckets.md)."""
    from edgedyn.runtime.bucket_schema import describe_outputs

    dims = ", ".join("{} dim {}".format(name, axis) for name, axis in group["inputs"].items())
    out.print("buckets    {}: {}  ({})".format(dims, ", ".join(map(str, group["sizes"])), group["source"]))
    padding = group.get("padding")
    if padding is None:
        out.print("  padding  none: exact shapes only (export with --pad to pad the lengths between them)")
        return
    values = ", ".join("{}={}".format(name, value) for name, value in padding["values"].items())
    probes = padding.get("proof", {}).get("probes", [])
    worst = max([o["max_rel"] for p in probes for o in p["outputs"]] or [0.0])
    out.print("  padding  {} with {}; lengths {} to {}; proven at {} lengths, worst relative error {:.2g}".format(
        padding["side"], values, padding["min_length"], group["sizes"][-1], len(probes), worst))
    for line in describe_outputs(padding):
        out.print("  output   {}".format(line))
    if probes:
        table = Table(box=None, pad_edge=False)
        for column in ["bucket", "length"] + [o["name"] for o in probes[0]["outputs"]]:
            table.add_column(column)
        for probe in probes:
            table.add_row(str(probe["size"]), str(probe["length"]),
                          *["{:.2g}".format(o["max_rel"]) for o in probe["outputs"]])
        out.print(table)


def _gpu(artifact: Dict[str, Any]) -> None:
    gpu = artifact["gpu"]
    out.print("  gpu      {}: {} (PTX ISA {}, {} kernels, NVRTC {}), needs a CUDA {}+ driver and {}".format(
        gpu["arch"], gpu["code_format"].upper(), gpu["ptx_isa"], gpu["kernels"], gpu.get("nvrtc", "?"),
        gpu["min_cuda_driver"], gpu["runtime"]))
    rules = (gpu.get("schedules") or {}).get("rules") or {}
    if rules:
        counts = {}  # type: Dict[str, int]
        for rule in rules.values():
            counts[rule] = counts.get(rule, 0) + 1
        failed = len((gpu.get("schedules") or {}).get("rule_failures") or {})
        out.print("  kernels  {} functions scheduled by dlight: {}{}".format(
            len(rules), ", ".join("{} {}".format(r, n) for r, n in sorted(counts.items())),
            "; {} took a later rule after an earlier one failed".format(failed) if failed else ""))
    accuracy = artifact.get("accuracy")
    if accuracy:
        worst = max(accuracy["outputs"], key=lambda o: o["max_rel_error"])
        out.print("  {}     max relative error {:.2e}, cosine {:.6f} ({})".format(
            artifact.get("precision", "fp32"), worst["max_rel_error"], worst["cosine"], accuracy["measured_on"]))


def _reduced(artifact: Dict[str, Any]) -> None:
    """A CPU artifact computing in bf16 or fp16: the accuracy its gate measured, and where."""
    accuracy = artifact.get("accuracy") or {}
    outputs = accuracy.get("outputs") or []
    gate = ", ".join("{} {}".format(k, v) for k, v in sorted((accuracy.get("gate") or {}).items()))
    worst = min(outputs, key=lambda o: o.get("cosine", 1.0)) if outputs else None
    measured = "cosine {:.6f}, max abs error {:.3g} ({})".format(worst["cosine"], worst["max_abs_error"], worst["name"]) \
        if worst else "not measured"
    out.print("  {}     {}; gate {} ({}); on {}".format(artifact["precision"], measured, gate or "-",
                                                     accuracy.get("gate_source", "?"), accuracy.get("inputs", "?")))
    mixed = fp32_layers_words(artifact)
    if mixed:
        out.print("           {} (a mixed artifact)".format(mixed))
    if artifact.get("tflite_mirrored"):  # backends/tflite/mirror.py
        out.print("  layout   mirrored: rows and columns back to front, the input reversed {}".format(
            "in one REVERSE_V2 (needs ai-edge-litert)" if artifact.get(REVERSES_AT_ONCE)
            else "one axis at a time"))


def _no_gpu_code(record: Dict[str, Any], shown: int = 10) -> None:
    """Why the bundle has no GPU artifact: the reason, then each function without GPU code and every rule's why."""
    functions = record.get("functions") or {}
    reason = " ".join(record["reason"].split())  # a reason from TVM's stderr spans lines
    if functions:  # the reason names only the first few; all of them follow
        reason = "{} builds no GPU code for {} functions:".format(record.get("backend"), len(functions))
    out.print("  no gpu   {} ({}): {}".format(record.get("target"), record.get("arch"),
                                             reason if len(reason) <= 600 else reason[:597] + "..."))
    for name in sorted(functions)[:shown]:
        out.print("    {}: {}".format(name, "; ".join("{}: {}".format(rule, why)
                                                     for rule, why in sorted(functions[name].items()))))
    if len(functions) > shown:
        out.print("    and {} more functions (inspect --json lists all)".format(len(functions) - shown))


def _selection(selection: Dict[str, Any]) -> str:
    mode = selection.get("mode")
    chosen = selection.get("candidate") or selection.get("chosen")
    rejected = "; rejected: " + ", ".join(sorted(selection["rejected"])) if selection.get("rejected") else ""
    if selection.get("held_back"):  # candidates.held_back: not built, and why is in inspect --json
        rejected += "; held back: " + ", ".join(sorted(selection["held_back"]))
    if mode == "measured":
        times = ", ".join("{} {:.3g} ms{}".format(label, ms, on) for label, (ms, on) in sorted(
            decided_times(selection).items(), key=lambda item: item[1][0]))
        return "{} (timed here in turns: {}{})".format(chosen, times, rejected)
    if mode == "emulated":
        counts = ", ".join("{} {:,}".format(k, v) for k, v in sorted(
            selection.get("instructions_per_call", {}).items(), key=lambda kv: kv[1]))
        return "{} (guest instructions per call on the emulated {}, -cpu {}: {}{})".format(
            chosen, selection.get("board"), selection.get("cpu"), counts, rejected)
    if mode == "fallback":
        return "{} as well: the fp32 fallback of {}".format(chosen, selection.get("for"))
    if mode == "board preference":
        return "{} (board preference {}{})".format(chosen, " > ".join(selection.get("order", [])),
                                                    "; " + selection["not_measured"]
                                                    if selection.get("not_measured") else "")
    return "{} (asked for)".format(selection.get("requested", selection.get("chosen", "")))


def decided_times(selection: Dict[str, Any]) -> Dict[str, Tuple[float, str]]:
    """Each candidate's time as `auto` weighed it ({label: (ms, " on one thread" or "")}): the contenders' second set
    of turns (threads_timed: on every core and on fewer threads, the kept count's time) over the first one
    (medians_ms), which a busy stretch of the first turns may have slowed (ncnn's ResNet-18: 18.4 ms in the first
    turns, 12.8 in the second, of one export): the numbers the record's `why` compares, not two sets of them."""
    times = {label: (float(ms), "") for label, ms in (selection.get("medians_ms") or {}).items()
             if isinstance(ms, (int, float))}
    for label, record in (selection.get("threads_timed") or {}).items():
        if not isinstance(record, dict):
            continue
        every, fewer = record.get("every_core_ms"), record.get("threads_ms") or {}
        kept = record.get("kept")
        if kept == "every core" and isinstance(every, (int, float)):
            times[label] = (float(every), "")
        elif kept != "every core" and fewer and all(isinstance(ms, (int, float)) for ms in fewer.values()):
            times[label] = (float(min(fewer.values())), " on {}".format(kept))
    return times


def _quantization(record: Dict[str, Any]) -> None:
    """The int8 summary: scheme, weight bytes before and after, and agreement with torch eager per output."""
    weights = record.get("weights", {})
    out.print("  quantization  {} ({}): {}".format(record["mode"], record["backend"], record.get("scheme", "")))
    if "float_ops" in record:
        from edgedyn.quantize.plan import float_ops_text

        out.print("  kept float    {}".format(float_ops_text(record["float_ops"])))
    if weights:
        before, after = weights["fp32_bytes"], weights["quantized_bytes"]
        out.print("  weights       fp32 {} -> {} {} ({:.1f}x smaller)".format(
            human_bytes(before), record["mode"], human_bytes(after), before / after if after else float("inf")))
    accuracy = record.get("accuracy", {})
    if accuracy:
        out.print("  accuracy      against {} on {} ({} batch(es))".format(
            accuracy.get("reference"), accuracy.get("inputs"), accuracy.get("batches")))
        table = Table(box=None, pad_edge=False)
        for column in ("output", "max_abs_error", "cosine", "top1_agreement"):
            table.add_column(column)
        for output in accuracy["outputs"]:
            agreement = output.get("top1_agreement")
            table.add_row(output["name"], "{:.4g}".format(output["max_abs_error"]), "{:.6f}".format(output["cosine"]),
                          "-" if agreement is None else "{:.2%}".format(agreement))
        out.print(table)


def _param(record: Dict[str, Any]) -> str:
    if "default" in record:
        return "{}={!r}".format(record["name"], record["default"])
    return record["name"]


def _tensor(record: Dict[str, Any]) -> str:
    from edgedyn.runtime.guards import format_shape

    return "{} {}[{}]".format(record["name"], record["dtype"], format_shape(record["shape"]))
