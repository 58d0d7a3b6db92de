"""ONNX Runtime: export the graph to ONNX at its fixed shapes, pre-optimize it portably, and bundle the .onnx file.

The model file is plain ONNX (opset 20, IR 9, weights inside the file: no pickle, no external data), so one
artifact runs on any CPU architecture and any onnxruntime >= 1.17 with the execution providers the board has.
"""
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from edgedyn.backends import onnx_nms, onnx_rewrites
from edgedyn.backends.artifact import Artifact, Build
from edgedyn.boards import Board
from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.runtime.program import FP32_TOLERANCE

# Opset 20 (IR version 9) is the first with a Gelu operator: torch's exporter writes aten.gelu as one node, which
# onnxruntime fuses with the MatMul/Add around it; at opset 18 the Erf expansion it writes is not fused (BERT-tiny
# and ViT: 2 and 4 Gelu left as Div/Erf/Mul). onnxruntime runs opset 20 since 1.17: old enough for the boards'
# wheels (Python 3.8 on aarch64 stops at onnxruntime 1.19). The manifest's `requires` carries that minimum.
OPSET = 20
IR_VERSION = 9
MIN_ONNXRUNTIME = "1.17"
# protobuf cannot serialize a message over 2 GiB; weights that large would need ONNX external data files.
MAX_MODEL_BYTES = 2 ** 31 - 1

# Note: the offline optimization level is "basic" on purpose. Basic rewrites (constant folding, redundant node
# removal, Conv+BatchNorm/Add/Mul fusions) keep the graph in standard ONNX ops, so the file stays valid for every
# onnxruntime version and execution provider (TensorRT and CUDA on a Jetson included). "extended" replaces nodes
# with com.microsoft contrib ops assigned to the exporting host's execution provider, and "layout"/"all" add
# NCHWc reorders sized for this host's vector width (AVX2/AVX-512): neither is portable. The runtime applies
# those levels itself when it opens the session on the board (ORT_ENABLE_ALL there), for the board's own CPU.
OFFLINE_LEVEL = "basic"


def _import_onnx() -> Tuple[Any, Any]:
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx.export(dynamo=True) needs it)
    except ImportError as error:
        raise MissingDependencyError(
            "the onnxruntime backend needs onnx, onnxscript and onnxruntime ({})".format(error),
            hint="pip install 'edgedyn[export,onnxruntime]'")
    return onnx, onnxruntime


def execution_providers(board: Board) -> List[str]:
    """The onnxruntime execution providers to try on the board, best first (from its board file); CPU is last."""
    # The executor keeps those its installed onnxruntime offers, so the same file also runs where only the CPU
    # one exists (a Jetson without onnxruntime-gpu, or the x86 host that verifies it).
    providers = [p for p in board.onnxruntime_providers if p != "CPUExecutionProvider"]
    return providers + ["CPUExecutionProvider"]


def board_session(board: Board) -> Dict[str, Any]:
    """The board's [onnxruntime] session settings, recorded in the artifact for the runtime to apply."""
    from edgedyn._schema import to_dict

    return to_dict(board.onnxruntime_session)


def lower(build: Build) -> Artifact:
    """Exports the program to ONNX, applies onnxruntime's portable graph optimizations and returns the model file;
    with `build.quantization` (edgedyn.quantize.Quantization), the model is quantized to int8 after that."""
    program, board, tensor_inputs, quantization = build.program, build.board, build.tensor_inputs, build.quantization
    onnx, onnxruntime = _import_onnx()
    output_names = ["output_{}".format(i) for i in range(len(program.graph_signature.user_outputs))]
    model, lowered = _export_high_level_or_core(onnx, program, tensor_inputs, output_names)
    # The rewrites match the graph after the basic optimizations (constant folding turns the exporter's computed
    # attention mask into the constant they look for); the exported file ships without them when that one fails.
    optimized, rewrites = onnx_rewrites.rewrite(onnx, _optimize_offline(onnx, onnxruntime, model))
    model, offline_level = _loadable(onnxruntime, optimized, model)
    if offline_level != OFFLINE_LEVEL:
        rewrites = {key: 0 for key in rewrites}
    extra = {}  # type: Dict[str, Any]
    if quantization is not None:
        from edgedyn.quantize.onnx import quantize

        model, extra["quantization"] = quantize(onnx, model, quantization, list(tensor_inputs))
        extra["tolerance"] = extra["quantization"].pop("tolerance")
    data = model.SerializeToString()
    return Artifact(
        backend="onnxruntime",
        executor="onnxruntime",
        device="cpu",
        arch=None,
        target="onnx-opset{}".format(OPSET),
        files={"model": data},
        file_names={"model": "model.onnx"},
        meta={"opset": OPSET, "ir_version": model.ir_version, "input_names": list(tensor_inputs),
              "output_names": output_names, "execution_providers": execution_providers(board),
              "onnx_rewrites": rewrites,
              "onnxruntime": {"version": onnxruntime.__version__, "graph_optimization": offline_level,
                              "session": board_session(board)},
              "tolerance": dict(FP32_TOLERANCE), "requires": {"python": ["onnxruntime>={}".format(MIN_ONNXRUNTIME)]},
              **lowered, **extra},
    )


def export_onnx(program: Any, tensor_inputs: List[str], output_names: List[str]) -> Tuple[Any, Dict[str, Any]]:
    """The program as a checked ONNX model (its high-level graph, else core ATen) and the manifest's note of which;
    the openvino backend converts the same model."""
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx.export(dynamo=True) needs it)
    except ImportError as error:
        raise MissingDependencyError("exporting to ONNX needs onnx and onnxscript ({})".format(error),
                                     hint="pip install 'edgedyn[export]'")
    return _export_high_level_or_core(onnx, program, tensor_inputs, output_names)


def _export_high_level_or_core(onnx: Any, program: Any, tensor_inputs: List[str],
                               output_names: List[str]) -> Tuple[Any, Dict[str, Any]]:
    """The ONNX model of the high-level graph (the one onnxruntime fuses best), or, when torch's exporter cannot
    convert that, of the same program in core ATen, with the manifest's note of why.

    Note: torch's exporter may fail on a high-level graph that it converts once decomposed (torch 2.13 did on the
    zoo's Swin until the export ran under no_grad); the core-ATen graph is what every other backend lowers, so it
    is a correct model, only with fewer onnxruntime fusions.
    """
    try:
        return _export(onnx, program, tensor_inputs, output_names), {}
    except BackendError as high_level_error:
        from edgedyn.passes import run_pipeline

        try:
            model = _export(onnx, run_pipeline(program, "default"), tensor_inputs, output_names)
        except BackendError:
            raise high_level_error
        return model, {"onnx_graph": {"lowered_from": "core ATen (the default pass pipeline)",
                                      "why": high_level_error.message}}


def _export(onnx: Any, program: Any, tensor_inputs: List[str], output_names: List[str]) -> Any:
    """torch's dynamo ONNX exporter over the ExportedProgram, inputs and outputs named as in the manifest."""
    import torch

    from edgedyn.torch_quiet import quiet_torch

    try:
        # Under autograd the exporter's decompositions give scaled_dot_product_attention's math a different
        # stride than the captured graph's views assume (the zoo's Swin: `Cannot view a tensor ... as
        # (4, 16, 32)`); inference graphs are exported as they run, without it.
        with quiet_torch(), torch.no_grad():
            exported = torch.onnx.export(program, (), dynamo=True, opset_version=OPSET, optimize=True,
                                         input_names=list(tensor_inputs), output_names=output_names, verbose=False,
                                         custom_translation_table=onnx_nms.translations(OPSET))
    except Exception as error:
        raise BackendError("torch's ONNX exporter cannot convert this graph: {}".format(_first_line(error)),
                           hint="try another --backend, or report the operator named above")
    model = exported.model_proto
    # The exporter stamps the newest IR version its onnx knows (10); nothing in an opset-20 graph needs more than
    # 9, the lowest that opset allows, and an older runtime is then never asked to trust a newer format.
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    if model.ByteSize() > MAX_MODEL_BYTES:
        raise BackendError("the ONNX model is {:.1f} GiB; one ONNX file holds at most 2 GiB".format(
            model.ByteSize() / 2 ** 30), hint="use --backend tvm for models this large")
    # Views the exporter writes as a gather, which a converter lacks (onnx_rewrites); after the size check: the
    # rewrite's shape inference needs the model in one protobuf.
    if onnx_rewrites.identity_gathers(onnx, model):
        onnx.checker.check_model(model)
    return model


def _optimize_offline(onnx: Any, onnxruntime: Any, model: Any) -> Any:
    """The model after onnxruntime's basic (hardware-independent) graph optimizations; see OFFLINE_LEVEL."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="edgedyn-onnx-") as workdir:
        path = Path(workdir) / "optimized.onnx"
        options.optimized_model_filepath = str(path)
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(path))
        if any(p != path for p in Path(workdir).iterdir()):
            raise BackendError("onnxruntime wrote external data next to the optimized model; edgedyn bundles one file")
    # onnxruntime lists every domain it knows in opset_import; keep those the graph uses, so older runtimes
    # (which reject domain versions they do not know) still load it.
    used = {node.domain for node in optimized.graph.node} | {""}
    kept = [entry for entry in optimized.opset_import if entry.domain in used]
    del optimized.opset_import[:]
    optimized.opset_import.extend(kept)
    optimized.ir_version = IR_VERSION
    optimized.producer_name, optimized.producer_version = model.producer_name, model.producer_version
    _rename_generated_initializers(model, optimized)
    onnx.checker.check_model(optimized)
    return optimized


GENERATED_PREFIX = "edgedyn_offline_"


def _rename_generated_initializers(exported: Any, optimized: Any) -> None:
    """Gives every initializer that onnxruntime's offline pass created a name of edgedyn's own.

    onnxruntime names some initializers it creates after node names that are free (MatMulAddFusion's
    `gemm_input_shape`, checked only against the graph's node names): the board's onnxruntime, optimizing the
    file once more at load, then makes the same name again and refuses the file ("AddInitializedOrtValue Attempt
    to replace the existing tensor", onnxruntime 1.32, the zoo's DistilBERT and Wav2Vec2).
    """
    graph = optimized.graph
    if any(a.type in (a.GRAPH, a.GRAPHS) for node in graph.node for a in node.attribute):
        return  # a subgraph may read an initializer by name; such graphs are left as they are
    known = ({t.name for t in exported.graph.initializer} | {v.name for v in exported.graph.input}
             | {name for node in exported.graph.node for name in node.output})
    taken = {t.name for t in graph.initializer} | {name for node in graph.node for name in node.output}
    renamed = {}  # type: Dict[str, str]
    for tensor in graph.initializer:
        if tensor.name in known:
            continue
        name = GENERATED_PREFIX + tensor.name
        while name in taken:
            name += "_"
        taken.add(name)
        renamed[tensor.name] = tensor.name = name
    if not renamed:
        return
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for value in graph.value_info:
        value.name = renamed.get(value.name, value.name)


def _loadable(onnxruntime: Any, optimized: Any, exported: Any) -> Tuple[Any, str]:
    """(the offline-optimized model, OFFLINE_LEVEL) when onnxruntime opens it with every optimization on (as the
    board does), else (the exported one, "none"): onnxruntime then optimizes it once, at load."""
    # Seen with onnxruntime 1.32 on a BERT encoder fed embeddings: a basic-optimized file failed to load at
    # ORT_ENABLE_ALL ("AddInitializedOrtValue Attempt to replace the existing tensor"), the exported one loaded.
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 4
    try:
        onnxruntime.InferenceSession(optimized.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return optimized, OFFLINE_LEVEL
    except Exception:  # onnxruntime raises its own pybind Fail/RuntimeException types
        return exported, "none"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return "{}: {}".format(type(error).__name__, lines[-1] if lines else "")
