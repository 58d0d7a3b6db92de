"""scripts/install.sh as a stock Debian 12 user meets it: the README's first command with Debian's own python3.

Debian 12's /usr/bin/python3 is externally managed (PEP 668): pip refuses to install into it, so install.sh must
make a virtual environment and say where `edgedyn` landed. This copies the checkout, runs the README's first
command there exactly as written with PYTHON=/usr/bin/python3, and checks the bundle it made.

The two install tests are marked slow_install and deselected by default (pyproject addopts): each installs every
extra into a fresh virtual environment. Measured on a shared 2-core machine: 4 min (1.6 GB) for the Debian-python
test, 7 min (3.0 GB with the root filesystem and its apt packages) for the bookworm one; both together took 2 min 55 s
on 2026-12-01 with pip's wheels cached, 10 min 36 s at a load average of about 6. .ci/run runs them after the
README's test command, both at once: `python3 -m pytest -n 2 -m slow_install tests/test_install.py`. Without what they need they skip locally and fail under
CI=true (conftest.require).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require

DEBIAN_PYTHON = Path("/usr/bin/python3")
ROOTFS_TOOLS = ("mmdebstrap", "unshare", "chroot", "mount")


def readme_command(number: int) -> str:
    """The README quick start's command `number` (1 or 2), as a user would paste it."""
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands  # the README promises exactly two commands
    return commands[number - 1]


def _externally_managed(python: Path) -> bool:
    code = ("import os, sys, sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path('stdlib'), "
            "'EXTERNALLY-MANAGED')) else 1)")
    return subprocess.run([str(python), "-c", code]).returncode == 0


def _copy_checkout(target: Path) -> None:
    """The files a clone has (tracked and new ones not ignored), without the build outputs of this checkout."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=str(REPO), check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(str(source), str(target / name))


@pytest.mark.slow_install
def test_readme_first_command_with_debians_own_python(tmp_path):
    require(DEBIAN_PYTHON.exists() and _externally_managed(DEBIAN_PYTHON),
            "this test needs Debian's own externally managed /usr/bin/python3", "run it on Debian 12 / Ubuntu 24.04")
    checkout = tmp_path / "edgedyn"
    _copy_checkout(checkout)
    environment = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "EDGEDYN_DEBUG")}
    environment["PYTHON"] = str(DEBIAN_PYTHON)
    result = subprocess.run(["bash", "-c", readme_command(1)], cwd=str(checkout), env=environment,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "making a virtual environment in .venv" in result.stderr
    assert "edgedyn is {}/.venv/bin/edgedyn".format(checkout) in result.stderr
    assert "verified 1 output(s) of 1 specialization(s)" in result.stderr
    assert (checkout / "tiny.edgedyn").is_file()
    # Debian's python itself is untouched: edgedyn went into the virtual environment only.
    assert subprocess.run([str(DEBIAN_PYTHON), "-c", "import edgedyn"], cwd="/", env=environment,
                          capture_output=True).returncode != 0


# The README's first command inside a fresh Debian 12 root filesystem, with nothing but Debian's own python3 in
# it: install.sh installs its apt packages and python3-venv there, makes .venv and installs edgedyn into it.
# pip inside reads this machine's pip configuration and local wheel folders (without them the index's
# torch==2.14.1 is the multi-GB CUDA build from the network), bind-mounted read-only; needs root (mount, chroot) and the network.
def _pip_files() -> list:
    """This machine's pip configuration files, and the CA bundle they name (a TLS-intercepting proxy's root may be
    in it, which Debian's own ca-certificates lacks)."""
    debug = subprocess.run([sys.executable, "-m", "pip", "config", "debug"], capture_output=True, text=True).stdout
    files = re.findall(r"^\s+(/\S+), exists: True$", debug, re.M)
    for text in [Path(f).read_text() for f in files] + [os.environ.get("PIP_CERT", "")]:
        files += re.findall(r"(?:cert\s*=\s*)?(/\S+\.(?:crt|pem|txt))", text)
    return sorted({f for f in files if Path(f).is_file()})


def _pip_folders(files: list) -> list:
    """The local folders pip here reads (find-links, file:// indexes), from its environment and config files."""
    text = " ".join([os.environ.get("PIP_FIND_LINKS", ""), os.environ.get("PIP_EXTRA_INDEX_URL", "")] +
                    [Path(f).read_text() for f in files if f.endswith(".conf")])
    folders = set()
    for word in re.split(r"[\s=]+", text):
        path = word[len("file://"):] if word.startswith("file://") else word
        if path.startswith("/opt/") or path.startswith("/srv/"):
            folders.add(str(Path(*Path(path).parts[:3])))  # /opt/pypi/simple -> /opt/pypi
    return sorted(f for f in folders if Path(f).is_dir())


def rootfs_tools_missing() -> list:
    """What the bookworm test lacks here: root (it mounts and chroots) and the tools it runs."""
    return (["root"] if os.geteuid() != 0 else []) + [tool for tool in ROOTFS_TOOLS if not shutil.which(tool)]


@pytest.mark.slow_install
def test_readme_first_command_in_a_fresh_bookworm_rootfs(tmp_path):
    missing = rootfs_tools_missing()
    require(not missing, "this test needs {}".format(", ".join(missing)),
            "run it as root after bash scripts/install.sh (it installs mmdebstrap, and uidmap for non-root users)")
    root = tmp_path / "bookworm"
    subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", "--include=python3,ca-certificates", "bookworm",
                    str(root)], check=True, timeout=1200)
    checkout = root / "root" / "edgedyn"
    _copy_checkout(checkout)
    pip_files = _pip_files()
    for name in pip_files + ["/etc/resolv.conf"]:
        if Path(name).is_file():
            (root / name.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(name, str(root / name.lstrip("/")))
    mounts = ["mount --bind /dev {0}/dev".format(root), "mount -t proc proc {0}/proc".format(root)]
    for folder in _pip_folders(pip_files):
        (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
        mounts.append("mount --bind -o ro {} {}{}".format(folder, root, folder))
    pip_environment = "".join("export {}='{}'\n".format(k, v) for k, v in os.environ.items() if k.startswith("PIP_"))
    (root / "root" / "readme.sh").write_text(
        "set -e\ncd /root/edgedyn\nexport PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n{}{}\n".format(
            pip_environment, readme_command(1)))
    script = " && ".join(mounts + ["chroot {} env -i /bin/bash /root/readme.sh".format(root)])
    # A private mount namespace: the bind mounts vanish with it, before anything deletes the root filesystem.
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "making a virtual environment in .venv" in result.stderr
    assert "apt-get install" in result.stderr and "python3-venv" in result.stderr
    assert "verified 1 output(s) of 1 specialization(s)" in result.stderr
    assert (checkout / "tiny.edgedyn").is_file()


def test_under_ci_a_missing_mmdebstrap_fails_the_bookworm_test_rather_than_skipping_it(tmp_path):
    """CI claims the install test ran: without mmdebstrap on PATH it must fail there, and only skip locally."""
    python_only = tmp_path / "bin"
    python_only.mkdir()
    (python_only / "python3").symlink_to(sys.executable)
    test = "tests/test_install.py::test_readme_first_command_in_a_fresh_bookworm_rootfs"
    outcomes = {}
    for ci in ("true", ""):
        environment = dict(os.environ, PATH=str(python_only), CI=ci)
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow_install",
                                 test], cwd=str(REPO), env=environment, capture_output=True, text=True, timeout=300)
        outcomes[ci] = (result.returncode, result.stdout)
    code, output = outcomes["true"]
    assert code == 1 and "1 failed" in output, output
    assert re.search(r"this test needs (root, )?mmdebstrap, unshare, chroot, mount", output), output
    assert "CI=true: this test must run, not skip" in output
    code, output = outcomes[""]
    assert code == 0 and "1 skipped" in output, output
