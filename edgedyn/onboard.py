"""`--backend auto` for a board that is not this machine, measured on the board's emulated CPU.

For a Raspberry Pi or a Jetson's CPU exported from an x86 PC, nothing here runs the board's arithmetic, and
timings under emulation mean nothing. But qemu-user executes the board's instructions exactly (fp16 included) and
can count them: under the board's own CPU model (`-cpu cortex-a76`) the number of guest instructions per call is
deterministic and ranks runtimes the way the board does (docs/emulate.md has the limits: no memory stalls, no
per-instruction cost). So each candidate artifact is written into a one-artifact probe bundle, run on the emulated
board on the evaluation inputs (its outputs judged here: fp32 against torch eager within its tolerance, a reduced
precision against the float gate, int8 against the --quantize gate), and the ones that pass are counted there
(edgedyn/emulate/instructions.py); `auto` keeps the one with the fewest instructions per call. One board image,
with the runtimes of every candidate, serves them all.

Without the emulation tools, `auto` falls back to the board file's preference and says so.
"""
import concurrent.futures
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.registry import BACKENDS
from edgedyn.backends.artifact import Artifact
from edgedyn.boards import Board
from edgedyn.errors import EdgedynError

# A board-side run: load the probe bundle on one thread, run its one specialization's executor on the first batch
# (the warm-up call), count COUNTED_CALLS more calls on it between marks (edgedyn/emulate/instructions.py's marks
# method), then run the other batches for the gate, and save every output and the precision it computed in. One
# process both checks and counts. Python 3.8 syntax (the board's Python).
_EVALUATE = """
import ctypes, sys
import numpy as np
from edgedyn.runtime.program import load
bundle, inputs, outputs, calls, marks = sys.argv[1:6]
spec = load(bundle, threads=1, device="cpu").specializations[0]
data = np.load(inputs, allow_pickle=False)
batches = [[data["{}.{}".format(b, i)] for i in range(int(data["arity"]))] for b in range(int(data["batches"]))]
syscall, number, magic = ctypes.CDLL(None).syscall, int(marks.split(",")[0]), ctypes.c_long(int(marks.split(",")[1]))
results = {}
for j, value in enumerate(spec.executor.run(batches[0])):
    results["0.{}".format(j)] = np.asarray(value)
syscall(number, magic)
syscall(number, magic)
for _ in range(int(calls)):
    spec.executor.run(batches[0])
syscall(number, magic)
for b in range(1, len(batches)):
    for j, value in enumerate(spec.executor.run(batches[b])):
        results["{}.{}".format(b, j)] = np.asarray(value)
results["precision"] = np.array(spec.precision()[0])
np.savez(outputs, **results)
"""
# Calls counted per candidate after its warm-up call: the counts are exact from run to run, so two suffice.
COUNTED_CALLS = 2

Probe = Callable[[Artifact, Path], Path]  # writes a one-artifact bundle of the specialization into a folder


def unavailable(board: Board) -> Optional[str]:
    """None when this host can emulate `board` and count instructions there, else why not, in words."""
    if board.qemu_cpu is None or board.debian_suite is None:
        return "board {} has no [emulation] table".format(board.name)
    from edgedyn.emulate.instructions import missing_counting_tools
    from edgedyn.emulate.rootfs import EmulationError, check_tools

    try:
        check_tools()
    except EmulationError as error:
        return error.message
    missing = list(missing_counting_tools())
    return "missing {}".format(", ".join(missing)) if missing else None


class Measurement:
    """The emulated board of one export, prepared once with the runtimes of every candidate, and each candidate's
    outputs and instructions measured there."""

    def __init__(self, board: Board, listed: Sequence[Any], probe: Probe, say: Callable[[str], None]) -> None:
        self.board, self.probe, self.say = board, probe, say
        self.extras = tuple(sorted({extra for candidate in listed for extra in
                                    BACKENDS[candidate.backend].board_extra.split(",") if extra}))
        self._workdir = tempfile.TemporaryDirectory(prefix="edgedyn-onboard-")
        self._emulated = None  # type: Any
        self._counts = {}  # type: Dict[str, Dict[str, Any]]

    def close(self) -> None:
        self._workdir.cleanup()

    def _board(self, bundle: Path) -> Any:
        if self._emulated is None:
            from edgedyn.emulate.board import prepare

            self._emulated = prepare(bundle, say=self.say, extras=self.extras)
        return self._emulated

    def stage(self, label: str, artifact: Artifact, batches: List[List[np.ndarray]]) -> Tuple[Path, Path, Path]:
        """Writes the candidate's probe bundle and its inputs (and prepares the board image, the first time):
        (bundle, inputs, outputs) for `run`. Called from one thread, in order."""
        folder = Path(self._workdir.name) / label.replace(":", "-")
        folder.mkdir()
        bundle = self.probe(artifact, folder)
        inputs, outputs = folder / "inputs.npz", folder / "outputs.npz"
        arrays = {"{}.{}".format(b, i): np.asarray(a) for b, batch in enumerate(batches) for i, a in enumerate(batch)}
        np.savez(str(inputs), batches=np.array(len(batches)), arity=np.array(len(batches[0])), **arrays)
        self._board(bundle)
        return bundle, inputs, outputs

    def run(self, label: str, staged: Tuple[Path, Path, Path], batches: int) -> Tuple[List[List[np.ndarray]], str]:
        """(the candidate's outputs on each of its `batches` batches, computed on the emulated board; the precision
        it computed in), its instructions per call counted in the same process (`count` returns them once the
        outputs passed). One qemu process per call: several may run at once, each on its own host thread.

        It runs as counts run: in the board's CPU view (the guest's /proc/cpuinfo names the board's CPU, as XNNPACK
        reads it), one thread, a fixed environment (edgedyn/emulate/instructions.py count_command)."""
        from edgedyn.emulate.instructions import LABEL, MARKS, count_command, plugin_library
        from edgedyn.emulate.rootfs import EmulationError

        bundle, inputs, outputs = staged
        board = self._emulated
        try:
            counted = count_command(board, ["-c", _EVALUATE, str(bundle), str(inputs), str(outputs),
                                            str(COUNTED_CALLS), MARKS])
        except EmulationError as error:
            raise EdgedynError("{} failed on {}: {}".format(label, _where(board), _last_line(error.message)))
        self._counts[label] = {"per_call": counted.per_call(COUNTED_CALLS),
                               "calls": COUNTED_CALLS, "method": "marks", "wall_s": round(counted.wall_s, 1),
                               "label": LABEL.format(board=board.name, cpu=_cpu_words(board.qemu_cpu)),
                               "plugin": plugin_library().describe()}
        with np.load(str(outputs), allow_pickle=False) as saved:
            count = len([k for k in saved.files if k.startswith("0.")])
            got = [[saved["{}.{}".format(b, j)] for j in range(count)] for b in range(batches)]
            precision = str(saved["precision"])
        return got, precision

    def count(self, label: str) -> Dict[str, Any]:
        """Guest instructions per call of a candidate that `run` ran, one thread, under the board's CPU."""
        return self._counts[label]

    def where(self) -> str:
        return _where(self._emulated)

    def probe_layers(self, label: str, staged: Tuple[Path, Path, Path], script: str, variants: Sequence[Any],
                     batches: int, base: bool) -> Dict[str, List[np.ndarray]]:
        """A staged candidate's outputs under `script` (layer_probe.py's) on its first `batches` gate batches: with
        every layer as built ("base.B", with `base`) and per variant ("KEY.B", `variants` as [key, layer names]),
        split between emulation_jobs processes (no counting: the probe ranks accuracy)."""
        import json

        from edgedyn.layer_probe import unpack

        bundle, inputs, _ = staged
        jobs = emulation_jobs(len(variants))
        parts = [[v for i, v in enumerate(variants) if i % jobs == part] for part in range(jobs)]

        def run(part: int) -> Dict[str, List[np.ndarray]]:
            listed, probed = (bundle.parent / "probe-{}.{}".format(part, ext) for ext in ("json", "npz"))
            listed.write_text(json.dumps(parts[part]))
            result = self._emulated.run_edgedyn(["-c", script, str(bundle), str(inputs), str(probed), str(listed),
                                                 str(batches), "1" if base and part == 0 else "0"])
            if result.returncode != 0:
                raise EdgedynError("probing {} failed on {}: {}".format(label, self.where(),
                                                                       _last_line(result.stderr or result.stdout)))
            with np.load(str(probed), allow_pickle=False) as saved:
                return unpack({key: saved[key] for key in saved.files})

        merged = {}  # type: Dict[str, List[np.ndarray]]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for outputs in pool.map(run, range(jobs)):
                merged.update(outputs)
        return merged


def _attempt_run(measurement: Measurement, label: str, files: Any, batches: int) -> Tuple[Any, Optional[str]]:
    """(`measurement.run`'s result, None) or (None, why it failed, as `attempt` words it): from a worker thread."""
    from edgedyn.turns import attempt

    why = {}  # type: Dict[str, str]
    return attempt(label, lambda: measurement.run(label, files, batches), why), why.get(label)


def emulation_jobs(candidates: int) -> int:
    """How many candidates run on the emulated board at once: EDGEDYN_EMULATE_JOBS, else one per CPU core this
    process may use, at most one per 2 GB of available memory (a full-size model's qemu process holds ~1 GB)."""
    asked = os.environ.get("EDGEDYN_EMULATE_JOBS", "")
    if asked.isdigit() and int(asked) > 0:
        return max(1, min(int(asked), candidates))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/meminfo") as meminfo:
            available_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
        cores = min(cores, max(1, available_kb // (2 * 1024 * 1024)))
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, min(cores, candidates))


def replay(outputs: List[List[np.ndarray]]) -> Callable[[Any], List[np.ndarray]]:
    """A `run` that returns the outputs the board computed, batch by batch, in the order a gate asks for them."""
    pending = iter(outputs)
    return lambda batch: next(pending)


def _last_line(text: str) -> str:
    """What a failed run on the board said: the last exception line of its traceback (or `error:` line) and the
    hint after it, else its last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [index for index, line in enumerate(lines) if line.startswith("error:") or _EXCEPTION.match(line)]
    if errors:
        return " ".join(lines[errors[-1]:errors[-1] + 2])[:400]
    return lines[-1][:300] if lines else "no message"


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def on_board(build: Callable[[Any], Artifact], board: Board, spec: Any, step: Callable[[str], None],
             listed: Sequence[Any], quantization: Optional[Any], accuracy: Optional[Any], probe: Probe,
             later: Sequence[Any] = ()) -> Artifact:
    """The candidate with the fewest guest instructions per call on the emulated board among those whose outputs
    there pass their check, with `meta["selection"]` saying what was measured and how ("emulated"); `later`
    (candidates.held_back) only when none of `listed` passes."""

    measurement = Measurement(board, list(listed) + list(later), probe, step)
    rounds = _Rounds(build, board, spec, step, quantization, accuracy, measurement)
    counts, chosen_artifacts, rejected, missed = rounds.counts, rounds.artifacts, rounds.rejected, rounds.missed
    try:
        # Built and staged here, one after another; then run on the emulated board JOBS at a time (each a
        # single-threaded qemu process, its count exact whatever runs beside it); judged in the listed order. A
        # reduced precision that mixes comes back for another round with some of its first layers in fp32
        # (candidates.more_fp32) after it met or missed its gate.
        pending, later = (list(listed), list(later)) if listed else (list(later), [])
        while pending:
            pending = rounds.run(pending)
            if not pending and not counts and later:
                pending, later = later, []
    finally:
        measurement.close()
    if not counts:
        from edgedyn.candidates import gate_missed, nothing_built

        raise gate_missed(spec, rejected, missed) if missed else nothing_built(spec, board, rejected)
    per_call = {label: count["per_call"] for label, count in counts.items()}
    chosen = min(per_call, key=lambda label: per_call[label])  # listed in preference order: a tie keeps the earlier
    candidate, artifact = chosen_artifacts[chosen]
    others = sorted((n, label) for label, n in per_call.items() if label != chosen)
    why = "fewest guest instructions per call of {} verified on {}: {:,.0f}{}".format(
        len(per_call), _where(board), per_call[chosen],
        "; " + ", ".join("{} {:,.0f} ({:.2f}x)".format(label, n, n / per_call[chosen]) for n, label in others)
        if others else "")
    step("chose {} for {} ({:,.0f} instructions per call on the emulated {})".format(
        chosen, spec.name, per_call[chosen], board.name))
    sample = counts[chosen]
    artifact.meta = dict(artifact.meta, selection={
        "mode": "emulated", "chosen": candidate.backend, "precision": candidate.precision, "candidate": chosen,
        "why": why, "instructions_per_call": {label: int(round(n)) for label, n in sorted(per_call.items())},
        "rejected": rejected, "board": board.name, "cpu": board.qemu_cpu, "label": sample.get("label"),
        "calls_counted": sample.get("calls"), "plugin": sample.get("plugin")})
    return artifact


class _Rounds:
    """on_board's rounds and what they found: per candidate label its count (`counts`) and (candidate, artifact)
    (`artifacts`) once verified, why it was rejected (`rejected`), and the labels that missed their gate
    (`missed`)."""

    def __init__(self, build: Callable[[Any], Artifact], board: Board, spec: Any, step: Callable[[str], None],
                 quantization: Optional[Any], accuracy: Optional[Any], measurement: "Measurement") -> None:
        self.build, self.board, self.spec, self.step = build, board, spec, step
        self.quantization, self.accuracy, self.measurement = quantization, accuracy, measurement
        self.counts = {}  # type: Dict[str, Dict[str, Any]]
        self.artifacts = {}  # type: Dict[str, Tuple[Any, Artifact]]
        self.rejected = {}  # type: Dict[str, str]
        self.missed = []  # type: List[str]

    def run(self, listed: Sequence[Any]) -> List[Any]:
        """One round: `listed` built, staged, run and judged, the verified counted; returns the candidates of the
        next round (the mixed tries after a reduced precision met or missed its gate)."""
        from edgedyn.candidates import missed_gate, more_fp32
        from edgedyn.turns import attempt

        step, rejected, measurement = self.step, self.rejected, self.measurement
        staged = []  # type: List[Tuple[Any, Artifact, Any, Any, int]]
        for candidate in listed:
            label = candidate.label
            step("building {} with {} for {}".format(self.spec.name, candidate.words, self.board.name))
            artifact = attempt(label, lambda: self.build(candidate), rejected)
            if artifact is None:
                step("{}: skipped ({})".format(label, rejected[label]))
                continue
            batches, judge = _evaluation(candidate, artifact, self.spec, self.quantization, self.accuracy,
                                         _where(self.board))
            files = attempt(label, lambda: measurement.stage(label, artifact, batches), rejected)
            if files is None:
                step("{}: rejected ({})".format(label, rejected[label]))
                continue
            staged.append((candidate, artifact, judge, files, len(batches)))
        jobs = emulation_jobs(len(staged))
        step("running and counting {} candidate(s) on {}, {} at a time".format(len(staged), _where(self.board), jobs))
        following = []  # type: List[Any]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_attempt_run, measurement, candidate.label, files, n)
                       for candidate, _, _, files, n in staged]
            for (candidate, artifact, judge, staged_files, _), future in zip(staged, futures):
                label = candidate.label
                ran, failure = future.result()
                errors = {}  # type: Dict[str, Any]
                if failure is not None:
                    rejected[label] = failure
                elif attempt(label, lambda: judge(ran[0], ran[1]) or True, rejected, errors) is None:
                    if missed_gate(candidate, errors.get(label)):
                        self.missed.append(label)
                        following += more_fp32(candidate, False) + self._probed(candidate, artifact, staged_files)
                else:
                    count = measurement.count(label)
                    step("{}: {:,.0f} instructions per call".format(label, count["per_call"]))
                    self.counts[label], self.artifacts[label] = count, (candidate, artifact)
                    following += more_fp32(candidate, True)
                    continue
                step("{}: rejected ({})".format(label, rejected[label]))
        return following

    def _probed(self, candidate: Any, artifact: Artifact, staged: Tuple[Path, Path, Path]) -> List[Any]:
        """After a reduced-precision candidate of a backend that `probes_layers` missed its gate: the same with
        the layers the probe found it costs most accuracy in kept fp32 (layer_probe.py); none when the probe
        names none or cannot run (it says why)."""
        from dataclasses import replace

        from edgedyn.layer_probe import probe

        if not BACKENDS[candidate.backend].probes_layers or candidate.fp32_layers or self.accuracy is None:
            return []
        try:
            layers = probe(self.measurement, candidate.label, staged, artifact, self.accuracy, self.step)
        except EdgedynError as error:
            self.step("{}: no probe ({})".format(candidate.label, error.message))
            return []
        if not layers:
            self.step("{}: no layer in fp32 gains accuracy alone".format(candidate.label))
            return []
        self.step("{}: fp32 for {} of its layers ({}) may meet the gate".format(
            candidate.label, len(layers), ", ".join(layers[:6]) + (", ..." if len(layers) > 6 else "")))
        return [replace(candidate, fp32_layers=layers)]


def _evaluation(candidate: Any, artifact: Artifact, spec: Any, quantization: Optional[Any], accuracy: Optional[Any],
                where: str) -> Tuple[List[List[np.ndarray]], Callable[[List[List[np.ndarray]], str], None]]:
    """(the batches a candidate runs on the emulated board (`where`), the check of what it returned): the example
    inputs first (checked as `auto` checks them here), then its gate's batches for int8 and reduced precisions; an
    int8 candidate keeps its outputs there for the export's record (Artifact.measured)."""
    from edgedyn.candidates import INT8, check_outputs, example_arrays
    from edgedyn.quantize.plan import example_gate, measured
    from edgedyn.runtime.precision import REDUCED

    examples = example_arrays(spec)
    extra = []  # type: List[List[np.ndarray]]
    if candidate.precision == INT8 and quantization is not None and quantization.held_out is not None:
        extra = list(quantization.held_out_batches)
    elif candidate.precision in REDUCED:
        extra = list(accuracy.batches)

    def judge(outputs: List[List[np.ndarray]], computed: str) -> None:
        check_outputs(artifact, outputs[0], spec)
        if candidate.precision in REDUCED and computed != candidate.precision:
            raise EdgedynError("the emulated CPU computed it in {}, not {}: the board's runtime would not use {} "
                               "either".format(computed, candidate.precision, candidate.precision))
        if candidate.precision == INT8 and extra:
            records = quantization.held_out(candidate.backend, replay(outputs[1:]))
            example_gate(spec, candidate.floats, outputs[0], quantization.target_cosine, candidate.label)
            artifact.measured = measured(records, outputs[0], where)
        elif candidate.precision in REDUCED:
            artifact.meta["accuracy"] = accuracy.check(candidate.label, candidate.precision, replay(outputs[1:]),
                                                       example_outputs=outputs[0])
            artifact.meta["accuracy"]["measured_on"] = where

    return [examples] + extra, judge


def _cpu_words(cpu: str) -> str:
    from edgedyn.emulate.rootfs import cpu_words

    return cpu_words(cpu)


def _where(board: Any) -> str:
    """Where a candidate ran: a board file's Board or an EmulatedBoard (emulate/rootfs.py `emulated_words`)."""
    from edgedyn.emulate.rootfs import emulated_words

    return emulated_words(board.name, board.qemu_cpu)
