"""Lookups over one exported ONNX graph for edgedyn's rewrites (onnx_rewrites, onnx_attention): producers,
consumers, constants, shapes and types inferred once, and pruning what no output needs any more."""
from typing import Any, Dict, List, Optional

import numpy as np


class Graph:
    """Lookups over one ONNX graph: producers, consumers, constants, and shapes and types inferred once (the
    rewrites only remove nodes and re-point inputs, so no tensor changes its shape)."""

    def __init__(self, onnx: Any, model: Any) -> None:
        self.onnx = onnx
        self.model = model
        self.graph = model.graph
        self._initializers = {t.name: t for t in self.graph.initializer}
        self._arrays = {}  # type: Dict[str, np.ndarray]
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self.shapes = {}  # type: Dict[str, List[int]]
        self.types = {}  # type: Dict[str, int]
        for value in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
            tensor = value.type.tensor_type
            self.types[value.name] = tensor.elem_type
            if all(d.HasField("dim_value") for d in tensor.shape.dim):
                self.shapes[value.name] = [d.dim_value for d in tensor.shape.dim]
        for tensor in self.graph.initializer:
            self.shapes[tensor.name] = list(tensor.dims)
            self.types[tensor.name] = tensor.data_type
        self.refresh()

    def refresh(self) -> None:
        """Producers and consumers again, after an edit."""
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.consumers = {}  # type: Dict[str, List[Any]]
        for node in self.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def constant(self, name: str) -> Optional[np.ndarray]:
        """The initializer's values (read once, when a rewrite asks), or None for a computed tensor."""
        if name not in self._arrays and name in self._initializers:
            from onnx import numpy_helper

            self._arrays[name] = numpy_helper.to_array(self._initializers[name])
        return self._arrays.get(name)

    def made_by(self, name: str, op_type: str, perm: Optional[List[int]] = None) -> Optional[Any]:
        """The node producing `name` when it is that op (see is_op), else None."""
        node = self.producer.get(name)
        return node if self.is_op(node, op_type, perm) else None

    def is_output(self, name: str) -> bool:
        return any(output.name == name for output in self.graph.output)

    def only_consumer(self, name: str) -> Optional[Any]:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and not self.is_output(name) else None

    def keeps_shape(self, node: Optional[Any]) -> bool:
        """Whether node is a Reshape whose output has its input's (known) shape."""
        return (self.is_op(node, "Reshape") and self.shapes.get(node.input[0]) is not None
                and self.shapes.get(node.input[0]) == self.shapes.get(node.output[0]))

    def is_op(self, node: Optional[Any], op_type: str, perm: Optional[List[int]] = None) -> bool:
        """Whether node is a standard-domain op_type (with this `perm`, for a Transpose)."""
        return (node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")
                and (perm is None or list(self.attribute(node, "perm", [])) == perm))

    def scalar(self, name: str) -> Optional[float]:
        array = self.constant(name)
        return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None

    def attribute(self, node: Any, name: str, default: Any = None) -> Any:
        for attribute in node.attribute:
            if attribute.name == name:
                return self.onnx.helper.get_attribute_value(attribute)
        return default


def prune(graph: Graph) -> None:
    """Drops the nodes and initializers no graph output depends on any more."""
    needed = {output.name for output in graph.graph.output}
    kept = []
    for node in reversed(list(graph.graph.node)):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    del graph.graph.node[:]
    graph.graph.node.extend(reversed(kept))
    initializers = [t for t in graph.graph.initializer if t.name in needed]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(initializers)
    graph.refresh()
