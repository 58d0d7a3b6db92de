"""Backend choice: which backend builds each specialization, and the record of why.

`--backend NAME` builds with that backend. `--backend auto` (the default):
- on the host's own board (same CPU architecture), builds every registered backend whose packages are installed,
  checks each against torch eager's outputs, times each on the specialization's example inputs and keeps the
  fastest that verified ("measured");
- for another board, takes the first backend of the board file's `backends.preference` that builds (and, when
  its artifact runs here too, verifies) ("board preference").
With `quantization` (--quantize), only backends with int8 kernels are built (edgedyn/quantize/__init__.py); a
candidate is checked for sanity against torch eager (cosine), not for float equality, then held to the accuracy gate
on the held-out split: one that misses is dropped with its numbers, and the fastest that passes is kept.
Measured here, the fp32 candidates are timed too, and the fp32 winner is kept when int8 is not faster (by
FP32_MUST_BEAT_INT8), saying so: int8 that costs time is no gain.
The choice and its reasons go into the artifact's manifest entry as `selection`.
"""
import contextlib
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from edgedyn.registry import AUTO, BACKENDS, check_backend_name
from edgedyn.backends.artifact import Artifact, Build, open_executor
from edgedyn.boards import Board, Target
from edgedyn.errors import BackendError, EdgedynError
from edgedyn.frontend import Specialization
from edgedyn.passes import pipeline_passes, run_pipeline
from edgedyn.runtime.format import host_arch
from edgedyn.runtime.detections import compare_outputs
from edgedyn.runtime.program import FP32_TOLERANCE, compare
from edgedyn.turns import DEFAULT_TIMING, Timing, attempt, timed_in_turns

__all__ = ["DEFAULT_TIMING", "Timing", "TuningRejectedWarning", "candidates", "check_backend_name", "choose",
           "untuned_if_wrong"]

Progress = Callable[[str], None]


def choose(backend: str, program: Any, board: Board, target: Target, spec: Specialization,
           progress: Optional[Progress] = None, timing: Timing = DEFAULT_TIMING,
           quantization: Optional[Any] = None) -> Artifact:
    """The artifact for one specialization, with `meta["selection"]` saying how it was chosen.

    `quantization`: an edgedyn.quantize.Quantization, handed to the backend (only those that quantize take it).
    """
    step = progress or (lambda message: None)
    check_backend_name(backend)
    # Each pipeline's graph, run once and shared by the int8 and the fp32 builder.
    programs = {"default": program}  # type: Dict[str, Any]
    build = _builder(programs, board, target, spec, quantization)
    if backend != AUTO:
        step("building {} with {} for {}".format(spec.name, backend, target.name))
        return _with_selection(build(backend), {"mode": "user", "requested": backend})
    if board.arch == host_arch():
        chosen = _threads_chosen(_measured(build, board, spec, step, timing, quantization), spec, timing, step)
        if quantization is not None:
            try:
                fp32 = _measured(_builder(programs, board, target, spec, None), board, spec, step, timing, None)
            except BackendError:
                fp32 = None  # no fp32 candidate built: nothing to compare int8 with
            if fp32 is not None:
                # each at the thread count its bundle would run with, so the comparison is the bundles'
                chosen = _int8_or_fp32(chosen, _threads_chosen(fp32, spec, timing, step), spec, timing, step)
        return chosen
    return _by_preference(build, board, target, spec, step, quantization)


def _builder(programs: Dict[str, Any], board: Board, target: Target, spec: Specialization,
             quantization: Optional[Any]) -> Callable[[str], Artifact]:
    """Builds a backend from the graph of the pipeline its record names: `programs["default"]` (the default
    pipeline's) or the captured program through that backend's own pipeline (run once into `programs`, kept for
    the other candidates and for the fp32 builder beside the int8 one)."""
    def build(name: str) -> Artifact:
        pipeline = BACKENDS[name].pipeline
        if pipeline not in programs:
            programs[pipeline] = run_pipeline(spec.program, pipeline)

        def lower(tuning: bool) -> Artifact:
            return BACKENDS[name].build(Build(program=programs[pipeline], board=board, target=target,
                                              tensor_inputs=list(spec.tensor_inputs), quantization=quantization,
                                              tuning=tuning))

        artifact = untuned_if_wrong(lower(True), spec, lambda: lower(False))
        if pipeline != "default":
            artifact.meta = dict(artifact.meta, pipeline={"name": pipeline, "passes": pipeline_passes(pipeline)})
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
        _verify(artifact, spec)
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


def candidates(board: Board, quantization: Optional[Any] = None) -> List[str]:
    """Registered backends, the board's preference first (it breaks ties), then the rest by name; with
    `quantization`, only those with int8 kernels."""
    usable = [name for name, record in BACKENDS.items() if quantization is None or record.quantizes]
    preferred = [name for name in board.backends if name in usable]
    return preferred + sorted(name for name in usable if name not in preferred)


def _measured(build: Callable[[str], Artifact], board: Board, spec: Specialization, step: Progress,
              timing: Timing, quantization: Optional[Any]) -> Artifact:
    verified = {}  # type: Dict[str, Artifact]
    rejected = {}  # type: Dict[str, str]
    missed = []  # type: List[str]  # int8 candidates that ran but missed the accuracy gate
    with contextlib.ExitStack() as stack:  # each verified executor stays open to be timed
        executors = {}  # type: Dict[str, Any]
        for name in candidates(board, quantization):
            step("building {} with {}".format(spec.name, name))
            artifact = attempt(name, lambda: build(name), rejected)
            if artifact is None:
                step("{}: skipped ({})".format(name, rejected[name]))
                continue
            executor = _checked(stack, name, artifact, spec, quantization, rejected, missed, step)
            if executor is None:
                continue
            step("{}: verified".format(name))
            verified[name], executors[name] = artifact, executor
        if not verified:
            raise _gate_missed(spec, rejected, missed) if missed else _nothing_built(spec, board, rejected)
        medians = timed_in_turns(executors, _example_arrays(spec), timing, rejected)
    if not medians:
        raise _nothing_built(spec, board, rejected)
    # Candidates come in preference order (dicts keep it), so a tie keeps the preferred one.
    chosen = min(medians, key=lambda name: medians[name])
    precision = "fp32" if quantization is None else quantization.mode
    step("chose {} for {} {} ({:.3g} ms)".format(chosen, spec.name, precision, medians[chosen]))
    return _with_selection(verified[chosen], {
        "mode": "measured", "chosen": chosen, "precision": precision, "why": _why(chosen, medians),
        "medians_ms": {k: round(v, 4) for k, v in sorted(medians.items())},
        "rejected": rejected, "timing": {"warmup": timing.warmup, "min_runs": timing.min_runs,
                                         "max_runs": timing.max_runs, "seconds": timing.seconds,
                                         "rounds": timing.rounds},
        "host": host_arch()})


def _why(chosen: str, medians: Dict[str, float]) -> str:
    """Why the measured winner won, in words: its time and how much faster it was than each other candidate."""
    others = sorted((m, name) for name, m in medians.items() if name != chosen)
    if not others:
        return "the only candidate that built and verified ({:.3g} ms)".format(medians[chosen])
    return "fastest of {} verified: {:.3g} ms; {}".format(len(medians), medians[chosen], ", ".join(
        "{} {:.3g} ms ({:.2f}x slower)".format(name, m, m / medians[chosen]) for m, name in others))


# Under --quantize, auto keeps the fastest fp32 artifact instead of int8 when it takes less than this share of
# int8's time. 1.0: int8 is kept only when the head-to-head measures it at least as fast. It was 0.9 (a near tie
# went to what the user asked for) until a speed.py run showed zoo:swin's and zoo:wav2vec2's int8 kept at 0.91x
# and 0.92x of their fp32: slower and less accurate is worse on both counts. A user who wants int8 for its size
# names the backend (`--backend tflite --quantize int8`), and that is never second-guessed.
FP32_MUST_BEAT_INT8 = 1.0


def _int8_or_fp32(int8: Artifact, fp32: Artifact, spec: Specialization, timing: Timing, step: Progress) -> Artifact:
    """The faster of the measured int8 and fp32 winners, timed against each other, with both sets of medians and
    the reason recorded.

    Note: each winner comes from its own timing session, seconds apart; on a machine whose speed changes between
    them (a 2-vCPU VM did: zoo:poolformer kept int8 at 0.87x of fp32's speed) comparing those medians compares
    the machine's two states. So the two winners are timed again, in turns, against each other (Timing), and
    that decides; the sessions' medians are kept in the record. Each runs on the thread count recorded for it
    (_threads_chosen): compared on every core, zoo:deit's int8 took 0.0953 ms against fp32's 0.0914 and was kept,
    while the fp32 bundle, on the one thread auto records for it, ran in 0.093 ms against the int8 bundle's 0.120.
    """
    int8_selection, fp32_selection = int8.meta["selection"], fp32.meta["selection"]
    with contextlib.ExitStack() as stack:
        paired = timed_in_turns({label: stack.enter_context(open_executor(artifact, artifact.meta.get("threads")))[0]
                                 for label, artifact in (("int8", int8), ("fp32", fp32))},
                                _example_arrays(spec), timing, {})
    int8_ms = paired.get("int8", int8_selection["medians_ms"][int8.backend])
    fp32_ms = paired.get("fp32", fp32_selection["medians_ms"][fp32.backend])
    compared = {"int8_medians_ms": int8_selection["medians_ms"], "fp32_medians_ms": fp32_selection["medians_ms"],
                "int8_rejected": int8_selection["rejected"], "fp32_rejected": fp32_selection["rejected"],
                "head_to_head_ms": {"int8": round(int8_ms, 4), "fp32": round(fp32_ms, 4)},
                "head_to_head_threads": {label: record.get("threads", {}).get("kept", "every core")
                                         for label, record in (("int8", int8_selection), ("fp32", fp32_selection))}}
    if fp32_ms < FP32_MUST_BEAT_INT8 * int8_ms:
        why = ("int8 is not faster here: the fastest int8 ({} {:.3g} ms) takes {:.2f}x the fastest fp32 ({} {:.3g} "
               "ms), so the fp32 artifact is kept".format(int8.backend, int8_ms, int8_ms / fp32_ms, fp32.backend,
                                                           fp32_ms))
        step(why)
        return _with_selection(fp32, dict(fp32_selection, why=why, **compared))
    why = "{}; {:.2f}x the fastest fp32 ({} {:.3g} ms)".format(int8_selection["why"], fp32_ms / int8_ms,
                                                              fp32.backend, fp32_ms)
    step("int8 kept: {} {:.3g} ms, {:.2f}x the speed of the fastest fp32 ({} {:.3g} ms)".format(
        int8.backend, int8_ms, fp32_ms / int8_ms, fp32.backend, fp32_ms))
    return _with_selection(int8, dict(int8_selection, why=why, **compared))


# auto records a thread count for an artifact only when it takes under this share of every core's time: timings
# on a shared machine wobble by ~5%, and a near tie keeps the runtime's default.
FEWER_THREADS_MUST_BEAT = 0.95


def thread_counts(cores: int) -> List[int]:
    """The counts timed against every core: 1, 2, 4, ... below `cores` (a 6-core board: 1, 2, 4)."""
    counts, count = [], 1
    while count < cores:
        counts.append(count)
        count *= 2
    return counts


def _threads_chosen(artifact: Artifact, spec: Specialization, timing: Timing, step: Progress) -> Artifact:
    """The measured winner, with `threads: N` in its record when N threads ran it faster here than every core
    (the runtime's default), all timed against each other in turns; every time goes into `selection.threads`.

    Note: measured on a 2-core x86 host (2026-12-02, each in its own process), the example transformer block's
    TFLite took 0.0265-0.0275 ms on one thread and 0.027-0.030 ms on two, where two threads also fell into this
    VM's slow mode (0.075 ms) for seconds at a time; zoo:resnet's took 0.097-0.101 ms on one and 0.059-0.075 on
    two. A model too small to share among threads pays for the hand-off between them: which side of that a
    model falls on is measured, not guessed, and on a host with more cores a model may want some of them but not
    all, so the powers of two below every core are timed too. The caller's own thread count always wins at load."""
    record = BACKENDS.get(artifact.backend)
    counts = thread_counts(os.cpu_count() or 1)
    if artifact.device != "cpu" or not counts or not getattr(record, "threads_per_model", False):
        return artifact
    labels = dict([("every core", None)] + [(_threads_label(count), count) for count in counts])
    with contextlib.ExitStack() as stack:
        executors = {label: stack.enter_context(open_executor(artifact, threads))[0]
                     for label, threads in labels.items()}
        timed = timed_in_turns(executors, _example_arrays(spec), timing, {})
    if "every core" not in timed or len(timed) < 2:
        return artifact
    every = timed["every core"]
    fastest = min((label for label in timed if label != "every core"), key=lambda label: timed[label])
    kept = fastest if timed[fastest] < FEWER_THREADS_MUST_BEAT * every else "every core"
    if kept != "every core":
        artifact.meta["threads"] = labels[kept]
        step("{}: {} run it in {:.3g} ms, every core in {:.3g} ms: {} recorded".format(
            artifact.backend, kept, timed[kept], every, kept))
    return _with_selection(artifact, dict(artifact.meta["selection"], threads={
        "every_core_ms": round(every, 4), "kept": kept,
        "threads_ms": {str(labels[label]): round(ms, 4) for label, ms in timed.items() if label != "every core"}}))


def _threads_label(count: int) -> str:
    return "one thread" if count == 1 else "{} threads".format(count)


def _by_preference(build: Callable[[str], Artifact], board: Board, target: Target, spec: Specialization,
                   step: Progress, quantization: Optional[Any]) -> Artifact:
    order = [name for name in candidates(board, quantization) if name in board.backends]
    if quantization is not None and not order:  # the board prefers none with int8 kernels: try those anyway
        order = candidates(board, quantization)
    rejected = {}  # type: Dict[str, str]
    missed = []  # type: List[str]
    for name in order:
        step("building {} with {} for {} ({})".format(spec.name, name, target.name, board.name))
        artifact = attempt(name, lambda: build(name), rejected)
        if artifact is None:
            step("{}: skipped ({})".format(name, rejected[name]))
            continue
        verified = artifact.arch in (None, host_arch())
        # An artifact this machine can run is checked here (int8: against the gate too); one that fails is never
        # chosen.
        if verified:
            with contextlib.ExitStack() as stack:
                if _checked(stack, name, artifact, spec, quantization, rejected, missed, step) is None:
                    continue
        return _with_selection(artifact, {"mode": "board preference", "order": list(board.backends),
                                          "chosen": name, "rejected": rejected, "verified_on_host": verified})
    raise _gate_missed(spec, rejected, missed) if missed else _nothing_built(spec, board, rejected)


def _verify(artifact: Artifact, spec: Specialization) -> bool:
    """Runs the artifact on the example inputs: True, or EdgedynError if it disagrees with torch eager."""
    with contextlib.ExitStack() as stack:
        _open_checked(stack, artifact, spec)
    return True


def _open_checked(stack: contextlib.ExitStack, artifact: Artifact, spec: Specialization) -> Any:
    """The artifact's executor, open until `stack` closes, once its outputs on the example inputs agree with torch
    eager (EdgedynError if they do not)."""
    with contextlib.ExitStack() as opened:  # closed again at once when the check fails
        executor, record = opened.enter_context(open_executor(artifact))
        _check_outputs(artifact, record, executor.run(_example_arrays(spec)), spec.reference_outputs,
                       spec.output_names, spec.detections)
        stack.enter_context(opened.pop_all())
    return executor


def _example_arrays(spec: Specialization) -> List[np.ndarray]:
    return [np.ascontiguousarray(tensor.numpy()) for tensor in spec.example_tensors]


def _check_outputs(artifact: Artifact, record: Dict[str, Any], outputs: List[np.ndarray],
                   expected: List[np.ndarray], names: List[str], detections: Any = None) -> None:
    if len(outputs) != len(expected):
        raise BackendError("{} returned {} outputs, torch eager {}".format(
            artifact.backend, len(outputs), len(expected)))
    if "quantization" in record:
        _check_quantized(artifact, outputs, expected)
        return
    tolerance = record.get("tolerance", FP32_TOLERANCE)
    for index, result in enumerate(compare_outputs(names, outputs, expected, tolerance, compare, detections)):
        if not result["ok"]:
            raise BackendError("{} disagrees with torch eager on output {}: {}".format(
                artifact.backend, index, result.get("error") or "max relative error {:.3g} (rtol {})".format(
                    result["max_rel"], tolerance["rtol"])))


def _check_quantized(artifact: Artifact, outputs: List[np.ndarray], expected: List[np.ndarray]) -> None:
    """int8 differs from float by design: only a broken artifact (cosine below SANITY_COSINE) is rejected here."""
    from edgedyn.quantize.accuracy import SANITY_COSINE, output_metrics

    for index, (got, want) in enumerate(zip(outputs, expected)):
        if np.shape(got) != np.shape(want):
            raise BackendError("{} output {}: shape {} != expected {}".format(
                artifact.backend, index, np.shape(got), np.shape(want)))
        cosine = output_metrics([got], [want])["cosine"]
        if not np.all(np.isfinite(got)) or cosine < SANITY_COSINE:
            raise BackendError("{} (int8) output {} has cosine {:.3f} to torch eager, below {}: a broken "
                               "artifact, not int8 rounding".format(artifact.backend, index, cosine, SANITY_COSINE))


def _checked(stack: contextlib.ExitStack, name: str, artifact: Artifact, spec: Specialization,
             quantization: Optional[Any], rejected: Dict[str, str], missed: List[str], step: Progress) -> Any:
    """The candidate's executor, open until `stack` closes, once it agrees with torch eager and, for int8, meets
    the accuracy gate on the held-out split (quantize/plan.py); else None, the reason in `rejected` (a gate miss, with
    its numbers, also in `missed`) and in the progress.

    Note: the gate is checked per candidate, not only on the winner, because the fastest int8 artifact is not
    always the most accurate (the zoo's MobileViT: TFLite's full-integer graph 0.955, the onnxruntime dynamic-int8
    one 0.9997); one that misses must cost the user neither the export nor the others."""
    executor = attempt(name, lambda: _open_checked(stack, artifact, spec), rejected)
    held_out = getattr(quantization, "held_out", None)
    if executor is not None and held_out is not None:
        if attempt(name, lambda: held_out(name, executor.run), rejected) is None:
            # The record goes into a bundle that may well be written (with another candidate): no "no bundle" in it.
            rejected[name] = rejected[name].replace("; no bundle was written", "")
            missed.append(name)
            executor = None
    if executor is None:
        step("{}: rejected ({})".format(name, rejected[name]))
    return executor


def _gate_missed(spec: Specialization, rejected: Dict[str, str], missed: List[str]) -> EdgedynError:
    """Every int8 candidate that ran missed the accuracy gate: each one's numbers (and why the others did not
    build), with the gate's hint."""
    from edgedyn.quantize.accuracy import GATE_MISS_HINT

    others = ["{}: {}".format(name, reason) for name, reason in rejected.items() if name not in missed]
    misses = " | ".join(rejected[name] for name in missed)
    return EdgedynError("no int8 candidate for {} meets the accuracy gate: {}{}; no bundle was written".format(
        spec.name, misses, "; not built: " + "; ".join(others) if others else ""), hint=GATE_MISS_HINT)


def _with_selection(artifact: Artifact, selection: Dict[str, Any]) -> Artifact:
    artifact.meta = dict(artifact.meta, selection=selection)
    return artifact


def _nothing_built(spec: Specialization, board: Board, rejected: Dict[str, str]) -> BackendError:
    reasons = "; ".join("{}: {}".format(name, reason) for name, reason in rejected.items()) or "none is registered"
    return BackendError("no backend could build {} for {}: {}".format(spec.name, board.name, reasons),
                        hint="install a backend (pip install 'edgedyn[onnxruntime]') or pick one with --backend")

