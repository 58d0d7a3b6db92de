"""Backend choice: which backend, in which precision and on how many threads, builds each specialization, and the
record of why.

`--backend NAME` builds with that backend. `--backend auto` (the default) considers candidates (candidates.py), one
per (backend, precision): fp32 on every registered backend (untuned TVM only when nothing else verifies:
candidates.held_back), each reduced float precision (bf16, fp16:
edgedyn/runtime/precision.py) that a backend computes natively on the CPU that measures it and that `--precision`
admits, and, under --quantize, the int8 build of every backend with int8 kernels. Then:
- on the host's own board (same CPU architecture), one loop ("measured"): every candidate is built and checked
  (candidates.checked), the verified ones are timed in turns (turns.py), the fastest few again on 1, 2, 4, ...
  threads below every core, and the fastest (candidate, thread count) is kept. An int8 or reduced-precision
  candidate is therefore kept only when it is faster than every fp32 one: a candidate that costs accuracy must
  buy time. A reduced-precision candidate that misses its gate on a backend that mixes is tried again with some
  of its first layers in fp32 (candidates.FP32_SHARES), each such try a candidate of its own;
- for another board whose CPU this host emulates (qemu-user and the counting plugin: edgedyn/onboard.py), every
  candidate is built, verified on the emulated board and its guest instructions per call counted there, and the
  fewest kept ("emulated");
- for another board this host cannot emulate, the first candidate of the board file's `backends.preference` that
  builds (and, when its artifact runs here too, verifies) ("board preference"); the record says why it was not
  measured.
`--backend NAME` with one candidate builds it ("user"); with several (its precisions under --precision auto) they
are measured as above, on that backend only. The choice and its reasons go into the artifact's manifest entry as
`selection`.
"""
import contextlib
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from edgedyn.registry import AUTO, BACKENDS, check_backend_name
from edgedyn.backends.artifact import Artifact, open_executor
from edgedyn.boards import Board, Target
from edgedyn.errors import EdgedynError
from edgedyn.candidates import (INT8, Candidate, TuningRejectedWarning, builder, candidate_list, candidates, checked,
                                example_arrays, gate_missed, gated, held_back, measuring_features, missed_gate,
                                more_fp32, no_candidate, nothing_built, untuned_if_wrong)
from edgedyn.frontend import Specialization
from edgedyn.runtime.format import host_arch
from edgedyn.runtime.precision import FP32, REDUCED, is_native, missing_words
from edgedyn.turns import DEFAULT_TIMING, Timing, attempt, timed_in_turns

__all__ = ["Candidate", "DEFAULT_TIMING", "Timing", "TuningRejectedWarning", "candidate_list", "candidates",
           "check_backend_name", "choose", "untuned_if_wrong"]

Progress = Callable[[str], None]


def choose(backend: str, program: Any, board: Board, target: Target, spec: Specialization,
           progress: Optional[Progress] = None, timing: Timing = DEFAULT_TIMING,
           quantization: Optional[Any] = None, precision: str = "fp32", accuracy: Optional[Any] = None,
           probe: Optional[Any] = None) -> Artifact:
    """The artifact for one specialization, with `meta["selection"]` saying how it was chosen.

    `quantization`: an edgedyn.quantize.Quantization, handed to the int8 candidates. `precision`: auto, fp32, bf16
    or fp16 (quantize/precision.py). `accuracy`: the specialization's float gate (quantize/precision.FloatGate),
    which every reduced-precision candidate must meet; without one none is built. `probe`: writes a one-artifact
    bundle of this specialization (edgedyn/onboard.py): with it, another board's candidates are measured on its
    emulated CPU when this host can emulate it.
    """
    step = progress or (lambda message: None)
    check_backend_name(backend)
    here = board.arch == host_arch()
    # Another board's candidates are measured on its emulated CPU when this host can emulate it and there is a
    # choice to make (auto), or a reduced precision to gate, alone or as an int8 candidate's float layers (its
    # arithmetic happens only there).
    emulated = not here and probe is not None and _emulation_missing(board) is None
    listed = candidate_list(backend, board, quantization, precision, measuring_features(board, here, emulated),
                            accuracy is not None)
    if not listed:
        raise no_candidate(backend, board, precision, here)
    on_board = emulated and (backend == AUTO or len(listed) > 1
                             or any(kind in REDUCED for kind in (listed[0].precision, listed[0].floats)))
    build = builder({"default": program}, board, target, spec, quantization)  # each pipeline's graph made once
    if backend != AUTO and len(listed) == 1 and not on_board:
        (only,) = listed
        step("building {} with {} for {}".format(spec.name, only.words, target.name))
        artifact = build(only)
        if only.precision in REDUCED and here:
            artifact, only = _gated(build, artifact, only, spec, accuracy, step)
        selection = {"mode": "user", "requested": backend, "precision": only.precision}
        if only.fp32_share:
            selection["candidate"] = only.label
        return _with_selection(artifact, selection)
    if here or on_board:
        first, later, waited = held_back(listed, backend, target)
        for label, why in waited.items():
            step("{}: held back ({})".format(label, why))
        if here:
            chosen = _measured(build, board, spec, step, timing, first, quantization, accuracy, later)
        else:
            from edgedyn.onboard import on_board as measured_on_board

            chosen = measured_on_board(build, board, spec, step, first, quantization, accuracy, probe, later)
        if here and backend != AUTO:
            chosen.meta["selection"] = dict(chosen.meta["selection"], requested=backend)
        if waited and chosen.meta["selection"]["candidate"] not in waited:  # the waiting ones were not built
            chosen.meta["selection"] = dict(chosen.meta["selection"], held_back=waited)
        return chosen
    chosen = _by_preference(build, board, target, spec, step, listed, quantization, accuracy)
    if backend == AUTO and board.qemu_cpu is not None:
        chosen.meta["selection"]["not_measured"] = "the emulated {} could not measure the candidates here ({}); " \
            "the board file's preference decided".format(board.name, _emulation_missing(board) if probe else
                                                         "no probe bundle")
    return chosen


def _gated(build: Callable[[Candidate], Artifact], artifact: Artifact, candidate: Candidate, spec: Specialization,
           accuracy: Any, step: Progress) -> Tuple[Artifact, Candidate]:
    """The user's reduced-precision artifact with its accuracy record once it meets the gate; else, when it missed
    the gate (a GateMissError; any other error is raised as it is), the same with its first layers in fp32
    (candidates.more_fp32), the smallest share that meets it; else the first miss, with the others' numbers."""
    try:
        artifact.meta["accuracy"] = gated(artifact, candidate, spec, accuracy)
        return artifact, candidate
    except EdgedynError as error:
        if not missed_gate(candidate, error):
            raise
        miss, tries, best = error, [], None  # type: EdgedynError, List[str], Any
    queue = more_fp32(candidate, False)
    while queue:
        candidate = queue.pop(0)
        step("{} missed the gate; trying {}".format(candidate.backend, candidate.words))
        try:
            artifact = build(candidate)
            artifact.meta["accuracy"] = gated(artifact, candidate, spec, accuracy)
            best = (artifact, candidate)
        except EdgedynError as error:
            tries.append("first {:.0%}: {}".format(candidate.fp32_share, error.message.split(": ", 1)[-1]))
            if not missed_gate(candidate, error):
                break  # it did not build or run: more fp32 layers would not mend that
        queue = more_fp32(candidate, best is not None and best[1] is candidate)
    if best is not None:
        return best
    if tries:
        raise EdgedynError("{}; with its first layers in fp32 it missed too ({})".format(
            miss.message, "; ".join(tries)), hint=miss.hint)
    raise miss


def _emulation_missing(board: Board) -> Optional[str]:
    from edgedyn.onboard import unavailable

    return unavailable(board)


def _measured(build: Callable[[Candidate], Artifact], board: Board, spec: Specialization, step: Progress,
              timing: Timing, listed: List[Candidate], quantization: Optional[Any],
              accuracy: Optional[Any], later: List[Candidate]) -> Artifact:
    """The one loop over candidates described in the module docstring: build, check, time in turns, time the
    fastest few on fewer threads, keep the fastest; `later` (candidates.held_back) only if none of `listed`
    verifies."""
    verified = {}  # type: Dict[str, Tuple[Candidate, Artifact]]
    rejected = {}  # type: Dict[str, str]
    missed = []  # type: List[str]  # candidates that ran but missed an accuracy gate
    with contextlib.ExitStack() as stack:  # each verified executor stays open to be timed
        executors = {}  # type: Dict[str, Any]
        queue = list(listed)
        while queue or (later and not verified):
            if not queue:
                queue, later = list(later), []
            candidate = queue.pop(0)
            label = candidate.label
            step("building {} with {}".format(spec.name, candidate.words))
            artifact = attempt(label, lambda: build(candidate), rejected)
            if artifact is None:
                step("{}: skipped ({})".format(label, rejected[label]))
                continue
            executor = checked(stack, candidate, artifact, spec, quantization, accuracy, rejected, missed, step)
            if executor is not None or label in missed:  # next: another share of its first layers in fp32, if any
                queue[:0] = more_fp32(candidate, executor is not None)
            if executor is None:
                continue
            step("{}: verified".format(label))
            verified[label], executors[label] = (candidate, artifact), executor
        if not verified:
            raise gate_missed(spec, rejected, missed) if missed else nothing_built(spec, board, rejected)
        int8 = [c.label for c in listed if c.precision == INT8]
        if int8 and not any(label in verified for label in int8) and any(label in missed for label in int8):
            # --quantize asked for int8 and every int8 build missed its gate: the numbers, not a quiet fp32 bundle
            raise gate_missed(spec, {k: v for k, v in rejected.items() if k in int8}, [k for k in missed if k in int8])
        medians = timed_in_turns(executors, example_arrays(spec), timing, rejected)
    if not medians:
        raise nothing_built(spec, board, rejected)
    fastest, threads = _threads_timed({label: verified[label][1] for label in medians}, medians, spec, timing, step)
    # Candidates come in preference order (dicts keep it), so a tie keeps the earlier one (int8 before fp32).
    chosen = min(fastest, key=lambda label: fastest[label][0])
    candidate, artifact = verified[chosen]
    ms, count = fastest[chosen]
    if count is not None:
        artifact.meta["threads"] = count
    by_precision = _fastest_by_precision(verified, fastest)
    why = _why(chosen, {label: time for label, (time, _) in fastest.items()}, count)
    step("chose {} for {} ({:.3g} ms{}){}".format(chosen, spec.name, ms, _on_threads(count),
                                                  _against_fp32(candidate, by_precision)))
    selection = {
        "mode": "measured", "chosen": candidate.backend, "precision": candidate.precision, "candidate": chosen,
        "why": why + _against_fp32(candidate, by_precision), "medians_ms": {k: round(v, 4)
                                                                           for k, v in sorted(medians.items())},
        "fastest_by_precision": by_precision, "rejected": rejected,
        "timing": {"warmup": timing.warmup, "min_runs": timing.min_runs, "max_runs": timing.max_runs,
                   "seconds": timing.seconds, "rounds": timing.rounds},
        "host": host_arch()}  # type: Dict[str, Any]
    if chosen in threads:
        selection["threads"] = threads[chosen]
    if threads:
        selection["threads_timed"] = {label: record for label, record in sorted(threads.items())}
    artifact.fallback = _fp32_fallback(candidate, board, verified, fastest, by_precision, step)
    return _with_selection(artifact, selection)


def _fp32_fallback(candidate: Candidate, board: Board, verified: Dict[str, Tuple[Candidate, Artifact]],
                   fastest: Dict[str, Tuple[float, Optional[int]]], by_precision: Dict[str, Dict[str, Any]],
                   step: Progress) -> Optional[Artifact]:
    """The fastest fp32 candidate, to go into the bundle after a kept reduced precision whose CPU feature the board
    does not promise (x86-64: any x86-64-v2 CPU; bf16 needs AVX512_BF16 or AMX): on a CPU without it the runtime
    runs this one instead (program.py). None when the kept one is fp32 or int8, the board promises the feature, or
    the fastest fp32 is the kept artifact's own backend (which computes fp32 there itself).

    Note: measured (benchmarks/x86_avx2.py, qemu-x86_64 -cpu Haswell-v4): ResNet-18's OpenVINO bf16 artifact
    exported on a Zen 4 executes 410.9M instructions per call in f32 on an AVX2 CPU, the fastest fp32 candidate
    of the same export (ncnn) 272.6M."""
    if candidate.precision not in REDUCED or is_native(candidate.precision, board.arch, board.cpu_features):
        return None
    fp32 = by_precision.get("fp32")
    if fp32 is None or verified[fp32["candidate"]][0].backend == candidate.backend:
        return None
    label = fp32["candidate"]
    fallback = verified[label][1]
    ms, count = fastest[label]
    if count is not None:
        fallback.meta["threads"] = count
    step("kept {} as well, for a CPU without {} ({:.3g} ms here)".format(label, missing_words(
        candidate.precision, board.arch), ms))
    return _with_selection(fallback, {
        "mode": "fallback", "chosen": fallback.backend, "precision": FP32, "candidate": label, "for": candidate.label,
        "why": "the fastest fp32 candidate ({:.3g} ms{}), run where the CPU lacks {}, which {} needs: {} promises "
               "no more than {}".format(ms, _on_threads(count), missing_words(candidate.precision, board.arch),
                                        candidate.label, board.name, ", ".join(board.cpu_features) or "nothing"),
        "host": host_arch()})


def _on_threads(threads: Optional[int]) -> str:
    return "" if threads is None else ", on {}".format(threads_label(threads))


def _why(chosen: str, times: Dict[str, float], threads: Optional[int] = None) -> str:
    """Why the measured winner won, in words: its time and how much faster it was than each other candidate."""
    others = sorted((m, name) for name, m in times.items() if name != chosen)
    if not others:
        return "the only candidate that built and verified ({:.3g} ms{})".format(times[chosen], _on_threads(threads))
    return "fastest of {} verified: {:.3g} ms{}; {}".format(len(times), times[chosen], _on_threads(threads), ", ".join(
        "{} {:.3g} ms ({:.2f}x slower)".format(name, m, m / times[chosen]) for m, name in others))


def _against_fp32(candidate: Candidate, by_precision: Dict[str, Dict[str, Any]]) -> str:
    """For a kept int8 or reduced-precision candidate: how much faster than the fastest fp32 one, in words."""
    fp32 = by_precision.get("fp32")
    mine = by_precision.get(candidate.precision)
    if candidate.precision == "fp32" or fp32 is None or mine is None:
        return ""
    return "; {:.2f}x the speed of the fastest fp32 ({} {:.3g} ms)".format(fp32["ms"] / mine["ms"], fp32["candidate"],
                                                                         fp32["ms"])


def _fastest_by_precision(verified: Dict[str, Tuple[Candidate, Artifact]],
                          fastest: Dict[str, Tuple[float, Optional[int]]]) -> Dict[str, Dict[str, Any]]:
    """Per precision, its fastest verified candidate and time (on its best thread count): what the export's
    summary compares (int8 against fp32, bf16 against fp32)."""
    best = {}  # type: Dict[str, Dict[str, Any]]
    for label, (ms, _) in fastest.items():
        precision = verified[label][0].precision
        if precision not in best or ms < best[precision]["ms"]:
            best[precision] = {"candidate": label, "ms": round(ms, 4)}
    return best


# The candidates within this factor of the fastest (at most CONTENDERS of them) are timed again on fewer threads:
# a model too small to share among threads may run faster on one, and a near loser on every core may win there.
# 3x: a candidate that loses on every core by up to 3x is still timed where it may win (a model too small to share
# among threads pays for the hand-off on every call); untuned TVM and the portable executor, 14-28x slower than
# onnxruntime on the example MobileNetV2 (README, "How fast"), are not worth the time.
CONTENDER_FACTOR = 3.0
CONTENDERS = 4
# A thread count below every core is recorded only when it takes under this share of every core's time: timings on
# a shared machine wobble by ~5%, and a near tie keeps the runtime's default.
FEWER_THREADS_MUST_BEAT = 0.95


def thread_counts(cores: int) -> List[int]:
    """The counts timed against every core: 1, 2, 4, ... below `cores` (a 6-core board: 1, 2, 4)."""
    counts, count = [], 1
    while count < cores:
        counts.append(count)
        count *= 2
    return counts


def _threads_timed(artifacts: Dict[str, Artifact], medians: Dict[str, float], spec: Specialization, timing: Timing,
                   step: Progress) -> Tuple[Dict[str, Tuple[float, Optional[int]]], Dict[str, Dict[str, Any]]]:
    """Each candidate's time on the thread count it would run with ({label: (ms, count, None for every core)}),
    and the threads record of each contender timed on fewer threads.

    Note: measured on a 2-core x86 host (2026-12-02, each in its own process), the example transformer block's
    TFLite took 0.0265-0.0275 ms on one thread and 0.027-0.030 ms on two; zoo:resnet's took 0.097-0.101 ms on one
    and 0.059-0.075 on two. Which side a model falls on is measured, not guessed, and on a host with more cores a
    model may want some of them but not all, so the powers of two below every core are timed. The contenders'
    variants, every core included, are timed in one set of turns, so candidates are compared as their bundles
    will run (zoo:deit's int8 beat fp32 on every core, but the fp32 bundle on its one thread was the faster one).
    The caller's own thread count always wins at load."""
    result = {label: (ms, None) for label, ms in medians.items()}  # type: Dict[str, Tuple[float, Optional[int]]]
    counts = thread_counts(os.cpu_count() or 1)
    best = min(medians.values())
    contenders = [label for label in sorted(medians, key=lambda label: medians[label])[:CONTENDERS]
                  if medians[label] <= CONTENDER_FACTOR * best and artifacts[label].device == "cpu"
                  and getattr(BACKENDS.get(artifacts[label].backend), "threads_per_model", False)]
    if not counts or not contenders:
        return result, {}
    variants = {}  # type: Dict[str, Tuple[str, Optional[int]]]
    with contextlib.ExitStack() as stack:
        executors = {}  # type: Dict[str, Any]
        for label in contenders:
            for count in [None] + counts:
                key = "{} on {}".format(label, threads_label(count))
                executors[key] = stack.enter_context(open_executor(artifacts[label], count))[0]
                variants[key] = (label, count)
        timed = timed_in_turns(executors, example_arrays(spec), timing, {})
    records = {}  # type: Dict[str, Dict[str, Any]]
    for label in contenders:
        mine = {count: timed[key] for key, (owner, count) in variants.items() if owner == label and key in timed}
        if None not in mine or len(mine) < 2:
            continue
        every = mine[None]
        fewest = min((count for count in mine if count is not None), key=lambda count: mine[count])
        kept = fewest if mine[fewest] < FEWER_THREADS_MUST_BEAT * every else None
        result[label] = (mine[kept], kept)
        if kept is not None:
            step("{}: {} run it in {:.3g} ms, every core in {:.3g} ms".format(label, threads_label(kept), mine[kept],
                                                                            every))
        records[label] = {"every_core_ms": round(every, 4), "kept": threads_label(kept),
                          "threads_ms": {str(count): round(ms, 4) for count, ms in mine.items() if count is not None}}
    return result, records


def threads_label(count: Optional[int]) -> str:
    return "every core" if count is None else "one thread" if count == 1 else "{} threads".format(count)


def _by_preference(build: Callable[[Candidate], Artifact], board: Board, target: Target, spec: Specialization,
                   step: Progress, listed: List[Candidate], quantization: Optional[Any],
                   accuracy: Optional[Any]) -> Artifact:
    preferred = [c for c in listed if c.backend in board.backends]
    order = preferred if preferred else listed  # none preferred (say, no int8 backend): try the others anyway
    rejected = {}  # type: Dict[str, str]
    missed = []  # type: List[str]
    for candidate in order:
        label = candidate.label
        step("building {} with {} for {} ({})".format(spec.name, candidate.words, target.name, board.name))
        artifact = attempt(label, lambda: build(candidate), rejected)
        if artifact is None:
            step("{}: skipped ({})".format(label, rejected[label]))
            continue
        verified = artifact.arch in (None, host_arch())
        # An artifact this machine can run is checked here (int8: against the gate too); one that fails is never
        # chosen.
        if verified:
            with contextlib.ExitStack() as stack:
                if checked(stack, candidate, artifact, spec, quantization, accuracy, rejected, missed, step) is None:
                    continue
        return _with_selection(artifact, {"mode": "board preference", "order": list(board.backends),
                                          "chosen": candidate.backend, "precision": candidate.precision,
                                          "rejected": rejected, "verified_on_host": verified})
    raise gate_missed(spec, rejected, missed) if missed else nothing_built(spec, board, rejected)


def _with_selection(artifact: Artifact, selection: Dict[str, Any]) -> Artifact:
    artifact.meta = dict(artifact.meta, selection=selection)
    return artifact
