"""The portable backend on an old board: Python 3.9 with Debian's numpy 1.19 (a Jetson Nano on its stock Python).

Bundles are exported on the host; the board runs `python3 -m edgedyn verify` on them with this checkout's wheel
installed and nothing else but what the bullseye image has: no torch, no compiled runtime.
"""
import json
from pathlib import Path

import pytest

from conftest import ALL_MODELS

from .emulator import run_edgedyn


@pytest.fixture(scope="module")
def portable_bundles(export_example):
    # jetson-nano: the board this story is for; the portable artifact runs on any arch.
    return lambda model: export_example(model, board="jetson-nano", backend="portable")


@pytest.mark.parametrize("model", sorted(ALL_MODELS))
def test_portable_bundle_verifies_on_python39_numpy119(bullseye_rootfs: Path, portable_bundles, model: str) -> None:
    bundle = portable_bundles(model)
    result = run_edgedyn(bullseye_rootfs, ["-m", "edgedyn", "verify", "--json", str(bundle)], cpu="cortex-a57",
                         env={"EDGEDYN_CACHE": str(bundle.parent / "cache")})
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64"
    assert report["results"] and all(r["artifact"] == "portable" and r["max_rel"] < 1e-4 for r in report["results"])


def test_no_allocation_per_call_on_numpy119(bullseye_rootfs: Path, portable_bundles) -> None:
    bundle = portable_bundles("tiny_cnn")
    code = """
import json, sys, tracemalloc
import numpy as np
import edgedyn.runtime as rt
spec = rt.load(sys.argv[1]).specializations[0]
inputs = [np.ones(r["shape"], np.float32) for r in spec.record["inputs"]]
spec.executor.run(inputs)
tracemalloc.start()
spec.executor.run(inputs)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"numpy": np.__version__, "python": sys.version_info[:2], "peak": peak,
                  "arena": spec.executor.describe()["arena_bytes"]}))
"""
    result = run_edgedyn(bullseye_rootfs, ["-c", code, str(bundle)], cpu="cortex-a57")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["numpy"].startswith("1.19.") and seen["python"] == [3, 9]
    assert seen["peak"] < 128 * 1024 and seen["peak"] < seen["arena"] / 2, seen
