"""The backends: one module (or package) per backend, each with `lower(build: Build) -> Artifact`.

Their records (how each lowers, its executor, devices, extras, overhead) are in edgedyn/registry.py, which sits
below this package (board files are checked against it, on the board too); `Build` and `Artifact` are in
artifact.py. How to add one: docs/architecture.md.
"""
