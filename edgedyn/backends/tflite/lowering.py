"""Walks a core-ATen ExportedProgram once, in order, and builds the TFLite subgraph through the op converters."""
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch
from torch import fx

from edgedyn.backends.tflite import layout
from edgedyn.backends.tflite.diagnostics import Unsupported, op_name, unsupported_error
from edgedyn.backends.tflite.layout import Perm
from edgedyn.backends.tflite.writer import FP16_INFERENCE, REDUCED_PRECISION_KEY, ModelWriter, Quant
from edgedyn.frontend.nms import NMS_OP

# Ops with several outputs return tuples; fx reads them with operator.getitem.
_GETITEM = "getitem"


class Value:
    """One tensor of the graph: torch shape, stored layout, and its TFLite tensor or constant data."""

    def __init__(self, shape: Sequence[int], dtype: Any, perm: Perm, tensor: Optional[int] = None,
                 data: Optional[np.ndarray] = None, quant: Optional[Quant] = None, flip: Sequence[int] = ()) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.perm = tuple(perm)
        self.flip = flipped(self.shape, flip)  # torch dims stored back to front (mirrored coordinates, mirror.py)
        self.tensor = tensor
        self.data = data  # in torch layout; set for parameters and folded constants
        self.quant = quant  # set for int8 tensors computed at run time (static quantization)
        self.relayouts = {}  # type: Dict[Tuple[Perm, FrozenSet[int]], int]
        self.twin = None  # type: Optional[Value]  # the float copy of an int8 value, or the int8 copy of a float one

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_constant(self) -> bool:
        return self.data is not None


def flipped(shape: Sequence[int], dims: Sequence[int]) -> FrozenSet[int]:
    """The dims of `dims` that reversing changes: a dim of size 1 reads the same either way."""
    return frozenset(d for d in dims if shape[d] > 1)


def mirrors(converter: Any) -> Any:
    """Marks a converter that takes and returns tensors in mirrored coordinates (Value.flip) and says so in its
    outputs; every other converter gets its inputs in torch's order of rows and columns (`_convert`)."""
    converter.mirrors = True
    return converter


def constant(array: Any) -> Value:
    array = np.asarray(array)
    return Value(array.shape, array.dtype, layout.identity(array.ndim), data=array)


class Lowering:
    """What converters build with: tensors in the layout they need, and operators producing new Values."""

    def __init__(self, quantize: Optional[str] = None, ranges: Optional[Dict[str, Tuple[float, float]]] = None,
                 int8_converters: Optional[Dict[Any, Any]] = None, fp16: bool = False) -> None:
        self.writer = ModelWriter()
        self.fp16 = fp16  # the model is marked for XNNPACK's fp16 inference (backends/tflite): ops/padding.py
        self.quantize = quantize  # None, "int8" (static) or "int8-weights" (hybrid kernels)
        self.ranges = ranges or {}  # node name -> calibrated (min, max), for "int8"
        self.int8_converters = int8_converters or {}  # ATen op -> converter on int8 inputs (ops/int8.py)
        self.fused = {}  # type: Dict[fx.Node, Any]  # activation node -> the Value of the op it was fused into
        self.same = set()  # type: Set[fx.Node]  # convolutions whose input PAD is their SAME padding (ops/pad.py)
        self.mirror = False  # convolutions and pooling compute in mirrored coordinates (mirror.py)
        self.reverse_at_once = False  # one REVERSE_V2 over every axis it reverses (LiteRT; not tflite-runtime)
        self.inputs = []  # type: List[int]  # the graph's input and output tensors, once lowered
        self.outputs = []  # type: List[int]

    def tensor(self, value: Value, perm: Optional[Perm] = None, flip: Sequence[int] = ()) -> int:
        """`value`'s TFLite tensor stored in layout `perm` (its own layout when None) with torch dims `flip` stored
        back to front (none by default: torch's order), relayouting once: a REVERSE_V2 in the layout it has, then a
        TRANSPOSE."""
        perm = value.perm if perm is None else tuple(perm)
        flip = flipped(value.shape, flip)
        if value.is_constant:
            data = np.flip(value.data, tuple(flip)) if flip else value.data
            return self.writer.constant(np.transpose(data, perm) if value.rank else data)
        if perm == value.perm and flip == value.flip:
            return value.tensor
        key = (perm, flip)
        if key not in value.relayouts:
            source = value.tensor
            axes = sorted(value.perm.index(d) for d in flip ^ value.flip)
            # tflite-runtime (Python < 3.10 boards) given several axes reverses only the first: one each there
            for group in [axes] if self.reverse_at_once and axes else [[axis] for axis in axes]:
                reversed_ = self.writer.tensor("mirrored", layout.stored_shape(value.shape, value.perm), value.dtype,
                                               value.quant)
                self.writer.operator("REVERSE_V2", [source, self.ints(group)], [reversed_])
                source = reversed_
            out = source
            if perm != value.perm:
                out = self.writer.tensor("relayout", layout.stored_shape(value.shape, perm), value.dtype, value.quant)
                if layout.same_memory_order(value.shape, value.perm, perm):
                    self.reshape_into(source, out)
                else:
                    self.writer.operator("TRANSPOSE", [source, self.ints(layout.transpose_perm(value.perm, perm))],
                                         [out], "TransposeOptions")
            value.relayouts[key] = out
        return value.relayouts[key]

    def unflipped(self, value: Value) -> Value:
        """`value` in torch's order of rows and columns, for converters that do not mirror."""
        if not value.flip or value.is_constant:
            return value
        return Value(value.shape, value.dtype, value.perm, tensor=self.tensor(value), quant=value.quant)

    def torch_order(self, value: Value) -> int:
        """A tensor with `value`'s elements in torch's memory order, for ops that reinterpret the shape."""
        torch_layout = layout.identity(value.rank)
        if not value.is_constant and not value.flip and layout.same_memory_order(value.shape, value.perm,
                                                                                    torch_layout):
            return value.tensor
        return self.tensor(value, torch_layout)

    def lift(self, value: Value, rank: int) -> Value:
        """`value` with leading size-1 dims up to `rank`, as numpy broadcasting would align it."""
        if value.rank >= rank:
            return value
        shape = (1,) * (rank - value.rank) + value.shape
        if value.is_constant:
            return constant(value.data.reshape(shape))
        return self.reshape(value, shape)

    def reshape(self, value: Value, shape: Sequence[int]) -> Value:
        out = self.new(shape, value.dtype, quant=value.quant)
        self.reshape_into(self.torch_order(value), out.tensor)
        return out

    def reshape_into(self, source: int, out: int) -> None:
        self.writer.operator("RESHAPE", [source, self.ints(self.writer.shape(out))], [out])

    def ints(self, values: Sequence[int]) -> int:
        return self.writer.constant(np.asarray(values, dtype=np.int32).reshape(-1))

    def scalar(self, number: float, dtype: Any = np.float32) -> int:
        return self.writer.constant(np.asarray(number, dtype=dtype))

    def new(self, shape: Sequence[int], dtype: Any = np.float32, perm: Optional[Perm] = None,
            name: str = "t", quant: Optional[Quant] = None, flip: Sequence[int] = ()) -> Value:
        """A fresh non-constant Value stored in `perm` (torch layout when None), torch dims `flip` back to front."""
        perm = layout.identity(len(shape)) if perm is None else tuple(perm)
        tensor = self.writer.tensor(name, layout.stored_shape(shape, perm), dtype, quant)
        return Value(shape, dtype, perm, tensor=tensor, quant=quant, flip=flip)

    def emit(self, op: str, inputs: Sequence[int], shape: Sequence[int], perm: Optional[Perm] = None,
             options: Optional[str] = None, dtype: Any = np.float32, quant: Optional[Quant] = None,
             flip: Sequence[int] = (), **fields: Any) -> Value:
        """Appends one operator with one output of torch shape `shape` stored in `perm` (and `flip`); returns it."""
        out = self.new(shape, dtype, perm, name=op.lower(), quant=quant, flip=flip)
        self.writer.operator(op, inputs, [out.tensor], options, **fields)
        return out

    def unary(self, op: str, value: Value, options: Optional[str] = None, **fields: Any) -> Value:
        """A layout-agnostic one-input op: the output keeps the input's layout, mirrored or not."""
        return self.emit(op, [self.tensor(value, value.perm, value.flip)], value.shape, value.perm, options,
                         value.dtype, flip=value.flip, **fields)


    def dequantized(self, value: Value) -> Value:
        """The float copy of an int8 value (one DEQUANTIZE, shared by every float consumer)."""
        if value.quant is None:
            return value
        if value.twin is None:
            self.writer.require_version("DEQUANTIZE", 2)
            value.twin = self.emit("DEQUANTIZE", [value.tensor], value.shape, value.perm)
        return value.twin

    def quantized(self, value: Value, node: fx.Node) -> Value:
        """The int8 copy of a float value, scaled by `node`'s calibrated range (one QUANTIZE, shared)."""
        from edgedyn.quantize.ranges import qparams

        if value.quant is not None:
            return value
        if value.twin is None:
            if node.name not in self.ranges:
                raise Unsupported("no calibrated range for {} (int8 input)".format(node.name))
            scale, zero_point = qparams(*self.ranges[node.name])
            self.writer.require_version("QUANTIZE", 2)
            value.twin = self.emit("QUANTIZE", [self.tensor(value)], value.shape, value.perm, dtype=np.int8,
                                   quant=Quant(scale, zero_point))
            value.twin.twin = value
        return value.twin


Converter = Callable[..., Any]
# Note: with --quantize int8 these converters take int8 Values (and return them), and so do those of
# `int8_converters` (ops/int8.py: add, pooling, mean, cat, pad, reshapes, activations) when an input is int8 and
# they cover the case; every other converter gets the float copy (Lowering.dequantized), so DEQUANTIZE/QUANTIZE
# appear only where an op without an int8 kernel sits between int8 ones (edgedyn/backends/tflite/ops/quantized.py).
QUANTIZED_CONVERTERS = ("convolution", "linear", "addmm", "mm")


def lower_program(program: "torch.export.ExportedProgram", converters: Dict[Any, Converter],
                  alternatives: List[str], quantize: Optional[str] = None,
                  ranges: Optional[Dict[str, Tuple[float, float]]] = None,
                  int8_converters: Optional[Dict[Any, Converter]] = None,
                  metadata: Optional[Dict[str, bytes]] = None,
                  mirror: Optional[bool] = None, reverse_at_once: bool = False) -> Tuple[bytes, Dict[str, Any]]:
    """The .tflite bytes for `program`, with its inputs and outputs in torch layout, and facts for the manifest;
    `metadata` marked for XNNPACK's fp16 inference (writer.py) makes the converters write for it, and in mirrored
    coordinates where that copies less (mirror.py; `mirror` True or False decides instead), reversing rows and
    columns in one REVERSE_V2 with `reverse_at_once` (a board whose LiteRT reverses several axes at once)."""
    from edgedyn.backends.tflite.mirror import mirror_pays, reverses_axes_at_once
    from edgedyn.runtime.executors.litert import REVERSES_AT_ONCE

    if mirror and quantize:
        raise ValueError("mirrored coordinates are for float files")
    fp16 = (metadata or {}).get(REDUCED_PRECISION_KEY) == FP16_INFERENCE
    parameters = _parameters(program)
    _check_supported(program.graph_module.graph, parameters, converters, alternatives)

    def lowered(mirrored: bool) -> Lowering:
        ctx = Lowering(quantize, ranges, int8_converters if quantize == "int8" else None, fp16)
        ctx.mirror, ctx.reverse_at_once = mirrored, reverse_at_once
        return _lowered(program, parameters, converters, alternatives, ctx)

    ctx = lowered(False) if not mirror else None
    if mirror or (mirror is None and fp16 and not quantize):
        mirrored = lowered(True)
        if ctx is None or mirror_pays(ctx, mirrored):
            ctx = mirrored
    model = ctx.writer.finish(ctx.inputs, ctx.outputs, "edgedyn {}".format(
        program.graph_module.__class__.__name__), metadata)
    ops = sorted({op.op for op in ctx.writer.operators})
    facts = {"tflite_ops": ops, "tflite_operators": len(ctx.writer.operators)}  # type: Dict[str, Any]
    if ctx.mirror:
        facts["tflite_mirrored"] = True
    if reverses_axes_at_once(ctx):
        facts[REVERSES_AT_ONCE] = True
    if quantize:
        facts["weight_bytes"] = sum(len(b) for b in ctx.writer.buffers)
    return model, facts


def _lowered(program: Any, parameters: Dict[str, np.ndarray], converters: Dict[Any, Converter],
             alternatives: List[str], ctx: Lowering) -> Lowering:
    """`ctx` with the program's operators written, its graph inputs and outputs in `ctx.inputs`, `ctx.outputs`."""
    values = {}  # type: Dict[fx.Node, Any]
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder":
            if node.name in parameters:
                values[node] = constant(parameters[node.name])
            else:
                val = node.meta["val"]
                values[node] = ctx.new(val.shape, _dtype(val.dtype), name=node.name)
                ctx.inputs.append(values[node].tensor)
        elif node.op == "call_function":
            try:
                values[node] = _convert(ctx, node, values, converters)
            except Unsupported as error:
                raise unsupported_error(node, str(error), [], alternatives)
        elif node.op == "output":
            ctx.outputs = [_output(ctx, values[item], ctx.inputs) for item in node.args[0]]
    return ctx


def _parameters(program: Any) -> Dict[str, np.ndarray]:
    """Placeholder name -> numpy data, for parameters, buffers and lifted constants."""
    signature = program.graph_signature
    sources = dict(signature.inputs_to_parameters)
    sources.update(signature.inputs_to_buffers)
    sources.update(signature.inputs_to_lifted_tensor_constants)
    tensors = dict(program.state_dict)
    tensors.update(program.constants)
    return {name: tensors[key].detach().cpu().numpy() for name, key in sources.items()}


def _check_supported(graph: fx.Graph, parameters: Dict[str, Any], converters: Dict[Any, Converter],
                     alternatives: List[str]) -> None:
    """Fails before building anything when an op has no converter, naming every such op of the graph."""
    constant_nodes = set()
    missing = []  # type: List[fx.Node]
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in parameters:
            constant_nodes.add(node)
        elif node.op == "placeholder":
            _check_dtype(node, alternatives)
        if node.op != "call_function":
            continue
        if all(arg in constant_nodes for arg in node.all_input_nodes) and _foldable(node):
            constant_nodes.add(node)  # computed here, at export time
        elif node.target.__name__ == _GETITEM:
            continue  # the converter of its source says which outputs it has
        elif node.target not in converters:
            missing.append(node)
        else:
            _check_dtype(node, alternatives)
    if missing:
        others = sorted({op_name(n) for n in missing[1:]} - {op_name(missing[0])})
        raise unsupported_error(missing[0], "no TFLite converter for this op", others, alternatives)


# What tensors computed at run time may hold: float32 data and bool masks (comparisons, where, any)...
_RUNTIME_DTYPES = (torch.float32, torch.bool)
# ...and integer ids, where only ops that TFLite runs on integers touch them: lookups, the position-id
# arithmetic of RoBERTa (compare, cast, cumsum, add, mul) and reshapes. No integer matmul, division or activation.
_INDEX_DTYPES = (torch.int64, torch.int32)
_aten = torch.ops.aten
_INTEGER_OPS = frozenset([
    _aten.embedding.default, _aten.gather.default, _aten.cumsum.default, _aten._to_copy.default,
    _aten.add.Tensor, _aten.add.Scalar, _aten.sub.Tensor, _aten.mul.Tensor, _aten.mul.Scalar,
    _aten.eq.Scalar, _aten.eq.Tensor, _aten.ne.Scalar, _aten.ne.Tensor, _aten.lt.Scalar, _aten.le.Scalar,
    _aten.gt.Scalar, _aten.ge.Scalar, _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default,
    _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.flatten.using_ints,
    _aten.expand.default, _aten.slice.Tensor, _aten.select.int, _aten.clone.default,
    _aten._assert_tensor_metadata.default,  # a dtype check torch.export leaves beside an input (an int64 mask)
    # transformers' audio models turn the sample mask into a frame mask: lengths // stride, a one-hot where, a
    # reversed cumsum (passes/indexing.py rewrites its index_put into where)
    _aten.div.Tensor_mode, _aten.where.self, _aten.flip.default, _aten.lt.Tensor, _aten.gt.Tensor,
    # detection post-processing (ops/detection.py): kept indices, their count, best-class labels
    NMS_OP, _aten.max.dim, _aten.index_select.default, _aten.cat.default, _aten.topk.default,
])


def _check_dtype(node: fx.Node, alternatives: List[str]) -> None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype in _RUNTIME_DTYPES:
        return
    if val.dtype in _INDEX_DTYPES and _integer_ok(node):
        return
    raise unsupported_error(node, "it has {} tensors at run time; the TFLite writer handles float32 data, bool "
                                  "masks and integer ids (lookups, compares, casts, cumsum, add, mul)".format(
                                      str(val.dtype).replace("torch.", "")), [], alternatives)


def _integer_ok(node: fx.Node) -> bool:
    """An integer tensor made by an op TFLite runs on integers (a placeholder: used only by such ops)."""
    if node.op == "placeholder":
        return bool(node.users) and all(user.target in _INTEGER_OPS for user in node.users)
    return node.target in _INTEGER_OPS


def _foldable(node: fx.Node) -> bool:
    return not getattr(node.target, "_nondeterministic_seeded", False) and "rand" not in op_name(node)


def _convert(ctx: Lowering, node: fx.Node, values: Dict[fx.Node, Any], converters: Dict[Any, Converter]) -> Any:
    args = fx.node.map_arg(node.args, lambda n: values[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: values[n])
    if node.target.__name__ == _GETITEM:
        source, index = args
        if source[index] is None:
            raise Unsupported("output {} of {} is not supported, only output 0".format(
                index, op_name(node.args[0])))
        return source[index]
    if node in ctx.fused:
        return ctx.fused[node]
    inputs = [values[n] for n in node.all_input_nodes]
    if all(isinstance(v, Value) and v.is_constant for v in inputs) and _foldable(node):
        return _fold(node, args, kwargs)
    converter = converters[node.target]
    if not getattr(converter, "mirrors", False):
        in_order = lambda v: ctx.unflipped(v) if isinstance(v, Value) else v  # noqa: E731
        args, kwargs = fx.node.map_aggregate(args, in_order), fx.node.map_aggregate(kwargs, in_order)
    if ctx.quantize == "int8" and converter.__name__ not in QUANTIZED_CONVERTERS:
        int8 = ctx.int8_converters.get(node.target)
        out = int8(ctx, node, *args, **kwargs) if int8 is not None else None
        if out is not None:
            return out
        to_float = lambda v: ctx.dequantized(v) if isinstance(v, Value) else v  # noqa: E731
        args, kwargs = fx.node.map_aggregate(args, to_float), fx.node.map_aggregate(kwargs, to_float)
    return converter(ctx, node, *args, **kwargs)


def _fold(node: fx.Node, args: Any, kwargs: Any) -> Any:
    """Runs an op whose inputs are all constants with torch, once, at export time."""
    to_torch = lambda v: torch.from_numpy(np.array(v.data)) if isinstance(v, Value) else v  # noqa: E731
    result = node.target(*fx.node.map_aggregate(args, to_torch), **fx.node.map_aggregate(kwargs, to_torch))
    if isinstance(result, (tuple, list)):
        return tuple(constant(r.numpy()) if isinstance(r, torch.Tensor) else r for r in result)
    return constant(result.numpy()) if isinstance(result, torch.Tensor) else result  # checks return None


def _output(ctx: Lowering, value: Value, inputs: List[int]) -> int:
    """The tensor a graph output is read from, always in torch layout (the bundle's interface is torch's)."""
    value = ctx.dequantized(value)
    tensor = ctx.tensor(value, layout.identity(value.rank))
    if value.is_constant or tensor in inputs:
        # TFLite outputs must be computed tensors: copy inputs and constants through a RESHAPE.
        return ctx.reshape(Value(value.shape, value.dtype, layout.identity(value.rank), tensor=tensor),
                           value.shape).tensor
    return tensor


def _dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(str(dtype).replace("torch.", ""))
