"""A zoo of public architectures from `transformers`, held as users hold them, to export for every board.

Each entry is a record (`ZooModel`): the raw `transformers` module built from a seeded, small config with random
weights (never a download), its example inputs and what its outputs are. `build(name)` gives the eager model,
`example_inputs(name, seed)` fresh random inputs (token ids in range), `input_options(name)` the `--input` strings.
Needs `pip install 'edgedyn[zoo]'` (host side only; bundles of these models run on the board without it).
"""
from typing import Any, Dict, List, Optional

from edgedyn.errors import EdgedynError, MissingDependencyError
from edgedyn.zoo.models import FAMILIES, MODELS
from edgedyn.zoo.records import InputSpec, ZooModel

__all__ = ["FAMILIES", "MODELS", "InputSpec", "ZooModel", "build", "example_inputs", "get", "input_options", "names"]


def names() -> List[str]:
    return list(MODELS)


def get(name: str) -> ZooModel:
    """The record of a zoo model; an unknown name lists the valid ones."""
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
