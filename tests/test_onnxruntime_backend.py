"""Every example and the reference models through the onnxruntime backend: equal to torch eager on fresh random
inputs, a portable ONNX file in the bundle, and the errors a user sees when onnxruntime is missing."""
import ast
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

import edgedyn
import edgedyn.runtime as rt
from edgedyn.backends.onnxruntime import execution_providers
from edgedyn.boards import load_board
from edgedyn.runtime.executors.onnxruntime import usable_providers

from conftest import ALL_MODELS, EXAMPLES, REPO, RTOL, assert_matches_torch

pytestmark = pytest.mark.requires("onnx", "onnxruntime")

MODELS = ALL_MODELS


@pytest.fixture(scope="module")
def export_onnx(export_example: Callable[..., Path]) -> Callable[..., Path]:
    """Exports a model with --backend onnxruntime once per (model, board)."""
    return lambda name, board="x86-64": export_example(name, board=board, backend="onnxruntime")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_torch_on_fresh_inputs(export_onnx, name):
    program = rt.load(export_onnx(name))
    assert program.specializations and all(spec.artifact["backend"] == "onnxruntime" for spec in program.specializations)
    assert_matches_torch(program, name, seed=2000)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_verifies_with_its_reference_data(export_onnx, name):
    results = rt.load(export_onnx(name)).verify()
    assert results and all(r["ok"] and r["artifact"] == "onnxruntime" for r in results), results
    assert all(r["max_rel"] < RTOL for r in results)


def test_bundle_holds_one_portable_onnx_file_with_its_weights(export_onnx):
    bundle = rt.Bundle(export_onnx("mobilenet_v2"))
    (spec,) = bundle.manifest["specializations"]
    (artifact,) = spec["artifacts"]
    assert artifact["arch"] is None and artifact["target"] == "onnx-opset20"
    assert artifact["opset"] == 20 and artifact["ir_version"] == 9
    assert artifact["requires"] == {"python": ["onnxruntime>=1.17"]}
    assert artifact["pipeline"] == {"name": "onnxruntime",
                                    "passes": ["merge_parallel_convolutions", "remove_dead_code"]}
    assert artifact["onnxruntime"] == {"version": __import__("onnxruntime").__version__, "graph_optimization": "basic",
                                       "session": {"graph_optimization": "all", "intra_op_threads": 0,
                                                   "allow_spinning": True, "execution_mode": "sequential"}}
    assert artifact["tolerance"]["rtol"] == 1e-4
    assert artifact["selection"] == {"mode": "user", "requested": "onnxruntime", "precision": "fp32"}
    assert list(artifact["files"]) == ["model"] and artifact["files"]["model"].endswith("/model.onnx")
    import onnx

    model = onnx.load_from_string(bundle.read(artifact["files"]["model"]))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["output_0"]
    # Only standard ONNX ops (basic optimizations): any onnxruntime and any execution provider can run it.
    assert {node.domain for node in model.graph.node} == {""}
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 20)]
    # Batch norm was folded into the convolutions (by onnxruntime's basic optimizations), and every weight is
    # inside the file.
    assert "BatchNormalization" not in {node.op_type for node in model.graph.node}
    assert model.graph.initializer and all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)


def test_export_is_deterministic(tmp_path):
    members = []
    for name in ("a", "b"):
        path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x32x32"], backend="onnxruntime",
                              output=tmp_path / (name + ".edgedyn"))
        manifest = rt.read_manifest(path)
        members.append(manifest["members"])
    assert members[0] == members[1]


def test_threads_option_sets_intra_op_threads(export_onnx):
    program = rt.load(export_onnx("tiny_cnn"), threads=1)
    executor = program.specializations[0].executor
    assert executor.describe()["threads"] == 1
    assert executor._session.get_session_options().intra_op_num_threads == 1


def _pinned_threads(seconds: float = 1.0, until: Callable[[list], bool] = lambda pinned: False) -> list:
    """This process's threads whose CPU affinity is narrower than the process's own, after `seconds` or as soon as
    `until` holds: onnxruntime's pool threads pin themselves once they first run."""
    import os
    import time

    allowed = os.sched_getaffinity(0)
    deadline = time.monotonic() + seconds
    while True:
        pinned = [tid for tid in os.listdir("/proc/self/task") if os.sched_getaffinity(int(tid)) != allowed]
        if until(pinned) or time.monotonic() > deadline:
            return pinned
        time.sleep(0.05)


def test_the_default_session_has_a_thread_per_physical_core_none_of_them_pinned(export_onnx):
    import os

    import numpy as np
    import onnxruntime

    from conftest import require
    from edgedyn.runtime import sysinfo

    require(hasattr(os, "sched_getaffinity") and sysinfo.physical_cores() > 1,
            "needs Linux on 2 physical cores or more", "run it on such a machine")
    # Left at 0, onnxruntime pins each pool thread to a CPU (docs/backends.md): a pinned worker waits for whatever
    # else runs on its CPU. The executor always names the count, which leaves them free.
    path = export_onnx("tiny_cnn")
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    pinned_before = _pinned_threads()
    program = rt.load(path)
    program(x)
    assert _pinned_threads() == pinned_before
    described = program.specializations[0].executor.describe()
    assert described["threads"] is None and described["intra_op_threads"] == sysinfo.physical_cores()
    # What it avoids, in the onnxruntime installed here: a session left at 0 pins its pool threads.
    model = rt.Bundle(path).read(program.specializations[0].artifact["files"]["model"])
    left_at_zero = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    left_at_zero.run(None, {"x": x})
    assert len(_pinned_threads(10.0, until=lambda pinned: len(pinned) > len(pinned_before))) > len(pinned_before)
    del left_at_zero


CONFINED = """
import os, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # first: threads started later inherit it
import numpy as np
import edgedyn.runtime as rt
program = rt.load(sys.argv[1])
program(np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32))
time.sleep(0.5)  # onnxruntime's pool threads pin themselves once they first run
cpus = sorted({cpu for tid in os.listdir("/proc/self/task") for cpu in os.sched_getaffinity(int(tid))})
print(program.specializations[0].executor.describe()["intra_op_threads"], cpus)
"""


def test_a_process_confined_to_one_cpu_runs_its_bundle_there(export_onnx):
    import os
    import subprocess

    from conftest import require

    require(hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1,
            "needs Linux with 2 CPUs or more", "run it on such a machine")
    # Left at 0, onnxruntime 1.32 counted the machine's cores, not the process's, and pinned a worker to CPU 1
    # of a process that `taskset -c 0` had confined to CPU 0.
    done = subprocess.run([sys.executable, "-c", CONFINED, str(export_onnx("tiny_cnn"))], capture_output=True,
                          text=True, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "[{}]".format(min(os.sched_getaffinity(0)))]


def test_jetson_bundle_asks_for_gpu_providers_and_runs_on_what_is_installed(export_onnx):
    program = rt.load(export_onnx("tiny_cnn", board="jetson-orin-nano"))
    described = program.specializations[0].executor.describe()
    assert described["providers_requested"] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    import onnxruntime

    assert described["providers"] == usable_providers(described["providers_requested"],
                                                      onnxruntime.get_available_providers())
    assert described["providers"][-1] == "CPUExecutionProvider"
    results = program.verify()
    assert results and all(r["ok"] for r in results), results


@pytest.mark.parametrize("wanted, available, used", [
    (["CPUExecutionProvider"], ["CPUExecutionProvider"], ["CPUExecutionProvider"]),
    (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
     ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"]),
    (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
     ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"],
     ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]),
    # CPU always ends the list, even when the artifact did not name it.
    (["CUDAExecutionProvider"], ["AzureExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]),
])
def test_usable_providers_keep_the_artifact_order_with_cpu_last(wanted, available, used):
    assert usable_providers(wanted, available) == used


@pytest.mark.parametrize("board, providers", [
    ("x86-64", ["CPUExecutionProvider"]),
    ("raspberry-pi-4", ["CPUExecutionProvider"]),
    ("jetson-nano", ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]),
])
def test_execution_providers_per_board(board, providers):
    assert execution_providers(load_board(board)) == providers


def test_missing_onnxruntime_on_the_device_names_the_install_command(export_onnx, monkeypatch):
    bundle = export_onnx("mlp")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(rt.MissingDependencyError) as raised:
        rt.load(bundle)
    assert "this bundle runs on onnxruntime, which is not installed" in str(raised.value)
    assert raised.value.hint.startswith("pip install 'edgedyn[onnxruntime]'")


def test_missing_onnxruntime_on_the_host_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(edgedyn.errors.MissingDependencyError) as raised:
        edgedyn.export(str(EXAMPLES / "mlp.py:MLP"), inputs=["x=1x64"], backend="onnxruntime",
                       output=tmp_path / "mlp.edgedyn")
    assert "the onnxruntime backend needs onnx, onnxscript and onnxruntime" in raised.value.message
    assert raised.value.hint == "pip install 'edgedyn[export,onnxruntime]'"


def test_verify_without_onnxruntime_is_one_error_line_with_the_hint(run_cli, export_onnx, tmp_path):
    # A fresh interpreter in which `import onnxruntime` fails, as on a board without the package.
    (tmp_path / "onnxruntime.py").write_text("raise ImportError('No module named onnxruntime')\n")
    result = run_cli("verify", str(export_onnx("mlp")), env={"PYTHONPATH": "{}:{}".format(tmp_path, REPO)})
    assert result.returncode == 2, result.stderr
    assert "error: this bundle runs on onnxruntime, which is not installed" in result.stderr
    assert "hint: pip install 'edgedyn[onnxruntime]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_executor_keeps_python38_syntax():
    source = (REPO / "edgedyn" / "runtime" / "executors" / "onnxruntime.py").read_text()
    ast.parse(source, feature_version=(3, 8))
    assert "from edgedyn." not in source.replace("from edgedyn.runtime", "")


def _fused_ops(bundle_path: Path) -> "collections.Counter[str]":
    """The operators onnxruntime runs after its own fusions (ORT_ENABLE_ALL) on the bundle's model file."""
    import collections

    import onnx
    import onnxruntime

    bundle = rt.Bundle(bundle_path)
    model = bundle.read(bundle.manifest["specializations"][0]["artifacts"][-1]["files"]["model"])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as workdir:
        options.optimized_model_filepath = str(Path(workdir) / "fused.onnx")
        onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return collections.Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


def test_transformer_block_keeps_the_ops_onnxruntime_fuses(export_onnx):
    # Lowered from the high-level graph (the onnxruntime pipeline), not from core ATen: GELU stays one op that
    # onnxruntime fuses, layer norms stay LayerNormalization (SkipLayerNormalization with the residual add).
    ops = _fused_ops(export_onnx("transformer_block"))
    assert ops["Gelu"] + ops["BiasGelu"] == 1, ops
    assert ops["LayerNormalization"] + ops["SkipLayerNormalization"] == 2, ops
    assert not {"Erf", "ReduceMean", "Pow", "Sqrt"} & set(ops), ops


def test_every_backend_names_a_registered_pipeline_and_onnxruntime_keeps_high_level_ops():
    from edgedyn.registry import BACKENDS
    from edgedyn.passes import HIGH_LEVEL, PIPELINES

    assert all(record.pipeline in PIPELINES for record in BACKENDS.values())
    assert BACKENDS["onnxruntime"].pipeline in HIGH_LEVEL
    assert all(BACKENDS[name].pipeline == "default" for name in ("portable", "tflite", "tvm"))


def test_a_file_onnxruntime_cannot_reopen_is_replaced_by_the_exported_model():
    import onnx
    import onnxruntime

    from edgedyn.backends.onnxruntime import _loadable

    class Refusing:
        SessionOptions, GraphOptimizationLevel = onnxruntime.SessionOptions, onnxruntime.GraphOptimizationLevel

        @staticmethod
        def InferenceSession(*args, **kwargs):
            raise RuntimeError("AddInitializedOrtValue Attempt to replace the existing tensor")

    optimized, exported = onnx.ModelProto(), onnx.ModelProto()
    assert _loadable(Refusing, optimized, exported) == (exported, "none")


def test_initializers_onnxruntime_generated_offline_are_renamed_so_the_board_reopens_the_file(tmp_path):
    """onnxruntime's offline MatMulAddFusion names its reshape shapes after free node names (gemm_input_shape). In
    a post-norm encoder layer (BERT's, DistilBERT's) it leaves the attention's projections for later; the board's
    onnxruntime fuses those at load, made the same names again and refused the file, and the backend shipped the
    unoptimized export, its attention unfused."""
    import numpy as np
    import onnx
    import onnxruntime
    import torch

    from edgedyn.backends.onnxruntime import GENERATED_PREFIX

    class PostNormLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(32) for _ in range(3))
            self.q, self.k, self.v, self.out = (torch.nn.Linear(32, 32) for _ in range(4))
            self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

        def forward(self, x):
            h = self.norms[0](x)
            q, k, v = (t.view(1, 8, 4, 8).transpose(1, 2) for t in (self.q(h), self.k(h), self.v(h)))
            attention = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            h = self.norms[1](h + self.out(attention.transpose(1, 2).reshape(1, 8, 32)))
            return self.norms[2](h + self.down(torch.nn.functional.gelu(self.up(h))))

    torch.manual_seed(0)
    model = PostNormLayer().eval()
    path = edgedyn.export(model, (torch.randn(1, 8, 32),), board="x86-64", backend="onnxruntime",
                          output=tmp_path / "layer.edgedyn")
    bundle = rt.Bundle(path)
    artifact = bundle.manifest["specializations"][0]["artifacts"][-1]
    assert artifact["onnxruntime"]["graph_optimization"] == "basic"
    assert artifact["onnx_rewrites"]["attention_fused"] == 1
    data = bundle.read(artifact["files"]["model"])
    assert any(t.name.startswith(GENERATED_PREFIX) for t in onnx.load_from_string(data).graph.initializer)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])  # as the board opens it
    x = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        want = model(x).numpy()
    got = rt.load(path)(x.numpy())
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def _board_with_session(tmp_path: Path, table: str) -> Path:
    """The x86-64 board file as a user's own, with an [onnxruntime] table."""
    text = (REPO / "boards" / "x86-64.toml").read_text().replace('name = "x86-64"', 'name = "my-x86"')
    text = text.split("[onnxruntime]")[0]  # the shipped table, if any, gives way to the test's
    path = tmp_path / "my-x86.toml"
    path.write_text(text + "\n[onnxruntime]\n" + table)
    return path


def test_board_session_settings_are_recorded_and_applied(tmp_path):
    import onnxruntime as ort

    board = _board_with_session(tmp_path, 'graph_optimization = "extended"\nintra_op_threads = 1\n'
                                          'allow_spinning = false\n')
    path = edgedyn.export(str(EXAMPLES / "tiny_cnn.py:TinyCNN"), inputs=["x=1x3x64x64"], board=str(board),
                          backend="onnxruntime", output=tmp_path / "tiny.edgedyn")
    (artifact,) = rt.read_manifest(path)["specializations"][0]["artifacts"]
    assert artifact["onnxruntime"]["session"] == {"graph_optimization": "extended", "intra_op_threads": 1,
                                                  "allow_spinning": False, "execution_mode": "sequential"}
    executor = rt.load(path).specializations[0].executor
    options = executor._session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert executor.describe()["session"]["allow_spinning"] is False
    # the runtime's own thread count (edgedyn run --threads, rt.load(threads=...)) wins over the board's
    assert rt.load(path, threads=2).specializations[0].executor._session.get_session_options().intra_op_num_threads == 2


def test_a_bad_session_setting_names_the_board_file_and_field(tmp_path):
    from edgedyn.errors import BoardError

    board = _board_with_session(tmp_path, 'execution_mode = "async"\n')
    with pytest.raises(BoardError) as caught:
        load_board(str(board))
    assert caught.value.message.startswith("{}: onnxruntime.execution_mode: ".format(board)), caught.value.message
    assert "got 'async'" in caught.value.message


@pytest.mark.parametrize("session", [{"execution_mode": "async"}, {"threads": 4}, {"intra_op_threads": -1},
                                     {"allow_spinning": "yes"}])
def test_a_bundle_with_bad_session_settings_is_refused(session):
    from edgedyn.runtime.errors import BundleError
    from edgedyn.runtime.executors.onnxruntime import session_settings

    with pytest.raises(BundleError) as caught:
        session_settings({"onnxruntime": {"session": session}})
    assert caught.value.message.startswith("onnxruntime.session: ")
