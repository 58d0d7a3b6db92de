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
# MetaSchedule's build and run workers are fresh processes that import TVM (and torch, when installed, through
# tvm_ffi) before their first job, inside the job's 30 s default limit: too little on a busy or small machine.
WORKER_TIMEOUT_S = 300.0


def tune(request: Dict[str, Any]) -> None:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from edgedyn.backends.tvm import tuning_passes

    target = tvm.target.Target(request["tvm_target"])  # CPU targets only: no host target
    module = tvm.ir.load_json(Path(request["module"]).read_text())
    with target:
        module = tuning_passes()(module)
    trials, per_task = request["trials"], request["per_task"] or request["trials"]
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [_progress_callback()]
    ms.relax_integration.tune_relax(
        module, params={}, target=target, work_dir=request["folder"], max_trials_global=trials,
        max_trials_per_task=per_task, num_trials_per_iter=min(64, per_task), runner=_runner(request["remote"]),
        builder=_builder(request["cross_compiler"]), measure_callbacks=callbacks)


def _runner(remote: Optional[Dict[str, Any]]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    if remote is None:
        return ms.runner.LocalRunner(timeout_sec=WORKER_TIMEOUT_S)
    config = ms.runner.RPCConfig(tracker_host=remote["tracker"][0], tracker_port=int(remote["tracker"][1]),
                                 tracker_key=remote["key"], session_timeout_sec=WORKER_TIMEOUT_S)
    return ms.runner.RPCRunner(rpc_config=config)


def _builder(cross_compiler: Optional[str]) -> Any:
    from tvm.s_tir import meta_schedule as ms

    if cross_compiler is None:
        return ms.builder.LocalBuilder(timeout_sec=WORKER_TIMEOUT_S)
    # MetaSchedule's default artifact is a .tar the board links with its own compiler; link it here instead.
    return ms.builder.LocalBuilder(timeout_sec=WORKER_TIMEOUT_S, f_export=_cross_export(cross_compiler))


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


class _WithoutTorch:
    """An import hook that makes torch look absent (tvm_ffi imports it when it can). Not sys.modules["torch"] = None:
    scipy, under xgboost, reads sys.modules["torch"] and would trip over the None."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("edgedyn's tuning worker runs without torch")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _WithoutTorch())  # type: ignore[arg-type]
    tune(json.loads(Path(sys.argv[1]).read_text()))
