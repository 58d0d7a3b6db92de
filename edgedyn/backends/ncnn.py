"""ncnn: the graph as an ncnn model (model.param + weights.bin), converted at export by pnnx, ncnn's own converter,
from the ONNX model that torch's exporter writes for the onnxruntime backend.

Why pnnx over ONNX, and not the other routes (checked on this repository's examples, 2026-12):
- pnnx from a TorchScript trace of the ExportedProgram's graph leaves core-ATen ops it does not know
  (`aten::_softmax`, `aten::native_layer_norm`, `pnnx.Expression`) in the file, which ncnn cannot load; from the
  ONNX model it writes ncnn's own fused layers (Convolution with its ReLU6, LayerNorm, GELU, SDPA) for every model
  that ncnn can hold, and matches torch within 5e-7.
- Writing the .param/.bin from edgedyn's graph, as the TFLite writer does, would re-derive what pnnx's several
  hundred passes already know about ncnn (its layer fusions, its axis conventions without a batch axis), and every
  ncnn release adds layers.
What pnnx cannot convert it leaves in the file as a torch op name (`Tensor.reshape`, `torch.unbind`): the backend
refuses those by name, with the user's line where the graph records one. And because ncnn has no batch axis (a blob
is at most c, d, h, w: pnnx treats the first axis as the batch), the artifact runs each item of the first axis on
its own, and the backend runs the converted model against torch eager on random inputs before keeping it: a graph
that mixes the items of its first axis, or that pnnx converted wrongly, is refused with the error it measured.

The .bin keeps fp32 weights for every precision: an fp16 artifact differs only in its recorded precision, and
ncnn stores and computes in fp16 on a core with Arm v8.2 half-precision arithmetic (and computes fp32 with the
same exact weights elsewhere). Twice the file size of pnnx's fp16 weights, for that.
"""
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.backends.artifact import Artifact, Build, open_executor
from edgedyn.backends.ncnn_rewrites import fuse_global_pooling, fuse_pooled_convolutions, fuse_swish, static_reshapes
from edgedyn.backends.onnx_rewrites import whole_map_pools
from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors.ncnn_mixed import mark_fp32, masked, probed_layers
from edgedyn.runtime.executors.ncnn_param import WEIGHTS, check_model
from edgedyn.runtime.executors.ncnn import MAX_ITEM_RANK
from edgedyn.runtime.precision import FP32
from edgedyn.runtime.program import FP32_TOLERANCE, compare

# The oldest ncnn that loads every layer edgedyn's ncnn files may hold and runs the examples and reference models,
# YOLO11n and MobileNetV2 right (checked by hand on x86, the manifest's `requires`; a Python 3.8 board gets
# 1.0.20260526). It and 1.0.20260526 gave NaN for DeepLabV3-MobileNetV3's upsampling from 1x1 where 1.0.20261020 is
# right: the executor notes an ncnn older than the one the export checked with (`ncnn_at_export`).
MIN_NCNN = "1.0.20250503"
PNNX_TIMEOUT_S = 900
CHECK_SEED = 20261203
# pnnx's names for torch ops -> the ATen ops of edgedyn's graph they come from, to find the user's line.
ATEN_NAMES = {"reshape": ("reshape", "view", "_unsafe_view"), "unbind": ("unbind", "select"),
              "permute": ("permute", "transpose")}


def _import_converters() -> Tuple[str, Any]:
    """(the pnnx program's path, the ncnn module): pnnx converts, ncnn checks the result here."""
    try:
        import ncnn
        import pnnx
    except ImportError as error:
        raise MissingDependencyError("the ncnn backend needs pnnx and ncnn ({})".format(error),
                                     hint="pip install 'edgedyn[export,ncnn-export]'")
    return str(pnnx.EXEC_PATH), ncnn


def board_options(board: Any) -> Dict[str, Any]:
    """The board's [ncnn] options, recorded in the artifact for the runtime to apply."""
    from edgedyn._schema import plain

    return plain(board.ncnn_options) if board.ncnn_options else {}


def lower(build: Build) -> Artifact:
    """Converts the program to an ncnn model for the CPU, computing in `build.precision` (fp32 or fp16)."""
    if build.quantization is not None:
        raise BackendError("the ncnn backend has no int8 path in edgedyn yet",
                           hint="use --backend onnxruntime or tflite for --quantize int8")
    from edgedyn.backends.onnxruntime import export_onnx

    inputs, outputs = _tensors(build.program, "input"), _tensors(build.program, "output")
    batch = _batch(list(build.tensor_inputs), inputs, outputs)
    pnnx, ncnn = _import_converters()
    output_names = ["output_{}".format(i) for i in range(len(outputs))]
    onnx_model, _ = export_onnx(build.program, list(build.tensor_inputs), output_names)
    _whole_map_pools(onnx_model)
    param, weights = _convert(pnnx, onnx_model.SerializeToString(), [shape for shape, _ in inputs])
    item_shapes = {name: shape[1:] for name, (shape, _) in zip(build.tensor_inputs, inputs)}
    param = fuse_swish(_named(param, build, list(build.tensor_inputs), output_names))
    param = static_reshapes(param, weights, ncnn, item_shapes)
    mixed = bool(build.fp32_layers) and build.precision != FP32  # the named layers in fp32 (ncnn_mixed.py)
    try:
        param = fuse_pooled_convolutions(fuse_global_pooling(param, item_shapes), item_shapes)
        if mixed:
            param = mark_fp32(param.decode("ascii"), build.fp32_layers).encode("ascii")
        layers = check_model(param, weights, "the ncnn model pnnx wrote", item_shapes)
    except BundleError as error:  # a layer or a shape edgedyn's checker does not take: the runtime would refuse it
        raise BackendError(error.message.replace(" is not a valid ncnn model: ", " fails edgedyn's checks: "),
                           hint="try --backend onnxruntime or tflite, or report the layer named above")
    meta = {"input_names": list(build.tensor_inputs), "output_names": output_names, "precision": build.precision,
            "ncnn": {"converted_by": "pnnx {}".format(_pnnx_version()), "ncnn_at_export": ncnn.__version__,
                     "batch": batch, "input_shapes": [list(shape[1:]) for shape, _ in inputs],
                     "output_shapes": [list(shape[1:]) for shape, _ in outputs], "weights": "fp32",
                     "layers": _counts(layer.type for layer in layers), "options": board_options(build.board)},
            "requires": {"python": ["ncnn>={}".format(MIN_NCNN)]}}  # type: Dict[str, Any]
    if mixed:
        kept = masked(layers)
        meta["ncnn"]["fp32_layers"] = {"layers": len(kept), "of": len(probed_layers(layers)), "names": kept}
    if build.precision == FP32:
        meta["tolerance"] = dict(FP32_TOLERANCE)
    artifact = Artifact(backend="ncnn", executor="ncnn", device="cpu", arch=None,
                        target="ncnn-cpu-{}".format(build.precision), files={"model": param, "weights": weights},
                        file_names={"model": "model.param", "weights": "weights.bin"}, meta=meta)
    _check_against_torch(artifact, build.program, inputs)
    return artifact


def _whole_map_pools(model: Any) -> None:
    """The ONNX model's AveragePools that take their whole map in one window as GlobalAveragePool, before pnnx
    (onnx_rewrites.whole_map_pools: ncnn would not clip the window). Only here: the other backends compute those
    pools as torch does, and onnxruntime's int8 quantizer treats the two ops differently (the zoo's EfficientNet
    moved from cosine 0.970 to 0.969992 under its int8 gate with the rewrite)."""
    import onnx

    if whole_map_pools(onnx, model):
        onnx.checker.check_model(model)


def _tensors(program: Any, which: str) -> List[Tuple[Tuple[int, ...], str]]:
    """(shape, dtype) of the program's user inputs or outputs, in order."""
    signature = program.graph_signature
    nodes = {node.name: node for node in program.graph.nodes}
    if which == "input":
        values = [nodes[name].meta.get("val") for name in signature.user_inputs]
    else:
        (output,) = [node for node in program.graph.nodes if node.op == "output"]
        results = output.args[0]
        values = [getattr(arg, "meta", {}).get("val") for arg in results[len(results) - len(signature.user_outputs):]]
    return [(tuple(int(d) for d in value.shape), str(value.dtype).replace("torch.", "")) if value is not None
            else ((), "none") for value in values]


def _batch(names: List[str], inputs: Sequence[Tuple[Tuple[int, ...], str]],
           outputs: Sequence[Tuple[Tuple[int, ...], str]]) -> int:
    """The size of the first axis every input and output shares: ncnn runs each of its items on its own."""
    tensors = [("input '{}'".format(n), shape, dtype) for n, (shape, dtype) in zip(names, inputs)] + [
        ("output {}".format(i), shape, dtype) for i, (shape, dtype) in enumerate(outputs)]
    for what, shape, dtype in tensors:
        if dtype != "float32":
            raise BackendError("the ncnn backend cannot express {} of dtype {}: ncnn computes float32 tensors "
                               "only".format(what, dtype), hint="try --backend onnxruntime or tflite")
        if not 2 <= len(shape) <= MAX_ITEM_RANK + 1:
            raise BackendError("the ncnn backend cannot express {} of shape {}: ncnn has no batch axis and holds "
                               "each item of the first axis as a blob of 1 to {} dimensions".format(
                                   what, list(shape), MAX_ITEM_RANK), hint="try --backend onnxruntime or tflite")
    sizes = sorted({shape[0] for _, shape, _ in tensors})
    if len(sizes) != 1:
        raise BackendError("the ncnn backend cannot express this graph: ncnn has no batch axis, so each item of the "
                           "first axis runs on its own, and its inputs and outputs disagree on that axis ({})".format(
                               ", ".join("{} {}".format(what, shape[0]) for what, shape, _ in tensors)),
                           hint="try --backend onnxruntime or tflite")
    return sizes[0]


def _convert(pnnx: str, onnx_bytes: bytes, shapes: List[Tuple[int, ...]]) -> Tuple[bytes, bytes]:
    """pnnx's .param and .bin for the ONNX model, the first axis of every input as its batch."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-pnnx-") as folder:
        work = Path(folder)
        (work / "model.onnx").write_bytes(onnx_bytes)
        outputs = {key: str(work / name) for key, name in (
            ("ncnnparam", "model.param"), ("ncnnbin", "model.bin"), ("ncnnpy", "model_ncnn.py"),
            ("pnnxparam", "model.pnnx.param"), ("pnnxbin", "model.pnnx.bin"), ("pnnxpy", "model_pnnx.py"),
            ("pnnxonnx", "model.pnnx.onnx"))}
        shape_text = ",".join("[{}]f32".format(",".join(str(d) for d in shape)) for shape in shapes)
        command = [pnnx, str(work / "model.onnx"), "inputshape=" + shape_text, "fp16=0", "device=cpu"] + [
            "{}={}".format(key, path) for key, path in outputs.items()]
        try:
            result = subprocess.run(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    timeout=PNNX_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BackendError("pnnx did not convert the model in {} s".format(PNNX_TIMEOUT_S),
                               hint="try another --backend")
        param, weights = work / "model.param", work / "model.bin"
        if result.returncode != 0 or not param.is_file() or not weights.is_file():
            tail = result.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise BackendError("pnnx could not convert the model (exit {}): {}".format(
                result.returncode, " | ".join(tail) or "no output"), hint="try another --backend")
        return param.read_bytes(), weights.read_bytes()


def _named(param: bytes, build: Build, inputs: List[str], outputs: List[str]) -> bytes:
    """pnnx's text with its blobs in0.., out0.. named as the manifest names inputs and outputs, once every layer
    is one edgedyn's ncnn files may hold (BackendError naming the ops pnnx could not convert otherwise)."""
    lines = param.decode("ascii", "replace").splitlines()
    rows = [line.split() for line in lines[2:] if line.strip()]
    _refuse_leftovers([row[0] for row in rows if row], build.program)
    names = dict([("in{}".format(i), name) for i, name in enumerate(inputs)] +
                 [("out{}".format(i), name) for i, name in enumerate(outputs)])
    renamed = []
    for row in rows:
        links = 4 + int(row[2]) + int(row[3])
        renamed.append(" ".join(row[:4] + [names.get(token, token) for token in row[4:links]] + row[links:]))
    return "\n".join(lines[:2] + renamed + [""]).encode("ascii")


def _refuse_leftovers(types: List[str], program: Any) -> None:
    unknown = sorted({t for t in types if t not in WEIGHTS})
    if not unknown:
        return
    leftovers = [t for t in unknown if "." in t or "::" in t]  # pnnx keeps torch's names for what it cannot convert
    if leftovers:
        where = _source_line(program, leftovers)
        raise BackendError("the ncnn backend cannot express {}: pnnx found no ncnn layer for {}{}".format(
            ", ".join(leftovers), "it" if len(leftovers) == 1 else "them",
            ", at {}".format(where) if where else " (no source line recorded)"),
            hint="ncnn has no batch axis: an op that reshapes, permutes or splits along the first axis often has "
                 "none; rewrite that line, or try --backend onnxruntime or tflite")
    raise BackendError("the ncnn model pnnx wrote uses ncnn layer(s) {}, which edgedyn's ncnn checker does not know "
                       "yet".format(", ".join(unknown)), hint="try --backend onnxruntime or tflite, or report it")


def _source_line(program: Any, leftovers: List[str]) -> Optional[str]:
    """The user's line of the first graph node of the kind pnnx left unconverted, when the graph records one."""
    from edgedyn.backends.tflite.diagnostics import source_line

    wanted = set()
    for op in leftovers:
        name = op.replace("::", ".").split(".")[-1]
        wanted.update(ATEN_NAMES.get(name, (name,)))
    for node in program.graph.nodes:
        target = str(node.target) if node.op == "call_function" else ""
        if target.startswith("aten.") and target.split(".")[1] in wanted:
            line = source_line(node)
            if line:
                return line
    return None


def _check_against_torch(artifact: Artifact, program: Any, inputs: Sequence[Tuple[Tuple[int, ...], str]]) -> None:
    """The converted model on random inputs, run here in fp32, against torch eager: pnnx's conversion and ncnn's
    item-by-item runs must compute what torch does."""
    import torch

    generator = torch.Generator().manual_seed(CHECK_SEED)
    tensors = [torch.randn(shape, generator=generator) for shape, _ in inputs]
    with torch.no_grad():
        expected = [np.asarray(t.detach().numpy()) for t in torch.utils._pytree.tree_leaves(
            program.module()(*tensors)) if isinstance(t, torch.Tensor)]
    checked = Artifact(**dict(vars(artifact), meta=dict(artifact.meta, precision=FP32)))
    hint = ("ncnn has no batch axis and runs each item of the first axis on its own: a model that mixes those items "
            "cannot run on it; try --backend onnxruntime or tflite")
    try:
        with open_executor(checked) as (executor, _):
            got = executor.run([t.numpy() for t in tensors])
    except BundleError as error:
        raise BackendError("the ncnn model pnnx converted fails on random inputs: {}".format(error.message), hint=hint)
    for index, (value, want) in enumerate(zip(got, expected)):
        result = compare(np.asarray(value), want, FP32_TOLERANCE)
        if not result["ok"]:
            raise BackendError("the ncnn model pnnx converted disagrees with torch eager on output {} for random "
                               "inputs: {}".format(index, result.get("error") or "max relative error {:.3g}".format(
                                   result["max_rel"])), hint=hint)


def _counts(types: Any) -> Dict[str, int]:
    counts = {}  # type: Dict[str, int]
    for kind in types:
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def _pnnx_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("pnnx")
    except metadata.PackageNotFoundError:
        return "unknown"
