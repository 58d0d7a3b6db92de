"""Where MetaSchedule's tuning records for a target live, and how a build names the records it used.

One folder per edgedyn target (`~/.cache/edgedyn/tuning/<target>/`, or under $EDGEDYN_TUNING_DIR), holding
MetaSchedule's JSON database (`database_workload.json`, `database_tuning_record.json`). `edgedyn tune` appends to
it; the TVM backend builds with it when it holds records. Host side, beside the backend that reads it (edgedyn/fleet,
which writes it, sits above the backends).
"""
import hashlib
import os
from pathlib import Path
from typing import Any, Dict, Optional

from edgedyn.runtime.format import cache_dir

ENV = "EDGEDYN_TUNING_DIR"
WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


def tuning_root() -> Path:
    """The folder holding one database per target: $EDGEDYN_TUNING_DIR, else the edgedyn cache's `tuning/`."""
    root = os.environ.get(ENV)
    return Path(root) if root else cache_dir() / "tuning"


def database_dir(target: str, root: Optional[Path] = None) -> Path:
    """The database folder of an edgedyn target name such as `x86-64-v2` or `cortex-a76`."""
    return (root or tuning_root()) / target


def record_count(folder: Path) -> int:
    path = folder / RECORDS
    if not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def describe(folder: Path) -> Optional[Dict[str, Any]]:
    """The manifest's record of a database (folder, record count, SHA-256 of its two files), or None when empty."""
    count = record_count(folder)
    if count == 0:
        return None
    digest = hashlib.sha256()
    for name in (WORKLOADS, RECORDS):
        digest.update((folder / name).read_bytes())
    return {"database": str(folder), "target": folder.name, "records": count, "sha256": digest.hexdigest()}
