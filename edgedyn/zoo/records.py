"""The zoo's record types: one tensor input, and one model."""
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple


@dataclass(frozen=True)
class InputSpec:
    """One tensor argument: its name in `forward`, shape and dtype; integer ids are drawn from [0, high)."""

    name: str
    shape: Tuple[int, ...]
    dtype: str = "float32"
    high: Optional[int] = None

    def __post_init__(self) -> None:
        if self.dtype.startswith("int") and self.high is None:
            raise ValueError("input {}: an integer input needs `high`, the end of its valid range".format(self.name))

    @property
    def option(self) -> str:
        """The `--input` string for this argument, e.g. `input_ids=1x16:int64`."""
        shape = "x".join(str(size) for size in self.shape)
        return "{}={}{}".format(self.name, shape, "" if self.dtype == "float32" else ":" + self.dtype)


@dataclass(frozen=True)
class ZooModel:
    """One architecture: how to build it, what it takes and what it returns (the keys of its ModelOutput)."""

    name: str
    family: str
    architecture: str
    factory: Callable[[], Any] = field(repr=False)
    inputs: Tuple[InputSpec, ...]
    outputs: Tuple[str, ...]
    description: str
    # The tests' default run keeps one model per family; the others carry the `zoo_full` marker.
    fast: bool = False
    # Relative to the largest reference magnitude; fp32 models meet the project's 1e-4.
    rtol: float = 1e-4
