"""Guest instructions per call on the emulated board (edgedyn.emulate.instructions, `bench --emulate --instructions`).

The counting plugin is compiled here with the host's gcc and loaded by Debian's dynamically linked qemu-aarch64:
these tests build it and use it, as CI does after scripts/install.sh.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from conftest import EXAMPLES, require

from edgedyn.emulate.board import EmulatedBoard
from edgedyn.emulate.cpus import board_cpus, cpu_view
from edgedyn.emulate.cpus import describe as describe_view
from edgedyn.emulate.instructions import (COUNT_HINT, count_command, count_instructions, count_program,
                                          missing_counting_tools, plugin_library)

from .emulator import PI_BOOKWORM, REPO, installed_checkout

BACKENDS = ["onnxruntime", "tflite", "tvm", "portable"]

# Each thread adds up i*i `iterations` times; with `threads` 0 only the main thread runs.
THREADED = r"""
#include <pthread.h>
#include <stdlib.h>
static volatile long sink;
static void *work(void *arg) {
    long total = 0;
    for (long i = 0; i < (long)arg; i++) total += i * i;
    sink += total;
    return NULL;
}
int main(int argc, char **argv) {
    int threads = atoi(argv[1]);
    long iterations = atol(argv[2]);
    pthread_t ids[64];
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, work, (void *)iterations);
    for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    return 0;
}
"""

# `k` products of a fixed 64x64 matrix with itself, after numpy is imported. Not from numpy.random: importing it
# seeds numpy's global generator from the OS's entropy, and Python's integers take more or fewer steps with the
# value (docs/emulate.md).
MATMULS = ("import sys, numpy as np; a = np.arange(4096.0).reshape(64, 64) / 4096; "
           "[a @ a for _ in range(int(sys.argv[1]))]")


@pytest.fixture(scope="module", autouse=True)
def counting_tools() -> None:
    missing = missing_counting_tools()
    require(not missing, "counting instructions needs {}".format(", ".join(missing)), "install with: " + COUNT_HINT)


@pytest.fixture(scope="module")
def pi5(pi_rootfs: Path) -> EmulatedBoard:
    """The Raspberry Pi 5 on the tests' bookworm image (every backend's runtime in one rootfs)."""
    return EmulatedBoard(name="raspberry-pi-5", qemu_cpu="cortex-a76", image=PI_BOOKWORM, rootfs=pi_rootfs,
                         site=installed_checkout(pi_rootfs))


def _cli(*args: str, env: Dict[str, str] = None) -> "subprocess.CompletedProcess[str]":
    environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(REPO), env=environment,
                          capture_output=True, text=True, timeout=3600)


def test_the_plugin_counts_every_thread(tmp_path: Path) -> None:
    # qemu-user runs each guest thread on its own host thread over shared translated blocks: one shared counter
    # bumped inline lost about half the counts with 8 threads; per-vCPU counters lose none.
    require(shutil.which("aarch64-linux-gnu-gcc") is not None, "needs the aarch64 cross compiler",
            "install with: bash scripts/install.sh")
    (tmp_path / "threads.c").write_text(THREADED)
    program = tmp_path / "threads"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-static", "-pthread", "-o", str(program),
                    str(tmp_path / "threads.c")], check=True)
    none, one, eight = (count_program(program, [str(n), "2000000"], "cortex-a76") for n in (0, 1, 8))
    per_thread = one.instructions - none.instructions
    assert per_thread > 2 * 2000000  # at least a multiply-add and a branch per iteration
    assert abs(eight.instructions - none.instructions - 8 * per_thread) <= 1e-4 * 8 * per_thread
    assert eight.vcpus >= 2 and sum(eight.per_vcpu) == eight.instructions


def test_the_same_command_counts_the_same_and_more_work_counts_more(pi_rootfs: Path) -> None:
    # From one matmul on: the first one's one-time work (numpy's and OpenBLAS's) is in every count alike.
    counts = {k: count_command(pi_rootfs, ["-c", MATMULS, str(k)], cpu="cortex-a76") for k in (1, 11, 21)}
    again = count_command(pi_rootfs, ["-c", MATMULS, "21"], cpu="cortex-a76")
    assert again.instructions == counts[21].instructions
    first, second = counts[11].instructions - counts[1].instructions, counts[21].instructions - counts[11].instructions
    # A 64x64 matmul is 262,144 multiply-adds: at most 4 per NEON instruction, plus numpy's own work per call.
    assert first > 10 * 262144 / 4
    # Linear within 5%: Python's and numpy's allocators grow their pools at points that depend on the run's
    # environment (paths, variables), a fixed cost that falls in one ten-matmul step or the other (1.7% seen in CI).
    assert abs(second - first) <= 0.05 * first
    assert counts[1].vcpus == 1  # one thread: OpenBLAS is told to start none


def test_the_guest_sees_the_counted_cpu(pi_rootfs: Path) -> None:
    code = "print(open('/proc/cpuinfo').read().split('CPU part')[1].split()[1])"
    parts = {cpu: count_command(pi_rootfs, ["-c", code], cpu=cpu).stdout.strip() for cpu in board_cpus()}
    # the Orin's A78AE runs on qemu's cortex-a76 (rootfs.SAME_ISA) and is shown as itself
    assert parts == {"cortex-a57": "0xd07", "cortex-a72": "0xd08", "cortex-a76": "0xd0b", "cortex-a78ae": "0xd42"}
    features = {cpu: describe_view(cpu_view(pi_rootfs, cpu))["features"] for cpu in ("cortex-a76", "cortex-a78ae")}
    assert features["cortex-a78ae"] == features["cortex-a76"] and "asimdhp" in features["cortex-a76"].split()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_counts_the_same_twice(pi5: EmulatedBoard, export_example, backend: str) -> None:
    bundle = export_example("tiny_cnn", board="raspberry-pi-5", backend=backend)
    first, second = (count_instructions(bundle, calls=2, board=pi5) for _ in range(2))
    assert (first["backend"], first["cpu"], first["board"], first["threads"]) == (backend, "cortex-a76",
                                                                                   "raspberry-pi-5", 1)
    # TinyCNN at 64x64 is 1.7 M multiply-adds: at least 4 per instruction, whatever the backend.
    assert first["per_call"] > 1.7e6 / 4, first
    assert abs(second["per_call"] - first["per_call"]) <= 0.01 * first["per_call"], (first, second)
    assert first["vcpus"] == 1, first  # one thread: no pool started
    assert first["inputs"] == "reference" and "-cpu cortex-a76, one thread" in first["label"]


def test_marks_in_one_process_agree_with_two_processes(pi5: EmulatedBoard, export_example) -> None:
    bundle = export_example("tiny_cnn", board="raspberry-pi-5", backend="onnxruntime")
    marked, again = (count_instructions(bundle, calls=3, board=pi5, method="marks") for _ in range(2))
    processes = count_instructions(bundle, calls=3, board=pi5)
    assert marked["per_call"] == again["per_call"], (marked, again)  # no start-up in it at all
    assert abs(marked["per_call"] - processes["per_call"]) <= 0.005 * processes["per_call"], (marked, processes)
    assert "in one process" in marked["method"] and "in one process" not in processes["method"]


def test_a_bigger_input_counts_more(pi5: EmulatedBoard, tmp_path: Path) -> None:
    import edgedyn

    bundle = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64", "x=1x3x128x128"],
                            board="raspberry-pi-5", backend="onnxruntime", output=tmp_path / "two.edgedyn")
    small, large = (count_instructions(bundle, calls=2, board=pi5, specialization=name)
                    for name in ("x=1x3x64x64", "x=1x3x128x128"))
    assert (small["specialization"], large["specialization"]) == ("x=1x3x64x64", "x=1x3x128x128")
    # Four times the pixels: four times the convolutions, the same Python and dispatch per call.
    assert 1.5 * small["per_call"] < large["per_call"] < 4.5 * small["per_call"], (small, large)


def test_bench_emulate_instructions(export_example, tmp_path: Path) -> None:
    bundle = export_example("tiny_cnn", board="raspberry-pi-5", backend="onnxruntime")
    result = _cli("bench", str(bundle), "--emulate", "--instructions", "--calls", "2", "--cpu", "cortex-a72",
                  "--json", str(tmp_path / "count.json"))
    assert result.returncode == 0, result.stderr
    label = ("guest instructions per call on an emulated raspberry-pi-5 (qemu-user, -cpu cortex-a72, one thread): a "
             "proxy for speed on the board that ignores memory stalls, caches and per-instruction cost; not a time")
    assert label in " ".join(result.stdout.split()), result.stdout
    report = json.loads((tmp_path / "count.json").read_text())
    assert report["label"] == label and report["cpu"] == "cortex-a72" and report["cpuinfo"]["cpu_part"] == "0xd08"
    (count,) = report["counts"]
    assert count["specialization"] == "x=1x3x64x64" and count["backend"] == "onnxruntime"
    assert "{:,.0f}".format(count["per_call"]) in result.stdout
    assert report["plugin"]["source_sha256"] == plugin_library().sha256


def test_without_the_dynamic_qemu_counting_stops_with_the_install_command(export_example, tmp_path: Path) -> None:
    bundle = export_example("tiny_cnn", board="raspberry-pi-5", backend="onnxruntime")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("gcc", "qemu-aarch64-static", "mmdebstrap"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    result = _cli("bench", str(bundle), "--emulate", "--instructions", env={"PATH": str(bin_dir)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert ("error: counting instructions on the emulated board needs qemu-aarch64 (Debian's dynamically linked "
            "qemu-user, which loads TCG plugins; qemu-user-static cannot), not found on PATH") in result.stderr
    assert "hint: sudo apt-get install qemu-user gcc" in result.stderr


def test_a_qemu_that_cannot_load_plugins_is_named(pi_rootfs: Path, tmp_path: Path) -> None:
    from edgedyn.errors import EdgedynError

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qemu-aarch64").symlink_to(shutil.which("qemu-aarch64-static"))  # a static build under that name
    for tool in ("gcc", "qemu-aarch64-static", "mmdebstrap"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(bin_dir))
        with pytest.raises(EdgedynError, match="could not load the instruction-counting plugin") as error:
            count_command(pi_rootfs, ["-c", "pass"], cpu="cortex-a76")
    assert "unknown option 'plugin'" in str(error.value) and "not a static build" in error.value.hint


def test_the_plugin_is_rebuilt_when_its_source_changes(tmp_path: Path) -> None:
    from edgedyn.emulate import instructions

    first = plugin_library(tmp_path)
    assert plugin_library(tmp_path).path == first.path and first.path.is_file()
    changed = tmp_path / "insn_count.c"
    changed.write_text(instructions.PLUGIN_SOURCE.read_text() + "/* changed */\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(instructions, "PLUGIN_SOURCE", changed)
        rebuilt = plugin_library(tmp_path)
    assert rebuilt.path != first.path and rebuilt.path.is_file() and rebuilt.sha256 != first.sha256
