"""Detection post-processing in TVM: `edgedyn::nms` and top-k call packed functions the runtime's TVM executor
registers; max with its index becomes max and argmax.

TVM 0.27's Relax has NMS operators, but with their own conventions (ONNX's per-class layout, TensorFlow's output
format); the op's semantics are defined once, by the numpy kernel of the portable executor
(edgedyn/runtime/kernels/detection.py), and the TVM executor registers that kernel as `edgedyn.nms`
(`register_kernels` there) before it loads a library. The compiled graph calls it in destination-passing style:
boxes, scores, labels (when given) and the IoU threshold in, keep and count written into the outputs.

Note: TVM's own top-k (and its frontend's max.dim, written as a top-1) calls `tvm.contrib.sort.topk`, a function
of the full TVM library that the runtime library a board loads (TVM_USE_RUNTIME_LIB=1) does not have: such a
bundle verified on the host and failed on the board. Top-k goes to the portable kernel the same way as NMS, and
max.dim to a max and an argmax (reductions TVM compiles into the library).
"""
from typing import Any, Callable, Dict

from edgedyn.runtime.executors.tvm import NMS_FUNCTION, TOPK_FUNCTION


def convert_map() -> Dict[str, Callable[[Any, Any], Any]]:
    """from_exported_program's custom_convert_map entries (keyed by the op's __name__)."""
    return {"nms.default": _nms, "topk.default": _topk, "max.dim": _max_dim}


def _topk(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    k = int(node.args[1])
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)
    largest = node.args[3] if len(node.args) > 3 else node.kwargs.get("largest", True)
    values, indices = (v.shape for v in node.meta["val"])
    rank = len(values)
    arguments = relax.Tuple([x, relax.const(k, "int64"), relax.const(int(dim) % rank, "int64"),
                             relax.const(bool(largest), "bool")])
    outputs = [relax.TensorType(tuple(int(n) for n in values), str(node.meta["val"][0].dtype).replace("torch.", "")),
               relax.TensorType(tuple(int(n) for n in indices), "int64")]
    return importer.block_builder.emit(relax.call_dps_packed(TOPK_FUNCTION, arguments, outputs))


def _max_dim(node: Any, importer: Any) -> Any:
    from tvm import relax

    x = importer.env[node.args[0]]
    dim = node.args[1]
    keepdim = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))
    builder = importer.block_builder
    values = builder.emit(relax.op.max(x, axis=dim, keepdims=keepdim))
    indices = builder.emit(relax.op.argmax(x, axis=dim, keepdims=keepdim))
    return builder.emit(relax.Tuple([values, indices]))


def _nms(node: Any, importer: Any) -> Any:
    from tvm import relax

    boxes, scores, labels, iou, max_out = node.args
    inputs = [importer.env[boxes], importer.env[scores]]
    if labels is not None:
        inputs.append(importer.env[labels])
    inputs.append(relax.const(float(iou), "float64"))
    outputs = [relax.TensorType((int(max_out),), "int64"), relax.TensorType((), "int64")]
    return importer.block_builder.emit(relax.call_dps_packed(NMS_FUNCTION, relax.Tuple(inputs), outputs))
