"""A model's output structure (tensor, tuple, list, dict, None) to and from the flat arrays executors return.

The manifest's `output_tree` records the structure (frontend/outputs.py writes it). Standard library and numpy
only, Python 3.8 syntax: this file runs on the board.
"""
from typing import Any, Dict, List

import numpy as np


def build_outputs(tree: Dict[str, Any], flat: List[np.ndarray]) -> Any:
    """Rebuilds the model's output structure (tensor, tuple, list, dict, None) from flat arrays."""
    kind = tree["kind"]
    if kind == "tensor":
        return flat[tree["index"]]
    if kind == "none":
        return None
    if kind == "constant":
        return tree["value"]
    items = [build_outputs(item, flat) for item in tree["items"]]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    if kind == "dict":
        return dict(zip(tree["keys"], items))
    raise ValueError("unknown output kind {!r}".format(kind))


def flatten_outputs(tree: Dict[str, Any], value: Any) -> List[np.ndarray]:
    """The tensors of an output structure in manifest order."""
    kind = tree["kind"]
    if kind == "tensor":
        return [value]
    if kind in ("none", "constant"):
        return []
    values = [value[key] for key in tree["keys"]] if kind == "dict" else list(value)
    flat = []  # type: List[np.ndarray]
    for item, item_value in zip(tree["items"], values):
        flat.extend(flatten_outputs(item, item_value))
    return flat
