"""Not torch: this folder goes first on PYTHONPATH of the processes `edgedyn tune` starts (the search and
MetaSchedule's build and run workers), so that `import torch` fails there as if torch were not installed.

tvm_ffi imports torch when it can, and TVM's script parser calls `inspect.stack()` for each kernel of its
schedule library, which scans every loaded module: beside torch, each worker took twice as long to start
(benchmarks/README.md, TVM tuning). An ImportError leaves no entry in sys.modules, so libraries that look for a
loaded torch (scipy under xgboost) see none.
"""
raise ImportError("edgedyn's tuning processes run without torch (edgedyn/fleet/without_torch)")
