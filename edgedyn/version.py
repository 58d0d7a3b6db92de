"""The edgedyn version: one definition, read by the package, the bundle producer record and the wheel build."""
__version__ = "0.1.0"
