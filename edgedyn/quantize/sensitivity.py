"""Choosing how to quantize an ONNX model so that it keeps its accuracy: scheme, calibration method, float islands.

Note: measured, not assumed. Every attempt is calibrated on the first three quarters of the calibration batches,
run on the last quarter (the check split; the export's accuracy gate later uses the held-out split, which this
never sees) and compared with the float model by cosine, per output. The first attempt that reaches the target
(the gate's cosine, 0.99 by default, plus SEARCH_MARGIN of the way to 1) is kept, quantized again on every
calibration batch; when none does, the best one is, and the gate then fails the export with its numbers.
- Scheme: transformer encoders (a graph with Softmax or LayerNormalization) get dynamic int8 MatMul/Gemm (int8
  weights per channel, activations quantized per call from their own range), because a static activation range
  cannot follow attention scores and post-LayerNorm outliers (a static-QDQ ViT-tiny gave cosine -0.04); everything
  else gets static QDQ, per-channel weights, with calibrated activation ranges.
- Static calibration: MinMax first (cheapest, best for ReLU networks), then Percentile and Entropy when MinMax
  misses the target; the most accurate method is kept for what follows.
- Costly op types (static): each op type other than the layers and pure data movement is kept in float alone,
  once; the types whose float nodes close at least a quarter of the gap to the target stay float together. This
  finds what no fixed list does: on the zoo's EfficientNet, onnxruntime 1.32's fused int8 kernels for its SiLU
  `Mul`s gave cosine 0.14-0.23 to the float model where the same QDQ graph run unfused gives 0.98, and keeping its
  29 `Mul`s in float gives 0.98 fused too (2026-12-01); a small SiLU network did not show it.
- Float groups, in order, each kept only when it raises the cosine: normalizations and activations (Softmax,
  LayerNormalization, Gelu, Sigmoid...), residual adds (Add of two activations: their sum spans both ranges), then
  the first and last layers (Conv/MatMul/Gemm: the input image's and the logits' ranges differ the most).
- Layers by measured loss (static): the worst 1, 2, 4, ... int8 layers by _layers_by_error, up to half of them.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.quantize.accuracy import worst_cosine

SENSITIVE_OPS = ("Softmax", "LayerNormalization", "Gelu", "Sigmoid", "HardSigmoid", "Tanh", "Erf", "Pow", "Sqrt",
                 "ReduceMean", "Div")
LAYERS = ("Conv", "MatMul", "Gemm")
ENCODER_OPS = ("Softmax", "LayerNormalization")
# Ops that only move or reshape data: float or int8, they pass their input's values on, so the scan skips them.
DATA_MOVEMENT = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Shape", "Constant",
                 "Gather", "Slice", "Split", "Expand")
# Activations onnxruntime's quantizer folds into the layer before them: the pair has one quantized output.
FUSED_ACTIVATIONS = ("Relu", "Clip")
# The search aims this share of the way from the gate's cosine to 1 on its check batches (a quarter of the
# calibration data): the gate then measures other inputs, and the zoo's EfficientNet read 0.9917 on the check
# batches where the held-out gate measured 0.9882.
SEARCH_MARGIN = 0.25
# Batches the layer ranking runs on: it keeps every intermediate tensor of two models for each (ResNet-18 at 224:
# tens of MB a batch), and a ranking needs few.
RANKING_BATCHES = 4
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
           quantize: Callable[[Attempt, List[List[np.ndarray]]], Any]) -> Found:
    """The first attempt (see the module note) whose outputs reach the target cosine, else the best one, quantized
    again on every calibration batch.

    `quantize(how, batches)` quantizes the float model as `how` says, calibrated on `batches`. The attempts are
    calibrated without the check batches (the last quarter) they are measured on: checked on the batches that set
    their ranges, the zoo's EfficientNet read 0.9925 where the held-out gate then measured 0.983."""
    batches = quantization.calibration
    checked = max(1, len(batches) // 4)
    calibrate, check = (batches[:-checked], batches[-checked:]) if len(batches) >= 4 else (batches, batches)
    reference = _run(model, input_names, check)
    target = quantization.target_cosine + SEARCH_MARGIN * (1.0 - quantization.target_cosine)
    tried = []  # type: List[Tuple[float, Attempt, Any]]
    log = []  # type: List[Dict[str, Any]]

    def measure(how: Attempt) -> float:
        for index, (cosine, done, quantized) in enumerate(tried):
            if (done.scheme, done.method, set(done.excluded)) == (how.scheme, how.method, set(how.excluded)):
                tried[index] = (cosine, how, quantized)  # the same nodes, measured already: keep the newer reason
                return cosine
        quantized = quantize(how, calibrate)
        cosine = worst_cosine(_run(quantized, input_names, check), reference)
        tried.append((cosine, how, quantized))
        log.append({"scheme": how.scheme, "method": how.method if how.scheme == "static" else None,
                    "kept_float": len(how.kept), "float_op_types": sorted({op for _, op, _ in how.kept}),
                    "cosine": round(cosine, 6)})
        return cosine

    def found() -> Found:
        """The first attempt that reached the target (the last one tried) or, when none did, the most accurate."""
        cosine, how, quantized = max(tried, key=lambda t: (t[0], -len(t[1].kept)))
        if calibrate is not batches:
            quantized = quantize(how, batches)
        entries = [dict(entry, batches=len(check), calibration_batches=len(calibrate)) for entry in log]
        return Found(quantized, how, entries if len(entries) > 1 else [], cosine)

    scheme = "dynamic" if any(node.op_type in ENCODER_OPS for node in model.graph.node) else "static"
    methods = METHODS if scheme == "static" else ("minmax",)
    for method in methods:
        if measure(Attempt(scheme, method)) >= target:
            return found()
    cosine, best, _ = max(tried, key=lambda t: t[0])
    costly = _costly_op_types(model, best, cosine, target, measure) if scheme == "static" else []
    if costly:
        best = best.keeping(costly)
        cosine = measure(best)  # one costly type: measured by the scan already (measure knows)
        if cosine >= target:
            return found()
    for group in _float_groups(model, scheme):
        if not group:
            continue
        trial = best.keeping(group)
        accuracy = measure(trial)
        if accuracy >= target:
            return found()
        if accuracy > cosine:  # a group that does not help does not stay float
            best, cosine = trial, accuracy
    if scheme == "static":
        quantized = next(q for _, how, q in tried if how == best)
        ranked = _layers_by_error(onnx, model, quantized, input_names, check[:RANKING_BATCHES], set(best.excluded))
        count = 1
        while ranked and count <= max(1, len(ranked) // 2):  # beyond half the layers float, int8 has little left
            # One reason for all of them (with the range of their drops), so that `inspect` groups them.
            why = ("measured: one of the {} layers whose signal-to-noise ratio falls the most in int8 ({:.1f} to "
                   "{:.1f} dB)".format(count, ranked[min(count, len(ranked)) - 1][0], ranked[0][0]))
            worst = [(node.name, node.op_type, why) for _, node in ranked[:count]]
            if measure(best.keeping(worst)) >= target:
                break
            count *= 2
    return found()


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
            why = "measured: with the {}s in int8 cosine {:.4f}, in float {:.4f} (check batches)".format(
                op, base, cosine)
            costly.extend((n.name, op, why) for n in nodes)
    return costly


def _layers_by_error(onnx: Any, model: Any, quantized: Any, input_names: List[str],
                     batches: List[List[np.ndarray]], skip: Any) -> List[Tuple[float, Any]]:
    """The layers (Conv/MatMul/Gemm) still int8 in `quantized`, the worst first: how far each one's signal to
    quantization noise ratio (float model against the QDQ model, per channel, dB; the tensors matched by
    onnxruntime.quantization.qdq_loss_debug) falls from its input to its output on `batches`.

    Note: the QDQ model with every intermediate tensor as an output runs unfused (each tensor must exist), so this
    ranks rounding, not a fused kernel's own error (the op-type scan measures those, fused)."""
    import tempfile

    from onnxruntime.quantization import qdq_loss_debug as debug

    activations = {}  # type: Dict[str, Dict[str, List[np.ndarray]]]
    with tempfile.TemporaryDirectory(prefix="edgedyn-sensitivity-") as workdir:
        for label, graph in (("float", model), ("int8", quantized)):
            plain, every = "{}/{}.onnx".format(workdir, label), "{}/{}-every.onnx".format(workdir, label)
            onnx.save(graph, plain)
            debug.modify_model_output_intermediate_tensors(plain, every)
            activations[label] = debug.collect_activations(every, Reader(batches, input_names))
    matched = debug.create_activation_matching(activations["int8"], activations["float"])
    ratio = {}  # type: Dict[str, float]
    for name, pair in matched.items():
        if pair.get("float") and pair.get("post_qdq"):
            ratio[name] = _channel_snr_db(np.stack(pair["float"]), np.stack(pair["post_qdq"]))
    clean = max(ratio.values()) if ratio else 200.0
    consumers = {}  # type: Dict[str, List[Any]]
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def quantized_output(name: str) -> Optional[str]:
        """The tensor where a layer's output is quantized: its own, or, when the quantizer fused the activation
        after it (Conv + Clip/Relu), that activation's output."""
        for _ in range(3):
            if name in ratio:
                return name
            after = consumers.get(name, [])
            if len(after) != 1 or after[0].op_type not in FUSED_ACTIVATIONS:
                return None
            name = after[0].output[0]
        return None

    ranked = []  # type: List[Tuple[float, Any]]
    for node in model.graph.node:
        output = quantized_output(node.output[0]) if node.op_type in LAYERS and node.name not in skip else None
        if output is not None:
            ranked.append((ratio.get(node.input[0], clean) - ratio[output], node))
    return sorted(ranked, key=lambda pair: -pair[0])


def _channel_snr_db(want: np.ndarray, got: np.ndarray) -> float:
    """The mean over channels (axis 2 of the stacked [batch, N, C, ...] NCHW activations, the last axis of others)
    of each channel's signal-to-noise ratio in dB, each within [-20, 200]. Per channel, because one wide channel
    sets a per-tensor int8 scale that leaves the others a few levels, and a whole-tensor ratio, dominated by that
    channel, then hides the loss until the next layer mixes the channels."""
    axis = 2 if want.ndim == 5 else want.ndim - 1
    want = np.moveaxis(want.astype(np.float64), axis, 0).reshape(want.shape[axis], -1)
    got = np.moveaxis(got.astype(np.float64), axis, 0).reshape(want.shape[0], -1)
    signal, noise = np.sum(want * want, axis=1), np.sum((want - got) ** 2, axis=1)
    live = signal > 0
    if not np.any(live):
        return 200.0
    with np.errstate(divide="ignore"):
        db = 10.0 * np.log10(signal[live] / np.maximum(noise[live], 1e-30))
    return float(np.mean(np.clip(db, -20.0, 200.0)))


class Reader:
    """onnxruntime's CalibrationDataReader protocol over batches of arrays."""

    def __init__(self, batches: List[Any], names: List[str]) -> None:
        self._batches = batches
        self._names = names
        self._iterator = self._feeds()

    def _feeds(self) -> Any:
        for batch in self._batches:
            yield dict(zip(self._names, batch))

    def get_next(self) -> Any:
        return next(self._iterator, None)

    def rewind(self) -> None:
        self._iterator = self._feeds()

    def __iter__(self) -> Any:
        return self._feeds()


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
