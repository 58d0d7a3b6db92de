"""Choosing how to quantize an ONNX model so that it keeps its accuracy: scheme, calibration method, float islands.

Note: measured, not assumed. Every attempt is quantized and run on the last quarter of the calibration batches
(the calibration split; the export's accuracy gate later uses the held-out split, which this never sees) and
compared with the float model by cosine, per output. The first attempt that reaches the target cosine (the gate's,
0.99 by default) is kept; when none does, the best one is, and the gate then fails the export with its numbers.
- Scheme: transformer encoders (a graph with Softmax or LayerNormalization) get dynamic int8 MatMul/Gemm (int8
  weights per channel, activations quantized per call from their own range), because a static activation range
  cannot follow attention scores and post-LayerNorm outliers (a static-QDQ ViT-tiny gave cosine -0.04); everything
  else gets static QDQ, per-channel weights, with calibrated activation ranges.
- Static calibration: MinMax first (cheapest, best for ReLU networks), then Percentile and Entropy when MinMax
  misses the target; the most accurate method is kept for what follows.
- Costly op types (static): each op type other than the layers and pure data movement is kept in float alone,
  once; the types whose float nodes close at least a quarter of the gap to the target stay float together. This
  finds what no fixed list does: on the zoo's EfficientNet, onnxruntime 1.32's fused int8 kernels for its SiLU
  `Mul`s gave cosine 0.23 to the float model where the same QDQ graph run unfused gives 0.98, and keeping those
  22 `Mul`s in float gives 0.98 fused too (2026-12-01); a small SiLU network did not show it.
- Float islands, in order, each group kept in float only when the previous attempt still missed: normalizations
  and activations (Softmax, LayerNormalization, Gelu, Sigmoid...), residual adds (Add of two activations: their
  sum spans both ranges), then the first and last layers (Conv/MatMul/Gemm: the input image's and the logits'
  ranges differ the most from the rest).
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.quantize.accuracy import output_metrics

SENSITIVE_OPS = ("Softmax", "LayerNormalization", "Gelu", "Sigmoid", "HardSigmoid", "Tanh", "Erf", "Pow", "Sqrt",
                 "ReduceMean", "Div")
LAYERS = ("Conv", "MatMul", "Gemm")
ENCODER_OPS = ("Softmax", "LayerNormalization")
# Ops that only move or reshape data: float or int8, they pass their input's values on, so the scan skips them.
DATA_MOVEMENT = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Shape", "Constant",
                 "Gather", "Slice", "Split", "Expand")
# An op type stays float when keeping it float closes at least this share of the gap to the target cosine.
COSTLY_SHARE = 0.25
METHODS = ("minmax", "percentile", "entropy")
Kept = Tuple[str, str, str]  # (node name, op type, why it stays float)


@dataclass(frozen=True)
class Attempt:
    """One way to quantize: the scheme, the calibration method (static only) and the nodes kept in float."""

    scheme: str  # "static" or "dynamic"
    method: str = "minmax"
    kept: Tuple[Kept, ...] = ()

    @property
    def excluded(self) -> List[str]:
        return [name for name, _, _ in self.kept]

    def describe(self) -> str:
        if self.scheme == "dynamic":
            text = "dynamic: MatMul/Gemm weights int8 per output channel, activations quantized at run time"
        else:
            text = "static QDQ: weights int8 per output channel, activations uint8 per tensor ({})".format(
                {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}[self.method])
        return text + ("; {} node(s) kept in float".format(len(self.kept)) if self.kept else "")

    def float_ops_record(self) -> List[Dict[str, str]]:
        """What stayed in float and why, for the manifest."""
        return [{"node": name, "op": op, "why": why} for name, op, why in self.kept]

    def keeping(self, more: Sequence[Kept]) -> "Attempt":
        names = set(self.excluded)
        return Attempt(self.scheme, self.method, self.kept + tuple(k for k in more if k[0] not in names))


@dataclass
class Found:
    model: Any
    chosen: Attempt
    search: List[Dict[str, Any]] = field(default_factory=list)
    cosine: Optional[float] = None


def search(onnx: Any, model: Any, quantization: Any, input_names: List[str],
           quantize: Callable[[Attempt], Any]) -> Found:
    """The first attempt (see the module note) whose outputs reach the target cosine, else the best one."""
    batches = quantization.calibration
    check = batches[-max(1, len(batches) // 4):]
    reference = _run(model, input_names, check)
    target = quantization.target_cosine
    tried = []  # type: List[Tuple[float, Attempt, Any]]
    log = []  # type: List[Dict[str, Any]]

    def measure(how: Attempt) -> float:
        for index, (cosine, done, quantized) in enumerate(tried):
            if (done.scheme, done.method, set(done.excluded)) == (how.scheme, how.method, set(how.excluded)):
                tried[index] = (cosine, how, quantized)  # the same nodes, measured already: keep the newer reason
                return cosine
        quantized = quantize(how)
        cosine = _cosine(_run(quantized, input_names, check), reference)
        tried.append((cosine, how, quantized))
        log.append({"scheme": how.scheme, "method": how.method if how.scheme == "static" else None,
                    "kept_float": len(how.kept), "float_op_types": sorted({op for _, op, _ in how.kept}),
                    "cosine": round(cosine, 6)})
        return cosine

    scheme = "dynamic" if any(node.op_type in ENCODER_OPS for node in model.graph.node) else "static"
    methods = METHODS if scheme == "static" else ("minmax",)
    for method in methods:
        if measure(Attempt(scheme, method)) >= target:
            return _found(tried, log, len(check))
    base, best, _ = max(tried, key=lambda t: t[0])
    costly = _costly_op_types(model, best, base, target, measure) if scheme == "static" else []
    if costly:
        best = best.keeping(costly)
        if measure(best) >= target:  # one costly type: measured by the scan already (measure knows)
            return _found(tried, log, len(check))
    for group in _float_groups(model, scheme):
        best = best.keeping(group)
        if group and measure(best) >= target:
            break
    return _found(tried, log, len(check))


def _found(tried: List[Tuple[float, Attempt, Any]], log: List[Dict[str, Any]], checked: int) -> Found:
    """The first attempt that reached the target (the last one tried) or, when none did, the most accurate."""
    cosine, how, quantized = max(tried, key=lambda t: (t[0], -len(t[1].kept)))
    return Found(quantized, how, [dict(entry, batches=checked) for entry in log] if len(log) > 1 else [], cosine)


def _costly_op_types(model: Any, best: Attempt, base: float, target: float,
                     measure: Callable[[Attempt], float]) -> List[Kept]:
    """The nodes of each op type whose being float, tried one type at a time on top of `best` (cosine `base`),
    closes at least COSTLY_SHARE of the gap to `target`; the layers (what int8 is for) and data movement are not
    tried."""
    by_type = {}  # type: Dict[str, List[Any]]
    for node in model.graph.node:
        if node.op_type not in LAYERS and node.op_type not in DATA_MOVEMENT and node.name:
            by_type.setdefault(node.op_type, []).append(node)
    costly = []  # type: List[Kept]
    for op, nodes in sorted(by_type.items()):
        cosine = measure(best.keeping([(n.name, op, "tried in float, alone, by the search") for n in nodes]))
        if cosine - base >= COSTLY_SHARE * (target - base):
            why = "measured: with the {}s in int8 cosine {:.4f}, in float {:.4f} (calibration split)".format(
                op, base, cosine)
            costly.extend((n.name, op, why) for n in nodes)
    return costly


def _float_groups(model: Any, scheme: str) -> List[List[Kept]]:
    """The groups of nodes to keep in float, in the order they are tried."""
    nodes = list(model.graph.node)
    initializers = {t.name for t in model.graph.initializer}
    sensitive = [(n.name, n.op_type, "sensitive to int8 (normalization/activation)") for n in nodes
                 if n.op_type in SENSITIVE_OPS]
    residual = [(n.name, n.op_type, "residual add: the sum spans both inputs' ranges") for n in nodes
                if n.op_type == "Add" and sum(1 for i in n.input if i not in initializers) == 2]
    layers = [n for n in nodes if n.op_type in LAYERS]
    ends = [(n.name, n.op_type, "{} layer: its range differs the most from the rest".format(where))
            for where, n in (("first", layers[0]), ("last", layers[-1]))] if layers else []
    if scheme == "dynamic":  # dynamic quantization touches only MatMul/Gemm: the other groups change nothing
        return [ends]
    return [sensitive, residual, ends]


def _run(model: Any, input_names: List[str], batches: List[List[np.ndarray]]) -> List[List[np.ndarray]]:
    """Outputs per batch of the model on onnxruntime's CPU provider."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [session.run(None, dict(zip(input_names, batch))) for batch in batches]


def _cosine(got: List[List[np.ndarray]], want: List[List[np.ndarray]]) -> float:
    """The lowest, over outputs, of the mean per-sample cosine: every output must keep its accuracy."""
    outputs = len(want[0])
    return min(output_metrics([g[i] for g in got], [w[i] for w in want])["cosine"] for i in range(outputs))
