"""ONNX operators as torch calls, for `onnx_import.OnnxModule`: OPS maps an op type to f(inputs, attributes).

A value is a torch tensor (it depends on the graph's inputs) or a numpy array (computed from shapes and
constants only). Shape-like operators keep numpy values numpy, so sizes stay Python numbers in the capture.
Layer operators (conv, pooling, norms, resize, ...) are in onnx_layers.py, which adds them to OPS when
onnx_import imports it. Each function returns the list of its outputs; `attributes["_op"]` is the op type, for
functions serving two. Semantics follow the ONNX operator specification (opset 13+).
"""
from typing import Any, Callable, Dict, List, Optional, Union

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


def op(*names: str) -> Callable[[Op], Op]:
    def register(function: Op) -> Op:
        for name in names:
            OPS[name] = function
        return function
    return register


def static(*values: Optional[Value]) -> bool:
    return all(v is None or isinstance(v, np.ndarray) for v in values)


def as_tensor(value: Value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, StaticArray) and value.buffer is not None:
        return value.buffer
    return torch.from_numpy(np.array(value))


def _operand(value: Value) -> Any:
    """A tensor, or a Python number for a one-element constant (so torch does not see a constant tensor)."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.ndim == 0:
        return value.item()
    return as_tensor(value)


def ints(value: Optional[Value]) -> List[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        raise CaptureError("an ONNX shape or axes input depends on the model's input values; a capture at fixed "
                           "shapes needs it constant")
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _elementwise(numpy_function: Callable[..., Any], torch_function: Callable[..., Any]) -> Op:
    def run(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
        if static(*inputs):
            return [np.asarray(numpy_function(*inputs))]
        operands = [_operand(v) for v in inputs]
        if not any(isinstance(o, torch.Tensor) for o in operands):
            operands[0] = as_tensor(inputs[0])  # type: ignore[arg-type]
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
            if static(result, value):
                result = numpy_function(result, value)
            else:
                result = torch_function(as_tensor(result), as_tensor(value))  # type: ignore[arg-type]
        return [result]  # type: ignore[list-item]
    return run


OPS["Max"] = _variadic(torch.maximum, np.maximum)
OPS["Min"] = _variadic(torch.minimum, np.minimum)
OPS["Sum"] = _variadic(torch.add, np.add)


def _unary(function: Callable[..., torch.Tensor]) -> Op:
    return lambda inputs, attributes: [function(as_tensor(inputs[0]), attributes)]  # type: ignore[arg-type]


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


@op("Identity")
def _identity(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [inputs[0]]  # type: ignore[list-item]


@op("Cast")
def _cast(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    dtype = _TORCH_DTYPES[attributes["to"]]
    if static(inputs[0]):
        return [as_tensor(inputs[0]).to(dtype).numpy()]  # type: ignore[arg-type]
    return [as_tensor(inputs[0]).to(dtype)]  # type: ignore[arg-type]


@op("Clip")
def _clip(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attributes.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attributes.get("max")
    as_number = (lambda v: None if v is None else float(np.asarray(v)))
    return [torch.clamp(as_tensor(inputs[0]), as_number(low), as_number(high))]  # type: ignore[arg-type]


@op("MatMul")
def _matmul(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [torch.matmul(as_tensor(inputs[0]), as_tensor(inputs[1]))]  # type: ignore[arg-type]


@op("Gemm")
def _gemm(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    a, b = as_tensor(inputs[0]), as_tensor(inputs[1])  # type: ignore[arg-type]
    a = a.t() if attributes.get("transA", 0) else a
    b = b.t() if attributes.get("transB", 0) else b
    result = attributes.get("alpha", 1.0) * torch.matmul(a, b)
    if len(inputs) > 2 and inputs[2] is not None:
        result = result + attributes.get("beta", 1.0) * as_tensor(inputs[2])
    return [result]


@op("Reshape")
def _reshape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data, shape = inputs[0], ints(inputs[1])
    if not attributes.get("allowzero", 0):
        shape = [data.shape[i] if size == 0 else size for i, size in enumerate(shape)]  # type: ignore[union-attr]
    if static(data):
        return [np.reshape(data, shape)]  # type: ignore[arg-type]
    return [as_tensor(data).reshape(shape)]  # type: ignore[arg-type]


@op("Flatten")
def _flatten(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", 1) % max(x.dim(), 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def axes_input(inputs: List[Optional[Value]], attributes: Attributes) -> List[int]:
    return ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attributes.get("axes", []))


@op("Unsqueeze")
def _unsqueeze(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    rank = value.ndim + len(axes_input(inputs, attributes)) if static(value) else value.dim() + len(  # type: ignore
        axes_input(inputs, attributes))
    for axis in sorted(a % rank for a in axes_input(inputs, attributes)):
        value = np.expand_dims(value, axis) if static(value) else as_tensor(value).unsqueeze(axis)  # type: ignore
    return [value]  # type: ignore[list-item]


@op("Squeeze")
def _squeeze(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    shape = list(value.shape)  # type: ignore[union-attr]
    axes = [a % len(shape) for a in axes_input(inputs, attributes)] or [i for i, s in enumerate(shape) if s == 1]
    kept = [s for i, s in enumerate(shape) if i not in axes]
    return [np.reshape(value, kept) if static(value) else as_tensor(value).reshape(kept)]  # type: ignore


@op("Concat")
def _concat(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    axis = attributes["axis"]
    if static(*inputs):
        return [np.concatenate(inputs, axis=axis)]  # type: ignore[arg-type]
    return [torch.cat([as_tensor(v) for v in inputs], dim=axis)]  # type: ignore[arg-type]


@op("Split")
def _split(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    axis = attributes.get("axis", 0)
    sizes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attributes.get("split", []))
    if not sizes:
        parts = attributes["num_outputs"]
        size = -(-x.shape[axis] // parts)
        sizes = [min(size, x.shape[axis] - i * size) for i in range(parts)]
    return list(torch.split(x, sizes, dim=axis))


@op("Slice")
def _slice(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value = inputs[0]
    starts, ends = ints(inputs[1]), ints(inputs[2])
    rank = len(value.shape)  # type: ignore[union-attr]
    axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * rank  # type: List[slice]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        size = value.shape[axis]  # type: ignore[union-attr]
        index[axis % rank] = slice(*slice(start, end, step).indices(size))
    if static(value):
        return [np.asarray(value)[tuple(index)]]  # type: ignore[index]
    if any((s.step or 1) < 0 for s in index):
        raise CaptureError("ONNX Slice with a negative step is not supported yet")
    return [as_tensor(value)[tuple(index)]]  # type: ignore[arg-type]


@op("Gather")
def _gather(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data, indices = inputs[0], inputs[1]
    axis = attributes.get("axis", 0)
    if static(data, indices):
        return [np.take(data, indices, axis=axis)]  # type: ignore[arg-type]
    tensor = as_tensor(data)  # type: ignore[arg-type]
    # Indices computed at run time (token ids) are taken as given: index_select becomes an ONNX Gather again,
    # which reads negative ones from the end. A where() to normalize them trips onnxruntime 1.32's extended
    # graph optimizations ("Attempt to replace the existing tensor").
    index = as_tensor(indices).long()  # type: ignore[arg-type]
    if axis == 0 and tensor.dim() == 2:
        return [F.embedding(index, tensor)]  # the graph a torch model's embedding gives (onnxruntime fuses it)
    picked = torch.index_select(tensor, axis, index.reshape(-1))
    shape = list(tensor.shape[:axis % tensor.dim()]) + list(index.shape) + list(tensor.shape[axis % tensor.dim() + 1:])
    return [picked.reshape(shape)]


@op("GatherElements")
def _gather_elements(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    data = as_tensor(inputs[0])  # type: ignore[arg-type]
    index = as_tensor(inputs[1]).long()  # type: ignore[arg-type]
    axis = attributes.get("axis", 0)
    return [torch.gather(data, axis, torch.where(index < 0, index + data.shape[axis], index))]


@op("Expand")
def _expand(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    value, shape = inputs[0], ints(inputs[1])
    target = list(np.broadcast_shapes(tuple(value.shape), tuple(shape)))  # type: ignore[union-attr]
    if static(value):
        return [np.broadcast_to(value, target).copy()]  # type: ignore[arg-type]
    return [as_tensor(value).expand(target)]  # type: ignore[arg-type]


@op("Tile")
def _tile(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [as_tensor(inputs[0]).repeat(*ints(inputs[1]))]  # type: ignore[arg-type]


@op("Shape")
def _shape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    shape = list(inputs[0].shape)  # type: ignore[union-attr]
    start, end = attributes.get("start", 0), attributes.get("end", len(shape))
    return [np.asarray(shape[start:end], dtype=np.int64)]


@op("Size")
def _size(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    return [np.asarray(int(np.prod(inputs[0].shape)), dtype=np.int64)]  # type: ignore[union-attr]


@op("ConstantOfShape")
def _constant_of_shape(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    fill = attributes.get("value", np.zeros(1, dtype=np.float32))
    return [np.full(ints(inputs[0]), fill.reshape(-1)[0], dtype=fill.dtype)]


@op("Range")
def _range(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    if not static(*inputs):
        raise CaptureError("an ONNX Range depends on the model's input values; a fixed-shape capture needs it constant")
    start, limit, delta = (np.asarray(v) for v in inputs)
    return [np.arange(start, limit, delta, dtype=start.dtype)]


@op("CumSum")
def _cumsum(inputs: List[Optional[Value]], attributes: Attributes) -> List[Value]:
    x = as_tensor(inputs[0])  # type: ignore[arg-type]
    axis = ints(inputs[1])[0]
    if attributes.get("reverse", 0):
        x = x.flip(axis)
    result = torch.cumsum(x, axis).to(x.dtype)
    if attributes.get("exclusive", 0):
        result = result - x
    return [result.flip(axis) if attributes.get("reverse", 0) else result]

