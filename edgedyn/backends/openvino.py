"""OpenVINO: the graph as an OpenVINO IR (model.xml + weights.bin), converted at export from the ONNX model that
torch's exporter writes for the onnxruntime backend (or, when that export fails, from the ExportedProgram itself).

The artifact records its precision (`build.precision`: fp32, bf16 or fp16) and the executor asks OpenVINO for
exactly that. Under --quantize, NNCF quantizes the converted model first (edgedyn/backends/openvino_int8.py). A
reduced-precision IR stores its weights in fp16 (half the bytes; OpenVINO computes in the requested precision
either way; fp32 when its first layers stay fp32: `keep_first_layers_fp32`), and is held to the float accuracy
gate by `auto` (edgedyn/selection.py).
The IR is plain XML and raw weights: no pickle, read by OpenVINO 2024.0 and newer (Python 3.8 boards stop there).
"""
from typing import Any, Dict, List

from edgedyn.backends.artifact import Artifact, Build
from edgedyn.backends.openvino_marks import keep_first_layers_fp32, serialized
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
    marked = None  # type: Any
    if build.quantization is not None:
        from edgedyn.backends.openvino_int8 import quantize

        model, quantization, marked = quantize(openvino, model, build.quantization, build.program, build.precision)
    compressed = reduced and not mixed and marked is None
    model_xml, weights = marked or serialized(openvino, model, compress=compressed)  # marked: the int8's fp32 prefix
    files = {"model": model_xml, "weights": weights}
    meta = {"input_names": list(build.tensor_inputs), "output_names": output_names, "precision": build.precision,
            "openvino": {"version": openvino.get_version(), "converted_from": source,
                         "weights": "fp16" if compressed else "fp32",
                         "properties": board_properties(build.board)},
            "requires": {"python": ["openvino>={}".format(MIN_OPENVINO)]}}  # type: Dict[str, Any]
    if mixed or marked is not None:
        if mixed:
            files["model"], kept, total = keep_first_layers_fp32(files["model"], build.fp32_share)
            meta["openvino"]["fp32_layers"] = {"first": kept, "of": total, "share": build.fp32_share}
        else:
            first = quantization["float_first"]  # the layers NNCF left out of int8: its first ones marked fp32
            meta["openvino"]["fp32_layers"] = {"first": first["fp32_first"], "of": first["of"],
                                               "share": first["fp32_share"]}
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


def _release(version: str) -> str:
    """'2026.4' of '2026.4.1-20617-...': the release a requirement names."""
    parts = version.split("-")[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else MIN_OPENVINO
