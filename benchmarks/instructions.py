"""Instructions per call, on one thread, for edgedyn and its peers: the work each does, which no noise changes.

    python benchmarks/instructions.py --models zoo:resnet,zoo:distilbert --calls 20
    python benchmarks/instructions.py --models mobilenet_v2 --variants edgedyn-fp32,executorch-xnnpack-fp32

Timings on the shared 2-vCPU VM this project is measured on swing 20-50% between rounds (benchmarks/README.md), more
than the differences in question between edgedyn and a peer running the same kernels. Valgrind's callgrind counts
the instructions a process executes, the same on a loaded machine as on an idle one. Each variant is built as
speed.py builds it, then its worker runs twice under callgrind, once with no timed calls and once with --calls of
them (both after the same 5 warm-up calls and the same loading); the difference over --calls is one call's count.
One thread only: a thread pool's spinning would count. Instructions are not time (a cache miss costs none): read
the counts beside speed.py's times, never instead of them. Slow: a worker that imports torch (ExecuTorch, torch
eager) takes minutes under valgrind. JSON: benchmarks/results/instructions-DATE.json, with the CPU model.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  (the models, how each variant is built, and its worker)

DEFAULT_VARIANTS = "edgedyn-fp32,edgedyn-int8,onnxruntime-direct,executorch-xnnpack-fp32,executorch-xnnpack-int8"


def counted(task: Dict[str, Any], calls: int, workdir: Path) -> int:
    """The instructions valgrind counted for the worker of `task` running `calls` calls after its warm-up."""
    path = workdir / "task-{}.json".format(calls)
    path.write_text(json.dumps(dict(task, calls=calls, threads=1)))
    # One hash seed and no bytecode written: the runs with and without the calls then differ by the calls alone
    # (a random seed, or the first run compiling what the second finds cached, moved edgedyn's MobileNetV4 count
    # by 2M instructions a call over 10 calls).
    env = dict(os.environ, PYTHONPATH=str(speed.REPO), OMP_NUM_THREADS="1", PYTHONHASHSEED="0",
               PYTHONDONTWRITEBYTECODE="1")
    # sys.executable as it is, never its real path: a virtual environment's python is a link to the base
    # interpreter, which run by its real path finds none of the environment's packages.
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           sys.executable, str(Path(speed.__file__).resolve()), "--worker",
                           str(path)], env=env, capture_output=True, text=True, timeout=3600)
    result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), "RESULT {}")
    if "error" in json.loads(result[len("RESULT "):]):
        raise RuntimeError(json.loads(result[len("RESULT "):])["error"])
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError("valgrind exited {}: {}".format(done.returncode, done.stderr.strip().splitlines()[-1:]))
    return int(found.group(1))


def per_call(task: Dict[str, Any], calls: int, workdir: Path) -> Dict[str, Any]:
    try:
        base, more = counted(task, 0, workdir), counted(task, calls, workdir)
    except Exception as error:  # a variant that fails is reported, the run goes on
        return {"error": "{}: {}".format(type(error).__name__, str(error)[:300])}
    return {"instructions_per_call": (more - base) / calls, "calls": calls}


def table(results: Dict[str, Any], variants: List[str]) -> str:
    lines = ["| model | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
    for name, record in results["models"].items():
        base = record.get("onnxruntime-direct", {}).get("instructions_per_call")
        cells = []
        for variant in variants:
            entry = record.get(variant)
            count = (entry or {}).get("instructions_per_call")
            if entry is None:
                cells.append("-")
            elif count is None:
                cells.append("failed")
            else:
                cells.append("{:,.0f}{}".format(count, " ({:.2f}x)".format(base / count) if base else ""))
        lines.append("| {} | {} |".format(name, " | ".join(cells)))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="zoo:resnet,zoo:distilbert", help="speed.py model names, or zoo:NAME")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--calls", type=int, default=20, help="calls counted per variant (after 5 warm-up calls)")
    parser.add_argument("--edgedyn-backend", default="auto")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in speed.VARIANTS]
    if unknown:
        parser.error("unknown variant(s) {}; choose from: {}".format(", ".join(unknown), ", ".join(speed.VARIANTS)))
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    results = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "cpu": speed.cpu_model(), "cpu_features": speed.cpu_features(), "valgrind": version, "threads": 1, "calls": args.calls,
               "edgedyn_backend": args.edgedyn_backend, "models": {}}  # type: Dict[str, Any]
    speed.RESULTS.mkdir(parents=True, exist_ok=True)
    out = speed.RESULTS / "instructions-{}.json".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    for name in [m for m in args.models.split(",") if m]:
        record = {}  # type: Dict[str, Any]
        with tempfile.TemporaryDirectory(prefix="edgedyn-instructions-") as workdir:
            kind, common = speed.fresh_inputs(name, Path(workdir))
            for variant in speed.variants_for(kind, variants):
                print("[{}] {}".format(name, variant), file=sys.stderr, flush=True)
                try:
                    task = dict(speed.prepare(variant, name, Path(workdir), args), seconds=0, **common)
                except Exception as error:
                    record[variant] = {"error": "{}: {}".format(type(error).__name__, str(error)[:300])}
                    continue
                record[variant] = dict(per_call(task, args.calls, Path(workdir)), recorded=task.get("recorded"))
                print("[{}] {}: {}".format(name, variant, {k: v for k, v in record[variant].items()
                                                           if k != "recorded"}), file=sys.stderr, flush=True)
        results["models"][name] = record
        out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print("{} ({}), 1 thread, instructions per call (callgrind), in parentheses onnxruntime-direct's count over the "
          "variant's (> 1: fewer instructions than onnxruntime-direct)".format(results["cpu"],
                                                                              " ".join(results["cpu_features"])))
    print(table(results, variants))
    print("results: {}".format(out.relative_to(speed.REPO)))


if __name__ == "__main__":
    main()
