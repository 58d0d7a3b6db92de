"""`edgedyn bench --buckets`: one benchmark per bucket, each at a length it serves, dispatch cost included.

Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
import time
from typing import Any, Dict, Optional

from edgedyn.runtime.bench import BenchConfig, Clock, OnProgress, run_benchmark
from edgedyn.runtime.buckets import typical_lengths
from edgedyn.runtime.errors import EdgedynError
from edgedyn.runtime.format import Bundle


def run_bucket_benchmarks(path: str, config: BenchConfig, on_progress: Optional[OnProgress] = None,
                          clock: Clock = time.perf_counter) -> Dict[str, Any]:
    """One benchmark per bucket, each at a length between the one below and it (padded, then sliced back), or at
    the bucket's own size where no length lies between: what each bucket costs, dispatch included."""
    manifest = Bundle(path).manifest
    if not manifest.get("buckets"):
        raise EdgedynError("bundle {} has no buckets".format(path),
                           hint="export with bucket sizes, e.g. --input 'input_ids=1x{16,32,64}:int64' --pad "
                                "input_ids=0; or time it without --buckets")
    reports = []
    for size, length in typical_lengths(manifest["buckets"][0]):
        config_at = BenchConfig(**dict({k: getattr(config, k) for k in config.__dataclass_fields__ if k != "rule"},
                                       length=length))
        report = run_benchmark(path, config_at, on_progress, clock)
        report["bucket"] = {"size": size, "length": length}
        reports.append(report)
    return {"model": reports[0]["model"], "board": reports[0]["board"], "bundle": str(path),
            "backend": reports[0]["backend"], "buckets": reports}
