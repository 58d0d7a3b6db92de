"""`edgedyn export`: a model file to a bundle for one board."""
from pathlib import Path
from typing import List, Optional

import typer
from typing_extensions import Annotated

from edgedyn.registry import AUTO, backends_help, quantizing_backends
from edgedyn.cli.common import err, human_bytes, out, output_file, progress


def export_command(
    model: Annotated[str, typer.Argument(help="The model as path/to/model.py:Name (a module class, an instance, a "
                                              "zero-argument factory or a function), package.module:Name, "
                                              "model.onnx or program.pt2 (a saved ExportedProgram).")],
    board: Annotated[str, typer.Option("--board", "-b", help="Board name (see `edgedyn boards`) or path to a board TOML.")]
    = "x86-64",
    input_: Annotated[Optional[List[str]], typer.Option(
        "--input", "-i", help="Example input NAME=VALUE: a shape 1x3x224x224[:dtype] or a number (specialized). "
                              "Repeat a name for another specialization, e.g. -i x=1x3x64x64 -i x=8x3x64x64. "
                              "Sizes in braces make buckets: -i 'input_ids=1x{16,32,64}:int64' (quoted). "
                              "Default: the model file's example_inputs().")] = None,
    pad: Annotated[Optional[List[str]], typer.Option(
        "--pad", help="Pad bucketed inputs to the next bucket with these values, e.g. --pad "
                      "input_ids=0,attention_mask=0; proven exact against torch eager at export, or refused "
                      "(docs/buckets.md).")] = None,
    pad_side: Annotated[str, typer.Option("--pad-side", help="Where the padding goes on the bucketed dimension: "
                                                              "right or left.")] = "right",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Bundle file to write.")] = None,
    backend: Annotated[str, typer.Option("--backend", help=backends_help())] = AUTO,
    device: Annotated[str, typer.Option(help="auto: on a board with a GPU, GPU code first and the CPU artifact as "
                                             "fallback; gpu or cpu: only that one.")] = "auto",
    precision: Annotated[str, typer.Option(help="auto (default): fp32, and bf16/fp16 where a backend computes them "
                                                "natively on this CPU and they pass the accuracy gate (cosine "
                                                ">= 0.999, or --max-accuracy-drop) and run faster; fp32: exact; "
                                                "bf16 / fp16: only that one (fp16 on a Jetson: the GPU code).")]
    = "auto",
    pipeline: Annotated[str, typer.Option("--pipeline", help="Pass pipeline (default, none).")] = "default",
    verify: Annotated[bool, typer.Option(help="Check the bundle against torch eager when this machine can run it.")]
    = True,
    quantize: Annotated[Optional[str], typer.Option(help="int8: int8 weights (per output channel) and activations "
                                                         "(scales from --calibration); int8-weights: int8 weights, "
                                                         "activations quantized at run time. Backends: {}.".format(
                                                             ", ".join(quantizing_backends())))] = None,
    calibration: Annotated[Optional[str], typer.Option(help="Calibration inputs for --quantize int8: a folder of "
                                                            ".npy files, an .npz, or path.py:fn returning input "
                                                            "tuples; 'random' for random normal inputs (smoke tests "
                                                            "only). A held-out share measures accuracy.")] = None,
    eval_inputs: Annotated[Optional[str], typer.Option("--eval-inputs", help="Inputs to measure int8 or bf16/fp16 "
                                                       "accuracy on (same formats as --calibration); default: "
                                                       "held-out calibration samples (int8), the example inputs and "
                                                       "8 drawn like them (bf16/fp16).")] = None,
    max_accuracy_drop: Annotated[Optional[str], typer.Option("--max-accuracy-drop", help="Fail the export when the "
                                                             "quantized model misses a bound: top1=1% (top-1 drop, "
                                                             "always in percent: top1=1 is 1%), cosine=0.99 "
                                                             "(minimum), max_abs=0.05; comma-separated. Default: "
                                                             "cosine=0.99 on every output.")]
    = None,
    nms: Annotated[Optional[str], typer.Option("--nms", help="Append NMS to a raw detection head (YOLO's [batch, "
                                               "4 + classes, anchors]): iou=0.45,conf=0.25,max_det=300 (any "
                                               "subset; classes=N, agnostic). Outputs boxes, scores, labels, count; "
                                               "the thresholds are specialized and guarded.")] = None,
    preprocess: Annotated[Optional[str], typer.Option(
        "--preprocess", help="The bundle also takes camera frames (uint8 HxWx3, any size up to max=WxH) and resizes "
                             "and scales them itself: letterbox or stretch, then any of normalize=unit|imagenet|none, "
                             "order=rgb|bgr, pad=114, max=4096x4096, input=NAME. Detections come back in the "
                             "frame's pixels.")] = None,
    sign: Annotated[Optional[Path], typer.Option("--sign", help="Sign the bundle with this Ed25519 private key "
                                                 "(`edgedyn keygen`); boards check it with --trusted-keys.")] = None,
) -> None:
    """Capture MODEL at its example inputs, optimize and compile it for BOARD, and write one bundle file."""
    from edgedyn.exporter import export
    from edgedyn.runtime.format import Bundle

    if output is not None:
        output_file(output, "-o")
    if sign is not None and not sign.is_file():
        from edgedyn.errors import EdgedynError

        raise EdgedynError("signing key {} does not exist".format(sign), hint="make one with `edgedyn keygen KEY`")
    with progress("export") as step:
        path = export(model, board=board, output=output, backend=backend, inputs=input_ or None,
                      pipeline=pipeline, device=device, precision=precision, verify=verify, progress=step,
                      quantize=quantize, calibration=calibration, eval_inputs=eval_inputs,
                      max_accuracy_drop=max_accuracy_drop, pad=pad, pad_side=pad_side,
                      nms=nms, preprocess=preprocess)
    if sign is not None:
        from edgedyn.bundle import sign_bundle

        err.print("signed with key {}...".format(sign_bundle(path, sign)[:16]))
    bundle = Bundle(path, trusted_keys=[])
    specs = bundle.manifest["specializations"]
    chosen = sorted({a["backend"] for s in specs for a in s["artifacts"]})  # what auto picked, when it did
    err.print("exported {} for {} ({}): {} specialization(s) [{}], {}".format(
        bundle.manifest["model"]["name"], bundle.manifest["board"]["name"], ", ".join(chosen), len(specs),
        ", ".join(s["name"] for s in specs), human_bytes(path.stat().st_size)))
    from edgedyn.quantize import plan, precision as precisions
    from edgedyn.runtime.format import kept_artifact

    for spec in specs:
        kept = kept_artifact(spec)
        for line in (plan.summary(kept), precisions.summary(kept)):
            if line:
                err.print("{}: {}".format(spec["name"], line))
        if kept is not spec["artifacts"][-1]:  # an fp32 fallback for CPUs without the kept one's precision
            fallback = spec["artifacts"][-1]["selection"]
            err.print("{}: {} kept too: {}".format(spec["name"], fallback["candidate"], fallback["why"]))
    out.print(str(path))

