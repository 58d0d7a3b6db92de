"""`edgedyn tune`: MetaSchedule (TVM's `static_shape_tuning`) for each specialization of a model, measured on this
machine or on boards through the RPC tracker, with the records kept in the target's database (database.py).

The steps are those of `relax.get_pipeline("static_shape_tuning")` (decompose, canonicalize, the zero pipeline,
tune, apply the database), with tune_relax's own two calls (extract_tasks, tune_tasks) so that the runner (local
or MetaSchedule's RPCRunner), the builder, the round size and a progress callback can be given; the TVM backend applies the database at every later build for the target.
MetaSchedule commits each measured batch to the JSON database as it goes, so an interrupted run keeps those trials.
The search and MetaSchedule's build and run workers run without torch (tune_worker.py, `without_torch`): TVM's
schedule library calls `inspect.stack()` for each of its kernels at import, which scans every loaded module.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from edgedyn.backends.tvm import import_relax
from edgedyn.boards import Board
from edgedyn.errors import BackendError, EdgedynError, require_modules
from edgedyn.backends import tuning_records as database
from edgedyn.fleet.tune_worker import PROGRESS_PREFIX
from edgedyn.runtime.format import host_arch

# What MetaSchedule imports only once tuning has started (module -> what for): checked before any work.
NEEDS = {"xgboost": "its cost model", "psutil": "its search",
         "cloudpickle": "its build and run workers (tvm.support.popen_pool)"}  # type: Dict[str, str]

# Note: a `torch` that fails to import, written first on the PYTHONPATH of the search and of every MetaSchedule
# build and run worker it starts. tvm_ffi imports torch when it can, and TVM's script parser calls
# `inspect.stack()` for each kernel of its schedule library, which scans every loaded module: beside torch, each
# worker took twice as long to start (benchmarks/README.md, TVM tuning). An ImportError leaves no entry in
# sys.modules, so libraries that look for a loaded torch (scipy under xgboost) see none. It is written per run,
# not shipped: a package named torch inside edgedyn would shadow the real one for anything that walks the tree.
NO_TORCH = 'raise ImportError("edgedyn\'s tuning processes run without torch (edgedyn.fleet.tuning)")\n'


def without_torch(workdir: Path) -> Path:
    """A folder whose `torch` package raises ImportError, for the front of a worker's PYTHONPATH."""
    package = workdir / "without_torch" / "torch"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(NO_TORCH)
    return package.parent


@dataclass
class Progress:
    """What a tuning run has done so far, for the progress display."""

    specialization: str = ""
    trials: int = 0
    total: int = 0
    tasks: int = 0  # kernels MetaSchedule tunes in this specialization
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


def tune_model(model: Any, board: Board, inputs: Optional[List[str]], trials: int, per_task: Optional[int] = None,
               remote: Optional[Remote] = None, root: Optional[Path] = None,
               on_progress: Optional[OnProgress] = None, example_inputs: Any = None) -> Dict[str, Any]:
    """Tunes every specialization of `model` for the board's CPU target; returns the database's record.

    `model`, `example_inputs` and `inputs` (`--input` strings) as for edgedyn.export."""
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
    require_modules(NEEDS, "MetaSchedule", "fleet")
    folder = database.database_dir(target.name, root)
    folder.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    captured = capture(model, example_inputs, inputs=inputs)
    for spec in captured.specializations:
        progress.specialization = spec.name
        module, _ = import_relax(run_pipeline(spec.program, "default"))
        _tune_module(module, target, board.cpu_cores, folder, trials, per_task, remote, progress, on_progress)
    return database.describe(folder) or {"database": str(folder), "records": 0}


def _tune_module(module: Any, target: Any, cores: int, folder: Path, trials: int, per_task: Optional[int],
                 remote: Optional[Remote], progress: Progress, on_progress: Optional[OnProgress]) -> None:
    """Tunes one Relax module in tune_worker.py's process, reading its progress lines as they come. MetaSchedule
    wants the board's core count in the target (it sizes parallel loops by it); the database still serves builds
    for the plain target (the records are looked up by kernel)."""
    import tvm

    with tempfile.TemporaryDirectory(prefix="edgedyn-tune-") as workdir:
        request = {"module": str(Path(workdir) / "module.json"), "folder": str(folder),
                   "tvm_target": dict(target.to_dict()["tvm"], **{"num-cores": cores}),
                   "trials": trials, "per_task": per_task,
                   "remote": None if remote is None else {"tracker": list(remote.tracker), "key": remote.key},
                   "cross_compiler": target.cross_compiler if target.arch != host_arch() else None}
        Path(request["module"]).write_text(tvm.ir.save_json(module))
        (Path(workdir) / "request.json").write_text(json.dumps(request))
        env = dict(os.environ)
        env.pop("TVM_USE_RUNTIME_LIB", None)
        # First on the path of the search and of every worker it starts: `import torch` fails there.
        blocker = without_torch(Path(workdir))
        env["PYTHONPATH"] = os.pathsep.join([str(blocker)] + [p for p in [env.get("PYTHONPATH")] if p])
        progress.total += trials
        log = Path(workdir) / "worker.log"
        with log.open("w") as errors:
            # A session of its own, so that an interrupted run stops MetaSchedule's build and run workers too.
            worker = subprocess.Popen(
                [sys.executable, "-m", "edgedyn.fleet.tune_worker", str(Path(workdir) / "request.json")],
                stdout=subprocess.PIPE, stderr=errors, text=True, env=env, start_new_session=True)
            try:
                _follow(worker, progress, on_progress)
            except BaseException:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait()
                raise
        if worker.wait() != 0:
            raise BackendError("MetaSchedule failed for {}:\n{}".format(progress.specialization,
                                                                         _tail(log.read_text())),
                               hint="the trials measured before the failure are kept in {}".format(folder))


def _follow(worker: "subprocess.Popen[str]", progress: Progress, on_progress: Optional[OnProgress]) -> None:
    """Reads the worker's progress lines until it ends."""
    base = progress.trials
    assert worker.stdout is not None
    for line in worker.stdout:
        if not line.startswith(PROGRESS_PREFIX):
            continue
        report = json.loads(line[len(PROGRESS_PREFIX):])
        if isinstance(report, dict):  # the search's plan, before its first batch
            progress.tasks = report["tasks"]
        else:
            done, best = report
            progress.trials, progress.best_gflops = base + done, max(progress.best_gflops, best)
        if on_progress is not None:
            on_progress(progress)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
