"""What `--backend auto` may keep (a backend and the precision its artifact computes in), how each candidate is
built, and how it is checked before it may be timed: fp32 against torch eager within the fp32 tolerance, a reduced
float precision against the float accuracy gate (quantize/precision.py), int8 against the --quantize gate on the
held-out split (quantize/plan.py). edgedyn/selection.py times the ones that pass and keeps the fastest.
"""
import contextlib
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from edgedyn.registry import AUTO, BACKENDS
from edgedyn.backends.artifact import Artifact, Build, open_executor
from edgedyn.boards import Board, Target
from edgedyn.errors import BackendError, EdgedynError, GateMissError
from edgedyn.frontend import Specialization
from edgedyn.passes import pipeline_passes, run_pipeline
from edgedyn.runtime.detections import compare_outputs
from edgedyn.runtime.format import host_arch
from edgedyn.runtime.precision import FP32, REDUCED, expand, host_features, is_native, missing_words
from edgedyn.runtime.program import FP32_TOLERANCE, compare
from edgedyn.turns import attempt

Progress = Callable[[str], None]
INT8 = "int8"


# The shares of a reduced-precision artifact's first layers kept in fp32 when the whole artifact misses its float gate
# on a backend that mixes (Backend.mixes): a rounding near the inputs has the whole network to grow through
# (DeepLabV3-MobileNetV3 in bf16 on OpenVINO: cosine 0.9965 to torch, 0.9990 with the first tenth of its layers in
# fp32, at 2-5% over all-bf16; past its first ten convolution groups none alone in fp32 gains more than 0.0001, and
# the first ones compound, so no choice cheaper than a prefix passes: benchmarks/mixed_layers.py). The largest is
# tried first: when even half the layers in fp32 miss, no share will do (one build spent, not four); when it passes,
# the smaller ones in turn up to the first that passes. Above half, fp32 would be about as fast.
FP32_SHARES = (0.1, 0.2, 0.35, 0.5)


@dataclass(frozen=True)
class Candidate:
    """One thing `auto` may keep: a backend and the precision its artifact computes in (fp32, bf16, fp16, or int8
    for a --quantize build), with the share of its first layers kept in fp32 (a reduced precision that mixes)."""

    backend: str
    precision: str = FP32
    fp32_share: float = 0.0
    fp32_layers: Tuple[str, ...] = ()  # the layers a probe found its reduced precision costs most in (layer_probe.py)
    floats: str = FP32  # an int8 candidate's: the precision of its layers kept out of int8 (int8_floats)

    @property
    def label(self) -> str:
        """`onnxruntime` for fp32, `openvino:bf16`, `tflite:int8`, `openvino:bf16+fp32-first-10%`: the keys of the
        selection record."""
        label = self.backend if self.precision == FP32 else "{}:{}".format(self.backend, self.precision)
        label += "+fp32-{}-layers".format(len(self.fp32_layers)) if self.fp32_layers else ""
        return label + ("+fp32-first-{:.0%}".format(self.fp32_share) if self.fp32_share else "")

    @property
    def words(self) -> str:
        words = self.backend if self.precision == FP32 else "{} in {}".format(self.backend, self.precision)
        words += " (float layers in {})".format(self.floats) if self.floats != FP32 else ""
        count = len(self.fp32_layers)
        words += " with the {} it costs most accuracy in fp32".format(
            "layer" if count == 1 else "{} layers".format(count)) if count else ""
        return words + (" with its first {:.0%} of layers in fp32".format(self.fp32_share) if self.fp32_share else "")


def missed_gate(candidate: Candidate, error: Optional[EdgedynError]) -> bool:
    """Whether a reduced-precision candidate was rejected for its numbers (GateMissError: its gate missed, or values
    beyond the precision's range), which keeping its first layers in fp32 may mend (more_fp32)."""
    return candidate.precision in REDUCED and isinstance(error, GateMissError)


def more_fp32(candidate: Candidate, passed: bool) -> List[Candidate]:
    """The candidate to try after `candidate` met (`passed`) or missed its float gate: on a backend that mixes, the
    same with another share of FP32_SHARES of its first layers in fp32 (the order in FP32_SHARES' note); else none."""
    if candidate.precision not in REDUCED or not BACKENDS[candidate.backend].mixes:
        return []
    share, top = candidate.fp32_share, FP32_SHARES[-1]
    if share == 0:
        shares = [] if passed else [top]
    elif share == top:
        shares = [FP32_SHARES[0]] if passed else []
    else:
        shares = [] if passed else [s for s in FP32_SHARES[:-1] if s > share][:1]
    return [replace(candidate, fp32_share=s) for s in shares]


def candidates(board: Board, quantization: Optional[Any] = None) -> List[str]:
    """Registered backends, the board's preference first (it breaks ties), then the rest by name; with
    `quantization`, only those with int8 kernels."""
    usable = [name for name, record in BACKENDS.items() if quantization is None or record.quantizes]
    preferred = [name for name in board.backends if name in usable]
    return preferred + sorted(name for name in usable if name not in preferred)


def candidate_list(backend: str, board: Board, quantization: Optional[Any], precision: str,
                   features: FrozenSet[str], gated: bool = True) -> List[Candidate]:
    """The candidates of one export, in the board's preference order (it breaks ties), int8 first under
    --quantize (a tie keeps what the user asked for).

    A reduced precision is a candidate when the backend computes it on the board's architecture, the export has
    a gate to hold it to (`gated`), and the CPU that measures it has the feature (`features`: this host's for its
    own board, the board file's when its emulated CPU measures, none otherwise: a gate is never estimated). With
    --quantize and a backend named, only its int8 build: the user's choice is never second-guessed."""
    from edgedyn.quantize.precision import wanted

    names = [backend] if backend != AUTO else candidates(board)
    listed = []  # type: List[Candidate]
    if quantization is not None:
        listed += [Candidate(name, INT8, floats=int8_floats(name, board, precision, features)) for name in names
                   if BACKENDS[name].quantizes]
        if backend != AUTO:
            return listed
    for name in names:
        for option in wanted(precision):
            if option == FP32 or (gated and BACKENDS[name].computes(option, board.arch)
                                  and is_native(option, board.arch, features)):
                listed.append(Candidate(name, option))
    return listed


def held_back(listed: List[Candidate], backend: str, target: Target) -> Tuple[List[Candidate], List[Candidate],
                                                                          Dict[str, str]]:
    """(the candidates `auto` builds first, those it builds only when none of the first verifies, why each of these
    waits): a backend whose record says it is slow untuned (Backend.held_back_untuned) waits until the target has
    tuning records (`edgedyn tune`). A backend the user named is always built."""
    from edgedyn.backends.tuning_records import database_dir, record_count

    first, later, why = [], [], {}  # type: List[Candidate], List[Candidate], Dict[str, str]
    for candidate in listed:
        reason = BACKENDS[candidate.backend].held_back_untuned
        if backend != AUTO or not reason or record_count(database_dir(target.name)):
            first.append(candidate)
            continue
        later.append(candidate)
        why[candidate.label] = "built only if no other candidate verifies: {}; it has no tuning records for {} " \
                               "(edgedyn tune writes them; --backend {} builds it anyway)".format(
                                   reason, target.name, candidate.backend)
    return first, later, why


def int8_floats(backend: str, board: Board, precision: str, features: FrozenSet[str]) -> str:
    """The precision an int8 candidate's float layers compute in: the first reduced precision the export allows
    (`precision`) that the backend computes on the board and the measuring CPU has (`features`), on a backend whose
    int8 artifacts take one (Backend.int8_floats); else fp32. Its held-out gate measures the two together."""
    from edgedyn.quantize.precision import wanted

    record = BACKENDS[backend]
    if record.int8_floats:
        for option in wanted(precision):
            if option in REDUCED and record.computes(option, board.arch) and is_native(option, board.arch, features):
                return option
    return FP32


def measuring_features(board: Board, here: bool, on_board: bool) -> FrozenSet[str]:
    """The CPU features of whatever will measure an export's candidates: this host for its own board, the board's
    emulated CPU (its board file's features) when that measures, else none."""
    if here:
        return host_features()
    return expand(board.cpu_features) if on_board else frozenset()


def no_candidate(backend: str, board: Board, precision: str, here: bool) -> EdgedynError:
    """Why an export asking for `precision` has nothing to build, and what to do."""
    able = sorted(name for name, record in BACKENDS.items() if record.computes(precision, board.arch))
    if not able:
        return EdgedynError("no backend computes {} on a {} CPU".format(precision, board.arch),
                            hint="use --precision auto or fp32")
    if backend != AUTO and backend not in able:
        return EdgedynError("backend {} does not compute {} on a {} CPU; backends that do: {}".format(
            backend, precision, board.arch, ", ".join(able)), hint="use --backend {} or --precision auto".format(
                able[0]))
    if not here and not is_native(precision, board.arch, board.cpu_features):
        return EdgedynError("{}'s CPU has no {} arithmetic (it needs {}; its board file lists {})".format(
            board.name, precision, missing_words(precision, board.arch), ", ".join(board.cpu_features) or "none"),
            hint="use --precision auto (fp32 on this board)")
    if here:
        return EdgedynError("{} would not run natively here: this CPU lacks {}, and its accuracy is measured where "
                            "its arithmetic happens, never estimated".format(precision,
                                                                             missing_words(precision, board.arch)),
                            hint="export on a machine with {}, or use --precision auto (fp32 here)".format(
                                missing_words(precision, board.arch)))
    return EdgedynError("{} for {} is measured on that board's CPU, and this export runs on a {} host".format(
        precision, board.name, host_arch()), hint="use --precision auto (fp32 for another board), install the "
                                                  "emulated board (qemu-user, qemu-user-static, mmdebstrap: bash "
                                                  "scripts/install.sh) to measure it there, or export on the board "
                                                  "itself")


def builder(programs: Dict[str, Any], board: Board, target: Target, spec: Specialization,
            quantization: Optional[Any]) -> Callable[[Candidate], Artifact]:
    """Builds a candidate from the graph of the pipeline its backend's record names: `programs["default"]` (the
    default pipeline's) or the captured program through that backend's own pipeline (run once into `programs`,
    kept for the other candidates)."""
    def build(candidate: Candidate) -> Artifact:
        name = candidate.backend
        pipeline = BACKENDS[name].pipeline
        if pipeline not in programs:
            programs[pipeline] = run_pipeline(spec.program, pipeline)
        int8 = candidate.precision == INT8

        def lower(tuning: bool) -> Artifact:
            return BACKENDS[name].build(Build(
                program=programs[pipeline], board=board, target=target, tensor_inputs=list(spec.tensor_inputs),
                quantization=quantization if int8 else None,
                precision=candidate.floats if int8 else candidate.precision,
                tuning=tuning, fp32_share=candidate.fp32_share, fp32_layers=candidate.fp32_layers))

        artifact = untuned_if_wrong(lower(True), spec, lambda: lower(False))
        if pipeline != "default":
            artifact.meta = dict(artifact.meta, pipeline={"name": pipeline, "passes": pipeline_passes(pipeline)})
        if not int8:
            artifact.meta = dict(artifact.meta, precision=candidate.precision)
        return artifact

    return build


class TuningRejectedWarning(UserWarning):
    """A build that took tuning records disagreed with torch eager and was built again without them."""


def untuned_if_wrong(artifact: Artifact, spec: Specialization, untuned: Callable[[], Artifact]) -> Artifact:
    """`artifact`, or, when it took tuning records and disagrees with torch eager here, the build without them.

    Note: a MetaSchedule record can compute the wrong thing (seen on x86: a tuned 1x1 convolution whose output
    buffer holds the next depthwise convolution's padding gave a MobileNetV2 relative error 0.43) while the same
    kernel untuned is right. The records were the user's choice, but a wrong tuned build must not cost them the
    export: the build is made again without them, and the warning and the manifest say why.
    """
    import warnings

    tuning = artifact.meta.get("tuning")
    if not tuning or not tuning.get("tuned_functions") or artifact.arch not in (None, host_arch()):
        return artifact  # untuned, or built for another CPU: the board's verify checks it there
    try:
        verify(artifact, spec)
        return artifact
    except BackendError as error:
        reason = error.message
    rebuilt = untuned()
    rejected = dict(tuning, tuned_functions=0, rejected="the build with {} tuned kernels disagreed with torch "
                    "eager ({}); built without the records".format(tuning["tuned_functions"], reason))
    rebuilt.meta = dict(rebuilt.meta, tuning=rejected)
    warnings.warn("tuning records of {} left out of this build: {}".format(
        tuning.get("database", "the tuning database"), rejected["rejected"]), TuningRejectedWarning, stacklevel=2)
    return rebuilt


def verify(artifact: Artifact, spec: Specialization) -> bool:
    """Runs the artifact on the example inputs: True, or EdgedynError if it disagrees with torch eager."""
    with contextlib.ExitStack() as stack:
        _open_checked(stack, artifact, spec)
    return True


def example_arrays(spec: Specialization) -> List[np.ndarray]:
    return [np.asarray(tensor.numpy(), order="C") for tensor in spec.example_tensors]


def checked(stack: contextlib.ExitStack, candidate: Candidate, artifact: Artifact, spec: Specialization,
            quantization: Optional[Any], accuracy: Optional[Any], rejected: Dict[str, str], missed: List[str],
            step: Progress) -> Any:
    """The candidate's executor, open until `stack` closes, once it agrees with torch eager and, for int8 or a
    reduced float precision, meets its accuracy gate; else None, the reason in `rejected` (a gate miss, with its
    numbers, also in `missed`) and in the progress.

    Note: the gate is checked per candidate, not only on the winner, because the fastest reduced-precision
    artifact is not always the most accurate (the zoo's MobileViT: TFLite's full-integer graph 0.955, the
    onnxruntime dynamic-int8 one 0.9997); one that misses must cost the user neither the export nor the others."""
    label = candidate.label
    errors = {}  # type: Dict[str, EdgedynError]
    executor = attempt(label, lambda: _open_checked(stack, artifact, spec), rejected, errors)
    if executor is None and missed_gate(candidate, errors.get(label)):  # beyond its range on the example inputs
        missed.append(label)
    gate = None  # type: Optional[Callable[[], Any]]
    if executor is not None and candidate.precision == INT8 and getattr(quantization, "held_out", None) is not None:
        gate = lambda: _measured_int8(artifact, candidate, spec, quantization, executor.run)  # noqa: E731
    elif executor is not None and candidate.precision in REDUCED:
        gate = lambda: artifact.meta.__setitem__(  # noqa: E731
            "accuracy", accuracy.check(label, candidate.precision, executor.run))
    if gate is not None and attempt(label, lambda: gate() or True, rejected) is None:
        # The record goes into a bundle that may well be written (with another candidate): no "no bundle" in it.
        rejected[label] = rejected[label].replace("; no bundle was written", "")
        missed.append(label)
        executor = None
    if executor is None:
        step("{}: rejected ({})".format(label, rejected[label]))
    return executor


def _measured_int8(artifact: Artifact, candidate: Candidate, spec: Specialization, quantization: Any,
                   run: Callable[[List[np.ndarray]], List[np.ndarray]]) -> None:
    """The int8 gate on the held-out split (EdgedynError with the numbers on a miss); what it measured stays on the
    artifact for the export's record (Artifact.measured)."""
    from edgedyn.quantize.plan import example_gate, measured

    records = quantization.held_out(candidate.backend, run)
    examples = run(example_arrays(spec))
    example_gate(spec, candidate.floats, examples, quantization.target_cosine, candidate.label)
    artifact.measured = measured(records, examples, None)


def gated(artifact: Artifact, candidate: Candidate, spec: Specialization, accuracy: Any) -> Dict[str, Any]:
    """The accuracy record of a reduced-precision artifact that runs here, once it meets the gate (EdgedynError with
    the numbers when it misses)."""
    with open_executor(artifact) as (executor, record):
        _check_outputs(artifact, record, executor.run(example_arrays(spec)), spec.reference_outputs,
                       spec.output_names, spec.detections)
        return accuracy.check(candidate.label, candidate.precision, executor.run)


def _open_checked(stack: contextlib.ExitStack, artifact: Artifact, spec: Specialization) -> Any:
    """The artifact's executor, open until `stack` closes, once its outputs on the example inputs agree with torch
    eager (EdgedynError if they do not)."""
    with contextlib.ExitStack() as opened:  # closed again at once when the check fails
        executor, record = opened.enter_context(open_executor(artifact))
        _check_outputs(artifact, record, executor.run(example_arrays(spec)), spec.reference_outputs,
                       spec.output_names, spec.detections)
        stack.enter_context(opened.pop_all())
    return executor


def check_outputs(artifact: Artifact, outputs: List[np.ndarray], spec: Specialization) -> None:
    """A candidate's outputs on the example inputs (computed here or on the emulated board) against torch eager's:
    within the fp32 tolerance (detections as matched rows), or, for int8 and reduced precisions, not broken (their
    gates judge the rest)."""
    _check_outputs(artifact, dict(artifact.meta), outputs, spec.reference_outputs, spec.output_names,
                   spec.detections)


def _check_outputs(artifact: Artifact, record: Dict[str, Any], outputs: List[np.ndarray],
                   expected: List[np.ndarray], names: List[str], detections: Any = None) -> None:
    if len(outputs) != len(expected):
        raise BackendError("{} returned {} outputs, torch eager {}".format(
            artifact.backend, len(outputs), len(expected)))
    if "quantization" in record or record.get("precision") in REDUCED:
        _check_sane(artifact, outputs, expected, "int8" if "quantization" in record else record["precision"], names)
        return
    tolerance = record.get("tolerance", FP32_TOLERANCE)
    for index, result in enumerate(compare_outputs(names, outputs, expected, tolerance, compare, detections)):
        if not result["ok"]:
            raise BackendError("{} disagrees with torch eager on output {}: {}".format(
                artifact.backend, index, result.get("error") or "max relative error {:.3g} (rtol {})".format(
                    result["max_rel"], tolerance["rtol"])))


def _check_sane(artifact: Artifact, outputs: List[np.ndarray], expected: List[np.ndarray], precision: str,
                names: List[str]) -> None:
    """int8 and reduced float precisions differ from fp32 by design: only a broken artifact (cosine below
    SANITY_COSINE) is rejected here; their gates judge the rest. The outputs of a detection group are padded lists
    that one row more or less shifts (no cosine says whether they are broken): the gate judges their rows."""
    from edgedyn.quantize.accuracy import SANITY_COSINE, output_metrics
    from edgedyn.runtime.detections import groups

    listed = {index for group in groups(names) for index in group.values()}
    for index, (got, want) in enumerate(zip(outputs, expected)):
        if np.shape(got) != np.shape(want):
            raise BackendError("{} output {}: shape {} != expected {}".format(
                artifact.backend, index, np.shape(got), np.shape(want)))
        finite = bool(np.all(np.isfinite(got)))
        if not finite and precision in REDUCED:  # fp16's largest is 65504: a range to keep, not a broken build
            raise GateMissError("{} in {} misses the float accuracy gate: output {} has values beyond {}'s range "
                               "(inf or nan)".format(artifact.backend, precision, index, precision),
                               hint="its first layers in fp32 may keep them in range (`auto` tries that on "
                                    "backends that mix); or --precision fp32")
        cosine = 1.0 if index in listed else output_metrics([got], [want])["cosine"]
        if not finite or cosine < SANITY_COSINE:
            raise BackendError("{} ({}) output {} has cosine {:.3f} to torch eager, below {}: a broken artifact, not "
                               "{} rounding".format(artifact.backend, precision, index, cosine, SANITY_COSINE,
                                                    precision))


def gate_missed(spec: Specialization, rejected: Dict[str, str], missed: List[str]) -> EdgedynError:
    """Every candidate that ran missed its accuracy gate: each one's numbers (and why the others did not build),
    with the gate's hint."""
    from edgedyn.quantize.accuracy import GATE_MISS_HINT

    others = ["{}: {}".format(name, reason) for name, reason in rejected.items() if name not in missed]
    misses = " | ".join(rejected[name] for name in missed)
    what = "int8 candidate" if all(name.endswith(":" + INT8) for name in missed) else "candidate"
    return EdgedynError("no {} for {} meets the accuracy gate: {}{}; no bundle was written".format(
        what, spec.name, misses, "; not built: " + "; ".join(others) if others else ""), hint=GATE_MISS_HINT)


def nothing_built(spec: Specialization, board: Board, rejected: Dict[str, str]) -> BackendError:
    reasons = "; ".join("{}: {}".format(name, reason) for name, reason in rejected.items()) or "none is registered"
    return BackendError("no backend could build {} for {}: {}".format(spec.name, board.name, reasons),
                        hint="install a backend (pip install 'edgedyn[onnxruntime]') or pick one with --backend")
