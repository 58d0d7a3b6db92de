"""Reduced float precisions (bf16, fp16) on the CPU: what the export asks for, and the accuracy gate each one meets.

`--precision auto` (the default) lets `auto` build, beside fp32, every reduced precision that a backend computes
natively on this CPU (edgedyn/runtime/precision.py), and keeps one only when it passes the gate and is faster;
`--precision fp32` keeps exact fp32; `--precision bf16|fp16` builds only that one (still gated). int8 is
`--quantize`, not a precision: it needs calibration data.

Note: the accuracy of a reduced precision is measured where its arithmetic really happens, never estimated: the
candidate artifact runs on this CPU (which has the feature, or the candidate is not built) on the evaluation
inputs, against torch eager in fp32 on the same inputs. Without --eval-inputs those are the specialization's
example inputs and EVAL_SAMPLES more drawn like them (floats: normal with the example's mean and spread; integers:
uniform over the example's range; booleans: as the example's share of True). Random inputs exercise the arithmetic,
not your data's distribution: pass --eval-inputs for numbers about your data. The default gate (FLOAT_GATE) is
strict, since a float reduction should cost almost nothing: cosine >= 0.999 on every output; --max-accuracy-drop
replaces it (`top1=1%` adds a bound on classifier-shaped outputs). Top-1 agreement is always measured and recorded,
but not bounded by default: on 9 samples one flipped row is 11%, and a random-weight classifier's logits are
often near ties that any rounding flips (the example TinyCNN in bf16: cosine 0.99998, one row of 9 flipped).
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from edgedyn import calibration as calibration_data
from edgedyn.errors import EdgedynError, GateMissError
from edgedyn.quantize.accuracy import (DETECTION_DROP, Gate, compare_outputs, detection_words, misses_of, parse_gate,
                                       rows_differ)
from edgedyn.runtime.precision import FP32, PRECISIONS, fp32_layers_words

AUTO = "auto"
CHOICES = (AUTO,) + PRECISIONS
EVAL_SAMPLES = 8
FLOAT_GATE = Gate(min_cosine=0.999)
DETECTION_HINT = ("keep fp32 with --precision fp32 (auto does so by itself), or accept a share of changed detections "
                  "with --max-accuracy-drop top1=5%")
FLOAT_GATE_WORDS = "cosine >= 0.999 on every output, {:.0%} of detections matched".format(1 - DETECTION_DROP)
MISS_HINT = ("keep fp32 with --precision fp32 (auto does so by itself), or accept more with --max-accuracy-drop "
             "(e.g. cosine=0.99)")


def check_precision(precision: str) -> None:
    if precision not in CHOICES:
        raise EdgedynError("unknown precision '{}'; choose from: {}".format(precision, ", ".join(CHOICES)),
                           hint="auto: fp32 and the reduced precisions this CPU computes natively that pass the "
                                "accuracy gate; fp32: exact; bf16 / fp16: only that one")


def wanted(precision: str) -> List[str]:
    """The CPU precisions an export asking for `precision` may build: all of them for auto."""
    check_precision(precision)
    return list(PRECISIONS) if precision == AUTO else [precision]


@dataclass
class FloatGate:
    """One specialization's evaluation inputs, torch eager's outputs on them (computed once, on first use), and the
    gate a reduced-precision candidate must meet."""

    spec: Any
    gate: Gate
    gate_source: str  # "default" or "--max-accuracy-drop"
    batches: List[List[np.ndarray]]
    source: str
    _want: Optional[List[List[np.ndarray]]] = field(default=None, repr=False)

    def _reference(self) -> List[List[np.ndarray]]:
        if self._want is None:
            import torch

            module = self.spec.program.module()
            with torch.no_grad():
                self._want = [[np.asarray(o.detach().numpy()) for o in _flat(module(*[torch.from_numpy(a)
                                                                                       for a in batch]))]
                              for batch in self.batches]
        return self._want

    def first(self, count: int) -> "FloatGate":
        """The same gate over its first `count` batches (a probe's: edgedyn/layer_probe.py), sharing the reference."""
        want = self._reference()[:count] if self._want is not None else None
        return FloatGate(self.spec, self.gate, self.gate_source, self.batches[:count], self.source, want)

    def measure(self, run: Callable[[List[np.ndarray]], List[Any]]) -> List[Dict[str, Any]]:
        """Per output: max abs error, cosine, top-1 agreement of `run` against torch eager on the batches; the
        outputs of a detection group (boxes, scores, labels, count) also get the group's detections compared."""
        want = self._reference()
        return compare_outputs(list(self.spec.output_names), [[np.asarray(o) for o in run(batch)]
                                                               for batch in self.batches], want)

    def check(self, label: str, precision: str, run: Callable[[List[np.ndarray]], List[Any]],
              example_outputs: Optional[List[Any]] = None) -> Dict[str, Any]:
        """The accuracy record of a candidate computing in `precision`; EdgedynError with the numbers on a miss.
        `example_outputs`: its outputs on the example inputs when they were computed already (on an emulated board,
        where `run` replays the board's outputs for the gate's batches only); else `run` computes them."""
        outputs = self.measure(run)
        misses = misses_of(self.gate, outputs) or self._reference_misses(run, example_outputs)
        record = {"precision": precision, "reference": "torch eager (float32)", "inputs": self.source,
                  "samples": len(self.batches), "outputs": outputs, "gate": self.gate.to_dict(),
                  "gate_source": self.gate_source}
        if misses:
            raise GateMissError("{} in {} misses {}: {}".format(
                label, precision, "the float accuracy gate ({})".format(FLOAT_GATE_WORDS)
                if self.gate_source == "default" else "--max-accuracy-drop", "; ".join(misses)),
                hint=DETECTION_HINT if rows_differ(self.gate, outputs) else MISS_HINT)
        return record

    def _reference_misses(self, run: Callable[[List[np.ndarray]], List[Any]],
                          example_outputs: Optional[List[Any]] = None) -> List[str]:
        """The bundle's own reference call (the example inputs, which `edgedyn verify` and the export's last check
        run) held to the cosine verify holds a reduced-precision artifact to (runtime/program.reduced_gate): the
        gate's mean over its inputs can pass while the example alone misses, and the export would then refuse
        the bundle it wrote as a bug (timm's EfficientViT-B0, OpenVINO bf16 with its first 35% of layers fp32:
        the example's relative error 5.6% after the gate passed). Against the bundle's own reference outputs
        (torch eager's on the example inputs, computed at capture), which are what verify compares with."""
        from edgedyn.runtime.program import DEFAULT_MIN_COSINE

        bound = self.gate.min_cosine if self.gate.min_cosine is not None else DEFAULT_MIN_COSINE
        if example_outputs is None:
            example_outputs = run([np.asarray(t.numpy(), order="C") for t in self.spec.example_tensors])
        return example_misses(self.spec.output_names, example_outputs, self.spec.reference_outputs, bound)


def example_misses(names: List[str], got: List[Any], want: List[np.ndarray], bound: float) -> List[str]:
    """The outputs on the example inputs whose cosine to torch eager's (`want`) is below `bound`, in words: what
    `edgedyn verify` and the export's last check would refuse in a reduced-precision bundle."""
    from edgedyn.runtime.program import compare_cosine

    return ["{} cosine {:.6f} < {:g} on the example inputs (the bundle's reference, which verify checks)".format(
        name, result.get("cosine", float("nan")), bound)
        for name, result in zip(names, (compare_cosine(np.asarray(g), w, bound) for g, w in zip(got, want)))
        if not result["ok"]]


def float_gate(spec: Any, eval_inputs: Any = None, max_accuracy_drop: Optional[str] = None,
               seed: int = 7) -> FloatGate:
    """The gate of one specialization: --max-accuracy-drop or FLOAT_GATE, on --eval-inputs or inputs drawn like
    the example ones (see the module docstring)."""
    gate = parse_gate(max_accuracy_drop)
    shapes = [list(t.shape) for t in spec.example_tensors]
    dtypes = [t.numpy().dtype for t in spec.example_tensors]
    if eval_inputs is not None:
        samples = calibration_data.load(eval_inputs, "--eval-inputs")
        batches = calibration_data.batches(samples, shapes, dtypes, seed=seed, names=spec.tensor_inputs)
        source = samples.source
    else:
        examples = [np.asarray(t.numpy(), order="C") for t in spec.example_tensors]
        rng = np.random.default_rng(seed)
        batches = [examples] + [[like(rng, a) for a in examples] for _ in range(EVAL_SAMPLES)]
        source = "the example inputs and {} drawn like them".format(EVAL_SAMPLES)
    return FloatGate(spec=spec, gate=gate if gate is not None else FLOAT_GATE,
                     gate_source="--max-accuracy-drop" if gate is not None else "default", batches=batches,
                     source=source)


def like(rng: Any, example: np.ndarray) -> np.ndarray:
    """A random array of the example's shape and dtype, drawn as described in the module docstring."""
    if example.dtype == np.bool_:
        return rng.random(example.shape) < float(np.mean(example)) if example.size else example.copy()
    if np.issubdtype(example.dtype, np.integer):
        low, high = (int(example.min()), int(example.max())) if example.size else (0, 0)
        return rng.integers(low, high + 1, example.shape).astype(example.dtype)
    mean = float(np.mean(example)) if example.size else 0.0
    spread = float(np.std(example)) if example.size > 1 else 1.0
    return (rng.standard_normal(example.shape) * (spread or 1.0) + mean).astype(example.dtype)


def _flat(value: Any) -> List[Any]:
    if isinstance(value, (list, tuple)):
        flat = []  # type: List[Any]
        for item in value:
            flat.extend(_flat(item))
        return flat
    return [value]


def summary(artifact: Dict[str, Any]) -> Optional[str]:
    """One line for people about a CPU artifact computing in bf16 or fp16: its accuracy and its speed against the
    fastest fp32 candidate; None for fp32 and int8 artifacts."""
    precision = artifact.get("precision", FP32)
    if precision == FP32 or precision not in PRECISIONS or artifact.get("device", "cpu") != "cpu":
        return None
    parts = ["{} in {}".format(artifact["backend"], precision)]
    mixed = fp32_layers_words(artifact)
    if mixed:
        parts[0] += " ({})".format(mixed)
    fastest = (artifact.get("selection") or {}).get("fastest_by_precision") or {}
    if precision in fastest and FP32 in fastest:
        parts.append("{:.2f}x the speed of fp32 ({:.3g} against {} {:.3g} ms, timed in turns)".format(
            fastest[FP32]["ms"] / fastest[precision]["ms"], fastest[precision]["ms"], fastest[FP32]["candidate"],
            fastest[FP32]["ms"]))
    for output in (artifact.get("accuracy") or {}).get("outputs", []):
        if output.get("compared") == "as detections":
            if output["name"] == output.get("group"):
                parts.append(detection_words(output))
            continue
        parts.append("{}: cosine {:.6f}, max abs error {:.4g}{}".format(
            output["name"], output["cosine"], output["max_abs_error"],
            ", top-1 agreement {:.1%}".format(output["top1_agreement"]) if "top1_agreement" in output else ""))
    return "; ".join(parts)
