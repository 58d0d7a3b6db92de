"""`edgedyn export model.onnx`: an ONNX graph as a torch module that torch.export can capture.

No maintained ONNX-to-torch converter installs beside torch 2.13 (onnx2torch is not on the index), so this is a
small interpreter: `OnnxModule.forward` runs the graph node by node with torch operators, and capturing it at
fixed shapes records exactly those operators. Values computed only from shapes and constants (the Shape ->
Gather -> Concat -> Reshape chains exporters emit) stay numpy arrays, so they become Python numbers in the
capture, not tensors. It covers the operators `torch.onnx.export` writes for the zoo's models and common CNNs;
any other operator is named, with its node, before anything runs.
"""
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

import numpy as np
import torch

from edgedyn.errors import CaptureError
from edgedyn.frontend.inputs import TensorSpec
from edgedyn.frontend.onnx_layers import LINEAR
from edgedyn.frontend.onnx_ops import OPS, StaticArray, Value

# ONNX TensorProto element types -> dtype names (inputs.DTYPES).
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
               11: "float64", 16: "bfloat16"}


class OnnxModule(torch.nn.Module):
    """Runs one ONNX graph with torch ops; forward takes the graph's inputs by (identifier-safe) name."""

    def __init__(self, model: Any, label: str) -> None:
        super().__init__()
        from onnx import helper, numpy_helper

        graph = model.graph
        self.label = label
        self._static = {}  # type: Dict[str, np.ndarray]
        self._buffer_of = {}  # type: Dict[str, str]
        for initializer in graph.initializer:
            self._add_constant(initializer.name, numpy_helper.to_array(initializer))
        nodes = []
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                attributes = {a.name: _attribute(helper.get_attribute_value(a)) for a in node.attribute}
                self._add_constant(node.output[0], _constant(attributes))
            else:
                nodes.append(node)
        unsupported = sorted({node.op_type for node in nodes if node.domain not in ("", "ai.onnx")
                              or node.op_type not in OPS})
        if unsupported:
            raise CaptureError(
                "{} uses ONNX operator(s) edgedyn cannot read yet: {}".format(label, ", ".join(unsupported)),
                hint="export the PyTorch model directly (path.py:Name), or save it with torch.export.save as .pt2")
        self._nodes = [(node.op_type, list(node.input), list(node.output),
                        dict({a.name: _attribute(helper.get_attribute_value(a)) for a in node.attribute},
                             _op=node.op_type))
                       for node in nodes]
        self._nodes = _fuse_linear(self._fold_constants(self._nodes), set(self._buffer_of),
                                   {o.name for o in graph.output})
        initialized = {i.name for i in graph.initializer}
        self.onnx_inputs = [i for i in graph.input if i.name not in initialized]
        self.input_names = _identifiers([i.name for i in self.onnx_inputs])
        self.output_names = [o.name for o in graph.output]
        self.forward = self._forward_with_signature()  # type: ignore[assignment]

    def _add_constant(self, name: str, array: np.ndarray) -> None:
        # Every constant of more than one element is a buffer, so torch ops see the capture's own buffer and
        # not a tensor made during the trace; integer ones also stay numpy, for shape arithmetic.
        if array.size > 1:
            buffer = "onnx_constant_{}".format(len(self._buffer_of))
            self.register_buffer(buffer, torch.from_numpy(array.copy()))
            self._buffer_of[name] = buffer
        if array.dtype.kind != "f" or array.size <= 1:
            self._static[name] = array

    def _fold_constants(self, nodes: List[Any]) -> List[Any]:
        """Computes, once, every node that reads only constants (weight norms, position ids): the capture then
        holds their results as buffers, and no backend sees constant subgraphs (onnxruntime 1.32's own folding
        of one failed with "Attempt to replace the existing tensor")."""
        kept = []
        for op, names, outputs, attributes in nodes:
            if not all(n == "" or n in self._static or n in self._buffer_of for n in names):
                kept.append((op, names, outputs, attributes))
                continue
            with torch.no_grad():
                results = OPS[op]([self._constant_value(n) for n in names], attributes)
            for name, result in zip(outputs, results):
                array = result.numpy() if isinstance(result, torch.Tensor) else np.asarray(result)
                self._add_constant(name, array)
        return kept

    def _constant_value(self, name: str) -> Optional[Value]:
        if name == "":
            return None
        buffer = getattr(self, self._buffer_of[name]) if name in self._buffer_of else None
        return StaticArray.of(self._static[name], buffer) if name in self._static else buffer

    def _forward_with_signature(self) -> Callable[..., Any]:
        import inspect

        def forward(*args: torch.Tensor, **kwargs: torch.Tensor) -> Dict[str, Value]:
            bound = dict(zip(self.input_names, args), **kwargs)
            return self.run([bound[name] for name in self.input_names])

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.input_names])
        return forward

    def run(self, inputs: List[torch.Tensor]) -> Dict[str, Value]:
        """The graph's outputs by their ONNX names, in the graph's order."""
        values = {name: getattr(self, buffer) for name, buffer in self._buffer_of.items()}  # type: Dict[str, Value]
        values.update({name: StaticArray.of(array, values.get(name)) for name, array in self._static.items()})
        values.update({i.name: tensor for i, tensor in zip(self.onnx_inputs, inputs)})
        values[""] = None  # an omitted optional input
        for op, names, outputs, attributes in self._nodes:
            results = OPS[op]([values[n] for n in names], attributes)
            for name, result in zip(outputs, results):
                values[name] = result
        return {name: _as_tensor(values[name]) for name in self.output_names}


def _fuse_linear(nodes: List[Any], constants: Set[str], graph_outputs: Set[str]) -> List[Any]:
    """MatMul by a constant weight, then Add of a constant bias -> one linear layer, as a torch model has it.

    ONNX exporters write linear layers as MatMul + Add; captured as such, onnxruntime 1.32's MatMulAddFusion
    then rejects the graph ("Attempt to replace the existing tensor"). torch's linear captures as addmm (Gemm).
    """
    uses = {}  # type: Dict[str, int]
    for _, names, _, _ in nodes:
        for name in names:
            uses[name] = uses.get(name, 0) + 1
    producer = {outputs[0]: index for index, (op, _, outputs, _) in enumerate(nodes) if op == "MatMul"}
    fused, dropped = {}, set()
    for index, (op, names, outputs, attributes) in enumerate(nodes):
        if op != "Add" or len(names) != 2:
            continue
        for product, bias in (names, names[::-1]):
            source = producer.get(product)
            if source is None or bias not in constants or uses.get(product) != 1 or product in graph_outputs:
                continue
            x, weight = nodes[source][1]
            if weight in constants and source not in dropped:
                fused[index] = (LINEAR, [x, weight, bias], outputs, {"_op": LINEAR})
                dropped.add(source)
                break
    return [fused.get(i, node) for i, node in enumerate(nodes) if i not in dropped]


def load_onnx(path: Path) -> "tuple":
    """(OnnxModule, example_inputs function reading the file's fixed input shapes)."""
    try:
        import onnx
    except ImportError as error:
        from edgedyn.errors import MissingDependencyError

        raise MissingDependencyError("reading ONNX files needs the onnx package ({})".format(error),
                                     hint="pip install 'edgedyn[export]'") from error
    try:
        model = onnx.load(str(path))
    except Exception as error:
        raise CaptureError("cannot read {} as ONNX: {}".format(path, str(error).splitlines()[0]),
                           hint="check that the file is a complete .onnx model") from error
    module = OnnxModule(model, path.name)
    return module, lambda: file_example_inputs(module, path.name)


def file_example_inputs(module: OnnxModule, label: str) -> Dict[str, TensorSpec]:
    """The inputs at the file's own fixed shapes; a symbolic dimension needs --input instead."""
    examples = {}
    for name, value in zip(module.input_names, module.onnx_inputs):
        tensor_type = value.type.tensor_type
        dtype = ONNX_DTYPES.get(tensor_type.elem_type)
        if dtype is None:
            raise CaptureError("{} input '{}' has ONNX element type {}, which edgedyn does not capture".format(
                label, value.name, tensor_type.elem_type))
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                for d in tensor_type.shape.dim]
        symbolic = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
        if symbolic:
            shown = "x".join(str(d) for d in dims)
            raise CaptureError(
                "{} input '{}' has symbolic dimension(s) {} (shape {}); a capture needs fixed sizes".format(
                    label, value.name, ", ".join("{} ({})".format(i, d) for i, d in symbolic), shown),
                hint="give every input's sizes, e.g. --input {}={}{}".format(
                    name, "x".join(str(d) if isinstance(d, int) else "1" for d in dims),
                    "" if dtype == "float32" else ":" + dtype))
        examples[name] = TensorSpec(tuple(dims), dtype)
    return examples


def _identifiers(names: List[str]) -> List[str]:
    """ONNX names ('input.1') as Python argument names ('input_1'), kept distinct."""
    result = []  # type: List[str]
    for name in names:
        candidate = re.sub(r"\W", "_", name)
        candidate = "_" + candidate if not candidate or candidate[0].isdigit() else candidate
        while candidate in result:
            candidate += "_"
        result.append(candidate)
    return result


def _attribute(value: Any) -> Any:
    from onnx import TensorProto, numpy_helper

    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def _constant(attributes: Dict[str, Any]) -> np.ndarray:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in attributes:
            value = np.asarray(attributes[key])
            return value.astype(np.float32) if key.startswith("value_float") else value
    raise CaptureError("an ONNX Constant node holds {}, which edgedyn cannot read".format(", ".join(attributes)))


def _as_tensor(value: Optional[Value]) -> Any:
    return torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray) else value
