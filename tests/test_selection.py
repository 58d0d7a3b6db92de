"""`--backend auto` and friends: what is chosen, why, and that a wrong or broken artifact is never chosen."""
import dataclasses
import re
import sys
from typing import Any, Dict, List

import numpy as np
import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.registry import BACKENDS, Backend
from edgedyn.backends.artifact import Artifact, Build
from edgedyn.boards import load_board
from edgedyn.errors import BackendError, EdgedynError, GateMissError
from edgedyn.frontend import capture
from edgedyn.passes import run_pipeline
from edgedyn.runtime.executors import EXECUTORS
from edgedyn.runtime.format import kept_artifact
from edgedyn.selection import Timing, candidates, check_backend_name, choose

from conftest import EXAMPLES, REPO, require_module

pytestmark = pytest.mark.requires("onnxruntime")
FAST = Timing(warmup=1, min_runs=3, max_runs=20, seconds=0.2)


# --- stand-in backends, registered by name for one test through the real registries ---

def wrong_but_fast(build: Build) -> Artifact:
    """Builds instantly and runs instantly, and returns zeros: the fastest artifact, and a wrong one."""
    outputs = build.program.module()(*build.program.example_inputs[0])
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    return Artifact(backend="wrong_but_fast", executor="zeros", device="cpu", arch=None, target="none",
                    files={"note": b"zeros"}, file_names={"note": "note.txt"},
                    meta={"shapes": [list(v.shape) for v in outputs]})


def fails_when_run(build: Build) -> Artifact:
    """Builds, then its executor hits a bug on the first call."""
    artifact = wrong_but_fast(build)
    artifact.backend, artifact.meta["fail"] = "fails_when_run", True
    return artifact


def cannot_express(build: Build) -> Artifact:
    raise BackendError("cannot express aten.mul.Tensor (examples/loop_example.py:12)")


def crashes(build: Build) -> Artifact:
    raise KeyError("a bug in a backend")


class FakeClock:
    """Time that passes only inside ClockedExecutor.run: what each stand-in backend's artifact costs per call."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls = {}  # type: Dict[str, int]
        self.order = []  # type: List[str]
        self.slowdown = 1.0  # how much slower the whole machine runs for now

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


def _clocked(build: Build, name: str, milliseconds: float) -> Artifact:
    """A correct artifact (torch's own outputs on the example inputs) that costs `milliseconds` on CLOCK."""
    outputs = build.program.module()(*build.program.example_inputs[0])
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    return Artifact(backend=name, executor="clocked", device="cpu", arch=None, target="none",
                    files={"note": b"clocked"}, file_names={"note": "note.txt"},
                    meta={"outputs": [v.detach().numpy().tolist() for v in outputs], "ms": milliseconds})


def a_slow(build: Build) -> Artifact:
    return _clocked(build, "a_slow", 4.0)


def b_fast(build: Build) -> Artifact:
    return _clocked(build, "b_fast", 0.5)


def c_too_slow(build: Build) -> Artifact:
    return _clocked(build, "c_too_slow", 64.0)


def d_mid(build: Build) -> Artifact:
    return _clocked(build, "d_mid", 3.0)


def e_fast_on_one_thread(build: Build) -> Artifact:
    """3 ms on every core, 1 ms on one thread: a model too small to share among threads."""
    artifact = _clocked(build, "e_fast_on_one_thread", 3.0)
    artifact.meta["ms_on_threads"] = {"1": 1.0}
    return artifact


def g_int8_two_ms(build: Build) -> Artifact:
    """2 ms on any thread count when quantized; its fp32 build is slow (8 ms), so it never wins fp32."""
    return _clocked(build, "g_int8_two_ms", 8.0 if build.quantization is None else 2.0)


def h_int8_five_percent_slower(build: Build) -> Artifact:
    """0.525 ms quantized, 5% slower than b_fast's fp32; its own fp32 build is slow (8 ms)."""
    return _clocked(build, "h_int8_five_percent_slower", 8.0 if build.quantization is None else 0.525)


class ClockedExecutor:
    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        milliseconds = artifact.get("ms_on_threads", {}).get(str(options.get("threads")), artifact["ms"])
        self.name, self.seconds = artifact["backend"], milliseconds / 1000.0
        self.outputs = [np.asarray(value, np.float32) for value in artifact["outputs"]]

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        CLOCK.now += self.seconds * CLOCK.slowdown
        CLOCK.calls[self.name] = CLOCK.calls.get(self.name, 0) + 1
        CLOCK.order.append(self.name)
        return [value.copy() for value in self.outputs]

    def describe(self) -> Dict[str, Any]:
        return {"executor": "clocked"}


class ZerosExecutor:
    def __init__(self, bundle: Any, artifact: Dict[str, Any], options: Dict[str, Any]) -> None:
        self.shapes, self.fail = artifact["shapes"], artifact.get("fail", False)

    def run(self, inputs: List[np.ndarray]) -> List[np.ndarray]:
        if self.fail:
            raise RuntimeError("index out of range in a kernel")
        return [np.zeros(shape, np.float32) for shape in self.shapes]

    def describe(self) -> Dict[str, Any]:
        return {"executor": "zeros"}


@pytest.fixture
def loop_spec():
    captured = capture(str(EXAMPLES / "loop_example.py:loop_example"), inputs=["x=2x3", "n=4"])
    (spec,) = captured.specializations
    return spec, run_pipeline(spec.program)


def _stand_in(name: str, lowering: str, quantizes: bool = False) -> Backend:
    """A registry record for a stand-in backend whose lower() is the function `lowering` of this file."""
    return Backend(name=name, lower="test_selection:" + lowering, executor="zeros", devices=("cpu",),
                   quantizes=quantizes, extra="", board_extra="", overhead_bytes=None, overhead_import="",
                   general=False, no_int8_reason="a stand-in for tests")


def _register(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    monkeypatch.setitem(EXECUTORS, "zeros", "test_selection:ZerosExecutor")
    monkeypatch.setitem(EXECUTORS, "clocked", "test_selection:ClockedExecutor")
    for name in names:
        monkeypatch.setitem(BACKENDS, name, _stand_in(name, name))


@pytest.mark.parametrize("name, hint", [
    ("tvmm", "did you mean 'tvm'?"),
    ("onnx-runtime", "did you mean 'onnxruntime'?"),
    ("tensorrt", "auto measures"),
])
def test_unknown_backend_lists_the_choices(name, hint):
    with pytest.raises(EdgedynError) as raised:
        check_backend_name(name)
    choices = ", ".join(sorted(list(BACKENDS) + ["auto"]))
    assert raised.value.message == "unknown backend '{}'; choose from: {}".format(name, choices)
    assert "auto" in choices.split(", ") and "onnxruntime" in choices.split(", ")
    assert hint in raised.value.hint


def test_unknown_backend_on_the_command_line(run_cli):
    result = run_cli("export", "examples/tiny_cnn.py:TinyCNN", "--backend", "tvmm")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: unknown backend 'tvmm'; choose from: auto, " in result.stderr
    assert "hint: did you mean 'tvm'?" in result.stderr


def test_candidates_follow_the_board_preference_then_the_rest():
    names = candidates(load_board("x86-64"))
    assert names[:2] == ["onnxruntime", "tvm"] and sorted(names) == sorted(BACKENDS)


def test_auto_never_picks_an_artifact_that_failed(monkeypatch, loop_spec):
    spec, program = loop_spec
    board = load_board("x86-64")  # before the registry changes: board files name registered backends only
    # Only onnxruntime besides the stand-ins keeps the test quick; the real ones are measured on MobileNetV2 below.
    for other in [n for n in BACKENDS if n != "onnxruntime"]:
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "wrong_but_fast", "fails_when_run", "cannot_express", "crashes")
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=FAST)
    selection = artifact.meta["selection"]
    assert artifact.backend == selection["chosen"] == "onnxruntime"
    assert selection["mode"] == "measured" and list(selection["medians_ms"]) == ["onnxruntime"]
    assert selection["rejected"] == {
        "wrong_but_fast": "wrong_but_fast disagrees with torch eager on output 0: max relative error 1 (rtol 0.0001)",
        "fails_when_run": "internal error: RuntimeError: index out of range in a kernel "
                          "(EDGEDYN_DEBUG=1 shows the traceback)",
        "cannot_express": "cannot express aten.mul.Tensor (examples/loop_example.py:12)",
        "crashes": "internal error: KeyError: 'a bug in a backend' (EDGEDYN_DEBUG=1 shows the traceback)",
    }


def test_auto_keeps_the_fastest_by_the_clock_and_stops_timing_by_its_rules(monkeypatch, loop_spec):
    spec, program = loop_spec
    board = load_board("x86-64")  # before the registry changes; it prefers none of the stand-ins
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "a_slow", "b_fast", "c_too_slow")  # candidates come by name: the slow one first
    monkeypatch.setattr(CLOCK, "calls", {})
    monkeypatch.setattr(CLOCK, "order", [])
    timing = Timing(warmup=3, min_runs=5, max_runs=60, seconds=0.048, rounds=3, clock=CLOCK)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=timing)
    selection = artifact.meta["selection"]
    assert artifact.backend == selection["chosen"] == "b_fast"
    assert selection["medians_ms"] == {"a_slow": 4.0, "b_fast": 0.5, "c_too_slow": 64.0}
    assert selection["rejected"] == {} and selection["timing"]["rounds"] == 3
    # One call to verify and one first call each; then per round: 2 more warm-ups and timed runs until 16 ms have
    # passed (4 of 4 ms, raised to min_runs 5), capped at 60 / 3 = 20 for the fast one (20 x 0.5 ms < 16 ms).
    # A first call slower than 48 ms: 1 timed run, and no rounds.
    assert CLOCK.calls == {"a_slow": 1 + 1 + 3 * (2 + 5), "b_fast": 1 + 1 + 3 * (2 + 20), "c_too_slow": 1 + 1 + 1}
    # The rounds take turns, each starting with the candidate the last one ended on (a b | b a | a b), so a burst
    # of other load lands on both; the calls before them: 3 verifications, 3 first calls, c's timed run.
    assert _runs(CLOCK.order[7:]) == ["a_slow", "b_fast", "a_slow", "b_fast"]


def test_a_slow_stretch_over_two_rounds_of_one_candidate_does_not_decide(monkeypatch, loop_spec):
    """b_fast (0.5 ms) runs 10x slower in two of its three rounds, as when the machine slows for a few seconds;
    d_mid (3 ms) is never slowed. The median of b's rounds (5 ms) would lose to d_mid; its fastest round wins."""
    import edgedyn.turns as turns

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "b_fast", "d_mid")
    monkeypatch.setattr(CLOCK, "order", [])
    real_round = turns._round_median_ms
    rounds_run = []  # type: List[str]

    def stretch(call, timing):  # type: ignore[no-untyped-def]
        start = len(CLOCK.order)
        median = real_round(call, timing)
        rounds_run.append(CLOCK.order[start])
        slowed = rounds_run[-1] == "b_fast" and rounds_run.count("b_fast") <= 2
        return median * (10.0 if slowed else 1.0)

    monkeypatch.setattr(turns, "_round_median_ms", stretch)
    timing = Timing(warmup=1, min_runs=3, max_runs=9, seconds=0.03, rounds=3, clock=CLOCK)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=timing)
    assert rounds_run.count("b_fast") == rounds_run.count("d_mid") == 3
    assert artifact.meta["selection"]["medians_ms"] == {"b_fast": 0.5, "d_mid": 3.0}
    assert artifact.backend == "b_fast"


def test_each_round_starts_once_the_process_is_idle(monkeypatch):
    """A thread pool spins on a core after its last call (see Timing): every round waits for the process to be idle
    first, so no candidate is timed on the cores another one's pool still holds."""
    import edgedyn.turns as turns

    events = []  # type: List[str]
    monkeypatch.setattr(turns, "settle", lambda: events.append("settle") or 0.0)

    class Calls:
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, inputs: List[Any]) -> None:
            events.append(self.name)

    timing = Timing(warmup=1, min_runs=2, max_runs=6, seconds=10.0, rounds=2)  # 3 runs a round
    medians = turns.timed_in_turns({"a": Calls("a"), "b": Calls("b")}, [], timing, {})
    assert sorted(medians) == ["a", "b"]
    # the first calls, then per round (rotating who goes first) a wait before each candidate's block
    assert _runs(events) == ["a", "b", "settle", "a", "settle", "b", "settle", "b", "settle", "a"]


def test_settle_waits_while_the_counted_cpu_time_grows():
    """settle waits while the CPU time it counts grows with the wall clock (a thread pool spinning after its last
    call) and returns once it stops. The clock is a stand-in: a real spinning thread on a loaded 2-core machine gets
    too little of a core in a 5 ms window to be seen (a CI run beside emulated-board counts saw 15 ms waited)."""
    import time

    import edgedyn.turns as turns

    started = time.perf_counter()

    def cpu_seconds() -> float:  # one core's worth until 80 ms, then idle
        return min(time.perf_counter() - started, 0.08)

    waited = turns.settle(cpu_seconds)
    assert 0.07 <= waited <= turns.SETTLE_MAX_S + 0.05
    assert turns.settle(lambda: 1.0) < 0.07  # nothing counted grows: the first short look suffices
    always = turns.settle(lambda: time.perf_counter())  # never idle: it gives up at SETTLE_MAX_S
    assert turns.SETTLE_MAX_S <= always <= turns.SETTLE_MAX_S + 0.05


@pytest.mark.parametrize("one_ms, two_ms, recorded", [(0.5, 0.7, 1), (0.97, 0.6, 2), (0.97, 0.96, None)])
def test_auto_records_a_thread_count_only_when_it_is_clearly_faster(monkeypatch, loop_spec, one_ms, two_ms,
                                                                    recorded):
    """The measured winner is timed on 1, 2, 4, ... threads below every core against every core; the fastest count
    is recorded (and used by the runtime when the caller gives no count) only when it takes under
    FEWER_THREADS_MUST_BEAT of every core's time."""
    import edgedyn.selection as selection

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in [n for n in BACKENDS if n != "onnxruntime"]:
        monkeypatch.delitem(BACKENDS, other)
    monkeypatch.setattr(selection.os, "cpu_count", lambda: 4)
    real = selection.timed_in_turns
    asked = []  # type: List[Dict[str, Any]]

    def timed(executors, inputs, timing, rejected):  # type: ignore[no-untyped-def]
        if "onnxruntime on every core" not in executors:
            return real(executors, inputs, timing, rejected)  # the backends against each other
        asked.append({label: executor.describe()["threads"] for label, executor in executors.items()})
        return {"onnxruntime on every core": 1.0, "onnxruntime on one thread": one_ms,
                "onnxruntime on 2 threads": two_ms}

    monkeypatch.setattr(selection, "timed_in_turns", timed)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=FAST)
    # None: the runtime's default, every core; 4 cores: the powers of two below it
    assert asked == [{"onnxruntime on every core": None, "onnxruntime on one thread": 1, "onnxruntime on 2 threads": 2}]
    assert artifact.meta.get("threads") == recorded
    kept = {1: "one thread", 2: "2 threads", None: "every core"}[recorded]
    assert artifact.meta["selection"]["threads"] == {"every_core_ms": 1.0, "threads_ms": {"1": one_ms, "2": two_ms},
                                                     "kept": kept}


@pytest.mark.parametrize("cores, counts", [(1, []), (2, [1]), (4, [1, 2]), (6, [1, 2, 4]), (16, [1, 2, 4, 8])])
def test_thread_counts_timed_against_every_core(cores, counts):
    from edgedyn.selection import thread_counts

    assert thread_counts(cores) == counts


def _runs(order: List[str]) -> List[str]:
    """The order of calls with consecutive calls of one candidate collapsed into one entry."""
    return [name for index, name in enumerate(order) if index == 0 or order[index - 1] != name]


@pytest.mark.parametrize("int8_backend, kept, precision, words", [
    ("a_slow", "b_fast", "fp32", "fastest of 3 verified: 0.5 ms; a_slow 4 ms (8.00x slower), a_slow:int8 4 ms "
                                 "(8.00x slower)"),
    ("b_fast", "b_fast", "int8", "fastest of 3 verified: 0.5 ms; b_fast 0.5 ms (1.00x slower), a_slow 4 ms (8.00x "
                                 "slower); 1.00x the speed of the fastest fp32 (b_fast 0.5 ms)"),
])
def test_auto_under_quantize_times_int8_and_fp32_together_and_keeps_int8_only_when_not_slower(
        monkeypatch, loop_spec, int8_backend, kept, precision, words):
    """Under --quantize the int8 builds are candidates beside the fp32 ones, all timed in one set of turns; a tie
    keeps int8 (what the user asked for), a slower int8 is no gain."""
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "a_slow", "b_fast")
    monkeypatch.setitem(BACKENDS, int8_backend, _stand_in(int8_backend, int8_backend, quantizes=True))
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]])
    timing = Timing(warmup=1, min_runs=3, max_runs=5, seconds=0.032, clock=CLOCK)
    lines = []  # type: List[str]
    artifact = choose("auto", program, board, board.target("cpu"), spec, progress=lines.append, timing=timing,
                      quantization=quantization)
    selection = artifact.meta["selection"]
    assert artifact.backend == selection["chosen"] == kept and selection["precision"] == precision
    int8_ms = {"a_slow": 4.0, "b_fast": 0.5}[int8_backend]
    assert selection["medians_ms"] == {"a_slow": 4.0, "b_fast": 0.5, int8_backend + ":int8": int8_ms}
    assert selection["fastest_by_precision"] == {"fp32": {"candidate": "b_fast", "ms": 0.5},
                                                 "int8": {"candidate": int8_backend + ":int8", "ms": int8_ms}}
    assert selection["why"] == words
    assert any(line.startswith("chose {} for".format(selection["candidate"])) for line in lines)


def test_int8_and_fp32_candidates_are_timed_in_the_same_turns(monkeypatch, loop_spec):
    """One set of rounds takes every verified candidate in turn, int8 and fp32 alike: a change of the machine's
    speed between two timing sessions cannot decide between them (it once did: zoo:poolformer kept int8 at 0.87x)."""
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "d_mid")
    monkeypatch.setitem(BACKENDS, "a_slow", _stand_in("a_slow", "a_slow", quantizes=True))
    monkeypatch.setattr(CLOCK, "order", [])
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]])
    timing = Timing(warmup=1, min_runs=3, max_runs=6, seconds=0.032, rounds=3, clock=CLOCK)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=timing, quantization=quantization)
    # a_slow's int8 and fp32 builds and d_mid, each verified and called once, then the rounds: each candidate's
    # block of calls, rotating who goes first
    blocks = _runs(CLOCK.order)
    assert len(blocks) >= 3 * 3 and set(blocks) == {"a_slow", "d_mid"}
    assert artifact.backend == "d_mid" and artifact.meta["selection"]["medians_ms"] == {
        "a_slow": 4.0, "a_slow:int8": 4.0, "d_mid": 3.0}


def test_int8_a_little_slower_than_fp32_is_not_kept(monkeypatch, loop_spec):
    """int8 measured 5% slower than fp32 is no gain: the fp32 artifact is kept, with both times (a 10% margin once
    kept it)."""
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "b_fast")
    monkeypatch.setitem(BACKENDS, "h_int8_five_percent_slower",
                        _stand_in("h_int8_five_percent_slower", "h_int8_five_percent_slower", quantizes=True))
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]])
    timing = Timing(warmup=1, min_runs=3, max_runs=5, seconds=0.032, clock=CLOCK)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=timing, quantization=quantization)
    assert artifact.backend == "b_fast" and "quantization" not in artifact.meta
    assert artifact.meta["selection"]["fastest_by_precision"] == {
        "int8": {"candidate": "h_int8_five_percent_slower:int8", "ms": 0.525}, "fp32": {"candidate": "b_fast",
                                                                                       "ms": 0.5}}
    assert artifact.meta["selection"]["why"].startswith(
        "fastest of 3 verified: 0.5 ms; h_int8_five_percent_slower:int8 0.525 ms (1.05x slower)")


def test_int8_and_fp32_are_compared_on_the_thread_counts_their_bundles_run_with(monkeypatch, loop_spec):
    """On every core int8 (2 ms) beats fp32 (3 ms), but the fp32 artifact runs in 1 ms on one thread: the fp32
    bundle is the faster one, and it is kept, with one thread."""
    import edgedyn.selection as selection
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch)
    monkeypatch.setattr(selection.os, "cpu_count", lambda: 2)
    monkeypatch.setitem(BACKENDS, "e_fast_on_one_thread", dataclasses.replace(
        _stand_in("e_fast_on_one_thread", "e_fast_on_one_thread"), threads_per_model=True))
    monkeypatch.setitem(BACKENDS, "g_int8_two_ms", dataclasses.replace(
        _stand_in("g_int8_two_ms", "g_int8_two_ms", quantizes=True), threads_per_model=True))
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]])
    timing = Timing(warmup=1, min_runs=3, max_runs=5, seconds=0.032, clock=CLOCK)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=timing, quantization=quantization)
    recorded = artifact.meta["selection"]
    assert artifact.backend == "e_fast_on_one_thread" and artifact.meta["threads"] == 1
    assert recorded["threads"] == {"every_core_ms": 3.0, "kept": "one thread", "threads_ms": {"1": 1.0}}
    assert recorded["threads_timed"]["g_int8_two_ms:int8"]["kept"] == "every core"
    assert recorded["fastest_by_precision"] == {"fp32": {"candidate": "e_fast_on_one_thread", "ms": 1.0},
                                                "int8": {"candidate": "g_int8_two_ms:int8", "ms": 2.0}}
    assert recorded["why"].startswith("fastest of 3 verified: 1 ms, on one thread; g_int8_two_ms:int8 2 ms")


def _gate_of(cosines: Dict[str, float], calls: List[str]) -> Any:
    """A held-out check (quantize/plan.py's HeldOut.check) that gives each stand-in int8 backend a fixed cosine
    and fails, with the number, the ones below 0.99; `calls` records whom it measured."""
    def held_out(backend: str, run: Any) -> List[Dict[str, Any]]:
        assert run([np.ones((2, 3), np.float32), np.asarray(4)])  # the candidate's own executor
        calls.append(backend)
        if cosines[backend] < 0.99:
            raise EdgedynError("the quantized model misses the default accuracy gate of --quantize (cosine=0.99) "
                               "on x ({}): y cosine {} < 0.99; no bundle was written".format(backend,
                                                                                          cosines[backend]))
        return [{"name": "y", "cosine": cosines[backend]}]

    return held_out


def _only_int8_stand_ins(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The registry holds only the stand-ins `names`, each one quantizing (has int8 kernels)."""
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch)
    for name in names:
        monkeypatch.setitem(BACKENDS, name, _stand_in(name, name, quantizes=True))


def test_auto_drops_an_int8_candidate_that_misses_the_gate_and_keeps_the_fastest_that_meets_it(monkeypatch,
                                                                                                 loop_spec):
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    _only_int8_stand_ins(monkeypatch, "a_slow", "b_fast")
    calls = []  # type: List[str]
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]],
                                held_out=_gate_of({"b_fast": 0.95, "a_slow": 0.995}, calls))
    timing = Timing(warmup=1, min_runs=3, max_runs=5, seconds=0.032, clock=CLOCK)
    lines = []  # type: List[str]
    artifact = choose("auto", program, board, board.target("cpu"), spec, progress=lines.append, timing=timing,
                      quantization=quantization)
    recorded = artifact.meta["selection"]
    assert sorted(calls) == ["a_slow", "b_fast"]  # every int8 candidate, fp32 ones never
    # the faster b_fast was never timed as int8
    assert recorded["medians_ms"] == {"a_slow": 4.0, "a_slow:int8": 4.0, "b_fast": 0.5}
    assert recorded["rejected"] == {"b_fast:int8": "the quantized model misses the default accuracy gate of "
                                                   "--quantize (cosine=0.99) on x (b_fast): y cosine 0.95 < 0.99"}
    assert any(line.startswith("b_fast:int8: rejected (the quantized model misses") for line in lines)
    # int8 a_slow (4 ms) against fp32 b_fast (0.5 ms): the fp32 artifact is kept, and says why.
    assert artifact.backend == "b_fast" and recorded["precision"] == "fp32"
    assert recorded["why"].startswith("fastest of 3 verified: 0.5 ms")


def test_when_every_int8_candidate_misses_the_gate_the_error_gives_each_ones_numbers(monkeypatch, loop_spec):
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    board = load_board("x86-64")
    _only_int8_stand_ins(monkeypatch, "a_slow", "b_fast", "cannot_express")
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]],
                                held_out=_gate_of({"b_fast": 0.95, "a_slow": 0.9}, []))
    with pytest.raises(EdgedynError) as raised:
        choose("auto", program, board, board.target("cpu"), spec, timing=FAST, quantization=quantization)
    message = raised.value.message
    assert message.startswith("no int8 candidate for {} meets the accuracy gate: ".format(spec.name))
    assert "(a_slow): y cosine 0.9 < 0.99" in message and "(b_fast): y cosine 0.95 < 0.99" in message
    assert "not built: cannot_express:int8: cannot express aten.mul.Tensor" in message
    assert message.endswith("; no bundle was written") and message.count("no bundle was written") == 1
    assert "--max-accuracy-drop" in raised.value.hint


def test_why_names_each_loser_and_how_much_slower():
    from edgedyn.selection import _why

    assert _why("b", {"a": 3.0, "b": 1.5, "c": 6.0}) == (
        "fastest of 3 verified: 1.5 ms; a 3 ms (2.00x slower), c 6 ms (4.00x slower)")


def test_edgedyn_debug_lets_a_backend_bug_through(monkeypatch, loop_spec):
    spec, program = loop_spec
    _register(monkeypatch, "crashes")
    monkeypatch.setenv("EDGEDYN_DEBUG", "1")
    board = dataclasses.replace(load_board("raspberry-pi-4"), backends=("tvm", "onnxruntime"))
    monkeypatch.setitem(BACKENDS, "tvm", _stand_in("tvm", "crashes"))
    with pytest.raises(KeyError, match="a bug in a backend"):
        choose("auto", program, board, board.target("cpu"), spec)


def test_auto_holds_back_a_backend_slow_untuned_until_it_has_tuning_records(monkeypatch, loop_spec, tmp_path):
    """A backend whose record says it is slow untuned (TVM's) is built by auto only when the target has tuning
    records, or when nothing else verifies; the record says why it was not built. Here it is the fast one, so each
    case shows in what auto keeps."""
    from edgedyn.backends.tuning_records import ENV, RECORDS, database_dir

    spec, program = loop_spec
    board = load_board("x86-64")
    target = board.target("cpu")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "a_slow", "cannot_express")
    monkeypatch.setitem(BACKENDS, "b_fast", dataclasses.replace(_stand_in("b_fast", "b_fast"),
                                                                held_back_untuned="slow untuned (measured)"))
    monkeypatch.setenv(ENV, str(tmp_path))
    timing = Timing(warmup=1, min_runs=3, max_runs=6, seconds=0.01, rounds=1, clock=CLOCK)
    monkeypatch.setattr(CLOCK, "calls", {})
    lines: List[str] = []
    selection = choose("auto", program, board, target, spec, lines.append, timing=timing).meta["selection"]
    assert selection["candidate"] == "a_slow" and set(selection["medians_ms"]) == {"a_slow"}
    assert "b_fast" not in CLOCK.calls  # never built, never run
    assert selection["held_back"] == {"b_fast": "built only if no other candidate verifies: slow untuned (measured); "
                                                "it has no tuning records for {} (edgedyn tune writes them; "
                                                "--backend b_fast builds it anyway)".format(target.name)}
    assert "b_fast: held back (built only if no other candidate verifies: slow untuned" in "\n".join(lines)
    # Nothing else verifies: it is built after all, and kept.
    monkeypatch.delitem(BACKENDS, "a_slow")
    selection = choose("auto", program, board, target, spec, timing=timing).meta["selection"]
    assert selection["candidate"] == "b_fast" and "held_back" not in selection
    assert set(selection["rejected"]) == {"cannot_express"}
    # With tuning records for the target it is a candidate like any other, and wins.
    _register(monkeypatch, "a_slow")
    database_dir(target.name).mkdir(parents=True)
    (database_dir(target.name) / RECORDS).write_text('["a record"]\n')
    selection = choose("auto", program, board, target, spec, timing=timing).meta["selection"]
    assert selection["candidate"] == "b_fast" and set(selection["medians_ms"]) == {"a_slow", "b_fast"}
    assert "held_back" not in selection


def test_auto_skips_a_backend_that_is_not_installed(monkeypatch, loop_spec):
    spec, program = loop_spec
    board = load_board("x86-64")
    for other in [n for n in BACKENDS if n not in ("onnxruntime", "tvm")]:
        monkeypatch.delitem(BACKENDS, other)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    artifact = choose("auto", program, board, board.target("cpu"), spec, timing=FAST)
    selection = artifact.meta["selection"]
    assert artifact.backend == "tvm" and list(selection["medians_ms"]) == ["tvm"]
    assert selection["rejected"]["onnxruntime"].startswith(
        "the onnxruntime backend needs onnx, onnxscript and onnxruntime")


def test_nothing_that_builds_is_an_error_naming_each_reason(monkeypatch, loop_spec):
    spec, program = loop_spec
    board = load_board("x86-64")
    for other in list(BACKENDS):
        monkeypatch.delitem(BACKENDS, other)
    _register(monkeypatch, "cannot_express", "wrong_but_fast")
    with pytest.raises(BackendError) as raised:
        choose("auto", program, board, board.target("cpu"), spec, timing=FAST)
    assert raised.value.message.startswith("no backend could build {} for x86-64: ".format(spec.name))
    assert "cannot_express: cannot express aten.mul.Tensor" in raised.value.message
    assert "wrong_but_fast: wrong_but_fast disagrees with torch eager" in raised.value.message
    assert "pip install 'edgedyn[onnxruntime]'" in raised.value.hint


def test_cross_board_follows_its_preference_and_skips_what_fails(monkeypatch, loop_spec):
    spec, program = loop_spec
    _register(monkeypatch, "cannot_express")
    monkeypatch.setitem(BACKENDS, "tvm", _stand_in("tvm", "cannot_express"))  # as if TVM could not express the graph
    board = dataclasses.replace(load_board("raspberry-pi-4"), backends=("tvm", "onnxruntime"))
    artifact = choose("auto", program, board, board.target("cpu"), spec)
    assert artifact.backend == "onnxruntime"
    assert artifact.meta["selection"] == {
        "mode": "board preference", "order": ["tvm", "onnxruntime"], "chosen": "onnxruntime", "precision": "fp32",
        "rejected": {"tvm": "cannot express aten.mul.Tensor (examples/loop_example.py:12)"}, "verified_on_host": True,
        "not_measured": "the emulated raspberry-pi-4 could not measure the candidates here (no probe bundle); the "
                        "board file's preference decided"}


def test_cross_board_int8_skips_a_preferred_candidate_that_misses_the_gate_here(monkeypatch, loop_spec):
    """For another board, the preference decides; an int8 artifact this machine can run is held to the gate here,
    and one that misses is passed over for the next, with its numbers."""
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    pi = load_board("raspberry-pi-4")  # read before the registry holds only stand-ins: it checks the names
    _only_int8_stand_ins(monkeypatch, "a_slow", "b_fast")
    board = dataclasses.replace(pi, backends=("b_fast", "a_slow"))
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]],
                                held_out=_gate_of({"b_fast": 0.95, "a_slow": 0.995}, []))
    artifact = choose("auto", program, board, board.target("cpu"), spec, quantization=quantization)
    assert artifact.backend == "a_slow"
    assert artifact.meta["selection"]["rejected"] == {
        "b_fast:int8": "the quantized model misses the default accuracy gate of --quantize (cosine=0.99) on x "
                       "(b_fast): y cosine 0.95 < 0.99"}


def test_cross_board_never_picks_a_portable_artifact_that_failed_here(monkeypatch, loop_spec):
    spec, program = loop_spec
    _register(monkeypatch)
    monkeypatch.setitem(BACKENDS, "tvm", _stand_in("tvm", "wrong_but_fast"))
    board = dataclasses.replace(load_board("raspberry-pi-4"), backends=("tvm", "onnxruntime"))
    artifact = choose("auto", program, board, board.target("cpu"), spec)
    assert artifact.backend == "onnxruntime"
    assert "disagrees with torch eager" in artifact.meta["selection"]["rejected"]["tvm"]


def test_cross_board_bundle_records_the_preference_when_the_board_cannot_be_emulated(tmp_path, monkeypatch):
    # With qemu and the counting plugin, auto measures another board's candidates on its emulated CPU
    # (tests/board/test_onboard.py); without them the board file's preference decides, and the manifest says why.
    import edgedyn.onboard

    monkeypatch.setattr(edgedyn.onboard, "unavailable", lambda board: "missing qemu-aarch64 (as if not installed)")
    path = edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], board="raspberry-pi-4",
                          output=tmp_path / "mlp.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    (artifact,) = spec["artifacts"]
    board = load_board("raspberry-pi-4")
    first = next(name for name in board.backends if name in BACKENDS)
    assert artifact["backend"] == first == "onnxruntime"
    assert artifact["selection"]["mode"] == "board preference"
    assert artifact["selection"]["order"] == list(board.backends)
    assert artifact["selection"]["not_measured"] == (
        "the emulated raspberry-pi-4 could not measure the candidates here (missing qemu-aarch64 (as if not "
        "installed)); the board file's preference decided")


def test_auto_measures_every_backend_on_mobilenet_v2_and_keeps_the_fastest(tmp_path, capsys, monkeypatch):
    from edgedyn.backends.tuning_records import ENV

    monkeypatch.setenv(ENV, str(tmp_path / "no-records"))  # whatever this machine has tuned
    lines: List[str] = []
    path = edgedyn.export(str(EXAMPLES / "mobilenet_v2.py:MobileNetV2"), inputs=["x=1x3x96x96"], board="x86-64",
                          output=tmp_path / "mnv2.edgedyn", progress=lines.append)
    (spec,) = rt.read_manifest(path)["specializations"]
    artifact = kept_artifact(spec)  # a bf16 winner is followed by its fp32 fallback (tests/test_openvino_backend.py)
    assert spec["artifacts"][0] is artifact and len(spec["artifacts"]) <= 2
    selection = artifact["selection"]
    medians = selection["medians_ms"]
    assert selection["mode"] == "measured" and selection["host"] == "x86_64"
    assert "onnxruntime" in medians and "tvm" not in medians, selection  # untuned TVM waits (its record says why)
    assert selection["held_back"]["tvm"].startswith("built only if no other candidate verifies: untuned TVM was "
                                                    "slower"), selection
    # Which backend is fastest is measured (benchmarks/compare.py), not asserted: a busy machine may reorder them.
    # Times are per candidate (backend, or backend:precision for bf16/fp16); the contenders were timed again on
    # each thread count in one set of turns, and those times decide; `chosen` is the candidate's backend.
    timed = dict(medians)
    for label, record in selection.get("threads_timed", {}).items():
        timed[label] = record["every_core_ms"] if record["kept"] == "every core" else \
            min(record["threads_ms"].values())
    assert selection["candidate"] == min(timed, key=timed.get), (timed, selection.get("threads_timed"))
    assert selection["chosen"] == artifact["backend"] == selection["candidate"].split(":")[0]
    results = rt.load(path).verify()
    assert results and all(r["ok"] for r in results), results
    # What a person sees in the export's progress, and what docs/backends.md quotes.
    with capsys.disabled():
        print("\nauto on MobileNetV2 1x3x96x96 (x86-64): medians_ms {} rejected {}".format(
            medians, selection["rejected"]))
    assert any(line.startswith("chose {} for x=1x3x96x96".format(selection["candidate"])) for line in lines), lines


def test_user_choice_is_recorded(export_example):
    (spec,) = rt.read_manifest(export_example("tiny_cnn", backend="tvm"))["specializations"]
    assert spec["artifacts"][0]["selection"] == {"mode": "user", "requested": "tvm", "precision": "fp32"}


def test_a_reduced_precision_output_beyond_its_range_is_a_gate_miss_its_first_layers_may_mend():
    """fp16 ends at 65504: an fp16 artifact whose outputs hold inf or nan (its fp32 self matched torch) missed the
    gate, and `auto` tries it with its first layers in fp32 (candidates.missed_gate); in fp32 the same is broken."""
    from edgedyn.candidates import Candidate, _check_sane, missed_gate

    artifact = dataclasses.make_dataclass("A", [("backend", str)])("openvino")
    want = [np.array([[1.0, 2.0, 3.0]], np.float32)]
    with pytest.raises(GateMissError) as raised:
        _check_sane(artifact, [np.array([[1.0, np.inf, 3.0]], np.float32)], want, "fp16", ["output_0"])
    assert raised.value.message == ("openvino in fp16 misses the float accuracy gate: output 0 has values beyond "
                                    "fp16's range (inf or nan)")
    assert missed_gate(Candidate("openvino", "fp16"), raised.value)
    assert not missed_gate(Candidate("openvino"), raised.value)  # fp32 has no first layers to keep
    # A build that failed is no verdict on the arithmetic, whatever its words.
    assert not missed_gate(Candidate("openvino", "fp16"), BackendError("openvino in fp16 misses a kernel"))
    with pytest.raises(BackendError, match="a broken artifact, not fp32 rounding"):
        _check_sane(artifact, [np.array([[1.0, np.nan, 3.0]], np.float32)], want, "fp32", ["output_0"])
    _check_sane(artifact, [want[0] * 1.001], want, "fp16", ["output_0"])  # finite and close: the gate judges it


def test_a_users_reduced_precision_is_retried_with_fp32_layers_only_after_a_gate_miss(monkeypatch):
    """`--backend openvino --precision bf16`: an artifact that missed its gate is built again with its first layers
    in fp32 (candidates.more_fp32); one that failed for any other reason is no verdict on its arithmetic, and its
    error is raised as it is, with nothing built again."""
    import edgedyn.selection as selection
    from edgedyn.candidates import FP32_SHARES, Candidate

    built: List[float] = []

    def build(candidate):
        built.append(candidate.fp32_share)
        return dataclasses.make_dataclass("A", [("meta", dict)])({})

    def failing(error):
        def gated(artifact, candidate, spec, accuracy):
            raise error
        return gated

    asked = Candidate("openvino", "bf16")
    monkeypatch.setattr(selection, "gated", failing(BackendError("openvino in bf16 misses a kernel for Erf")))
    with pytest.raises(BackendError, match="misses a kernel for Erf"):
        selection._gated(build, build(asked), asked, None, None, lambda message: None)
    assert built == [0.0]  # the first build only
    built.clear()
    monkeypatch.setattr(selection, "gated", failing(GateMissError("openvino in bf16 misses the float accuracy gate: "
                                                                  "output_0 cosine 0.9951 < 0.999")))
    with pytest.raises(EdgedynError, match="with its first layers in fp32 it missed too") as raised:
        selection._gated(build, build(asked), asked, None, None, lambda message: None)
    assert built == [0.0, FP32_SHARES[-1]]  # half in fp32 missed too: no smaller share can pass
    assert "first 50%: output_0 cosine 0.9951 < 0.999" in raised.value.message


def test_another_boards_int8_with_reduced_float_layers_is_gated_on_its_emulated_cpu(monkeypatch, loop_spec):
    """`--backend openvino --quantize int8 --board raspberry-pi-5` from x86: the layers NNCF leaves float compute in
    fp16 on the Pi 5, which this host cannot; its gate is measured on the emulated board (onboard.on_board), not
    here, where they would compute in fp32."""
    require_module("openvino")
    import edgedyn.onboard
    import edgedyn.selection as selection
    from edgedyn.quantize import Quantization

    spec, program = loop_spec
    seen = []
    monkeypatch.setattr(selection, "_emulation_missing", lambda board: None)
    monkeypatch.setattr(edgedyn.onboard, "on_board", lambda build, board, spec, step, listed, *rest: seen.extend(
        listed) or "measured on the board")
    quantization = Quantization(mode="int8", calibration=[[np.ones((2, 3), np.float32)]])
    board = load_board("raspberry-pi-5")
    assert choose("openvino", program, board, board.target("cpu"), spec, quantization=quantization, precision="auto",
                  probe=lambda *args: None) == "measured on the board"
    assert [(c.backend, c.precision, c.floats) for c in seen] == [("openvino", "int8", "fp16")]


def test_a_candidate_that_fails_on_the_emulated_board_is_rejected_with_its_exception_not_its_hint_alone():
    """The board's stderr ends with the runtime error's hint; the rejection names the error itself (LeViT's TFLite
    fp16 on the Pi 5: XNNPACK failed to delegate a BATCH_MATMUL, which the hint line alone hid)."""
    from edgedyn.onboard import _last_line

    stderr = ("Traceback (most recent call last):\n  File \"<string>\", line 5, in <module>\n"
              "edgedyn.runtime.program.ArtifactLoadError: tflite-cpu does not load: RuntimeError: failed to delegate "
              "BATCH_MATMUL node #27\nhint: copy the bundle again or export it again; never edit a bundle by hand\n")
    assert _last_line(stderr) == (
        "edgedyn.runtime.program.ArtifactLoadError: tflite-cpu does not load: RuntimeError: failed to delegate "
        "BATCH_MATMUL node #27 hint: copy the bundle again or export it again; never edit a bundle by hand")
    assert _last_line("error: the bundle is for x86_64\nhint: export it for the board") == (
        "error: the bundle is for x86_64 hint: export it for the board")
    assert _last_line("qemu: uncaught target signal 11 (Segmentation fault) - core dumped\n") == (
        "qemu: uncaught target signal 11 (Segmentation fault) - core dumped")


def test_an_fp32_fallback_only_where_the_board_does_not_promise_the_kept_precision(tmp_path):
    """A kept bf16 brings the fastest fp32 candidate along for CPUs without bf16 (runtime/choice.py runs it there)
    only when the board file does not promise bf16, that candidate is another backend, and the kept one is a float
    reduction (int8 computes anywhere); its measured thread count comes with it."""
    from edgedyn.candidates import Candidate
    from edgedyn.selection import _fp32_fallback

    text = (REPO / "boards" / "x86-64.toml").read_text()
    promising = tmp_path / "zen4.toml"
    promising.write_text(text.replace('name = "x86-64"', 'name = "zen4"').replace('"cx16"]', '"cx16", "avx512_bf16"]'))
    generic, zen4 = load_board("x86-64"), load_board(str(promising))
    assert "avx512_bf16" in zen4.cpu_features and "avx512_bf16" not in generic.cpu_features

    def verified():  # fresh artifacts per call: the fallback's meta is written
        return {label: (candidate, Artifact(candidate.backend, candidate.backend, "cpu", None, "t", {}, {}))
                for label, candidate in (("openvino:bf16", Candidate("openvino", "bf16")),
                                         ("onnxruntime", Candidate("onnxruntime")), ("openvino", Candidate("openvino")),
                                         ("tflite:int8", Candidate("tflite", "int8")))}

    fastest = {"openvino:bf16": (1.0, None), "onnxruntime": (2.0, 1), "openvino": (2.5, None),
               "tflite:int8": (0.9, None)}
    by_precision = {"bf16": {"candidate": "openvino:bf16", "ms": 1.0}, "fp32": {"candidate": "onnxruntime", "ms": 2.0}}
    said = []  # type: List[str]
    kept = Candidate("openvino", "bf16")
    fallback = _fp32_fallback(kept, generic, verified(), fastest, by_precision, said.append)
    assert fallback is not None and fallback.backend == "onnxruntime" and fallback.meta["threads"] == 1
    selection = fallback.meta["selection"]
    assert (selection["mode"], selection["candidate"], selection["for"], selection["precision"]) == (
        "fallback", "onnxruntime", "openvino:bf16", "fp32")
    assert "x86-64 promises no more than sse4.2, ssse3, popcnt, cx16" in selection["why"]
    assert said == ["kept onnxruntime as well, for a CPU without avx512_bf16 or amx_bf16 (2 ms here)"]
    assert _fp32_fallback(kept, zen4, verified(), fastest, by_precision, said.append) is None
    own = dict(by_precision, fp32={"candidate": "openvino", "ms": 2.5})  # OpenVINO computes fp32 itself there
    assert _fp32_fallback(kept, generic, verified(), fastest, own, said.append) is None
    assert _fp32_fallback(Candidate("tflite", "int8"), generic, verified(), fastest, by_precision, said.append) is None
    assert _fp32_fallback(Candidate("onnxruntime"), generic, verified(), fastest, by_precision, said.append) is None


def test_inspect_shows_the_times_auto_weighed_not_its_first_turns():
    # The contenders are timed a second time (every core and fewer threads) and those times decide; `inspect`
    # lists them, not the first turns' (one ResNet-18 export: ncnn 18.4 ms in the first turns, 12.8 in the second,
    # and the record's `why` said 12.8), with the thread count where fewer threads were kept.
    from edgedyn.cli.inspect import _selection

    selection = {"mode": "measured", "candidate": "openvino:bf16",
                 "medians_ms": {"openvino:bf16": 9.02, "ncnn": 18.35, "tvm": 1439.35},
                 "threads_timed": {
                     "openvino:bf16": {"every_core_ms": 8.62, "kept": "every core", "threads_ms": {"1": 16.26}},
                     "ncnn": {"every_core_ms": 14.1, "kept": "one thread", "threads_ms": {"1": 12.8}}}}
    assert _selection(selection) == ("openvino:bf16 (timed here in turns: openvino:bf16 8.62 ms, ncnn 12.8 ms on one "
                                     "thread, tvm 1.44e+03 ms)")
    held = dict(selection, held_back={"tvm": "built only if no other candidate verifies: ..."})
    assert _selection(held) == _selection(selection)[:-1] + "; held back: tvm)"


def _off_on(example, batch, outputs, rng, amount):
    """`outputs` (torch's on `batch`), but on the example inputs the first moved at right angles to itself by
    `amount` of its norm: cosine 1 / sqrt(1 + amount^2) to torch there, exact on every other batch."""
    if not all(np.array_equal(a, b) for a, b in zip(batch, example)):
        return outputs
    out = outputs[0].astype(np.float64).ravel()
    side = rng.standard_normal(out.shape)
    side -= (side @ out) / (out @ out) * out
    moved = out + amount * np.linalg.norm(out) * side / np.linalg.norm(side)
    return [moved.reshape(outputs[0].shape).astype(np.float32)] + outputs[1:]


def test_the_float_gate_holds_the_example_inputs_to_the_cosine_verify_will():
    # The gate is a mean over the example inputs and 8 drawn like them; the bundle's verify (and the export's last
    # check) holds the example alone to the same cosine. A candidate that passed the mean and missed on the example
    # failed the export afterwards as "a bug" (timm's EfficientViT-B0, OpenVINO bf16 with 35% of its layers fp32);
    # now it misses the gate, and auto tries the next candidate.
    import torch

    from edgedyn.quantize.precision import _flat, float_gate

    (spec,) = capture(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"]).specializations
    gate = float_gate(spec)
    module, example = spec.program.module(), gate.batches[0]
    rng = np.random.default_rng(3)

    def exact(batch):
        with torch.no_grad():
            return [o.numpy() for o in _flat(module(*[torch.from_numpy(a) for a in batch]))]

    def off_on_the_example(batch):  # cosine 0.995 to torch there (1 / sqrt(1 + 0.1^2)), exact elsewhere
        return _off_on(example, batch, exact(batch), rng, 0.1)

    assert gate.check("exact", "bf16", exact)["outputs"][0]["cosine"] > 0.99999
    with pytest.raises(GateMissError) as missed:
        gate.check("off", "bf16", off_on_the_example)
    assert "< 0.999 on the example inputs (the bundle's reference, which verify checks)" in missed.value.message
    assert gate.measure(off_on_the_example)[0]["cosine"] >= 0.999  # the mean alone passes: the old gate let it by


@pytest.mark.parametrize("floats", ["bf16", "fp32"])
def test_the_int8_gate_holds_the_example_inputs_when_its_float_layers_are_reduced(floats):
    # An int8 artifact whose layers kept out of int8 compute in bf16 is verified by its example outputs against
    # torch eager at the int8 gate's cosine (not against outputs recorded at export): passing the held-out split
    # alone let the export keep a candidate it would then refuse as a bug, as the float gate once did. With fp32
    # float layers verify compares with the recorded outputs, so the example has nothing more to meet.
    import types

    import torch

    from edgedyn.candidates import Candidate, _measured_int8
    from edgedyn.quantize import Quantization
    from edgedyn.quantize.precision import _flat, like

    (spec,) = capture(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"]).specializations
    module, example = spec.program.module(), [t.numpy() for t in spec.example_tensors]
    rng = np.random.default_rng(5)
    held = [[like(rng, a) for a in example] for _ in range(4)]

    def off_on_the_example(batch):  # cosine 0.98 to torch there (1 / sqrt(1 + 0.2^2)), exact on the held-out split
        with torch.no_grad():
            return _off_on(example, batch, [o.numpy() for o in _flat(module(*[torch.from_numpy(a) for a in batch]))],
                           rng, 0.2)

    quantization = Quantization(mode="int8", calibration=held, target_cosine=0.99,
                                held_out=lambda backend, run: [run(batch) for batch in held])
    artifact = types.SimpleNamespace(measured=None)
    candidate = Candidate("openvino", "int8", floats=floats)
    if floats == "fp32":
        _measured_int8(artifact, candidate, spec, quantization, off_on_the_example)
        assert len(artifact.measured["records"]) == len(held)
        return
    with pytest.raises(GateMissError) as missed:
        _measured_int8(artifact, candidate, spec, quantization, off_on_the_example)
    assert re.search(r"openvino:int8 \(int8, its float layers in bf16\) misses the int8 gate: \S+ cosine 0\.98\d+ "
                     r"< 0\.99 on the example inputs", missed.value.message), missed.value.message
    assert artifact.measured is None
