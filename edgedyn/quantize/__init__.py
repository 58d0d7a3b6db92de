"""int8 quantization: the modes, which backends give real integer kernels, and what each backend is handed.

Note: quantization happens inside the three backends whose runtimes execute int8 kernels, on their own formats,
not as a pass over the ATen graph. Why each path:
- onnxruntime: the ONNX Runtime quantizer (onnxruntime.quantization) writes QuantizeLinear/DequantizeLinear
  around Conv/Gemm/MatMul with int8 initializers (QDQ); ORT fuses those into QLinearConv/QGemm/QLinearAdd or
  MatMulInteger at session creation on the board, for that CPU. torch 2.13 has PT2E only in torchao (not a
  dependency here), and torch's ONNX exporter would emit the same QDQ pattern anyway.
- tflite: our own .tflite writer emits int8 tensors with per-channel scales feeding CONV_2D, DEPTHWISE_CONV_2D
  and FULLY_CONNECTED, and QUANTIZE/DEQUANTIZE where float ops remain; LiteRT hands those to XNNPACK's int8
  kernels. Activation ranges come from running the ATen graph on the calibration data (quantize/ranges.py).
- openvino: NNCF quantizes the converted IR (backends/openvino_int8.py), keeping a float prefix where every layer
  in int8 misses the gate; OpenVINO's CPU plugin runs its int8 convolutions and matrix products.
- the others (ncnn, TVM, portable) say why in their registry record (`no_int8_reason`) and refuse --quantize, naming
  the backends that can.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import numpy as np

from edgedyn.registry import AUTO, get_backend, quantizing_backends
from edgedyn.errors import EdgedynError

MODES = ("int8", "int8-weights")


@dataclass(frozen=True)
class Quantization:
    """What a backend needs to quantize one specialization: the mode and, for static int8, calibration batches."""

    mode: str
    calibration: List[List[np.ndarray]] = field(default_factory=list, compare=False)
    source: str = ""
    # The cosine to torch eager the backend aims for while choosing what to keep in float (the gate's bound).
    target_cosine: float = 0.99
    # `held_out(backend, run)`: the gate on the held-out split (quantize/plan.py's HeldOut.check), raising
    # EdgedynError with the numbers on a miss; `auto` drops a candidate that misses and keeps the fastest that passes.
    held_out: Optional[Callable[[str, Callable[[List[np.ndarray]], List[Any]]], Any]] = field(
        default=None, compare=False, repr=False)
    # The held-out batches `held_out` runs a candidate on, in order (an emulated board runs them elsewhere and the
    # gate replays its outputs: edgedyn/onboard.py).
    held_out_batches: List[List[np.ndarray]] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.mode == "int8" and not self.calibration:
            raise EdgedynError("--quantize int8 needs calibration batches", hint="pass --calibration")

    @property
    def static(self) -> bool:
        return self.mode == "int8"


def check_mode(mode: Optional[str]) -> None:
    if mode is not None and mode not in MODES:
        raise EdgedynError("unknown quantization '{}'; choose from: {}".format(mode, ", ".join(MODES)),
                           hint="int8: int8 weights and activations (needs --calibration); "
                                "int8-weights: int8 weights, activations quantized at run time")


def check_backend(mode: Optional[str], backend: str) -> None:
    """Fails before any work when `backend` cannot run int8 kernels (auto is narrowed later)."""
    if mode is None or backend == AUTO:
        return
    record = get_backend(backend)
    if record.quantizes:
        return
    raise EdgedynError("--quantize {} is not supported by backend '{}': {}".format(mode, backend,
                                                                                   record.no_int8_reason),
                       hint="use --backend {} (or auto, which builds the int8 of each beside the float "
                            "candidates)".format(" or --backend ".join(quantizing_backends())))


def weight_bytes(program: object) -> int:
    """Bytes of the float parameters and constants of an ExportedProgram (the fp32 weights before quantizing)."""
    tensors = dict(program.state_dict)  # type: ignore[attr-defined]
    tensors.update(program.constants)  # type: ignore[attr-defined]
    return int(sum(t.numel() * t.element_size() for t in tensors.values() if hasattr(t, "numel")))
