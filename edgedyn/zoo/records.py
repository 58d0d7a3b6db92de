"""The zoo's record type and the functions every caller (tests, benchmarks, the CLI) uses to reach a model."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from edgedyn.errors import EdgedynError, MissingDependencyError


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


def names() -> List[str]:
    from edgedyn.zoo.models import MODELS

    return list(MODELS)


def get(name: str) -> ZooModel:
    """The record of a zoo model; an unknown name lists the valid ones."""
    from edgedyn.zoo.models import MODELS

    if name not in MODELS:
        raise EdgedynError("unknown zoo model '{}'; choose from: {}".format(name, ", ".join(MODELS)))
    return MODELS[name]


def build(name: str) -> Any:
    """The eager `transformers` model in eval mode, with seeded random weights that make outputs input-dependent."""
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError("the zoo needs transformers ({})".format(error),
                                     hint="pip install 'edgedyn[zoo]'") from error
    from edgedyn.zoo.weights import calibrate_batchnorm, randomize

    import torch

    record = get(name)
    # Construction draws from the global generator too (embeddings, class tokens): seed it, and leave the
    # caller's generator as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(name))
        model = record.factory()
    randomize(model, seed=_seed(name))
    calibrate_batchnorm(model, _batch(record, seed=_seed(name), size=4))
    return model.eval()


def example_inputs(name: str, seed: int = 0) -> Dict[str, Any]:
    """Fresh random inputs for a zoo model (normal floats, ids uniform in range), as a dict of tensors."""
    return _batch(get(name), seed, size=None)


def _batch(record: ZooModel, seed: int, size: Optional[int]) -> Dict[str, Any]:
    """Random inputs at the record's shapes, or with the batch dimension set to `size`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    values = {}
    for spec in record.inputs:
        shape = spec.shape if size is None else (size,) + tuple(spec.shape[1:])
        if spec.high is not None:
            dtype = getattr(torch, spec.dtype)
            values[spec.name] = torch.randint(0, spec.high, shape, generator=generator, dtype=dtype)
        else:
            values[spec.name] = torch.randn(shape, generator=generator)
    return values


def input_options(name: str) -> List[str]:
    return [spec.option for spec in get(name).inputs]


def _seed(name: str) -> int:
    """A stable per-model seed (Python's hash() of a str changes per process)."""
    return sum((index + 1) * ord(char) for index, char in enumerate(name)) % (2 ** 31)
