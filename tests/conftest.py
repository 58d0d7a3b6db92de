"""Shared fixtures: example models and bundles exported once per test session, and the one way a test skips."""
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# The examples every backend must handle: (model reference, --input options).
EXAMPLE_MODELS = {
    "loop_example": ("loop_example.py:loop_example", ("x=2x3", "n=4")),
    "tiny_cnn": ("tiny_cnn.py:TinyCNN", ("x=1x3x64x64",)),
    "mlp": ("mlp.py:MLP", ("x=1x64", "x=8x64")),
}
# The models people take to a board, beside the small examples.
REFERENCE_MODELS = {
    "mobilenet_v2": ("mobilenet_v2.py:MobileNetV2", ("x=1x3x96x96",)),
    "transformer_block": ("transformer_block.py:TransformerBlock", ("x=1x32x64",)),
}
ALL_MODELS = dict(EXAMPLE_MODELS, **REFERENCE_MODELS)
# fp32 backends: max |edgedyn - torch| <= RTOL * max |torch| on every output.
RTOL = 1e-4


# Note: every skip in tests/ goes through `require` (or the `requires` marker, which calls it). Locally a test
# that lacks something skips with the reason; under CI=true it fails, naming what is missing and how to install
# it, because CI claims to have run it. Only tests marked `gpu` (a real NVIDIA GPU) may still skip in CI.
# test_conftest.py checks that no test skips any other way.

# Python module -> the pyproject extra that installs it.
MODULE_EXTRAS = {
    "tvm": "tvm",
    "onnx": "export",
    "onnxruntime": "onnxruntime",
    "openvino": "openvino",
    "ncnn": "ncnn",
    "pnnx": "ncnn-export",
    "tflite": "export",
    "ai_edge_litert": "litert",
    "nvidia.cuda_nvrtc": "cuda",
    "nvidia.cuda_nvcc": "cuda",
    "vermin": "test",
    "transformers": "zoo",
    "torchvision": "zoo",
    "ultralytics": "zoo",
    "cv2": "zoo",  # opencv-python, which ultralytics brings
    "tornado": "fleet",
    "xgboost": "fleet",
    "cryptography": "sign",
    "PIL": "images",
    "psutil": "fleet",
    "cloudpickle": "fleet",
    "nncf": "nncf",
}
_running = None  # type: Optional[pytest.Item]


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def install_hint(module: str) -> str:
    extra = MODULE_EXTRAS.get(module) or MODULE_EXTRAS.get(module.split(".")[0])
    return "pip install 'edgedyn[{}]'".format(extra) if extra else "pip install {}".format(module.split(".")[0])


def require(condition: bool, why: str, hint: str) -> None:
    """Skips the running test unless `condition` holds; under CI=true fails it instead (unless it is `gpu`)."""
    if condition:
        return
    message = "{}; {}".format(why, hint)
    if in_ci() and not (_running is not None and _running.get_closest_marker("gpu")):
        pytest.fail("{} (CI=true: this test must run, not skip)".format(message), pytrace=False)
    pytest.skip(message)


def require_module(name: str, why: str = "") -> ModuleType:
    """The imported module `name`, or a skip (a failure under CI=true) naming it and its install command."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        problem = str(error)
    # Outside the `except`: the report shows the reason, not a chained ImportError traceback.
    require(False, "needs the Python module '{}'{} ({})".format(name, ": " + why if why else "", problem),
            install_hint(name))
    raise AssertionError("not reached: require skips or fails")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Any:
    """Lets `require` see the running test's markers, from its fixtures (any scope) and its body."""
    global _running
    _running = item
    try:
        yield
    finally:
        _running = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.requires("tvm", ...)` (or `pytestmark = ...` for a module): checked before any fixture runs."""
    for marker in item.iter_markers("requires"):
        for name in marker.args:
            require_module(name)


@pytest.fixture(scope="session")
def export_example(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Exports an example or reference model once per (model, board, backend) and returns the bundle path."""
    cache = {}  # type: Dict[Tuple[str, str, str], Path]
    directory = tmp_path_factory.mktemp("bundles")

    def export(example: str, board: str = "x86-64", backend: str = "tvm", precision: str = "fp32") -> Path:
        key = (example, board, backend, precision)
        if key not in cache:
            import edgedyn

            reference, inputs = ALL_MODELS[example]
            # fp32 unless asked: these bundles are compared with torch eager at the fp32 tolerance
            cache[key] = edgedyn.export(str(EXAMPLES / reference), inputs=list(inputs), board=board, backend=backend,
                                        precision=precision,
                                        output=directory / "{}-{}-{}-{}.edgedyn".format(*key))
        return cache[key]

    return export


def foreign_board() -> Tuple[str, str]:
    """(a board whose CPU architecture is not this machine's, that architecture): its bundles are refused here."""
    from edgedyn.runtime.format import host_arch

    return ("x86-64", "x86_64") if host_arch() == "aarch64" else ("raspberry-pi-4", "aarch64")


def torch_model(name: str) -> Any:
    """The eager model (or function) behind an example or reference model, in eval mode."""
    import torch

    from edgedyn.frontend.loading import load_reference

    model, _, _ = load_reference(str(EXAMPLES / ALL_MODELS[name][0]))
    return model.eval() if isinstance(model, torch.nn.Module) else model


def assert_matches_torch(program: Any, name: str, seed: int = 1000, calls: int = 1) -> None:
    """Every specialization of a loaded bundle equals torch eager on fresh random inputs (never zeros).

    `calls` > 1 runs each input again, e.g. in an arena the previous call left dirty.
    """
    import numpy as np
    import torch

    model = torch_model(name)
    for index, spec in enumerate(program.specializations):
        values = dict(spec.record["constants"])
        rng = np.random.default_rng(seed + index)
        for record in spec.record["inputs"]:
            values[record["name"]] = rng.standard_normal(record["shape"]).astype(np.float32)
        for _ in range(calls):
            actual = program(**values)
        with torch.no_grad():
            expected = model(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in values.items()})
        scale = float(expected.abs().max())
        np.testing.assert_allclose(actual, expected.numpy(), rtol=RTOL, atol=RTOL * scale,
                                   err_msg="{} specialization {}".format(name, spec.name))


def raw_sensor_model(offset: float = 1000.0, size: int = 32) -> Tuple[Any, tuple]:
    """(a small CNN on raw 10-bit sensor values, its example input): values around `offset` with a spread of 1, the
    offset taken off by the first convolution's bias. A reduced precision rounds the input itself (bf16 keeps 8 bits
    of mantissa, fp16 11: steps of 4 and 0.5 at 1000), so its error is all in the first layer, and the layers after
    it see values of order one: what keeping the first layers in fp32 (candidates.more_fp32) repairs."""
    import torch

    class RawSensor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(16, 8, 3, padding=1))
            with torch.no_grad():
                self.body[0].bias.copy_(-offset * self.body[0].weight.sum((1, 2, 3)))

        def forward(self, x: Any) -> Any:
            return self.body(x)

    torch.manual_seed(0)
    return RawSensor().eval(), (offset + torch.randn(1, 3, size, size),)


def with_precision(bundle: Path, precision: str, output: Path) -> Path:
    """A copy of `bundle` whose artifacts record `precision` (and no fp32 tolerance): for backends whose files are
    the same in every precision (ncnn's), the artifact `auto` would build for a board whose gate runs there."""
    import json
    import zipfile

    with zipfile.ZipFile(str(bundle)) as source, zipfile.ZipFile(str(output), "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename == "manifest.json":
                manifest = json.loads(data)
                for spec in manifest["specializations"]:
                    for artifact in spec["artifacts"]:
                        artifact["precision"] = precision
                        artifact.pop("tolerance", None)
                data = json.dumps(manifest).encode()
            target.writestr(info, data)
    return output


def reseal(source: Path, target: Path, edit_member: Optional[Callable[[str, bytes], bytes]] = None,
           deflate: Sequence[str] = (), extra: Sequence[Tuple[str, bytes]] = ()) -> Path:
    """A copy of a bundle with members edited and the manifest's sizes and SHA-256 recomputed to match: tampering
    that checksums cannot see, or an artifact's file as the export would write it."""
    import hashlib
    import json
    import zipfile

    from edgedyn.runtime.format import MANIFEST_NAME

    with zipfile.ZipFile(str(source)) as archive:
        manifest = json.loads(archive.read(MANIFEST_NAME))
        members = {name: archive.read(name) for name in manifest["members"]}
    if edit_member is not None:
        members = {name: edit_member(name, data) for name, data in members.items()}
    for name, data in members.items():
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with zipfile.ZipFile(str(target), "w") as archive:
        archive.writestr(MANIFEST_NAME, json.dumps(manifest))
        for name, data in list(members.items()) + list(extra):
            archive.writestr(name, data, zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return target


def with_member(bundle: Path, suffix: str, edit: Callable[[bytes], bytes], output: Path) -> Path:
    """A copy of `bundle` whose members ending in `suffix` are `edit`ed, resealed: an artifact's file as the export
    would write it (a mixed ncnn model), without exporting it again."""
    return reseal(bundle, output, lambda name, data: edit(data) if name.endswith(suffix) else data)


@pytest.fixture
def run_cli() -> Callable[..., "subprocess.CompletedProcess[str]"]:
    """Runs `python -m edgedyn ARGS` in a fresh interpreter, as a user would."""
    import subprocess

    def run(*args: str, cwd: Path = REPO, env: Dict[str, str] = None) -> "subprocess.CompletedProcess[str]":
        environment = {k: v for k, v in os.environ.items() if k != "EDGEDYN_DEBUG"}
        environment.update(env or {})
        return subprocess.run([sys.executable, "-m", "edgedyn", *args], cwd=str(cwd), env=environment,
                              capture_output=True, text=True, timeout=600)

    return run
