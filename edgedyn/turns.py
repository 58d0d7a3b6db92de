"""Timing `auto`'s candidates against each other on a shared machine: in rounds that take them in turns, each
candidate's fastest round deciding (see Timing), and the one helper that turns a candidate's failure into a reason.
"""
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from edgedyn.errors import EdgedynError
from edgedyn.runtime.bench import Clock, StopRule, percentile, time_calls


@dataclass(frozen=True)
class Timing:
    """How long `auto` measures each candidate: `rounds` rounds that take the verified candidates in turn (rotating
    who goes first), each a few warm-up runs, then timed runs until `seconds / rounds` have passed (at least
    `min_runs`, at most `max_runs / rounds`); a candidate's time is its fastest round's median. A candidate slower
    than `seconds` per call gets one timed run: it will not win, and untuned code must not make an export take
    minutes. `clock` is read around each call (tests pass a fake one).

    Note: one pass per candidate, one after the other, measured zoo:resnet's TFLite at 0.102 ms in one export and
    0.059 ms in the next (onnxruntime 0.056 and 0.089 ms: a burst of other work on a shared 2-core host lands on
    whichever candidate runs then); taking turns spreads such a burst over all of them. On that host such
    stretches last seconds (2-thread runs at 1-thread speed) and only ever add time; the median of 3 rounds still
    took the slow value when a stretch covered two of one candidate's rounds (benchmarks/speed.py's full run of
    2026-12-01 19:02: the example MobileNetV2's fp32 TFLite read 0.341 ms in the export, 0.19-0.21 ms in other
    runs, and onnxruntime's 0.223 ms won), so the fastest round decides.

    Before each round the process waits until it is idle (settle): a runtime's thread pool keeps
    spinning on a core after a call returns, and a round timed meanwhile has one core fewer. Measured on a 2-core
    x86 host (2026-12-02), CPU time of an otherwise sleeping process after its last call: numpy's OpenBLAS (the
    portable executor) kept one core busy for ~100 ms, onnxruntime ~50 ms, torch ~10 ms, LiteRT and TVM none.
    Without the wait, the example MobileNetV2's TFLite, timed right after the portable executor in every round,
    read 0.37-0.49 ms in each of four exports against 0.21-0.22 ms on its own, and `auto` kept onnxruntime
    (0.25 ms); with the wait it read 0.225-0.235 ms in each of four and was kept. The "slow stretch" that the full
    run above blamed for its 0.341 ms was this."""

    warmup: int = 3  # including the first call
    min_runs: int = 5
    max_runs: int = 200
    seconds: float = 1.0
    rounds: int = 3
    clock: Clock = field(default=time.perf_counter, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.warmup >= 1 and 1 <= self.min_runs <= self.max_runs and self.seconds > 0 and self.rounds >= 1):
            raise ValueError("Timing needs warmup >= 1, 1 <= min_runs <= max_runs, seconds > 0 and rounds >= 1; "
                             "got {}".format(self))

    def stop_rule(self) -> StopRule:
        """One round's timed runs as runtime.bench's stop rule; no time cap: its seconds decide, or its max_runs."""
        return StopRule(self.min_runs, self.seconds / self.rounds, math.inf,
                        max(self.min_runs, self.max_runs // self.rounds))


DEFAULT_TIMING = Timing()


def timed_in_turns(executors: Dict[str, Any], inputs: List[Any], timing: Timing,
                   rejected: Dict[str, str]) -> Dict[str, float]:
    """Each open executor's milliseconds per call on `inputs` (its fastest round's median), all of them
    timed in turns (see Timing); one that fails while being timed goes to `rejected`."""
    calls = {name: (lambda executor=executor: executor.run(inputs)) for name, executor in executors.items()}
    medians = {}  # type: Dict[str, float]
    turns = []  # type: List[str]
    for name, call in calls.items():
        slow = attempt(name, lambda: _slow_call_ms(call, timing), rejected)
        if name in rejected:
            continue
        if slow is not None:
            medians[name] = slow  # too slow to win: its one timed run says so
        else:
            turns.append(name)
    per_round = {name: [] for name in turns}  # type: Dict[str, List[float]]
    for index in range(timing.rounds if turns else 0):
        shift = index % len(turns)
        for name in turns[shift:] + turns[:shift]:
            if name not in rejected:
                settle()
                median = attempt(name, lambda: _round_median_ms(calls[name], timing), rejected)
                if median is not None:
                    per_round[name].append(median)
    # The fastest round, not the median of rounds: a slow stretch of the machine only ever adds time, and a
    # median takes the slow value whenever it covers most of one candidate's rounds (see Timing).
    medians.update({name: min(per_round[name]) for name in turns if name not in rejected})
    return {name: medians[name] for name in executors if name in medians}


# settle: idle once the CPU time grew by under IDLE_SHARE of one core over a window of IDLE_WINDOW_S.
IDLE_WINDOW_S = 0.005
IDLE_SHARE = 0.2
SETTLE_MAX_S = 0.3


def settle(cpu_seconds: Callable[[], float] = time.process_time, window_s: float = IDLE_WINDOW_S) -> float:
    """Waits until the threads that `cpu_seconds` counts are idle (a thread pool that spins after its last call has
    stopped), at most SETTLE_MAX_S; returns the seconds waited. Default: this process's CPU time, so a busy machine
    alone does not make it wait (benchmarks/compare.py passes another process's)."""
    started = time.perf_counter()
    while True:
        cpu, wall = cpu_seconds(), time.perf_counter()
        time.sleep(window_s)
        now = time.perf_counter()
        if cpu_seconds() - cpu < IDLE_SHARE * (now - wall) or now - started >= SETTLE_MAX_S:
            return now - started


def _slow_call_ms(call: Callable[[], Any], timing: Timing) -> Optional[float]:
    """Makes the first call (it pays for allocation and lazy initialization: never counted); when that took
    longer than `timing.seconds`, the milliseconds of one more, timed call, else None (timed in rounds)."""
    clock = timing.clock
    started = clock()
    call()
    if clock() - started > timing.seconds:
        return percentile(time_calls(call, StopRule(1, 0.0, math.inf, 1), clock), 50) * 1000.0
    return None


def _round_median_ms(call: Callable[[], Any], timing: Timing) -> float:
    """One round: warm-up runs (another candidate ran just before: its threads and data leave the caches), then
    the median of the timed runs."""
    if timing.warmup > 1:
        time_calls(call, StopRule(timing.warmup - 1, 0.0, math.inf, timing.warmup - 1), timing.clock)
    return percentile(time_calls(call, timing.stop_rule(), timing.clock), 50) * 1000.0


def attempt(name: str, work: Callable[[], Any], rejected: Dict[str, str],
            errors: Optional[Dict[str, EdgedynError]] = None) -> Any:
    """`work()`, or None with the reason in `rejected` (not installed, cannot express the graph, disagrees) and,
    when `errors` is given, the EdgedynError itself there (its type says what kind of rejection it was)."""
    try:
        return work()
    except EdgedynError as error:
        rejected[name] = error.message
        if errors is not None:
            errors[name] = error
    except Exception as error:  # a bug in one backend must not cost the user the others; say so
        if os.environ.get("EDGEDYN_DEBUG"):
            raise
        rejected[name] = "internal error: {}: {} (EDGEDYN_DEBUG=1 shows the traceback)".format(
            type(error).__name__, error)
    return None
