"""ONNX operators as torch calls, for `onnx_import.OnnxModule`: OPS maps an op type to f(inputs, attributes).

A value is a torch tensor (it depends on the graph's inputs) or a numpy array (computed from shapes and
constants only). Shape-like operators keep numpy values numpy, so sizes stay Python numbers in the capture.
Each function returns the list of its outputs; `attributes["_op"]` is the op type, for functions serving two.
Semantics follow the ONNX operator specification (opset 13+).
"""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from edgedyn.errors import CaptureError

Value = Union[np.ndarray, torch.Tensor]
Attributes = Dict[str, Any]
Op = Callable[[List[Optional[Value]], Attributes], List[Value]]
OPS = {}  # type: Dict[str, Op]

_TORCH_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
                 9: torch.bool, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


class StaticArray(np.ndarray):
    """A constant's numpy value that also knows the module buffer holding it, for ops that need a tensor."""

    buffer = None  # type: Optional[torch.Tensor]

    @classmethod
    def of(cls, array: np.ndarray, buffer: Optional[Value]) -> np.ndarray:
        if buffer is None:
            return array
        view = np.asarray(array).view(cls)
        view.buffer = buffer  # type: ignore[assignment]
        return view


def _op(*names: str) -> Callable[[Op], Op]:
    def register(function: Op) -> Op:
        for name in names:
            OPS[name] = function
        return function
    return register


def _static(*values: Optional[Value]) -> bool:
    return all(v is None or isinstance(v, np.ndarray) for v in values)


def _tensor(value: Value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, StaticArray) and value.buffer is not None:
        return value.buffer
    return torch.from_numpy(np.array(value))


def _operand(value: Value) -> Any:
    """A tensor, or a Python number for a one-element constant (so torch does not see a constant tensor)."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.ndim == 0:
        return value.item()
    return _tensor(value)


def _ints(value: Optional[Value]) -> List[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        raise CaptureError("an ONNX shape or axes input depends on the model's input values; a capture at fixed "
                           "shapes needs it constant")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _elementwise(numpy_function: Callable[..., Any], torch_function: Callable[..., Any]) -> Op:
    def run(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
        if _static(*inputs):
            return [np.asarray(numpy_function(*inputs))]
        operands = [_operand(v) for v in inputs]
        if not any(isinstance(o, torch.Tensor) for o in operands):
            operands[0] = _tensor(inputs[0])  # type: ignore[arg-type]
        return [torch_function(*operands)]
    return run


def _divide(a: Any, b: Any) -> Any:
    integer = (a.dtype.is_floating_point is False) if isinstance(a, torch.Tensor) else isinstance(a, int)
    return torch.div(a, b, rounding_mode="trunc") if integer else a / b


def _numpy_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.trunc(a / b).astype(a.dtype) if a.dtype.kind in "iu" else a / b


for _name, _numpy, _torch in (
        ("Add", np.add, lambda a, b: a + b), ("Sub", np.subtract, lambda a, b: a - b),
        ("Mul", np.multiply, lambda a, b: a * b), ("Div", _numpy_divide, _divide),
        ("Pow", np.power, torch.pow), ("Equal", np.equal, torch.eq), ("Less", np.less, torch.lt),
        ("Greater", np.greater, torch.gt), ("LessOrEqual", np.less_equal, torch.le),
        ("GreaterOrEqual", np.greater_equal, torch.ge), ("And", np.logical_and, torch.logical_and),
        ("Or", np.logical_or, torch.logical_or), ("Where", np.where, torch.where),
        ("Not", np.logical_not, torch.logical_not), ("Neg", np.negative, torch.neg), ("Abs", np.abs, torch.abs),
        ("Sqrt", np.sqrt, torch.sqrt), ("Exp", np.exp, torch.exp), ("Log", np.log, torch.log),
        ("Reciprocal", np.reciprocal, torch.reciprocal), ("IsNaN", np.isnan, torch.isnan),
        ("IsInf", np.isinf, torch.isinf), ("Floor", np.floor, torch.floor), ("Ceil", np.ceil, torch.ceil)):
    OPS[_name] = _elementwise(_numpy, _torch)


def _variadic(torch_function: Callable[..., Any], numpy_function: Callable[..., Any]) -> Op:
    def run(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
        result = inputs[0]
        for value in inputs[1:]:
            if _static(result, value):
                result = numpy_function(result, value)
            else:
                result = torch_function(_tensor(result), _tensor(value))  # type: ignore[arg-type]
        return [result]  # type: ignore[list-item]
    return run


OPS["Max"] = _variadic(torch.maximum, np.maximum)
OPS["Min"] = _variadic(torch.minimum, np.minimum)
OPS["Sum"] = _variadic(torch.add, np.add)


def _unary(function: Callable[..., torch.Tensor]) -> Op:
    return lambda inputs, attributes: [function(_tensor(inputs[0]), attributes)]  # type: ignore[arg-type]


OPS.update({
    "Relu": _unary(lambda x, a: torch.relu(x)),
    "Sigmoid": _unary(lambda x, a: torch.sigmoid(x)),
    "Tanh": _unary(lambda x, a: torch.tanh(x)),
    "Erf": _unary(lambda x, a: torch.erf(x)),
    "Softplus": _unary(lambda x, a: F.softplus(x)),
    "Gelu": _unary(lambda x, a: F.gelu(x, approximate=a.get("approximate", "none"))),
    "LeakyRelu": _unary(lambda x, a: F.leaky_relu(x, a.get("alpha", 0.01))),
    "Elu": _unary(lambda x, a: F.elu(x, a.get("alpha", 1.0))),
    "HardSigmoid": _unary(lambda x, a: torch.clamp(x * a.get("alpha", 0.2) + a.get("beta", 0.5), 0.0, 1.0)),
    "HardSwish": _unary(lambda x, a: F.hardswish(x)),
    "Softmax": _unary(lambda x, a: torch.softmax(x, a.get("axis", -1))),
    "LogSoftmax": _unary(lambda x, a: torch.log_softmax(x, a.get("axis", -1))),
    "Transpose": _unary(lambda x, a: x.permute(*a.get("perm", list(range(x.dim() - 1, -1, -1))))),
})


@_op("Identity")
def _identity(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [inputs[0]]  # type: ignore[list-item]


@_op("Cast")
def _cast(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    dtype = _TORCH_DTYPES[attributes["to"]]
    if _static(inputs[0]):
        return [_tensor(inputs[0]).to(dtype).numpy()]  # type: ignore[arg-type]
    return [_tensor(inputs[0]).to(dtype)]  # type: ignore[arg-type]


@_op("Clip")
def _clip(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attributes.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attributes.get("max")
    as_number = (lambda v: None if v is None else float(np.asarray(v)))
    return [torch.clamp(_tensor(inputs[0]), as_number(low), as_number(high))]  # type: ignore[arg-type]


@_op("MatMul")
def _matmul(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [torch.matmul(_tensor(inputs[0]), _tensor(inputs[1]))]  # type: ignore[arg-type]


@_op("Gemm")
def _gemm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    a, b = _tensor(inputs[0]), _tensor(inputs[1])  # type: ignore[arg-type]
    a = a.t() if attributes.get("transA", 0) else a
    b = b.t() if attributes.get("transB", 0) else b
    result = attributes.get("alpha", 1.0) * torch.matmul(a, b)
    if len(inputs) > 2 and inputs[2] is not None:
        result = result + attributes.get("beta", 1.0) * _tensor(inputs[2])
    return [result]


def _spatial_padding(x: torch.Tensor, attributes: Attributes, kernel: Sequence[int], strides: Sequence[int],
                     dilations: Sequence[int]) -> "tuple":
    """(x padded where ONNX pads are asymmetric or SAME_*, the symmetric padding left for the torch op)."""
    rank = len(kernel)
    auto_pad = attributes.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []  # type: List[int]
        ends = []  # type: List[int]
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            pads.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID":
        pads, ends = [0] * rank, [0] * rank
    else:
        given = list(attributes.get("pads", [0] * 2 * rank))
        pads, ends = given[:rank], given[rank:]
    if pads == ends:
        return x, pads
    flat = []  # type: List[int]
    for begin, end in reversed(list(zip(pads, ends))):
        flat += [begin, end]
    return F.pad(x, flat), [0] * rank


@_op("Conv")
def _conv(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, weight = _tensor(inputs[0]), _tensor(inputs[1])  # type: ignore[arg-type]
    bias = _tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    rank = weight.dim() - 2
    kernel = list(weight.shape[2:])
    strides = list(attributes.get("strides", [1] * rank))
    dilations = list(attributes.get("dilations", [1] * rank))
    x, padding = _spatial_padding(x, attributes, kernel, strides, dilations)
    function = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    return [function(x, weight, bias, strides, padding, dilations, attributes.get("group", 1))]


@_op("MaxPool", "AveragePool")
def _pool(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    kernel = list(attributes["kernel_shape"])
    rank = len(kernel)
    strides = list(attributes.get("strides", [1] * rank))
    dilations = list(attributes.get("dilations", [1] * rank))
    ceil = bool(attributes.get("ceil_mode", 0))
    padded, padding = _spatial_padding(x, attributes, kernel, strides, dilations)
    return [_pool_call(padded, attributes, kernel, strides, padding, dilations, ceil)]


def _pool_call(x: torch.Tensor, attributes: Attributes, kernel: List[int], strides: List[int], padding: List[int],
               dilations: List[int], ceil: bool) -> torch.Tensor:
    rank = len(kernel)
    if attributes["_op"] == "MaxPool":
        function = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]
        return function(x, kernel, strides, padding, dilations, ceil_mode=ceil)
    if any(d != 1 for d in dilations):
        raise CaptureError("ONNX AveragePool with dilations is not supported")
    function = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank]
    return function(x, kernel, strides, padding, ceil_mode=ceil,
                    count_include_pad=bool(attributes.get("count_include_pad", 0)))


@_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    axes = list(range(2, x.dim()))
    if attributes["_op"] == "GlobalMaxPool":
        return [torch.amax(x, dim=axes, keepdim=True)]
    return [torch.mean(x, dim=axes, keepdim=True)]


@_op("BatchNormalization")
def _batch_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, scale, bias, mean, var = (_tensor(v) for v in inputs[:5])  # type: ignore[arg-type]
    return [F.batch_norm(x, mean, var, scale, bias, False, 0.0, attributes.get("epsilon", 1e-5))]


@_op("LayerNormalization")
def _layer_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", -1) % x.dim()
    bias = _tensor(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    return [F.layer_norm(x, list(x.shape[axis:]), _tensor(inputs[1]), bias,  # type: ignore[arg-type]
                         attributes.get("epsilon", 1e-5))]


@_op("InstanceNormalization")
def _instance_norm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x, scale, bias = (_tensor(v) for v in inputs[:3])  # type: ignore[arg-type]
    return [F.instance_norm(x, weight=scale, bias=bias, eps=attributes.get("epsilon", 1e-5))]


@_op("Reshape")
def _reshape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data, shape = inputs[0], _ints(inputs[1])
    if not attributes.get("allowzero", 0):
        shape = [data.shape[i] if size == 0 else size for i, size in enumerate(shape)]  # type: ignore[union-attr]
    if _static(data):
        return [np.reshape(data, shape)]  # type: ignore[arg-type]
    return [_tensor(data).reshape(shape)]  # type: ignore[arg-type]


@_op("Flatten")
def _flatten(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", 1) % max(x.dim(), 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _axes(inputs: List[Optional[Value]], attributes: Attributes) -> List[int]:
    return _ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attributes.get("axes", []))


@_op("Unsqueeze")
def _unsqueeze(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    rank = value.ndim + len(_axes(inputs, attributes)) if _static(value) else value.dim() + len(  # type: ignore
        _axes(inputs, attributes))
    for axis in sorted(a % rank for a in _axes(inputs, attributes)):
        value = np.expand_dims(value, axis) if _static(value) else _tensor(value).unsqueeze(axis)  # type: ignore
    return [value]  # type: ignore[list-item]


@_op("Squeeze")
def _squeeze(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    shape = list(value.shape)  # type: ignore[union-attr]
    axes = [a % len(shape) for a in _axes(inputs, attributes)] or [i for i, s in enumerate(shape) if s == 1]
    kept = [s for i, s in enumerate(shape) if i not in axes]
    return [np.reshape(value, kept) if _static(value) else _tensor(value).reshape(kept)]  # type: ignore


@_op("Concat")
def _concat(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    axis = attributes["axis"]
    if _static(*inputs):
        return [np.concatenate(inputs, axis=axis)]  # type: ignore[arg-type]
    return [torch.cat([_tensor(v) for v in inputs], dim=axis)]  # type: ignore[arg-type]


@_op("Split")
def _split(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", 0)
    sizes = _ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attributes.get("split", []))
    if not sizes:
        parts = attributes["num_outputs"]
        size = -(-x.shape[axis] // parts)
        sizes = [min(size, x.shape[axis] - i * size) for i in range(parts)]
    return list(torch.split(x, sizes, dim=axis))


@_op("Slice")
def _slice(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    rank = len(value.shape)  # type: ignore[union-attr]
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * rank  # type: List[slice]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        size = value.shape[axis]  # type: ignore[union-attr]
        index[axis % rank] = slice(*slice(start, end, step).indices(size))
    if _static(value):
        return [np.asarray(value)[tuple(index)]]  # type: ignore[index]
    if any((s.step or 1) < 0 for s in index):
        raise CaptureError("ONNX Slice with a negative step is not supported yet")
    return [_tensor(value)[tuple(index)]]  # type: ignore[arg-type]


@_op("Gather")
def _gather(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data, indices = inputs[0], inputs[1]
    axis = attributes.get("axis", 0)
    if _static(data, indices):
        return [np.take(data, indices, axis=axis)]  # type: ignore[arg-type]
    tensor = _tensor(data)  # type: ignore[arg-type]
    # Indices computed at run time (token ids) are taken as given: index_select becomes an ONNX Gather again,
    # which reads negative ones from the end. A where() to normalize them trips onnxruntime 1.32's extended
    # graph optimizations ("Attempt to replace the existing tensor").
    index = _tensor(indices).long()  # type: ignore[arg-type]
    if axis == 0 and tensor.dim() == 2:
        return [F.embedding(index, tensor)]  # the graph a torch model's embedding gives (onnxruntime fuses it)
    picked = torch.index_select(tensor, axis, index.reshape(-1))
    shape = list(tensor.shape[:axis % tensor.dim()]) + list(index.shape) + list(tensor.shape[axis % tensor.dim() + 1:])
    return [picked.reshape(shape)]


@_op("GatherElements")
def _gather_elements(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data = _tensor(inputs[0])  # type: ignore[arg-type]
    index = _tensor(inputs[1]).long()  # type: ignore[arg-type]
    axis = attributes.get("axis", 0)
    return [torch.gather(data, axis, torch.where(index < 0, index + data.shape[axis], index))]


@_op("Expand")
def _expand(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value, shape = inputs[0], _ints(inputs[1])
    target = list(np.broadcast_shapes(tuple(value.shape), tuple(shape)))  # type: ignore[union-attr]
    if _static(value):
        return [np.broadcast_to(value, target).copy()]  # type: ignore[arg-type]
    return [_tensor(value).expand(target)]  # type: ignore[arg-type]


@_op("Tile")
def _tile(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [_tensor(inputs[0]).repeat(*_ints(inputs[1]))]  # type: ignore[arg-type]


@_op("Shape")
def _shape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    shape = list(inputs[0].shape)  # type: ignore[union-attr]
    start, end = attributes.get("start", 0), attributes.get("end", len(shape))
    return [np.asarray(shape[start:end], dtype=np.int64)]


@_op("Size")
def _size(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [np.asarray(int(np.prod(inputs[0].shape)), dtype=np.int64)]  # type: ignore[union-attr]


@_op("ConstantOfShape")
def _constant_of_shape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    fill = attributes.get("value", np.zeros(1, dtype=np.float32))
    return [np.full(_ints(inputs[0]), fill.reshape(-1)[0], dtype=fill.dtype)]


@_op("Range")
def _range(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    if not _static(*inputs):
        raise CaptureError("an ONNX Range depends on the model's input values; a fixed-shape capture needs it constant")
    start, limit, delta = (np.asarray(v) for v in inputs)
    return [np.arange(start, limit, delta, dtype=start.dtype)]


@_op("CumSum")
def _cumsum(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    axis = _ints(inputs[1])[0]
    if attributes.get("reverse", 0):
        x = x.flip(axis)
    result = torch.cumsum(x, axis).to(x.dtype)
    if attributes.get("exclusive", 0):
        result = result - x
    return [result.flip(axis) if attributes.get("reverse", 0) else result]


@_op("Pad")
def _pad(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    pads = _ints(inputs[1]) if len(inputs) > 1 else list(attributes.get("pads", []))
    rank = x.dim()
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(rank))
    begins, ends = [0] * rank, [0] * rank
    for position, axis in enumerate(axes):
        begins[axis % rank], ends[axis % rank] = pads[position], pads[position + len(axes)]
    flat = []  # type: List[int]
    for axis in reversed(range(rank)):
        flat += [begins[axis], ends[axis]]
    value = float(np.asarray(inputs[2])) if len(inputs) > 2 and inputs[2] is not None else 0.0
    mode = attributes.get("mode", "constant")
    if mode != "constant":
        flat = flat[:2 * (rank - 2)]
        return [F.pad(x, flat, mode={"reflect": "reflect", "edge": "replicate"}[mode])]
    return [F.pad(x, flat, value=value)]


@_op("Resize")
def _resize(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    sizes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else []
    scales = [float(s) for s in np.asarray(inputs[2]).reshape(-1)] if len(inputs) > 2 and inputs[2] is not None \
        and np.asarray(inputs[2]).size else []
    target = sizes[2:] if sizes else [int(math.floor(n * s)) for n, s in zip(x.shape[2:], scales[2:])]
    mode = attributes.get("mode", "nearest")
    transform = attributes.get("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest" and transform == "asymmetric" and attributes.get("nearest_mode", "round_prefer_floor") \
            == "floor":
        return [F.interpolate(x, size=target, mode="nearest")]
    if mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        kind = {3: "linear", 4: "bilinear", 5: "trilinear"}[x.dim()]
        return [F.interpolate(x, size=target, mode=kind, align_corners=transform == "align_corners")]
    if mode == "cubic" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners") and x.dim() == 4:
        return [F.interpolate(x, size=target, mode="bicubic", align_corners=transform == "align_corners")]
    raise CaptureError("ONNX Resize with mode {} and coordinate_transformation_mode {} is not supported yet".format(
        mode, transform))


def _reduce(torch_function: Callable[..., torch.Tensor]) -> Op:
    def run(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
        x = _tensor(inputs[0])  # type: ignore[arg-type]
        axes = _axes(inputs, attributes)
        if not axes:
            if attributes.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.dim()))
        return [torch_function(x, axes, bool(attributes.get("keepdims", 1)))]
    return run


OPS.update({
    "ReduceMean": _reduce(lambda x, axes, keep: torch.mean(x, dim=axes, keepdim=keep)),
    "ReduceSum": _reduce(lambda x, axes, keep: torch.sum(x, dim=axes, keepdim=keep)),
    "ReduceMax": _reduce(lambda x, axes, keep: torch.amax(x, dim=axes, keepdim=keep)),
    "ReduceMin": _reduce(lambda x, axes, keep: torch.amin(x, dim=axes, keepdim=keep)),
    "ReduceProd": _reduce(lambda x, axes, keep: _product(x, axes, keep)),
    "ReduceL2": _reduce(lambda x, axes, keep: torch.sqrt(torch.sum(x * x, dim=axes, keepdim=keep))),
})


def _product(x: torch.Tensor, axes: List[int], keep: bool) -> torch.Tensor:
    for axis in sorted((a % x.dim() for a in axes), reverse=True):
        x = torch.prod(x, dim=axis, keepdim=keep)
    return x


@_op("ArgMax", "ArgMin")
def _arg_extreme(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = _tensor(inputs[0])  # type: ignore[arg-type]
    function = torch.argmax if attributes["_op"] == "ArgMax" else torch.argmin
    return [function(x, dim=attributes.get("axis", 0), keepdim=bool(attributes.get("keepdims", 1)))]
