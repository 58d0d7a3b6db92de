"""The emulated board itself: an aarch64 CPU with the Python, numpy and TVM runtime that later tests rely on."""
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .emulator import (BULLSEYE_OLD, REPO, BoardImage, build_wheel, image_of, install_wheel, installed_checkout,
                       run_edgedyn, run_on_board)


def on_board(rootfs: Path, code: str, *args: Any, **kwargs: Any) -> Any:
    """Run `code` on the board with `args` as sys.argv[1:] and return the JSON it prints last."""
    result = run_on_board(rootfs, ["-c", code, *map(str, args)], **kwargs)
    assert result.returncode == 0, f"board python exited {result.returncode}:\n{result.stderr}"
    return json.loads(result.stdout.splitlines()[-1])


def test_board_is_aarch64_with_its_own_python(pi_rootfs: Path) -> None:
    seen = on_board(pi_rootfs, """
import json, platform, sys
cpu_parts = [line for line in open("/proc/cpuinfo") if line.startswith("CPU part")]
print(json.dumps({"machine": platform.machine(), "python": sys.version_info[:2], "prefix": sys.prefix,
                  "cpu_parts": cpu_parts}))
""")
    assert seen["machine"] == "aarch64"
    assert seen["python"] == [3, 11]
    assert seen["prefix"] == str(pi_rootfs / "usr")
    # The fake cpuinfo that onnxruntime needs, found through qemu's -L.
    assert seen["cpu_parts"] == ["CPU part\t: 0xd08\n"] * 4


def test_host_python_setup_does_not_reach_the_board(
    pi_rootfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("PYTHONHOME", "/nonexistent")
    code = """
import importlib.util, json, sys
print(json.dumps({"path": sys.path, "probe": importlib.util.find_spec("probe_module") is not None}))
"""
    seen = on_board(pi_rootfs, code)
    assert not seen["probe"]
    assert [p for p in seen["path"] if p and not p.startswith(str(pi_rootfs))] == []

    seen = on_board(pi_rootfs, code, pythonpath=[tmp_path])
    assert seen["probe"]
    assert seen["path"][1] == str(tmp_path)


@pytest.mark.parametrize("rootfs_fixture", ["pi_rootfs", "bullseye_rootfs"])
def test_numpy_matmul_matches_host(rootfs_fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    rootfs = request.getfixturevalue(rootfs_fixture)
    rng = np.random.default_rng()
    a, b = rng.standard_normal((67, 45)), rng.standard_normal((45, 31))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    run = on_board(rootfs, """
import json, sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
np.save(sys.argv[3], a @ b)
print(json.dumps({"numpy": np.__version__}))
""", tmp_path / "a.npy", tmp_path / "b.npy", tmp_path / "c.npy")
    board = np.load(tmp_path / "c.npy")
    assert board.shape == (67, 31) and board.dtype == np.float64, run
    # Another BLAS sums in another order: equal up to rounding, not bit for bit.
    np.testing.assert_allclose(board, a @ b, rtol=1e-10, atol=1e-12)


def test_tvm_runtime_loads_alone(pi_rootfs: Path, tmp_path: Path) -> None:
    weights = np.random.default_rng().standard_normal((3, 5)).astype("float32")
    np.save(tmp_path / "w.npy", weights)
    seen = on_board(pi_rootfs, """
import json, sys
import numpy as np
import tvm.runtime, tvm.runtime.vm
from tvm import base
tvm.runtime.save_param_dict_to_file({"w": tvm.runtime.tensor(np.load(sys.argv[1]))}, sys.argv[2])
np.save(sys.argv[3], tvm.runtime.load_param_dict_from_file(sys.argv[2])["w"].numpy())
print(json.dumps({"libs": sorted(base._LOADED_LIBS), "vm": tvm.runtime.vm.VirtualMachine.__name__}))
""", tmp_path / "w.npy", tmp_path / "w.params", tmp_path / "back.npy", env={"TVM_USE_RUNTIME_LIB": "1"})
    assert seen == {"libs": ["tvm_runtime"], "vm": "VirtualMachine"}  # no compiler library loaded
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), weights)


def test_bullseye_is_python39_with_debian_numpy119(bullseye_rootfs: Path) -> None:
    seen = on_board(bullseye_rootfs, """
import json, sys
import numpy, rich, tomli, typer, typing_extensions
print(json.dumps({"python": sys.version_info[:2], "numpy": numpy.__version__, "numpy_file": numpy.__file__}))
""")
    assert seen["python"] == [3, 9]
    assert seen["numpy"].startswith("1.19."), seen
    assert seen["numpy_file"] == str(bullseye_rootfs / "usr/lib/python3/dist-packages/numpy/__init__.py")
    # Only pure-Python wheels from the package index: the old board's compiled code is Debian's.
    assert list(BULLSEYE_OLD.site_dir(bullseye_rootfs).rglob("*.so")) == []


def test_board_image_is_validated_and_keyed_by_content() -> None:
    with pytest.raises(ValueError, match="unknown suite 'buster'; choose from: bookworm, bullseye"):
        BoardImage("buster")
    with pytest.raises(ValueError, match="must include 'python3'"):
        BoardImage(debs=("libgomp1",))
    image = BoardImage("bullseye", debs=["python3", "libgomp1"], wheels=["rich"])  # type: ignore[arg-type]
    assert image.debs == ("python3", "libgomp1") and hash(image)  # lists become tuples: hashable
    assert image.key() == BoardImage("bullseye", debs=("libgomp1", "python3"), wheels=("rich",)).key()
    assert image.key() != BoardImage("bullseye", debs=("python3", "libgomp1"), wheels=("rich<15",)).key()
    assert image.key() != BoardImage("bookworm", debs=("python3", "libgomp1"), wheels=("rich",)).key()


WHEEL_PROBE = """
import json, sys
from importlib import metadata
import edgedyn, edgedyn.boards
found = {"file": edgedyn.__file__, "version": metadata.version("edgedyn"),
         "boards_dir": str(edgedyn.boards.boards_dir()), "boards": edgedyn.boards.board_names(),
         "targets": edgedyn.boards.target_names()}
for name in ("numpy", "tomli"):
    try:
        found[name] = __import__(name).__file__
    except ImportError:
        found[name] = None
print(json.dumps(found))
"""


@pytest.mark.parametrize("rootfs_fixture", ["pi_rootfs", "bullseye_rootfs"])
def test_board_runs_the_installed_wheel_of_this_checkout(rootfs_fixture: str, request: pytest.FixtureRequest) -> None:
    from packaging.requirements import Requirement

    from edgedyn.boards import board_names, target_names

    rootfs = request.getfixturevalue(rootfs_fixture)
    result = run_edgedyn(rootfs, ["-c", WHEEL_PROBE])
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    site = installed_checkout(rootfs)
    # The wheel's copy, not the source tree, with the board and target files the wheel ships.
    assert seen["file"] == str(site / "edgedyn" / "__init__.py") and not seen["file"].startswith(str(REPO) + "/edgedyn")
    assert seen["boards_dir"] == str(site / "edgedyn" / "_data" / "boards")
    assert (seen["boards"], seen["targets"]) == (board_names(), target_names())
    assert seen["version"] == "0.1.0"
    install = json.loads((site.parent / "install.json").read_text())
    wanted = {Requirement(requirement).name for requirement in install["requirements"]}
    # The dependency markers, evaluated for the board and satisfied by what it has: the board's own numpy
    # (Debian's 1.19 on bullseye) meets numpy>=1.19 instead of being shadowed by a wheel.
    assert install["added_requirements"] == [] and all(install["board_has"].values()), install
    assert seen["numpy"].startswith(str(rootfs)), seen
    if image_of(rootfs).python == "3.9":  # base install: tomli below Python 3.11, no backend runtimes
        assert wanted == {"numpy", "rich", "tomli", "typer", "typing-extensions"}, install
        assert seen["tomli"] is not None and seen["tomli"].startswith(str(rootfs))
    else:  # with the tvm, onnxruntime and litert extras: ai-edge-litert, not tflite-runtime, from Python 3.10
        assert wanted == {"numpy", "rich", "typer", "typing-extensions", "apache-tvm", "apache-tvm-ffi",
                          "onnxruntime", "ai-edge-litert"}, install


def test_installs_are_cached_by_wheel_hash(pi_rootfs: Path, tmp_path: Path) -> None:
    site = installed_checkout(pi_rootfs)
    wheel = build_wheel(REPO, tmp_path / "wheel")
    assert install_wheel(pi_rootfs, wheel, image_of(pi_rootfs)) == site  # the same bytes: the same install, reused
    changed = tmp_path / "changed" / wheel.name
    changed.parent.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(changed, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            target.writestr(item, data + b"\n# changed\n" if item.filename == "edgedyn/__init__.py" else data)
    cache = tmp_path / "cache"
    first = install_wheel(pi_rootfs, wheel, image_of(pi_rootfs), cache_dir=cache)
    stamp = (first.parent / "install.json").stat().st_mtime_ns
    assert install_wheel(pi_rootfs, wheel, image_of(pi_rootfs), cache_dir=cache) == first
    assert (first.parent / "install.json").stat().st_mtime_ns == stamp  # not installed a second time
    other = install_wheel(pi_rootfs, changed, image_of(pi_rootfs), cache_dir=cache)
    assert other != first and (other / "edgedyn" / "__init__.py").read_bytes().endswith(b"# changed\n")
