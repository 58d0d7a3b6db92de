"""`edgedyn::nms` in TVM: a call to the packed function `edgedyn.nms`, which the runtime's TVM executor registers.

TVM 0.27's Relax has NMS operators, but with their own conventions (ONNX's per-class layout, TensorFlow's output
format); the op's semantics are defined once, by the numpy kernel of the portable executor
(edgedyn/runtime/kernels/detection.py), and the TVM executor registers that kernel as `edgedyn.nms`
(`register_kernels` there) before it loads a library. The compiled graph calls it in destination-passing style:
boxes, scores, labels (when given) and the IoU threshold in, keep and count written into the outputs.
"""
from typing import Any, Callable, Dict

from edgedyn.runtime.executors.tvm import NMS_FUNCTION


def convert_map() -> Dict[str, Callable[[Any, Any], Any]]:
    """from_exported_program's custom_convert_map entries for edgedyn's ops (keyed by the op's __name__)."""
    return {"nms.default": _nms}


def _nms(node: Any, importer: Any) -> Any:
    from tvm import relax

    boxes, scores, labels, iou, max_out = node.args
    inputs = [importer.env[boxes], importer.env[scores]]
    if labels is not None:
        inputs.append(importer.env[labels])
    inputs.append(relax.const(float(iou), "float64"))
    outputs = [relax.TensorType((int(max_out),), "int64"), relax.TensorType((), "int64")]
    return importer.block_builder.emit(relax.call_dps_packed(NMS_FUNCTION, relax.Tuple(inputs), outputs))
