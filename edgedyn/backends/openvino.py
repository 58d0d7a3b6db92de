"""OpenVINO: the graph as an OpenVINO IR (model.xml + weights.bin), converted at export from the ONNX model that
torch's exporter writes for the onnxruntime backend (or, when that export fails, from the ExportedProgram itself).

The artifact records its precision (`build.precision`: fp32, bf16 or fp16) and the executor asks OpenVINO for
exactly that. Under --quantize, NNCF quantizes the converted model first (edgedyn/quantize/openvino.py). A
reduced-precision IR stores its weights in fp16 (half the bytes; OpenVINO computes in the requested precision
either way; fp32 when its first layers stay fp32: `keep_first_layers_fp32`), and is held to the float accuracy
gate by `auto` (edgedyn/selection.py).
The IR is plain XML and raw weights: no pickle, read by OpenVINO 2024.0 and newer (Python 3.8 boards stop there).
"""
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

from edgedyn.backends.artifact import Artifact, Build
from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.runtime.precision import FP32
from edgedyn.runtime.program import FP32_TOLERANCE

MIN_OPENVINO = "2024.0"


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError as error:
        raise MissingDependencyError("the openvino backend needs OpenVINO ({})".format(error),
                                     hint="pip install 'edgedyn[export,openvino]'")
    return openvino


def board_properties(board: Any) -> Dict[str, Any]:
    """The board's [openvino] CPU properties, recorded in the artifact for the runtime to apply."""
    from edgedyn._schema import plain

    return plain(board.openvino_properties) if board.openvino_properties else {}


def lower(build: Build) -> Artifact:
    """Converts the program to an OpenVINO IR for the CPU, computing in `build.precision`."""
    openvino = _import_openvino()
    output_names = ["output_{}".format(i) for i in range(len(build.program.graph_signature.user_outputs))]
    model, source = _converted(openvino, build, output_names)
    reduced = build.precision != FP32
    mixed = reduced and build.fp32_share > 0 and build.quantization is None
    quantization = None  # type: Any
    fp32_names = []  # type: List[str]
    if build.quantization is not None:
        from edgedyn.quantize.openvino import quantize

        model, quantization, fp32_names = quantize(openvino, model, build.quantization, build.program,
                                                   build.precision)
    compressed = reduced and not mixed and not fp32_names
    model_xml, weights = serialized(openvino, model, compress=compressed)
    files = {"model": model_xml, "weights": weights}
    meta = {"input_names": list(build.tensor_inputs), "output_names": output_names, "precision": build.precision,
            "openvino": {"version": openvino.get_version(), "converted_from": source,
                         "weights": "fp16" if compressed else "fp32",
                         "properties": board_properties(build.board)},
            "requires": {"python": ["openvino>={}".format(MIN_OPENVINO)]}}  # type: Dict[str, Any]
    if mixed or fp32_names:
        if mixed:
            files["model"], kept, total = keep_first_layers_fp32(files["model"], build.fp32_share)
            meta["openvino"]["fp32_layers"] = {"first": kept, "of": total, "share": build.fp32_share}
        else:
            files["model"] = mark_named_fp32(files["model"], set(fp32_names))
            first = quantization["float_first"]  # the layers NNCF left out of int8, marked fp32
            meta["openvino"]["fp32_layers"] = {key: first[key] for key in ("first", "of", "share")}
        # Older OpenVINOs read the marks as an unknown attribute and compute every layer in the reduced precision:
        # an artifact that only the release it was measured with (or a newer one) computes as gated.
        meta["requires"]["python"] = ["openvino>={}".format(_release(openvino.get_version()))]
    if quantization is not None:
        meta["tolerance"] = quantization.pop("tolerance")
        meta["quantization"] = quantization
    elif not reduced:
        meta["tolerance"] = dict(FP32_TOLERANCE)
    return Artifact(backend="openvino", executor="openvino", device="cpu", arch=None,
                    target="openvino-cpu-{}".format(build.precision), files=files,
                    file_names={"model": "model.xml", "weights": "weights.bin"}, meta=meta)


def _converted(openvino: Any, build: Build, output_names: List[str]) -> Any:
    """(the OpenVINO model with the manifest's input and output names, what it was converted from)."""
    from edgedyn.backends.onnxruntime import export_onnx

    try:
        onnx_model, _ = export_onnx(build.program, list(build.tensor_inputs), output_names)
        model = openvino.convert_model(_as_stream(onnx_model.SerializeToString()))
        return model, "onnx"
    except (BackendError, MissingDependencyError) as onnx_error:
        try:
            model = openvino.convert_model(build.program)
        except Exception as error:  # OpenVINO's frontends raise their own types
            raise BackendError("OpenVINO cannot convert this graph: from ONNX: {}; from the ExportedProgram: "
                               "{}".format(onnx_error.message, _first_line(error)),
                               hint="try another --backend, or report the operator named above")
        _rename(model, list(build.tensor_inputs), output_names)
        return model, "exported program"
    except Exception as error:
        raise BackendError("OpenVINO cannot convert the ONNX model: {}".format(_first_line(error)),
                           hint="try another --backend, or report the operator named above")


def _as_stream(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def _rename(model: Any, inputs: List[str], outputs: List[str]) -> None:
    """Names a model converted from the ExportedProgram as the manifest does (the ONNX route keeps them)."""
    for port, name in zip(model.inputs, inputs):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, outputs):
        port.get_tensor().set_names({name})


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return "{}: {}".format(type(error).__name__, lines[0] if lines else "")


# The layers a mixed artifact counts and marks: what computes (not the weights, the inputs and outputs, or the
# Converts that decompress weights).
NOT_COMPUTING = ("Const", "Parameter", "Result", "Convert")
# The marked layers end just before one of these: the CPU plugin fuses a convolution with the adds and activation
# after it, and refuses to compile ("object is not initialized") a fused group that is part f32, part bf16
# (DeepLabV3-MobileNetV3: every cut between a convolution and its residual add failed, none before a convolution).
GROUP_STARTS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData", "MatMul")
# OpenVINO's runtime attribute that keeps a layer in its original precision (the CPU plugin leaves a layer that may
# not be converted to f16 in f32 under a bf16 or f16 inference precision): from any element type to f16.
KEEP_FP32 = ("DisablePrecisionConversion", "0", "dynamic:f16")


def keep_first_layers_fp32(xml: bytes, share: float) -> Tuple[bytes, int, int]:
    """(the IR with its first `share` of computing layers marked to stay fp32, up to the next convolution or matrix
    product, how many were marked, how many compute). An IR lists its layers in topological order: the first ones
    are those nearest the inputs, where a reduced precision's rounding has the whole network to grow through
    (DeepLabV3-MobileNetV3 in bf16: cosine 0.9969 to torch with every layer bf16, 0.9991 with the first tenth fp32,
    0.9998 with half; benchmarks/mixed_layers.py measures each convolution group alone)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.fromstring(xml)
    layers, total = first_layers(root, share)
    mark_fp32(layers)
    return ElementTree.tostring(root, encoding="utf-8"), len(layers), total


def first_layers(root: Any, share: float) -> Tuple[List[Any], int]:
    """(the first `share` of a parsed IR's computing layers, extended up to the next layer of GROUP_STARTS, how many
    layers compute): the prefix a mixed artifact keeps out of its reduced precision or out of int8."""
    import math

    computing = [layer for group in computing_groups(root) for layer in group]
    count = min(len(computing), int(math.ceil(share * len(computing))))
    while 0 < count < len(computing) and computing[count].get("type") not in GROUP_STARTS:
        count += 1
    return computing[:count], len(computing)


def mark_named_fp32(xml: bytes, names: Any) -> bytes:
    """The IR with the layers named in `names` marked to stay fp32 (an int8 IR's float prefix: NNCF keeps the
    names of the layers it leaves alone)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.fromstring(xml)
    mark_fp32([layer for layer in root.iter("layer") if layer.get("name") in names])
    return ElementTree.tostring(root, encoding="utf-8")


def serialized(openvino: Any, model: Any, compress: bool = False) -> Tuple[bytes, bytes]:
    """(model.xml, weights.bin) of an OpenVINO model, weights in fp16 when `compress`."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-openvino-") as workdir:
        xml = Path(workdir) / "model.xml"
        openvino.save_model(model, str(xml), compress_to_fp16=compress)
        return xml.read_bytes(), xml.with_suffix(".bin").read_bytes()


def computing_groups(root: Any) -> List[List[Any]]:
    """The computing layers of a parsed IR in order, cut before each layer of GROUP_STARTS: the units a mixed
    artifact may keep in fp32 (the first group also holds whatever computes before the first convolution)."""
    groups = []  # type: List[List[Any]]
    for layer in root.iter("layer"):
        if layer.get("type") in NOT_COMPUTING:
            continue
        if not groups or layer.get("type") in GROUP_STARTS:
            groups.append([])
        groups[-1].append(layer)
    return groups


def mark_fp32(layers: List[Any]) -> None:
    """Marks each layer (an IR's <layer> element) with KEEP_FP32, beside any runtime attributes it has."""
    import xml.etree.ElementTree as ElementTree

    name, version, value = KEEP_FP32
    for layer in layers:
        info = layer.find("rt_info")
        if info is None:
            info = ElementTree.Element("rt_info")
            layer.insert(0, info)
        ElementTree.SubElement(info, "attribute", {"name": name, "version": version, "value": value})


def _release(version: str) -> str:
    """'2026.4' of '2026.4.1-20617-...': the release a requirement names."""
    parts = version.split("-")[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else MIN_OPENVINO
