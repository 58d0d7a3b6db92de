"""Jetson bundles carry GPU code first and the aarch64 CPU code as a fallback; with no GPU the board says so."""
import json

import pytest

from conftest import REPO

from .emulator import run_edgedyn

pytestmark = pytest.mark.requires("tvm", "nvidia.cuda_nvrtc")

JETSONS = {"jetson-nano": "sm_53", "jetson-xavier-nx": "sm_72", "jetson-orin-nano": "sm_87"}


@pytest.fixture(scope="module")
def jetson_bundles(tmp_path_factory):
    import edgedyn

    directory = tmp_path_factory.mktemp("jetson")
    return {board: edgedyn.export(str(REPO / "examples" / "tiny_cnn.py:TinyCNN"), board=board, backend="tvm",
                                  output=directory / "{}.edgedyn".format(board)) for board in JETSONS}


def _board_cli(rootfs, board, *args):
    from edgedyn.boards import load_board

    return run_edgedyn(rootfs, ["-m", "edgedyn", *args], cpu=load_board(board).qemu_cpu)


@pytest.mark.parametrize("board, arch", sorted(JETSONS.items()))
def test_inspect_shows_the_gpu_arch_then_the_cpu_fallback(jetson_bundles, run_cli, board, arch):
    manifest = json.loads(run_cli("inspect", "--json", str(jetson_bundles[board])).stdout)
    (spec,) = manifest["specializations"]
    gpu, cpu = spec["artifacts"]
    assert (gpu["device"], gpu["gpu"]["arch"], gpu["gpu"]["code_format"]) == ("cuda", arch, "ptx")
    assert gpu["gpu"]["ptx_isa"] and gpu["gpu"]["min_cuda_driver"] == "12.6" and gpu["gpu"]["kernels"] > 0
    assert (cpu["device"], cpu["arch"]) == ("cpu", "aarch64")


@pytest.mark.parametrize("board", sorted(JETSONS))
def test_cpu_fallback_verifies_on_the_emulated_board(pi_rootfs, jetson_bundles, board):
    result = _board_cli(pi_rootfs, board, "verify", "--json", str(jetson_bundles[board]))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["arch"] == "aarch64"
    (selection,) = report["selection"].values()
    assert selection["artifact"]["device"] == "cpu"
    assert selection["skipped"] == [["tvm-cuda ({})".format(JETSONS[board]), "no NVIDIA driver (libcuda.so.1 not found)"]]
    assert "tvm-cuda ({}) not used: no NVIDIA driver".format(JETSONS[board]) in result.stderr


def test_forcing_the_gpu_without_one_is_a_clear_error(pi_rootfs, jetson_bundles):
    result = _board_cli(pi_rootfs, "jetson-nano", "verify", "--device", "gpu", str(jetson_bundles["jetson-nano"]))
    assert result.returncode == 2
    assert ("no artifact of specialization x=1x3x64x64 can run here: tvm-cuda (sm_53): no NVIDIA driver "
            "(libcuda.so.1 not found); tvm-cpu: --device gpu") in result.stderr


def test_bench_reports_which_artifact_ran_and_why(pi_rootfs, jetson_bundles):
    result = _board_cli(pi_rootfs, "jetson-orin-nano", "bench", "--iterations", "3", "--warmup", "1",
                        "--duration", "0", "--json", "-", str(jetson_bundles["jetson-orin-nano"]))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == "cpu" and report["board"] == "jetson-orin-nano"
    assert "tvm-cuda (sm_87) not used: no NVIDIA driver (libcuda.so.1 not found)" in report["selection"]
