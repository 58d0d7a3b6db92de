"""Guest instructions per call on the emulated board: a deterministic proxy for a bundle's speed on an Arm board.

Timings under qemu-user mean nothing, but the number of guest instructions a process executes under a board's own
CPU model does not depend on the host or its load. A small TCG plugin (plugins/insn_count.c, compiled here with
the host's gcc on first use) counts them; Debian's dynamically linked qemu-user loads it (the static qemu cannot).

Per call = (instructions of a process that loads the bundle, makes `warmup` calls and then N more) minus (the
same process with the warm-up calls only), divided by N: start-up, imports and loading cancel out. Or, in one
process, the count between marks the guest makes before and after the N calls (METHODS). One thread, no spinning
thread pools, fixed inputs, fixed hash seed: the same command gives the same count.
"""
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from edgedyn.emulate.board import EmulatedBoard, Say, prepare, to_stderr
from edgedyn.emulate.cpus import check_cpu, cpu_view
from edgedyn.emulate.cpus import describe as describe_view
from edgedyn.emulate.rootfs import (EmulationError, board_environment, build_once, cpu_words, default_cache_dir,
                                    qemu_model)
from edgedyn.errors import EdgedynError
from edgedyn.runtime.format import read_manifest

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugins" / "insn_count.c"


def _c_define(name: str) -> str:
    """A #define of the plugin's source: its constants have one definition, there."""
    return PLUGIN_SOURCE.read_text().split("#define {} ".format(name), 1)[1].split("\n", 1)[0].strip()


# A guest marks a point of its run with syscall(MARK_SYSCALL, MARK_MAGIC); the plugin keeps the count there.
MARK_SYSCALL, MARK_MAGIC = int(_c_define("MARK_SYSCALL"), 16), int(_c_define("MARK_MAGIC"), 16)
MARKS = "{},{}".format(MARK_SYSCALL, MARK_MAGIC)  # how a guest script is told the two (its argv)
# Note: counting needs Debian's dynamically linked qemu-user (qemu-user-static cannot load plugins) and a C
# compiler for the plugin; scripts/install.sh installs both.
QEMU = "qemu-aarch64"
COUNT_TOOLS = (QEMU, "gcc")
COUNT_HINT = "sudo apt-get install qemu-user gcc (in a source checkout: bash scripts/install.sh)"
# Note: every count carries this label, in the table and in --json.
LABEL = ("guest instructions per call on an emulated {board} (qemu-user, -cpu {cpu}, one thread): a proxy for speed "
         "on the board that ignores memory stalls, caches and per-instruction cost; not a time")
# How per_call is obtained, in words (--json carries it). "processes" cancels everything before the calls by
# subtraction between two processes; "marks" reads the count at marks the guest makes (see the plugin's
# MARK_SYSCALL) in one process: half the time, and immune to start-up work that differs between processes.
METHODS = {
    "processes": "(instructions of a process that loads the bundle and makes {warmup} + N calls) minus (the same "
                 "process making {warmup}), divided by N",
    "marks": "(instructions between a mark after {warmup} call(s) and a mark after N more, in one process) minus "
             "(those between two marks with nothing between), divided by N",
}
# What makes two runs of one command execute the same instructions: Python's string hashing (set and dict order),
# one thread in every pool a library may start by itself (OpenBLAS under numpy spins while it waits), and no
# onnxruntime telemetry (1.32 starts a thread that writes a database at exit, a different amount each time). And
# what the board's `edgedyn` command does too: TVM's runtime library only (the compiler adds 1.6 G instructions
# to every process's import, on top of the 8 G that importing TVM's FFI and ml_dtypes costs).
COUNT_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TVM_NUM_THREADS": "1",
             "ORT_DISABLE_TELEMETRY": "1", "TVM_USE_RUNTIME_LIB": "1"}

# Runs on the board: load the bundle on one thread, pick the specialization and inputs as `edgedyn bench` does,
# call it N times, say what ran. Python 3.8 syntax (the board's Python).
_GUEST = """
import json, sys
from edgedyn.runtime.bench import BenchConfig, as_called, choose_inputs
from edgedyn.runtime.program import load
path, warmup, calls, options, marks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
program = load(path, threads=1, device="cpu")
spec, values, source = choose_inputs(program, BenchConfig(threads=1, device="cpu", **options))
args, kwargs = as_called(program, values)
mark = lambda: None
if marks != "-":
    import ctypes
    syscall, number, magic = ctypes.CDLL(None).syscall, int(marks.split(",")[0]), ctypes.c_long(int(marks.split(",")[1]))
    mark = lambda: syscall(number, magic)
for _ in range(warmup):
    program(*args, **kwargs)
mark()
mark()
for _ in range(calls):
    program(*args, **kwargs)
mark()
print(json.dumps({"specialization": spec.name, "selection": spec.selection(), "backend": spec.artifact["backend"],
                  "inputs": source}))
"""


@dataclass(frozen=True)
class Plugin:
    """The compiled counting plugin."""

    path: Path
    sha256: str  # of the C source it was compiled from
    version: str  # what the plugin writes into every count

    def describe(self) -> Dict[str, str]:
        return {"version": self.version, "source_sha256": self.sha256, "library": str(self.path)}


@dataclass(frozen=True)
class Count:
    """The guest instructions of one counted process."""

    instructions: int
    vcpus: int  # 1 + the highest vCPU (guest thread) index that ran
    per_vcpu: Tuple[int, ...]  # instructions of each vCPU index (below 1024)
    marks: Tuple[int, ...]  # the total at each mark the guest made (the plugin's MARK_SYSCALL)
    cpu: str
    wall_s: float
    stdout: str
    stderr: str

    def per_call(self, calls: int) -> float:
        """Instructions per call of a guest that marked three times: before and after an empty stretch, then after
        `calls` calls (METHODS["marks"]: the marks' own cost cancels)."""
        first, empty, last = self.marks
        return ((last - empty) - (empty - first)) / calls


def missing_counting_tools() -> Sequence[str]:
    """Which of the host tools counting needs are not on PATH."""
    return [tool for tool in COUNT_TOOLS if shutil.which(tool) is None]


def check_counting_tools() -> None:
    missing = missing_counting_tools()
    if missing:
        raise EmulationError(
            "counting instructions on the emulated board needs {} (Debian's dynamically linked qemu-user, which "
            "loads TCG plugins; qemu-user-static cannot), not found on PATH".format(" and ".join(missing)),
            hint=COUNT_HINT)


def plugin_library(cache_dir: Optional[Path] = None) -> Plugin:
    """The counting plugin, compiled with the host's gcc once per version of its C source (cached)."""
    check_counting_tools()
    source = PLUGIN_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    boards = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = build_once(boards / "plugins" / "insn_count-{}".format(digest[:16]), _compile)
    version = _c_define("EDGEDYN_PLUGIN_VERSION").strip('"')
    return Plugin(path=folder / "insn_count.so", sha256=digest, version=version)


def _compile(target: Path) -> None:
    target.mkdir(parents=True)
    shutil.copyfile(PLUGIN_SOURCE, target / PLUGIN_SOURCE.name)  # what the library was built from, beside it
    command = ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(target / "insn_count.so"),
               str(target / PLUGIN_SOURCE.name)]
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise EmulationError("compiling the instruction-counting plugin failed (exit {}): {}\n{}".format(
            result.returncode, " ".join(command), result.stderr[-3000:]), hint=COUNT_HINT)


def count_program(program: Path, argv: Sequence[str], cpu: str, root: Optional[Path] = None,
                  env: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None, timeout: float = 3600,
                  qemu: str = QEMU) -> Count:
    """The guest instructions of the aarch64 `program ARGV` under qemu-user -cpu `cpu` (`-L root` when given),
    start to exit, every thread included; `env` is its whole environment. A program that fails is an error.
    `qemu` another qemu-user of the same package (benchmarks/x86_avx2.py counts x86-64 programs under
    qemu-x86_64 and one of its CPU models, which `cpu` then names unchecked)."""
    if qemu == QEMU:
        check_cpu(cpu)
    plugin = plugin_library()
    with tempfile.TemporaryDirectory(prefix="edgedyn-count-") as work:
        out = Path(work) / "count.json"
        # The qemu on this process's PATH (the one checked), not whichever the guest's PATH would find.
        command = [str(shutil.which(qemu)), *(["-L", str(root)] if root is not None else []), "-cpu", qemu_model(cpu),
                   "-plugin", "{},out={}".format(plugin.path, out), str(program), *argv]
        if "," in str(out) or "," in str(plugin.path):  # qemu splits -plugin's argument at commas
            raise EmulationError("the counting plugin's paths hold a comma: {}, {}".format(plugin.path, out),
                                 hint="set TMPDIR and EDGEDYN_CACHE to folders without commas")
        started = time.monotonic()
        result = subprocess.run(command, env=dict(env or {}), cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=timeout)
        wall = time.monotonic() - started
        if result.returncode != 0 or not out.is_file():
            raise _failure(result, cpu)
        counted = json.loads(out.read_text())
    if counted["plugin"] != plugin.version:
        raise AssertionError("the plugin wrote {!r}, expected {!r}".format(counted["plugin"], plugin.version))
    return Count(instructions=int(counted["instructions"]), vcpus=int(counted["vcpus"]),
                 per_vcpu=tuple(int(n) for n in counted["per_vcpu"]), marks=tuple(int(n) for n in counted["marks"]),
                 cpu=cpu, wall_s=wall,
                 stdout=result.stdout, stderr=result.stderr)


def count_command(board: Union[EmulatedBoard, Path], argv: Sequence[str], cpu: Optional[str] = None,
                  env: Optional[Mapping[str, str]] = None, pythonpath: Sequence[Path] = (),
                  timeout: float = 3600) -> Count:
    """The guest instructions of the board's `python3 ARGV` under qemu-user -cpu `cpu`, start to exit.

    `board` is a prepared EmulatedBoard (its edgedyn on the path, its CPU by default) or a root filesystem (then
    `cpu` is required and `pythonpath` says where the packages are). The guest sees `cpu` in /proc/cpuinfo, a
    fresh home and bundle cache, one thread per pool and a fixed hash seed (COUNT_ENV), so a deterministic
    command counts the same every time. A command that fails is an error.
    """
    if isinstance(board, EmulatedBoard):
        rootfs, cpu, paths, cwd = board.rootfs, cpu or board.qemu_cpu, [board.site, *pythonpath], board.site.parent
    elif cpu is None:
        raise EdgedynError("count_command on a root filesystem needs the qemu CPU to count under",
                           hint="pass cpu=, one of the boards' [emulation] qemu_cpu (edgedyn boards)")
    else:
        rootfs, paths, cwd = Path(board), list(pythonpath), None
    view = cpu_view(rootfs, check_cpu(cpu))
    with tempfile.TemporaryDirectory(prefix="edgedyn-guest-") as work:
        # A fresh home and bundle cache per process: what a library writes there (onnxruntime 1.32 keeps a usage
        # database under ~/.cache/Microsoft) would otherwise make the next run do other work.
        (Path(work) / "home").mkdir()
        environment = dict(COUNT_ENV, EDGEDYN_CACHE=str(Path(work) / "cache"), HOME=str(Path(work) / "home"))
        environment.update(env or {})
        return count_program(view / "usr" / "bin" / "python3", argv, cpu, root=view,
                             env=board_environment(rootfs, environment, paths), cwd=cwd, timeout=timeout)


def _failure(result: "subprocess.CompletedProcess[str]", cpu: str) -> EmulationError:
    # qemu's own complaints: "qemu: unknown option 'plugin'" (a static build), "qemu-aarch64: Could not load plugin".
    if result.returncode == 1 and re.search(r"^qemu[\w-]*: .*plugin", result.stderr, re.IGNORECASE | re.MULTILINE):
        return EmulationError("{} could not load the instruction-counting plugin:\n{}".format(
            shutil.which(QEMU), result.stderr[-2000:]),
            hint="counting needs Debian's dynamically linked qemu-user 7.2 (not a static build): " + COUNT_HINT)
    return EmulationError("the counted command exited {} on the emulated board (qemu -cpu {}):\n{}".format(
        result.returncode, cpu, result.stderr[-3000:]),
        hint="a negative status is a signal (-11: the board's python3 crashed under qemu)")


def count_instructions(bundle: Path, calls: int = 10, board: Optional[EmulatedBoard] = None,
                       cpu: Optional[str] = None, specialization: Optional[str] = None, warmup: int = 1,
                       inputs: Optional[Path] = None, random_inputs: bool = False,
                       method: str = "processes") -> Dict[str, Any]:
    """Guest instructions per call of one specialization of `bundle` on its emulated board (or `board`), under
    its CPU (or `cpu`), one thread, on the bundle's reference inputs (or `inputs`, or seeded random ones).

    "processes": two processes load the bundle and make `warmup` calls, one then `calls` more; the difference,
    divided by `calls`, is per_call, and `baseline` is the first process's count (start-up, loading, warm-up).
    "marks": one process marks before and after the `calls` (METHODS); `baseline` is the count at the first mark.
    """
    _check_counts(calls, warmup)
    if method not in METHODS:
        raise EdgedynError("unknown counting method '{}'; choose from: {}".format(method, ", ".join(sorted(METHODS))))
    check_counting_tools()
    board = board or prepare(Path(bundle))
    cpu = check_cpu(cpu or board.qemu_cpu)
    options = json.dumps({"specialization": specialization, "random_inputs": random_inputs,
                          "inputs": str(Path(inputs).resolve()) if inputs is not None else None})
    argv = ["-c", _GUEST, str(Path(bundle).resolve()), str(warmup)]
    if method == "marks":
        run = count_command(board, argv + [str(calls), options, MARKS], cpu=cpu)
        per_call, baseline, runs = run.per_call(calls), run.marks[0], [run]
    else:
        base = count_command(board, argv + ["0", options, "-"], cpu=cpu)
        more = count_command(board, argv + [str(calls), options, "-"], cpu=cpu)
        per_call, baseline, runs = (more.instructions - base.instructions) / calls, base.instructions, [base, more]
    ran = json.loads(runs[-1].stdout.splitlines()[-1])
    return dict(ran, bundle=str(bundle), board=board.name, cpu=cpu, threads=1, calls=calls, warmup=warmup,
                method=METHODS[method].format(warmup=warmup), per_call=per_call, baseline=baseline,
                total=runs[-1].instructions, vcpus=max(run.vcpus for run in runs),
                wall_s=sum(run.wall_s for run in runs), label=LABEL.format(board=board.name, cpu=cpu_words(cpu)),
                plugin=plugin_library().describe(), cpuinfo=describe_view(cpu_view(board.rootfs, cpu)))


def _check_counts(calls: int, warmup: int) -> None:
    for name, value, least in (("calls", calls, 1), ("warmup", warmup, 0)):
        if type(value) is not int or value < least:
            raise EdgedynError("{}: expected an integer >= {}, got {!r}".format(name, least, value),
                               hint="--calls 10 counts ten calls after one warm-up call" if name == "calls" else None)


def count_bundle(bundle: Path, calls: int = 10, cpu: Optional[str] = None, specialization: Optional[str] = None,
                 inputs: Optional[Path] = None, random_inputs: bool = False,
                 say: Say = to_stderr) -> Dict[str, Any]:
    """`edgedyn bench --emulate --instructions`: per-call instructions of each specialization (or the one named)
    of `bundle` on its emulated board, under its CPU or `cpu`; the report --json prints."""
    # Everything a caller can get wrong is refused before the board is built (minutes the first time).
    _check_counts(calls, 1)
    manifest = read_manifest(Path(bundle))
    names = [spec["name"] for spec in manifest["specializations"]]
    if specialization is not None and specialization not in names:
        raise EdgedynError("bundle has no specialization '{}'; choose from: {}".format(specialization, ", ".join(names)))
    if cpu is not None:
        check_cpu(cpu)
    check_counting_tools()
    board = prepare(Path(bundle), say=say)
    cpu = cpu or board.qemu_cpu
    counts = []
    for name in [specialization] if specialization is not None else names:
        say("counting guest instructions of {} on the emulated {} (qemu -cpu {}, 1 thread): two processes, "
            "{} and {} calls".format(name, board.name, cpu, 1, 1 + calls))
        count = count_instructions(bundle, calls=calls, board=board, cpu=cpu, specialization=name, inputs=inputs,
                                   random_inputs=random_inputs)
        counts.append({key: count[key] for key in ("specialization", "selection", "backend", "inputs", "per_call",
                                                   "baseline", "total", "vcpus", "wall_s")})
    return {"bundle": str(bundle), "model": manifest["model"]["name"], "board": board.name, "cpu": cpu,
            "label": count["label"], "unit": "guest instructions per call", "calls": calls, "warmup": 1, "threads": 1,
            "method": count["method"], "counts": counts, "plugin": count["plugin"], "cpuinfo": count["cpuinfo"],
            "emulation": dict(board.describe(), qemu_cpu=cpu)}
