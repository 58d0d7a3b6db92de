"""What `edgedyn.export(..., quantize=...)` does around the backends: check the request before any work, hand each
specialization its calibration batches, then measure the quantized artifact against torch eager and apply the gate.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgedyn import calibration as calibration_data
from edgedyn.errors import EdgedynError
from edgedyn.quantize import Quantization, check_backend, check_mode
from edgedyn.quantize.accuracy import DEFAULT_GATE, MIN_EVAL_SAMPLES, Gate, check, compare_outputs, parse_gate
from edgedyn.runtime.program import EXPECTED_ROLE


class AccuracyWarning(UserWarning):
    """The int8 accuracy was measured on too few held-out samples to be trusted."""


@dataclass(frozen=True)
class Plan:
    mode: str
    calibration: Optional[calibration_data.Samples]
    evaluation: Optional[calibration_data.Samples]
    gate: Optional[Gate]
    # One HeldOut per specialization name: torch eager runs once on its held-out batches, however many candidates
    # are measured against them.
    _held_out: Dict[str, "HeldOut"] = field(default_factory=dict, compare=False, repr=False)

    def quantization(self, spec: Any) -> Quantization:
        """The backend's input for one specialization: calibration batches of its shapes, and the held-out check
        with which `auto` drops a candidate that misses the gate (and keeps the fastest one that passes)."""
        batches = []  # type: List[List[np.ndarray]]
        if self.mode == "int8" and self.calibration is not None:
            batches = calibration_data.batches(self.calibration, *_shapes(spec), names=spec.tensor_inputs)
        gate = self.gate if self.gate is not None and self.gate.min_cosine is not None else DEFAULT_GATE
        held_out = self.held_out(spec)
        return Quantization(mode=self.mode, calibration=batches, target_cosine=gate.min_cosine,
                            source=self.calibration.source if self.calibration else "",
                            held_out=held_out.check, held_out_batches=held_out.batches)

    def held_out(self, spec: Any) -> "HeldOut":
        if spec.name not in self._held_out:
            self._held_out[spec.name] = HeldOut(self, spec)
        return self._held_out[spec.name]

    def evaluation_batches(self, spec: Any) -> Tuple[List[List[np.ndarray]], str]:
        if self.evaluation is None:  # int8-weights without data: the example inputs are all there is
            return [[t.numpy() for t in spec.example_tensors]], "the example inputs"
        return (calibration_data.batches(self.evaluation, *_shapes(spec), seed=1, names=spec.tensor_inputs),
                self.evaluation.source)


def plan(mode: Optional[str], backend: str, device: str, calibration: Any = None, eval_inputs: Any = None,
         max_accuracy_drop: Optional[str] = None, precision: str = "fp32") -> Optional[Plan]:
    """Checks the quantization options before any work; None when not quantizing. Without --quantize,
    --eval-inputs and --max-accuracy-drop serve a reduced float precision's gate (any --precision but fp32)."""
    check_mode(mode)
    if mode is None:
        given = [name for name, value in (("--calibration", calibration), ("--eval-inputs", eval_inputs),
                                          ("--max-accuracy-drop", max_accuracy_drop)) if value is not None]
        if precision != "fp32":
            given = [name for name in given if name == "--calibration"]
        if given:
            raise EdgedynError("{} applies only with --quantize{}".format(
                ", ".join(given), "" if given == ["--calibration"] else " or a reduced --precision"),
                hint="add --quantize int8 (or int8-weights), or drop {}".format(", ".join(given)))
        return None
    check_backend(mode, backend)
    if device == "gpu":
        raise EdgedynError("--quantize {} builds CPU artifacts (onnxruntime, tflite); --device gpu builds TVM CUDA "
                           "code, which has no int8 path".format(mode), hint="use --device cpu or auto")
    if mode == "int8" and calibration is None:
        raise EdgedynError(calibration_data.RANDOM_REFUSED.format(mode=mode), hint=calibration_data.RANDOM_HINT)
    gate = parse_gate(max_accuracy_drop)
    samples = calibration_data.load(calibration) if calibration is not None else None
    evaluation = None  # type: Optional[calibration_data.Samples]
    if eval_inputs is not None:
        evaluation = calibration_data.load(eval_inputs, "--eval-inputs")
    elif samples is not None:
        samples, evaluation = calibration_data.split(samples)
    return Plan(mode=mode, calibration=samples, evaluation=evaluation, gate=gate)


def measure(plan: Plan, spec: Any, run: Callable[[List[np.ndarray]], List[np.ndarray]]) -> Dict[str, Any]:
    """What `finish` records of a quantized artifact, from `run` (its executor here): its accuracy records on the
    held-out split (HeldOut.measure) and its outputs on the example inputs. The gate `auto` applies to each int8
    candidate keeps the same on it (Artifact.measured: candidates.py, onboard.py), so the export does not run the
    one it keeps on the held-out split a second time."""
    records = plan.held_out(spec).measure(run)
    return measured(records, run([np.asarray(t.numpy(), order="C") for t in spec.example_tensors]), None)


def measured(records: List[Dict[str, Any]], examples: List[np.ndarray], where: Optional[str]) -> Dict[str, Any]:
    """What `finish` takes: the held-out accuracy records, the outputs on the example inputs, and where they were
    computed (words, or None for this machine)."""
    return {"records": records, "examples": examples, "where": where}


def example_gate(spec: Any, floats: str, examples: List[Any], min_cosine: float, label: str) -> None:
    """An int8 artifact whose layers kept out of int8 compute in bf16 or fp16 is verified by its outputs on the
    example inputs against torch eager at the int8 gate's cosine (runtime/program.reduced_gate), not against
    outputs recorded here, since CPUs differ in those layers. The held-out mean can pass while the example alone
    misses, and the export would then refuse the bundle it wrote as a bug: GateMissError, so `auto` drops the
    candidate as it drops one that misses on the held-out split. int8 with fp32 float layers is verified against
    its recorded outputs and has nothing to check here."""
    from edgedyn.errors import GateMissError
    from edgedyn.quantize.precision import example_misses
    from edgedyn.runtime.precision import REDUCED

    misses = example_misses(spec.output_names, examples, spec.reference_outputs, min_cosine) \
        if floats in REDUCED else []
    if misses:
        raise GateMissError("{} (int8, its float layers in {}) misses the int8 gate: {}".format(
            label, floats, "; ".join(misses)),
            hint="pass example inputs drawn like your calibration data (the bundle's reference call), or "
                 "--precision fp32 so that the layers kept out of int8 compute in fp32")


def finish(plan: Plan, artifact: Any, spec: Any, found: Dict[str, Any]) -> Any:
    """Records a quantized artifact's accuracy against torch eager on held-out inputs and its outputs on the
    example inputs (`found`, as `measure` returns it), and applies the gate."""
    from edgedyn.runtime.format import pack_arrays

    if "quantization" not in artifact.meta:
        return artifact  # `auto` kept fp32, faster here than every int8 candidate (its selection says so)
    held_out = plan.held_out(spec)
    outputs, expected, measured_on = found["records"], found["examples"], found["where"]
    record = dict(artifact.meta["quantization"])
    record["calibration"] = {"source": plan.calibration.source if plan.calibration else None,
                             "batches": len(plan.quantization(spec).calibration) if plan.mode == "int8" else 0}
    record["accuracy"] = {"reference": "torch eager (float32)", "inputs": held_out.source,
                          "batches": len(held_out.batches), "outputs": outputs}
    record["accuracy"]["gate"] = (plan.gate or DEFAULT_GATE).to_dict()
    record["accuracy"]["gate_source"] = "--max-accuracy-drop" if plan.gate is not None else "default"
    if measured_on is not None:
        record["accuracy"]["measured_on"] = measured_on
    samples = outputs[0]["samples"] if outputs else 0
    if samples < MIN_EVAL_SAMPLES:
        import warnings

        warnings.warn("{} ({}): int8 accuracy measured on {} held-out sample(s), fewer than {}: the numbers are "
                      "noisy; pass more calibration data or --eval-inputs".format(
                          spec.name, artifact.backend, samples, MIN_EVAL_SAMPLES), AccuracyWarning, stacklevel=3)
        record["accuracy"]["warning"] = "only {} held-out sample(s)".format(samples)
    check(plan.gate, outputs, "{} ({})".format(spec.name, artifact.backend))
    artifact.meta = dict(artifact.meta, quantization=record)
    artifact.files = dict(artifact.files, **{EXPECTED_ROLE: pack_arrays(
        {"output.{}".format(i): np.asarray(a) for i, a in enumerate(expected)})})
    artifact.file_names = dict(artifact.file_names, **{EXPECTED_ROLE: "expected.npz"})
    return artifact


class HeldOut:
    """One specialization's held-out batches and torch eager's outputs on them (computed on first use, once):
    measures a quantized artifact's outputs against them and applies the gate."""

    def __init__(self, plan: Plan, spec: Any) -> None:
        self._plan = plan
        self._spec = spec
        self.batches, self.source = plan.evaluation_batches(spec)
        self._want = None  # type: Optional[List[List[np.ndarray]]]

    def _reference(self) -> List[List[np.ndarray]]:
        if self._want is None:
            import torch

            module = self._spec.program.module()
            with torch.no_grad():
                self._want = [[o.detach().numpy() for o in module(*[torch.from_numpy(a) for a in batch])]
                              for batch in self.batches]
        return self._want

    def measure(self, run: Callable[[List[np.ndarray]], List[np.ndarray]]) -> List[Dict[str, Any]]:
        """Per output: the accuracy record (accuracy.compare_outputs) of `run` against torch eager."""
        want = self._reference()
        return compare_outputs(self._spec.output_names, [[np.asarray(o) for o in run(batch)]
                                                         for batch in self.batches], want)

    def check(self, backend: str, run: Callable[[List[np.ndarray]], List[np.ndarray]]) -> List[Dict[str, Any]]:
        """The accuracy records of `run`; EdgedynError with the numbers when they miss the gate."""
        outputs = self.measure(run)
        check(self._plan.gate, outputs, "{} ({})".format(self._spec.name, backend))
        return outputs


def _shapes(spec: Any) -> Tuple[List[List[int]], List[Any]]:
    return [list(t.shape) for t in spec.example_tensors], [t.numpy().dtype for t in spec.example_tensors]


def float_ops_text(kept: List[Dict[str, str]]) -> str:
    """What the quantizer kept in float and why, grouped: `Softmax x2, LayerNormalization x4 (sensitive ...)`."""
    if not kept:
        return "none (every quantizable op is int8)"
    groups = {}  # type: Dict[str, Dict[str, int]]
    for entry in kept:
        ops = groups.setdefault(entry["why"], {})
        ops[entry["op"]] = ops.get(entry["op"], 0) + 1
    return "; ".join("{} ({})".format(", ".join("{} x{}".format(op, n) for op, n in sorted(ops.items())), why)
                     for why, ops in groups.items())


def summary(artifact_record: Dict[str, Any]) -> Optional[str]:
    """One line for people: mode, weights before and after, and the agreement numbers."""
    record = artifact_record.get("quantization")
    if not record:
        return None
    weights = record.get("weights", {})
    parts = ["{} ({})".format(record["mode"], artifact_record["backend"])]
    if weights:
        parts.append("weights {} -> {} bytes".format(weights.get("fp32_bytes"), weights.get("quantized_bytes")))
    if "float_ops" in record:
        parts.append("kept in float: " + float_ops_text(record["float_ops"]))
    fastest = (artifact_record.get("selection") or {}).get("fastest_by_precision") or {}
    if "int8" in fastest and "fp32" in fastest:
        parts.append("{:.2f}x the speed of fp32 ({:.3g} against {:.3g} ms, timed in turns)".format(
            fastest["fp32"]["ms"] / fastest["int8"]["ms"], fastest["int8"]["ms"], fastest["fp32"]["ms"]))
    for output in record.get("accuracy", {}).get("outputs", []):
        parts.append("{}: max abs error {:.4g}, cosine {:.5f}{}".format(
            output["name"], output["max_abs_error"], output["cosine"],
            ", top-1 agreement {:.1%}".format(output["top1_agreement"]) if "top1_agreement" in output else ""))
    return "; ".join(parts)


