"""TFLite without TensorFlow: write a .tflite flatbuffer from the captured core-ATen graph, run it with LiteRT.

The writer (writer.py) serializes tensors, buffers and operators; the lowering (lowering.py) walks the graph and
keeps track of layouts (layout.py) so convolutions run NHWC; ops/ holds one converter module per kind of op.
"""
from typing import Any, List

from edgedyn.backends import BACKENDS, Artifact
from edgedyn.boards import Board, Target

# fp32 through XNNPACK: other summation orders and its own GELU/exp approximations; errors seen were below 1e-5
# of the largest output magnitude, so 1e-4 leaves room without hiding a wrong layout (those are O(1)).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
# Backends that take the full core-ATen opset, named when this one cannot express an op.
GENERAL_BACKENDS = ("onnxruntime", "tvm")


def lower(program: Any, board: Board, target: Target, tensor_inputs: List[str]) -> Artifact:
    """Writes the program as one .tflite model whose inputs and outputs have the torch model's shapes (NCHW)."""
    from edgedyn.backends.tflite.lowering import lower_program
    from edgedyn.backends.tflite.ops import CONVERTERS

    model, facts = lower_program(program, CONVERTERS, [b for b in GENERAL_BACKENDS if b in BACKENDS])
    return Artifact(
        backend="tflite",
        executor="litert",
        device="cpu",
        arch=None,  # a .tflite file runs on any CPU LiteRT supports
        target=target.name,
        files={"model": model},
        file_names={"model": "model.tflite"},
        meta=dict(facts, tolerance=dict(TOLERANCE), layout="NHWC inside, torch layout at inputs and outputs",
                  requires={"python": ["ai-edge-litert"]}),
    )
