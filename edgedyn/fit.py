"""Board fit: does the exported model fit in the board's RAM budget? Checked at export, before anything is written.

Peak resident memory on the board is estimated as
    runtime overhead of the executor (interpreter, numpy, the backend runtime, measured below)
  + the bundle, which the runtime reads into memory whole (it checks every member's SHA-256)
  + for each specialization: its weights as loaded arrays and its planned arena (intermediates).
"""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence  # noqa: F401 (type comments)

from edgedyn.registry import BACKENDS
from edgedyn.boards import Board
from edgedyn.errors import EdgedynError

MB = 1 << 20
CLOSE = 0.90  # within 10% of the budget: warn

# The runtime overhead of each executor, from its backend's registry record (edgedyn/registry.py says how
# it was measured; benchmarks/overheads.py re-measures it). aarch64 boards measure within a few MB of this (same
# libraries, similar page sizes); Python 3.8/numpy 1.19 is smaller.
RUNTIME_OVERHEAD_BYTES = {b.executor: b.overhead_bytes for b in BACKENDS.values() if b.overhead_bytes is not None}
# Executors nobody measured yet are charged the largest overhead measured (and the report says so).
UNMEASURED_OVERHEAD_BYTES = max(RUNTIME_OVERHEAD_BYTES.values())
_IMPORTS = {b.executor: b.overhead_import for b in BACKENDS.values()}
PORTABLE = BACKENDS["portable"].executor  # the executor whose runtime needs only numpy
SHARES_ARENA = frozenset(b.executor for b in BACKENDS.values() if b.shares_arena)


class FitError(EdgedynError):
    """The model would not fit in the board's memory budget."""


@dataclass(frozen=True)
class FitReport:
    """Estimated peak memory on the board against its budget, with the parts it is made of."""

    board: str
    budget_bytes: int
    executor: str
    overhead_bytes: int
    overhead_measured: bool
    bundle_bytes: int
    weights_bytes: int
    arena_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.overhead_bytes + self.bundle_bytes + self.weights_bytes + self.arena_bytes

    @property
    def status(self) -> str:
        if self.total_bytes > self.budget_bytes:
            return "over"
        return "close" if self.total_bytes > CLOSE * self.budget_bytes else "ok"

    def breakdown(self) -> str:
        return "{} MB = runtime {} MB ({}{}) + bundle {} MB + weights {} MB + arena {} MB".format(
            _mb(self.total_bytes), _mb(self.overhead_bytes), self.executor,
            "" if self.overhead_measured else ", not measured: charged the largest known", _mb(self.bundle_bytes),
            _mb(self.weights_bytes), _mb(self.arena_bytes))

    def to_dict(self) -> Dict[str, Any]:
        return {"board": self.board, "budget_bytes": self.budget_bytes, "executor": self.executor,
                "overhead_bytes": self.overhead_bytes, "overhead_measured": self.overhead_measured,
                "bundle_bytes": self.bundle_bytes, "weights_bytes": self.weights_bytes,
                "arena_bytes": self.arena_bytes, "total_bytes": self.total_bytes, "status": self.status}


def _mb(size: int) -> str:
    return "{:.1f}".format(size / MB)


def estimate(board: Board, executor: str, bundle_bytes: int, weights_bytes: Sequence[int],
             arena_bytes: Sequence[int]) -> FitReport:
    """The estimate for one bundle: weights and arenas are per specialization (each executor loads its own)."""
    measured = executor in RUNTIME_OVERHEAD_BYTES
    return FitReport(board=board.name, budget_bytes=board.ram_budget_mb * MB, executor=executor,
                     overhead_bytes=RUNTIME_OVERHEAD_BYTES.get(executor, UNMEASURED_OVERHEAD_BYTES),
                     overhead_measured=measured, bundle_bytes=int(bundle_bytes),
                     weights_bytes=int(sum(weights_bytes)), arena_bytes=int(sum(arena_bytes)))


def shared_arenas(arenas: Sequence[int], executors: Sequence[str], groups: Sequence[Sequence[int]]) -> List[int]:
    """Per specialization, the arena the board allocates for it: in a bucket group, the executors that run every
    bucket in one arena (their registry record's `shares_arena`) allocate the group's largest once; others one each."""
    result = list(arenas)
    for members in groups:
        sharing = [index for index in members if executors[index] in SHARES_ARENA]
        if len(sharing) > 1:
            largest = max(result[index] for index in sharing)
            for index in sharing:
                result[index] = 0
            result[sharing[0]] = largest
    return result


def check_fit(report: FitReport, specializations: int = 1) -> Optional[str]:
    """Raises FitError when over budget; returns a warning when within 10% of it, else None."""
    if report.status == "over":
        raise FitError(
            "the model does not fit board '{}': estimated peak {} is over its memory budget of {} MB".format(
                report.board, report.breakdown(), _mb(report.budget_bytes)),
            hint=_suggestions(report, specializations))
    if report.status == "close":
        return "board '{}': estimated peak {} is within 10% of its {} MB budget".format(
            report.board, report.breakdown(), _mb(report.budget_bytes))
    return None


def _suggestions(report: FitReport, specializations: int) -> str:
    ideas = []  # type: List[str]
    if report.weights_bytes + report.bundle_bytes > report.arena_bytes:
        ideas.append("quantize the weights to int8 (--pipeline int8 where the backend supports it: 4x smaller)")
    if report.arena_bytes > report.weights_bytes or specializations > 1:
        ideas.append("export a smaller batch or fewer input shapes (--input), which shrinks the arena")
    if report.executor != PORTABLE and report.overhead_bytes > RUNTIME_OVERHEAD_BYTES[PORTABLE]:
        ideas.append("use --backend portable, whose runtime needs only numpy ({} MB instead of {} MB)".format(
            _mb(RUNTIME_OVERHEAD_BYTES[PORTABLE]), _mb(report.overhead_bytes)))
    else:
        ideas.append("try another --backend")
    ideas.append("or raise [memory] budget_mb in the board file if the board really has more free")
    return "; ".join(ideas)


def measure_overhead_bytes(executor: str) -> int:
    """Peak RSS of a fresh interpreter that imported what `executor` needs on a board (Linux only)."""
    code = "import sys; sys.modules['torch'] = None\nimport numpy, edgedyn.runtime\n{}\n" \
           "import re; print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))".format(
               _IMPORTS[executor])
    environment = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                            cwd=str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), timeout=300)
    if result.returncode != 0:
        raise RuntimeError("measuring {} failed: {}".format(executor, result.stderr.strip()[-2000:]))
    return int(re.findall(r"\d+", result.stdout)[-1]) * 1024


class FitWarning(UserWarning):
    """The model fits the board's memory budget with less than 10% to spare."""
