"""The emulated boards' install cache stays bounded: every edgedyn change is a new wheel and a new install beside
the rootfs (~200 MB), and a machine that ran CI on each commit had filled its disk with 41 GB of them."""
import os
import time
from pathlib import Path

from edgedyn.emulate.wheels import prune_installs


def _install(folder: Path, name: str, age_s: float, used_file: bool = True) -> Path:
    install = folder / name
    (install / "site").mkdir(parents=True)
    (folder / (name + ".lock")).touch()
    when = time.time() - age_s
    if used_file:
        (install / "used").touch()
        os.utime(str(install / "used"), (when, when))
    os.utime(str(install), (when, when))
    return install


def test_old_installs_of_a_rootfs_go_and_recent_or_other_ones_stay(tmp_path: Path) -> None:
    current = _install(tmp_path, "bookworm-aaaa-000000000000", 0)
    old = [_install(tmp_path, "bookworm-aaaa-{:012x}".format(i), 7200 + 60 * i, used_file=i % 2 == 0)
           for i in range(1, 9)]
    in_use = _install(tmp_path, "bookworm-aaaa-ffffffffffff", 100000)
    os.utime(str(in_use / "used"), None)  # used a moment ago, though built long before
    other_rootfs = _install(tmp_path, "bullseye-bbbb-000000000001", 99999)

    removed = prune_installs(current, keep=4, idle_s=3600)

    # kept: the current, the one in use, and the next two used last; the six older ones go with their locks
    assert sorted(removed) == sorted(old[2:])
    for install in old[2:]:
        assert not install.exists() and not (tmp_path / (install.name + ".lock")).exists()
    for install in [current, in_use, old[0], old[1], other_rootfs]:
        assert (install / "site").is_dir(), install


def test_installs_used_within_the_idle_time_stay_however_many(tmp_path: Path) -> None:
    current = _install(tmp_path, "bookworm-aaaa-000000000000", 0)
    recent = [_install(tmp_path, "bookworm-aaaa-{:012x}".format(i), 60 * i) for i in range(1, 12)]
    assert prune_installs(current, keep=2, idle_s=3600) == []
    assert all(install.is_dir() for install in recent)
