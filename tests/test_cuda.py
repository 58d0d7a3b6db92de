"""GPU artifacts for the Jetsons, built without a GPU: real device code for each arch, or a loud failure."""
import json
import subprocess
import sys

import pytest
import torch

import warnings

from edgedyn.backends import nvrtc
from edgedyn.backends.artifact import Build
from edgedyn.backends.tvm import check_device_code, lower
from edgedyn.errors import GpuBuildError
from edgedyn.exporter import GpuFallbackWarning, gpu_or_why_not
from edgedyn.boards import load_board
from edgedyn.errors import BackendError, MissingDependencyError
from edgedyn.frontend import capture
from edgedyn.passes import run_pipeline
from edgedyn.runtime import devices

from conftest import ALL_MODELS, EXAMPLES

pytestmark = pytest.mark.requires("tvm", "nvidia.cuda_nvrtc")

JETSONS = {"jetson-nano": "sm_53", "jetson-xavier-nx": "sm_72", "jetson-orin-nano": "sm_87"}


@pytest.fixture(scope="module")
def small_cnn():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    (spec,) = capture(model, (torch.randn(1, 3, 16, 16),)).specializations
    return run_pipeline(spec.program), spec.tensor_inputs


@pytest.fixture(scope="module")
def gpu_artifacts(small_cnn):
    program, inputs = small_cnn
    return {board: lower(Build(program=program, board=load_board(board), target=load_board(board).target("gpu"),
                               tensor_inputs=inputs)) for board in JETSONS}


def test_a_function_dlights_matmul_rule_asserts_on_gets_the_next_rule_that_works():
    # transformers' MobileNetV2 pads after each ReLU6 (TF "same" padding); the convolution fused with that pad
    # makes dlight's Matmul rule assert ("consumers of the cache-write stage that are not properly inlined"),
    # which ended the whole build under TVM's ApplyDefaultSchedule. This is the smallest graph that shows it.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU6(), torch.nn.ZeroPad2d((0, 1, 0, 1)),
                                torch.nn.Conv2d(8, 8, 3, stride=2, groups=8)).eval()
    (spec,) = capture(model, (torch.randn(1, 3, 8, 8),)).specializations
    board = load_board("jetson-orin-nano")
    artifact = lower(Build(program=run_pipeline(spec.program), board=board, target=board.target("gpu"),
                           tensor_inputs=spec.tensor_inputs))
    schedules = artifact.meta["gpu"]["schedules"]
    (padded,) = [name for name in schedules["rule_failures"] if name.endswith("_pad")]
    assert "not properly inlined" in schedules["rule_failures"][padded]["Matmul"]
    assert schedules["rules"][padded] != "Matmul"
    assert artifact.meta["gpu"]["kernels"] >= len(schedules["rules"])


def test_a_function_no_rule_schedules_is_named_with_every_rules_failure(monkeypatch):
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    from edgedyn.backends import gpu_worker

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU6(), torch.nn.ZeroPad2d((0, 1, 0, 1)),
                                torch.nn.Conv2d(8, 8, 3, stride=2, groups=8)).eval()
    (spec,) = capture(model, (torch.randn(1, 3, 8, 8),)).specializations
    module, _ = relax.frontend.detach_params(from_exported_program(
        run_pipeline(spec.program), keep_params_as_input=True, unwrap_unit_return_tuple=True))
    monkeypatch.setattr(gpu_worker, "RULES", ("Matmul",))  # as if no later rule could schedule the pad function
    schedules = gpu_worker.new_schedules()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_87"})
    with pytest.raises(Exception, match=r"fused_conv2d_add_tir_clip_pad \(Matmul: AssertionError: There are some "
                                        r"consumers of the cache-write stage that are not properly inlined"):
        gpu_worker._cuda_pipeline(tvm, relax, target, schedules)(module)
    assert list(schedules["unscheduled"]) == ["fused_conv2d_add_tir_clip_pad"]
    reason = gpu_worker._unscheduled_reason({"f{}".format(i): {"Fallback": "ValueError: x"} for i in range(5)})
    assert reason.endswith("f2 (Fallback: ValueError: x); and 2 more")


@pytest.mark.requires("transformers")
def test_a_zoo_export_without_gpu_code_names_each_function_and_why(monkeypatch, tmp_path, run_cli):
    """On a real graph: only dlight's Matmul rule, which asserts on MobileNetV2's padded convolutions."""
    import edgedyn
    import edgedyn.runtime as rt
    from edgedyn import zoo
    from edgedyn.backends.gpu_worker import RULES_VARIABLE

    import edgedyn.onboard

    monkeypatch.setenv(RULES_VARIABLE, "Matmul")  # the GPU build runs in a child process: it reads the variable
    # the CPU artifact beside it by the board's preference, not counted on the emulated board (not what is tested)
    monkeypatch.setattr(edgedyn.onboard, "unavailable", lambda board: "not measured in this test")
    with pytest.warns(GpuFallbackWarning, match=r"runs on the CPU: .* no dlight GPU schedule works for: .*"
                                                r"_pad\d* \(Matmul: AssertionError"):
        path = edgedyn.export(zoo.build("mobilenet_v2"), zoo.example_inputs("mobilenet_v2"),
                              board="jetson-orin-nano", output=tmp_path / "mobilenet.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    assert [(a["backend"], a["device"]) for a in spec["artifacts"]] == [("onnxruntime", "cpu")]
    missing = spec["no_gpu_code"]
    assert (missing["backend"], missing["arch"]) == ("tvm", "sm_87") and "sm_87 failed" in missing["reason"]
    failed = sorted(name for name, why in missing["functions"].items() if "Matmul" in why)
    assert failed and all("_pad" in name and "not properly inlined" in missing["functions"][name]["Matmul"]
                          for name in failed)
    # the rest are elementwise kernels Matmul does not apply to, each named too
    assert {"dlight": "no GPU rule applies"} in missing["functions"].values()
    shown = run_cli("inspect", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "no gpu   cuda-sm87 (sm_87): tvm builds no GPU code for {} functions:".format(
        len(missing["functions"])) in shown.stdout
    assert "    {}: Matmul: AssertionError: There are some consumers".format(failed[0]) in shown.stdout
    listed = json.loads(run_cli("inspect", "--json", str(path)).stdout)["specializations"][0]["no_gpu_code"]
    assert listed["functions"] == missing["functions"]


def test_the_rules_variable_picks_dlight_rules_in_their_order(monkeypatch):
    from edgedyn.backends import gpu_worker

    monkeypatch.delenv(gpu_worker.RULES_VARIABLE, raising=False)
    assert gpu_worker.rules() == gpu_worker.RULES
    monkeypatch.setenv(gpu_worker.RULES_VARIABLE, "Fallback, GEMV")
    assert gpu_worker.rules() == ("GEMV", "Fallback")
    monkeypatch.setenv(gpu_worker.RULES_VARIABLE, "Matmull")
    with pytest.raises(ValueError, match="unknown dlight rule Matmull; choose from: Matmul, GEMV"):
        gpu_worker.rules()


def test_under_device_auto_a_gpu_build_failure_ships_the_cpu_artifact_with_the_reason():
    def failing_build():
        raise GpuBuildError("the TVM CUDA build for sm_87 failed: no dlight GPU schedule works for: f (...)")

    with pytest.warns(GpuFallbackWarning, match="runs on the CPU: the TVM CUDA build for sm_87 failed: no dlight"):
        assert gpu_or_why_not(failing_build, "auto")[0] is None
    with pytest.raises(GpuBuildError, match="no dlight GPU schedule"):
        gpu_or_why_not(failing_build, "gpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_or_why_not(lambda: "artifact", "auto") == ("artifact", None)


def test_an_export_whose_gpu_build_fails_ships_the_cpu_artifact_and_says_why(monkeypatch, tmp_path):
    import edgedyn
    import edgedyn.runtime as rt
    from edgedyn.backends import tvm as tvm_backend

    def no_schedule(*args, **kwargs):
        raise GpuBuildError("the TVM CUDA build for sm_87 failed: no dlight GPU schedule works for: fused_f "
                            "(Fallback: AssertionError: ...)", hint="export with --device cpu for a CPU-only bundle")

    monkeypatch.setattr(tvm_backend, "lower_cuda", no_schedule)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    with pytest.warns(GpuFallbackWarning, match="runs on the CPU: .*no dlight GPU schedule works for: fused_f"):
        path = edgedyn.export(model, (torch.randn(2, 8),), board="jetson-orin-nano", backend="tvm",
                              output=tmp_path / "cpu-only.edgedyn", verify=False)
    (spec,) = rt.read_manifest(path)["specializations"]
    assert [a["device"] for a in spec["artifacts"]] == ["cpu"]
    with pytest.raises(GpuBuildError, match="no dlight GPU schedule"):
        edgedyn.export(model, (torch.randn(2, 8),), board="jetson-orin-nano", backend="tvm", device="gpu",
                       output=tmp_path / "gpu.edgedyn", verify=False)


@pytest.mark.parametrize("board, arch", sorted(JETSONS.items()))
def test_gpu_artifact_holds_ptx_for_the_boards_arch(gpu_artifacts, board, arch):
    artifact = gpu_artifacts[board]
    gpu = artifact.meta["gpu"]
    assert (artifact.device, artifact.arch, gpu["arch"], gpu["code_format"]) == ("cuda", "aarch64", arch, "ptx")
    assert gpu["ptx_target"] == arch and gpu["kernels"] >= 2
    assert gpu["ptx_isa"] == "8.5" and gpu["min_cuda_driver"] == "12.6"
    ptx = artifact.files["kernels"]
    assert b".target " + arch.encode() in ptx and b".entry" in ptx
    library = artifact.files["library"]
    assert library[:4] == b"\x7fELF" and int.from_bytes(library[18:20], "little") == 183  # aarch64 host code
    assert ptx[:2000] in library  # the device code travels inside the library the TVM runtime loads


@pytest.mark.requires("nvidia.cuda_nvcc")  # ptxas, from the nvcc wheel of NVRTC's CUDA release
@pytest.mark.parametrize("board, arch", sorted(JETSONS.items()))
def test_ptxas_assembles_the_ptx_for_each_jetson(gpu_artifacts, tmp_path, board, arch):
    source = tmp_path / "kernels.ptx"
    source.write_bytes(gpu_artifacts[board].files["kernels"])
    cubin = tmp_path / "kernels.cubin"
    done = subprocess.run([nvrtc.ptxas_path(), "-arch=" + arch, str(source), "-o", str(cubin)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert cubin.read_bytes()[:4] == b"\x7fELF"  # a cubin is an ELF file of device code


def test_missing_ptxas_names_the_cuda_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.cuda_nvcc", None)  # as if the nvcc wheel were not installed
    with pytest.raises(MissingDependencyError) as raised:
        nvrtc.ptxas_path()
    assert raised.value.message == "checking PTX needs ptxas from NVIDIA's nvcc wheel, which is not installed"
    assert "pip install 'edgedyn[cuda]'" in raised.value.hint


def test_maxwell_ptx_is_real_maxwell_code(gpu_artifacts):
    # PTX for sm_53 may use warp shuffles without .sync, which only pre-Volta targets accept: it was generated for
    # the Nano, not relabelled from a newer arch.
    assert b".target sm_53" in gpu_artifacts["jetson-nano"].files["kernels"]


@pytest.mark.parametrize("ptx, library, message", [
    (b"", b"\x7fELF host code only", "produced no device code for it"),
    (b"//\n.version 8.5\n.target sm_87\n.visible .entry k()\n{\n}\n", b"\x7fELF", "produced no device code for it"),
    (b"//\n.version 8.5\n.target sm_53\n.address_size 64\n", b"\x7fELF", "produced no device code for it"),
    (b"//\n.version 8.5\n.target sm_53\n.visible .entry k()\n{\n}\n", b"\x7fELF without it",
     "does not embed the PTX"),
])
def test_missing_device_code_fails_loudly(ptx, library, message):
    with pytest.raises(BackendError, match=message):
        check_device_code(library, ptx, "sm_53")


@pytest.mark.parametrize("driver, artifact, reason", [
    ({"available": False, "reason": "no NVIDIA driver (libcuda.so.1 not found)", "devices": []}, {},
     "no NVIDIA driver (libcuda.so.1 not found)"),
    ({"available": True, "driver_version": "10.2", "devices": [{"name": "NVIDIA Tegra X1", "compute_capability": "5.3"}]},
     {"requires": {"cuda_driver": "12.6", "compute_capability": "5.3"}, "gpu": {"arch": "sm_53", "ptx_isa": "8.5"}},
     "the CUDA driver here is 10.2, the GPU code (sm_53 PTX ISA 8.5) needs 12.6 or newer"),
    ({"available": True, "driver_version": "12.6", "devices": [{"name": "Orin", "compute_capability": "8.7"}]},
     {"requires": {"cuda_driver": "12.6", "compute_capability": "5.3"}, "gpu": {"arch": "sm_53"}}, None),
    ({"available": True, "driver_version": "12.8", "devices": [{"name": "Tegra X1", "compute_capability": "5.3"}]},
     {"requires": {"cuda_driver": "12.6", "compute_capability": "8.7"}, "gpu": {"arch": "sm_87"}},
     "the GPU here (Tegra X1, compute capability 5.3) is older than the code's 8.7"),
])
def test_gpu_requirements_against_the_driver(monkeypatch, driver, artifact, reason):
    monkeypatch.setattr(devices, "_cached", driver)
    assert devices.gpu_unusable_reason(artifact) == reason


def test_this_machine_has_no_gpu_driver_or_reports_it():
    driver = devices.cuda_driver()
    assert set(driver) >= {"available", "reason", "devices"}
    assert driver["available"] == bool(driver["devices"])


def test_fp16_gpu_artifact_records_its_accuracy(tmp_path):
    import edgedyn
    import edgedyn.runtime as rt

    path = edgedyn.export(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)),
                          (torch.randn(4, 32),), board="jetson-orin-nano", backend="tvm", device="gpu",
                          precision="fp16", output=tmp_path / "half.edgedyn")
    (spec,) = rt.read_manifest(path)["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["precision"] == "fp16" and artifact["gpu"]["arch"] == "sm_87"
    (output,) = artifact["accuracy"]["outputs"]
    # fp16 inputs and weights with fp32 accumulation: about 3 significant digits, never garbage.
    assert 0 < output["max_rel_error"] < 1e-2 and output["cosine"] > 0.999


def test_the_real_gpu_check_builds_for_a_local_gpu_without_one():
    """tests/gpu/check_gpu.py's build half (x86 host, the local GPU's arch) works on a machine with no GPU."""
    import json
    from pathlib import Path

    script = Path(__file__).parent / "gpu" / "check_gpu.py"
    done = subprocess.run([sys.executable, str(script), "--arch", "sm_90", "--build-only", "--models", "mlp"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.splitlines()[0])
    assert row["model"] == "mlp" and row["arch"] == "sm_90" and row["kernels"] > 0


def test_inspect_says_what_the_gpu_code_needs_and_what_this_machine_would_run(monkeypatch, tmp_path, run_cli):
    import edgedyn
    import edgedyn.onboard
    from edgedyn.runtime.format import read_manifest

    # The Nano's CPU artifact is one of the CPU-independent ones (onnxruntime, TFLite, OpenVINO, NCNN): this x86
    # machine can run it too. Chosen by the board's preference here, as where qemu is not installed: counting every
    # candidate on the emulated CPU (tests/board/test_onboard.py) took 75 of this test's 90 s.
    monkeypatch.setattr(edgedyn.onboard, "unavailable", lambda board: "not measured in this test")
    reference, inputs = ALL_MODELS["tiny_cnn"]
    bundle = edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board="jetson-nano", backend="auto",
                            precision="fp32", output=tmp_path / "nano.edgedyn")
    (spec,) = read_manifest(bundle)["specializations"]
    cpu = next(a["backend"] for a in spec["artifacts"] if a["device"] == "cpu")
    assert cpu in ("onnxruntime", "tflite", "openvino", "ncnn"), cpu
    shown = run_cli("inspect", str(bundle))
    assert shown.returncode == 0, shown.stderr
    assert "gpu      sm_53: PTX (PTX ISA 8.5" in shown.stdout and "needs a CUDA 12.6+ driver" in shown.stdout
    assert "here     would run {}-cpu; tvm-cuda (sm_53) not used: ".format(cpu) in shown.stdout
    here = json.loads(run_cli("inspect", "--json", str(bundle)).stdout)["this_machine"]["x=1x3x64x64"]
    assert here["would_run"] == cpu + "-cpu" and here["skipped"][0][0] == "tvm-cuda (sm_53)"
