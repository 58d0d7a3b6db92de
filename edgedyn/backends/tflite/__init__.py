"""TFLite without TensorFlow: write a .tflite flatbuffer from the captured core-ATen graph, run it with LiteRT.

The writer (writer.py) serializes tensors, buffers and operators; the lowering (lowering.py) walks the graph and
keeps track of layouts (layout.py) so convolutions run NHWC; ops/ holds one converter module per kind of op.
"""
from typing import Any, Dict, Optional

from edgedyn.registry import general_backends
from edgedyn.backends.artifact import Artifact, Build
from edgedyn.boards import Target
from edgedyn.runtime.program import FP32_TOLERANCE
from edgedyn.backends.tflite.writer import FP16_INFERENCE, REDUCED_PRECISION_KEY  # fp16: see writer.py

# fp32 through XNNPACK: other summation orders and its own GELU/exp approximations; errors seen were below 1e-5
# of the largest output magnitude, so FP32_TOLERANCE (1e-4) leaves room without hiding a wrong layout (those are
# O(1)).


def lower(build: Build) -> Artifact:
    """Writes the program as one .tflite model whose inputs and outputs have the torch model's shapes (NCHW);
    with `build.quantization` (edgedyn.quantize.Quantization), convolutions and fully connected layers run int8."""
    program, target, quantization = build.program, build.target, build.quantization
    from edgedyn.backends.tflite.lowering import lower_program
    from edgedyn.backends.tflite.ops import CONVERTERS

    alternatives = general_backends()
    if quantization is None:
        fp16 = build.precision == "fp16"
        # ai-edge-litert, on Python >= 3.10 (pyproject's litert extra), reverses several axes in one REVERSE_V2
        at_once = tuple(int(part) for part in build.board.python.split(".")[:2]) >= (3, 10)
        model, facts = lower_program(program, CONVERTERS, alternatives,
                                     metadata={REDUCED_PRECISION_KEY: FP16_INFERENCE} if fp16 else None,
                                     reverse_at_once=at_once)
        if fp16:
            facts["reduced_precision_support"] = FP16_INFERENCE.decode()
        return _artifact(model, facts, target, None if fp16 else dict(FP32_TOLERANCE))
    from edgedyn.quantize import weight_bytes
    from edgedyn.quantize.accuracy import INT8_TOLERANCE
    from edgedyn.backends.tflite.ops.int8 import INT8_CONVERTERS
    from edgedyn.quantize.ranges import observe

    ranges = observe(program, quantization.calibration) if quantization.static else {}
    model, facts = lower_program(program, CONVERTERS, alternatives, quantization.mode, ranges, INT8_CONVERTERS)
    scheme = ("static, full integer: int8 CONV_2D/DEPTHWISE_CONV_2D/FULLY_CONNECTED (weights per output channel) "
              "and int8 ADD/pooling/MEAN/CONCATENATION/PAD/RESHAPE/activations between them, activations per "
              "tensor (calibrated min/max), QUANTIZE/DEQUANTIZE only around ops without an int8 kernel"
              if quantization.static else
              "hybrid: int8 weights per output channel, float activations quantized on the fly")
    facts["quantization"] = {"mode": quantization.mode, "backend": "tflite", "scheme": scheme,
                             "weights": {"fp32_bytes": weight_bytes(program),
                                         "quantized_bytes": facts.pop("weight_bytes")}}
    return _artifact(model, facts, target, dict(INT8_TOLERANCE))


def _artifact(model: bytes, facts: Dict[str, Any], target: Target, tolerance: Optional[Dict[str, float]]) -> Artifact:
    if tolerance is not None:
        facts = dict(facts, tolerance=tolerance)
    return Artifact(
        backend="tflite",
        executor="litert",
        device="cpu",
        arch=None,  # a .tflite file runs on any CPU LiteRT supports
        target=target.name,
        files={"model": model},
        file_names={"model": "model.tflite"},
        meta=dict(facts, layout="NHWC inside, torch layout at inputs and outputs",
                  requires={"python": ["ai-edge-litert"]}),
    )
