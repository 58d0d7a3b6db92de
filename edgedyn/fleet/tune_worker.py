"""The MetaSchedule search for one Relax module, in a process that never imports torch (see tuning.py).

Reads a request written by tuning.py: the module (TVM JSON), the target, the database folder, the trial budget and
the boards to measure on; prints `edgedyn-progress: [trials, best GFLOPS]` lines on stdout as batches finish.
"""
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional

PROGRESS_PREFIX = "edgedyn-progress: "
# MetaSchedule's build and run workers are fresh processes that import TVM and its schedule library before their
# first job (10-25 s on 2 busy cores), inside the job's 30 s default limit: too little on a busy or small machine.
WORKER_TIMEOUT_S = 300.0
# MetaSchedule's LocalBuilder starts new workers for every batch (TVM's note: a memory leak in long-lived ones),
# paying that import each time; ours keep theirs for this many builds.
BUILDS_PER_WORKER = 256
# At most this many candidates per task in one round (MetaSchedule's default batch).
MAX_BATCH = 64


def tune(request: Dict[str, Any]) -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from edgedyn.backends.tvm import tuning_passes

    target = tvm.target.Target(request["tvm_target"])  # CPU targets only: no host target
    module = tvm.ir.load_json(Path(request["module"]).read_text())
    with target:
        module = tuning_passes()(module)
    # tune_relax's steps, with the task list in hand to size the rounds.
    extracted = ms.relax_integration.extract_tasks(module, target, params={})
    trials, per_task = request["trials"], request["per_task"] or request["trials"]
    batch = batch_size(trials, len(extracted), per_task)
    sys.stdout.write(PROGRESS_PREFIX + json.dumps({"tasks": len(extracted), "batch": batch}) + "\n")
    sys.stdout.flush()
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(extracted, work_dir=request["folder"])
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [_progress_callback()]
    ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=request["folder"], max_trials_global=trials,
                       max_trials_per_task=per_task, num_trials_per_iter=batch, runner=_runner(request["remote"]),
                       builder=_builder(request["cross_compiler"]), measure_callbacks=callbacks)


def batch_size(trials: int, tasks: int, per_task: int) -> int:
    """Candidates per task and round: the budget shared by every task in the first round (MetaSchedule's scheduler
    visits each task once before it favours any), so that 64 trials over 30 kernels measure something for each
    rather than 64 candidates of the first kernel only."""
    return max(1, min(MAX_BATCH, per_task, trials // max(1, tasks)))


def _runner(remote: Optional[Dict[str, Any]]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    if remote is None:
        return ms.runner.LocalRunner(timeout_sec=WORKER_TIMEOUT_S)
    config = ms.runner.RPCConfig(tracker_host=remote["tracker"][0], tracker_port=int(remote["tracker"][1]),
                                 tracker_key=remote["key"], session_timeout_sec=WORKER_TIMEOUT_S)
    return ms.runner.RPCRunner(rpc_config=config)


def _builder(cross_compiler: Optional[str]) -> Any:
    """MetaSchedule's LocalBuilder's work, on workers kept for the whole run. For an aarch64 board, candidates are
    linked here with the cross compiler (MetaSchedule's default artifact is a .tar the board would link)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import local_builder
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    f_export = None if cross_compiler is None else _cross_export(cross_compiler)

    def answer(result: Any) -> Any:
        if result.status == StatusKind.COMPLETE:
            return ms.builder.BuilderResult(result.value, None)
        if result.status == StatusKind.TIMEOUT:
            return ms.builder.BuilderResult(None, "build timed out after {} s".format(WORKER_TIMEOUT_S))
        return ms.builder.BuilderResult(None, "LocalBuilder: An exception occurred\n{}".format(result.value))

    @derived_object
    class ReusedWorkersBuilder(ms.builder.PyBuilder):
        def __init__(self) -> None:
            super().__init__()
            self.pool = PopenPoolExecutor(max_workers=ms.utils.cpu_count(logical=True), timeout=WORKER_TIMEOUT_S,
                                          maximum_process_uses=BUILDS_PER_WORKER)

        def build(self, build_inputs: Any) -> Any:
            # LocalBuilder's own job (TVM 0.27's local_builder._worker_func: build, then export).
            jobs = [(build_candidate, f_export, item.mod, item.target, local_builder._serialize_params(item.params))
                    for item in build_inputs]
            return [answer(result) for result in
                    self.pool.map_with_error_catching(lambda job: local_builder._worker_func(*job), jobs)]

    return ReusedWorkersBuilder()


def build_candidate(module: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's default_build without its `import tvm.s_tir.tensor_intrin`: that registers the tensor
    intrinsics (500 kernels parsed, 13 s of a worker's start on 2 cores) for the search, whose candidates arrive
    already tensorized; building them needs none of it."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(module), target=target)


def _cross_export(compiler: str) -> Callable[[Any], str]:
    def export(module: Any) -> str:
        from tvm.support import cc

        path = str(Path(tempfile.mkdtemp(prefix="edgedyn-tune-")) / "candidate.so")
        module.export_library(path, fcompile=cc.cross_compiler(compiler))
        return path
    return export


def _progress_callback() -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    state = {"trials": 0, "best": 0.0}

    @derived_object
    class ReportProgress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
                  runner_results: Any) -> None:
            flop = float(task_scheduler.tasks_[task_id].flop)
            for result in runner_results:
                state["trials"] += 1
                if result.error_msg is None and result.run_secs:
                    seconds = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                    if seconds > 0:
                        state["best"] = max(state["best"], flop / seconds / 1e9)
            sys.stdout.write(PROGRESS_PREFIX + json.dumps([state["trials"], state["best"]]) + "\n")
            sys.stdout.flush()

    return ReportProgress()


if __name__ == "__main__":
    tune(json.loads(Path(sys.argv[1]).read_text()))
