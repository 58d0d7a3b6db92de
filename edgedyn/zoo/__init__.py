"""A zoo of public architectures from `transformers`, held as users hold them, to export for every board.

Each entry is a record (`ZooModel`): the raw `transformers` module built from a seeded, small config with random
weights (never a download), its example inputs and what its outputs are. `build(name)` gives the eager model,
`example_inputs(name, seed)` fresh random inputs (token ids in range), `input_options(name)` the `--input` strings.
Needs `pip install 'edgedyn[zoo]'` (host side only; bundles of these models run on the board without it).
"""
from edgedyn.zoo.models import MODELS, FAMILIES
from edgedyn.zoo.records import InputSpec, ZooModel, build, example_inputs, get, input_options, names

__all__ = ["FAMILIES", "MODELS", "InputSpec", "ZooModel", "build", "example_inputs", "get", "input_options", "names"]
