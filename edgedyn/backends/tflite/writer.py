"""Serializes a TFLite model (schema v3) with the `tflite` package's flatbuffer builders: no TensorFlow needed."""
import importlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.errors import MissingDependencyError

# numpy dtype -> TFLite TensorType value (tflite/TensorType.py)
TENSOR_TYPES = {np.dtype("float32"): 0, np.dtype("int32"): 2, np.dtype("uint8"): 3, np.dtype("int64"): 4,
                np.dtype("bool"): 6, np.dtype("int8"): 9}
SCHEMA_VERSION = 3

# Note: an fp16 artifact is the fp32 model marked with LiteRT's `reduced_precision_support` metadata: XNNPACK then
# computes every operator in IEEE fp16 (fp16 accumulation, as TensorFlow's converter marks a model converted with
# float16 accumulation) on CPUs with ARMv8.2 fp16 arithmetic, and in fp32 elsewhere (LiteRT's XNNPACK README,
# "Floating-Point (IEEE FP16) Operators"). Weights stay fp32 in the file: XNNPACK converts them once at load.
REDUCED_PRECISION_KEY = "reduced_precision_support"
FP16_INFERENCE = b"fp16accfp16"

# Builtin codes above 127 live in OperatorCode.builtin_code; the old int8 field then holds this placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127
# Operator versions LiteRT registers from 1, except these (the kernel registry starts them higher).
_MIN_VERSIONS = {"BROADCAST_TO": 2}
# XNNPACK reads weights in place when buffers are aligned; 16 bytes covers every SIMD load it does.
_BUFFER_ALIGNMENT = 16


def schema(name: str) -> Any:
    """A module of the generated schema, e.g. schema("Conv2DOptions").

    `tflite/__init__.py` star-imports every module, so `import tflite.Model` gives the class, not the module.
    """
    try:
        return importlib.import_module("tflite." + name)
    except ImportError as error:
        raise MissingDependencyError("the TFLite backend writes models with the `tflite` and `flatbuffers` "
                                     "packages ({})".format(error), hint="pip install 'edgedyn[export]'")


def builtin_code(op: str) -> int:
    return getattr(schema("BuiltinOperator").BuiltinOperator, op)


class Quant:
    """A tensor's quantization: real = scale * (q - zero_point), one scale per slice along `dimension` (or one)."""

    def __init__(self, scale: Any, zero_point: Any = 0, dimension: int = 0) -> None:
        self.scale = np.atleast_1d(np.asarray(scale, dtype=np.float32))
        self.zero_point = np.broadcast_to(np.atleast_1d(np.asarray(zero_point, dtype=np.int64)),
                                          self.scale.shape).copy()
        self.dimension = int(dimension)

    def key(self) -> Tuple[bytes, bytes, int]:
        return self.scale.tobytes(), self.zero_point.tobytes(), self.dimension


class Operator:
    def __init__(self, op: str, inputs: Sequence[int], outputs: Sequence[int],
                 options: Optional[Tuple[str, Dict[str, Any]]]) -> None:
        self.op, self.inputs, self.outputs, self.options = op, list(inputs), list(outputs), options


class ModelWriter:
    """Collects tensors, constant buffers and operators of one subgraph, then writes the flatbuffer."""

    def __init__(self) -> None:
        self.tensors = []  # type: List[Tuple[str, List[int], np.dtype, int, Optional[Quant]]]
        self.buffers = [b""]  # buffer 0 is the empty buffer every non-constant tensor points to
        self.operators = []  # type: List[Operator]
        self._constants = {}  # type: Dict[Tuple[Any, ...], int]
        self.versions = {}  # type: Dict[str, int]

    def tensor(self, name: str, shape: Sequence[int], dtype: Any = np.float32, quant: Optional[Quant] = None) -> int:
        """A new non-constant tensor; returns its index."""
        return self._add(name, shape, np.dtype(dtype), 0, quant)

    def constant(self, array: np.ndarray, name: str = "const", quant: Optional[Quant] = None) -> int:
        """A constant tensor holding `array`; identical constants share one tensor."""
        array = np.asarray(array, order="C")
        key = (str(array.dtype), tuple(array.shape), array.tobytes()) + ((quant.key(),) if quant else ())
        if key not in self._constants:
            self.buffers.append(key[2])
            self._constants[key] = self._add(name, array.shape, array.dtype, len(self.buffers) - 1, quant)
        return self._constants[key]

    def require_version(self, op: str, version: int) -> None:
        """The operator's version must be at least `version` (int8 kernels are registered from 2 or 3 up)."""
        self.versions[op] = max(self.versions.get(op, 1), version)

    def operator(self, op: str, inputs: Sequence[int], outputs: Sequence[int], options: Optional[str] = None,
                 **fields: Any) -> None:
        """Appends an operator; `options` names its option table (e.g. "Conv2DOptions") filled from `fields`."""
        self.operators.append(Operator(op, inputs, outputs, (options, fields) if options else None))

    def shape(self, index: int) -> List[int]:
        return list(self.tensors[index][1])

    def _add(self, name: str, shape: Sequence[int], dtype: np.dtype, buffer: int, quant: Optional[Quant]) -> int:
        if dtype not in TENSOR_TYPES:
            raise ValueError("no TFLite tensor type for {}".format(dtype))
        self.tensors.append(("{}_{}".format(name, len(self.tensors)), [int(d) for d in shape], dtype, buffer, quant))
        return len(self.tensors) - 1

    def finish(self, inputs: Sequence[int], outputs: Sequence[int], description: str,
               metadata: Optional[Dict[str, bytes]] = None) -> bytes:
        """The complete .tflite file; `metadata` names buffers the runtime reads (LiteRT's
        `reduced_precision_support`)."""
        import flatbuffers

        named = []  # type: List[Tuple[str, int]]
        for name, data in sorted((metadata or {}).items()):
            self.buffers.append(data)
            named.append((name, len(self.buffers) - 1))
        builder = flatbuffers.Builder(1024 + sum(len(b) for b in self.buffers))
        codes = sorted({op.op for op in self.operators}, key=lambda op: builtin_code(op))
        code_index = {op: i for i, op in enumerate(codes)}
        buffers = [_buffer(builder, data) for data in self.buffers]
        tensors = [_tensor(builder, *tensor) for tensor in self.tensors]
        operators = [_operator(builder, op, code_index[op.op]) for op in self.operators]
        subgraph = _subgraph(builder, tensors, operators, inputs, outputs)
        opcodes = [_opcode(builder, op, self.versions.get(op, 1)) for op in codes]
        description_offset = builder.CreateString(description)
        entries = [_metadata(builder, name, buffer) for name, buffer in named]
        Model = schema("Model")
        vectors = [(Model.ModelStartOperatorCodesVector, opcodes), (Model.ModelStartSubgraphsVector, [subgraph]),
                   (Model.ModelStartBuffersVector, buffers)]
        opcodes_vec, subgraphs_vec, buffers_vec = [_offsets(builder, start, items) for start, items in vectors]
        metadata_vec = _offsets(builder, Model.ModelStartMetadataVector, entries) if entries else None
        Model.ModelStart(builder)
        Model.ModelAddVersion(builder, SCHEMA_VERSION)
        Model.ModelAddOperatorCodes(builder, opcodes_vec)
        Model.ModelAddSubgraphs(builder, subgraphs_vec)
        Model.ModelAddDescription(builder, description_offset)
        Model.ModelAddBuffers(builder, buffers_vec)
        if metadata_vec is not None:
            Model.ModelAddMetadata(builder, metadata_vec)
        builder.Finish(Model.ModelEnd(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _offsets(builder: Any, start: Any, items: Sequence[int]) -> int:
    start(builder, len(items))
    for item in reversed(items):
        builder.PrependUOffsetTRelative(item)
    return builder.EndVector()


def _ints(builder: Any, values: Sequence[int]) -> int:
    return builder.CreateNumpyVector(np.asarray(values, dtype=np.int32))


def _metadata(builder: Any, name: str, buffer: int) -> int:
    Metadata = schema("Metadata")
    text = builder.CreateString(name)
    Metadata.MetadataStart(builder)
    Metadata.MetadataAddName(builder, text)
    Metadata.MetadataAddBuffer(builder, buffer)
    return Metadata.MetadataEnd(builder)


def _buffer(builder: Any, data: bytes) -> int:
    Buffer = schema("Buffer")
    vector = None
    if data:
        builder.StartVector(1, len(data), _BUFFER_ALIGNMENT)
        builder.head = builder.head - len(data)
        builder.Bytes[builder.head:builder.head + len(data)] = data
        vector = builder.EndVector()
    Buffer.BufferStart(builder)
    if vector is not None:
        Buffer.BufferAddData(builder, vector)
    return Buffer.BufferEnd(builder)


def _tensor(builder: Any, name: str, shape: List[int], dtype: np.dtype, buffer: int, quant: Optional[Quant]) -> int:
    Tensor = schema("Tensor")
    name_offset = builder.CreateString(name)
    shape_offset = _ints(builder, shape)
    quant_offset = _quantization(builder, quant) if quant is not None else None
    Tensor.TensorStart(builder)
    if quant_offset is not None:
        Tensor.TensorAddQuantization(builder, quant_offset)
    Tensor.TensorAddShape(builder, shape_offset)
    Tensor.TensorAddType(builder, TENSOR_TYPES[dtype])
    Tensor.TensorAddBuffer(builder, buffer)
    Tensor.TensorAddName(builder, name_offset)
    return Tensor.TensorEnd(builder)


def _quantization(builder: Any, quant: Quant) -> int:
    Parameters = schema("QuantizationParameters")
    scale = builder.CreateNumpyVector(quant.scale.astype(np.float32))
    zero_point = builder.CreateNumpyVector(quant.zero_point.astype(np.int64))
    Parameters.QuantizationParametersStart(builder)
    Parameters.QuantizationParametersAddScale(builder, scale)
    Parameters.QuantizationParametersAddZeroPoint(builder, zero_point)
    Parameters.QuantizationParametersAddQuantizedDimension(builder, quant.dimension)
    return Parameters.QuantizationParametersEnd(builder)


def _options(builder: Any, table: str, fields: Dict[str, Any]) -> int:
    module = schema(table)
    getattr(module, table + "Start")(builder)
    for field, value in fields.items():
        adder = getattr(module, "{}Add{}".format(table, "".join(part.title() for part in field.split("_"))))
        adder(builder, value)
    return getattr(module, table + "End")(builder)


def _operator(builder: Any, op: Operator, opcode_index: int) -> int:
    Operator_ = schema("Operator")
    inputs, outputs = _ints(builder, op.inputs), _ints(builder, op.outputs)
    options = _options(builder, op.options[0], op.options[1]) if op.options else None
    Operator_.OperatorStart(builder)
    Operator_.OperatorAddOpcodeIndex(builder, opcode_index)
    Operator_.OperatorAddInputs(builder, inputs)
    Operator_.OperatorAddOutputs(builder, outputs)
    if op.options:
        kind = getattr(schema("BuiltinOptions").BuiltinOptions, op.options[0])
        Operator_.OperatorAddBuiltinOptionsType(builder, kind)
        Operator_.OperatorAddBuiltinOptions(builder, options)
    return Operator_.OperatorEnd(builder)


def _subgraph(builder: Any, tensors: List[int], operators: List[int], inputs: Sequence[int],
              outputs: Sequence[int]) -> int:
    SubGraph = schema("SubGraph")
    tensors_vec = _offsets(builder, SubGraph.SubGraphStartTensorsVector, tensors)
    operators_vec = _offsets(builder, SubGraph.SubGraphStartOperatorsVector, operators)
    inputs_vec, outputs_vec = _ints(builder, inputs), _ints(builder, outputs)
    name = builder.CreateString("main")
    SubGraph.SubGraphStart(builder)
    SubGraph.SubGraphAddTensors(builder, tensors_vec)
    SubGraph.SubGraphAddInputs(builder, inputs_vec)
    SubGraph.SubGraphAddOutputs(builder, outputs_vec)
    SubGraph.SubGraphAddOperators(builder, operators_vec)
    SubGraph.SubGraphAddName(builder, name)
    return SubGraph.SubGraphEnd(builder)


def _opcode(builder: Any, op: str, version: int = 1) -> int:
    OperatorCode = schema("OperatorCode")
    code = builtin_code(op)
    OperatorCode.OperatorCodeStart(builder)
    OperatorCode.OperatorCodeAddDeprecatedBuiltinCode(builder, min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES))
    OperatorCode.OperatorCodeAddBuiltinCode(builder, code)
    OperatorCode.OperatorCodeAddVersion(builder, max(version, _MIN_VERSIONS.get(op, 1)))
    return OperatorCode.OperatorCodeEnd(builder)
