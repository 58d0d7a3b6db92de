"""`edgedyn tune`: MetaSchedule (TVM's `static_shape_tuning`) for each specialization of a model, measured on this
machine or on boards through the RPC tracker, with the records kept in the target's database (database.py).

The steps are those of `relax.get_pipeline("static_shape_tuning")` (decompose, canonicalize, the zero pipeline,
tune, apply the database), called as `tune_relax` so that the runner (local or MetaSchedule's RPCRunner) and a
progress callback can be given; the TVM backend applies the database at every later build for the target.
MetaSchedule commits each measured batch to the JSON database as it goes, so an interrupted run keeps those trials.
"""
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from edgedyn.backends.tvm import import_relax, tuning_passes
from edgedyn.boards import Board
from edgedyn.errors import EdgedynError, MissingDependencyError
from edgedyn.fleet import database
from edgedyn.runtime.format import host_arch


@dataclass
class Progress:
    """What a tuning run has done so far, for the progress display."""

    specialization: str = ""
    trials: int = 0
    total: int = 0
    best_gflops: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started


OnProgress = Callable[[Progress], None]


@dataclass(frozen=True)
class Remote:
    """Boards to measure on: a tracker address and the key its boards registered under."""

    tracker: Tuple[str, int]
    key: str


def tune_model(model: str, board: Board, inputs: Optional[List[str]], trials: int, per_task: Optional[int] = None,
               remote: Optional[Remote] = None, root: Optional[Path] = None,
               on_progress: Optional[OnProgress] = None) -> Dict[str, Any]:
    """Tunes every specialization of `model` for the board's CPU target; returns the database's record."""
    if trials < 1:
        raise EdgedynError("--trials must be at least 1, got {}".format(trials),
                           hint="a few hundred per model give most of the speed-up; 16 is a smoke test")
    from edgedyn.frontend import capture
    from edgedyn.passes import run_pipeline

    target = board.target("cpu")
    if remote is None and target.arch != host_arch():
        raise EdgedynError("board {} is {}, this machine is {}: tuning measures kernels on the board itself".format(
            board.name, target.arch, host_arch()),
            hint="measure on the boards through a tracker: --remote HOST:PORT --key KEY (docs/fleet.md)")
    _require_xgboost()
    folder = database.database_dir(target.name, root)
    folder.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    captured = capture(model, None, inputs=inputs)
    for spec in captured.specializations:
        progress.specialization = spec.name
        module, _ = import_relax(run_pipeline(spec.program, "default"))
        _tune_module(module, target, folder, trials, per_task, remote, progress, on_progress)
    return database.describe(folder) or {"database": str(folder), "records": 0}


def _tune_module(module: Any, target: Any, folder: Path, trials: int, per_task: Optional[int],
                 remote: Optional[Remote], progress: Progress, on_progress: Optional[OnProgress]) -> None:
    from tvm.s_tir import meta_schedule as ms  # import_relax has checked that TVM is installed

    tvm_target = target.tvm_target()
    with tvm_target:
        module = tuning_passes()(module)
    progress.total += trials
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [_progress_callback(progress, on_progress)]
    ms.relax_integration.tune_relax(
        module, params={}, target=tvm_target, work_dir=str(folder), max_trials_global=trials,
        max_trials_per_task=per_task or trials, num_trials_per_iter=min(64, per_task or trials),
        runner=_runner(remote), builder=_builder(target), measure_callbacks=callbacks)


def _runner(remote: Optional[Remote]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    if remote is None:
        return "local"
    config = ms.runner.RPCConfig(tracker_host=remote.tracker[0], tracker_port=remote.tracker[1],
                                 tracker_key=remote.key, session_timeout_sec=120)
    return ms.runner.RPCRunner(rpc_config=config)


def _builder(target: Any) -> Any:
    from tvm.s_tir import meta_schedule as ms

    if not target.cross_compiler or target.arch == host_arch():
        return "local"
    # A board without a compiler cannot link MetaSchedule's default .tar artifacts: link them here instead.
    return ms.builder.LocalBuilder(f_export=_cross_export(target.cross_compiler))


def _cross_export(compiler: str) -> Callable[[Any], str]:
    def export(module: Any) -> str:
        import tempfile

        from tvm.support import cc

        path = str(Path(tempfile.mkdtemp(prefix="edgedyn-tune-")) / "candidate.so")
        module.export_library(path, fcompile=cc.cross_compiler(compiler))
        return path
    return export


def _progress_callback(progress: Progress, on_progress: Optional[OnProgress]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    @ms.utils.derived_object
    class ReportProgress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
                  runner_results: Any) -> None:
            flop = task_scheduler.tasks_[task_id].flop
            for result in runner_results:
                progress.trials += 1
                if result.error_msg is None and result.run_secs:
                    seconds = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                    if seconds > 0:
                        progress.best_gflops = max(progress.best_gflops, flop / seconds / 1e9)
            if on_progress is not None:
                on_progress(progress)

    return ReportProgress()


def _require_xgboost() -> None:
    try:
        import xgboost  # noqa: F401
    except ImportError:
        raise MissingDependencyError("MetaSchedule's cost model needs xgboost, which is not installed",
                                     hint="pip install 'edgedyn[tvm]'")
