"""The one skip helper: locally a test that lacks something skips, under CI=true it fails naming what is missing."""
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple
from xml.etree import ElementTree

import pytest

from conftest import MODULE_EXTRAS, REPO

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

MISSING = "edgedyn_test_no_such_module"
GENERATED = '''
import pytest

from conftest import require, require_module


@pytest.mark.requires("{missing}")
def test_marked():
    pass


def test_in_the_body():
    require_module("{missing}")


@pytest.fixture(scope="module")
def needs_it():
    return require_module("{missing}")


def test_through_a_module_fixture(needs_it):
    pass


@pytest.mark.gpu
def test_gpu_only():
    require(False, "needs an NVIDIA GPU", "run it on a machine with one")


def test_present():
    assert require_module("json").dumps([1]) == "[1]"
'''.format(missing=MISSING)
# What a module-level importorskip became: every test in the file needs the module.
GENERATED_MODULE = '''
import pytest

pytestmark = pytest.mark.requires("{missing}")


def test_whole_module():
    pass
'''.format(missing=MISSING)
ALL_GENERATED = {"test_marked", "test_in_the_body", "test_through_a_module_fixture", "test_whole_module",
                 "test_gpu_only", "test_present"}
NEEDS_MISSING = ("test_marked", "test_in_the_body", "test_through_a_module_fixture", "test_whole_module")


def run_generated(tmp_path: Path, ci: bool) -> Dict[str, Tuple[str, str]]:
    """Runs the generated test files with this repo's conftest and markers: test name -> (outcome, message)."""
    (tmp_path / "test_generated.py").write_text(GENERATED)
    (tmp_path / "test_generated_module.py").write_text(GENERATED_MODULE)
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    if ci:
        env["CI"] = "true"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-c", str(REPO / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", "--junit-xml", str(report),
                           "test_generated.py", "test_generated_module.py"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert report.exists(), done.stdout + done.stderr
    outcomes = {}
    for case in ElementTree.parse(str(report)).iter("testcase"):
        results = [child for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = (results[0].tag, results[0].get("message", "")) if results else ("passed", "")
    assert set(outcomes) == ALL_GENERATED, done.stdout + done.stderr
    return outcomes


def test_a_missing_module_fails_under_ci_naming_it(tmp_path):
    outcomes = run_generated(tmp_path, ci=True)
    for name in NEEDS_MISSING:
        outcome, message = outcomes[name]
        assert outcome in ("failure", "error"), outcomes[name]  # a failing fixture or setup hook is an error
        assert "needs the Python module '{}'".format(MISSING) in message and "CI=true: this test must run" in message
        assert "pip install {}".format(MISSING) in message
    assert outcomes["test_gpu_only"] == ("skipped", "needs an NVIDIA GPU; run it on a machine with one")
    assert outcomes["test_present"] == ("passed", "")


def test_a_missing_module_skips_locally_with_the_reason(tmp_path):
    outcomes = run_generated(tmp_path, ci=False)
    for name in NEEDS_MISSING + ("test_gpu_only",):
        assert outcomes[name][0] == "skipped", outcomes[name]
    assert "needs the Python module '{}'".format(MISSING) in outcomes["test_marked"][1]
    assert outcomes["test_present"] == ("passed", "")


# The ways pytest skips besides `require`; each would skip silently under CI=true.
OTHER_SKIPS = re.compile(r"pytest\.skip\(|importorskip\(|mark\.skip|skipif\(|pytest\.xfail\(|mark\.xfail")


def test_no_test_skips_except_through_require():
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path == REPO / "tests" / "conftest.py" or path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if OTHER_SKIPS.search(line):
                offenders.append("{}:{}: {}".format(path.relative_to(REPO), number, line.strip()))
    assert not offenders, "skip through conftest.require / require_module / @pytest.mark.requires:\n" + "\n".join(
        offenders)


def test_install_hints_name_real_extras_and_the_markers_are_registered():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert set(MODULE_EXTRAS.values()) <= set(extras)
    markers = [m.split(":")[0].split("(")[0] for m in project["tool"]["pytest"]["ini_options"]["markers"]]
    assert {"gpu", "requires"} <= set(markers)


def test_a_module_absent_here_names_its_extra(monkeypatch):
    from conftest import require_module

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"needs the Python module 'onnxruntime'.*"
                                                    r"pip install 'edgedyn\[onnxruntime\]'"):
        require_module("onnxruntime")
