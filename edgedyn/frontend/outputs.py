"""Model outputs as a flat list of tensors plus a JSON tree that rebuilds the structure on the board."""
from typing import Any, Dict, List, Tuple

import torch

from edgedyn.errors import CaptureError


def flatten_output(value: Any) -> Tuple[Dict[str, Any], List[torch.Tensor]]:
    """(tree, tensors): tuples, lists and dicts (in insertion order) of tensors, None or Python scalars."""
    flat = []  # type: List[torch.Tensor]
    return _flatten(value, flat), flat


def _flatten(value: Any, flat: List[torch.Tensor]) -> Dict[str, Any]:
    if isinstance(value, torch.Tensor):
        flat.append(value)
        return {"kind": "tensor", "index": len(flat) - 1}
    if value is None:
        return {"kind": "none"}
    if type(value) in (int, float, bool):
        return {"kind": "constant", "value": value}
    if isinstance(value, (tuple, list)):
        return {"kind": "tuple" if isinstance(value, tuple) else "list", "items": [_flatten(v, flat) for v in value]}
    if isinstance(value, dict):
        keys = list(value)
        if not all(isinstance(k, str) for k in keys):
            raise CaptureError("the model returns a dict with non-string keys {}; use string keys".format(keys))
        return {"kind": "dict", "keys": keys, "items": [_flatten(value[k], flat) for k in keys]}
    raise CaptureError("the model returns a {}; edgedyn handles tensors, tuples, lists, dicts, None and "
                       "numbers".format(type(value).__name__))


def output_names(tree: Dict[str, Any]) -> List[str]:
    """One name per flat output, from the model's own structure: dict keys (a ModelOutput's `logits`,
    `pred_boxes`), joined with '.' under tuples or nested dicts; `output_0`, `output_1`... when it has no keys."""
    paths = {}  # type: Dict[int, List[str]]
    _paths(tree, [], paths)
    if not any(any(not part.isdigit() for part in path) for path in paths.values()):
        return ["output_{}".format(index) for index in sorted(paths)]
    return [".".join(paths[index]) or "output_{}".format(index) for index in sorted(paths)]


def _paths(tree: Dict[str, Any], prefix: List[str], paths: Dict[int, List[str]]) -> None:
    if tree["kind"] == "tensor":
        paths[tree["index"]] = prefix
    elif tree["kind"] in ("tuple", "list"):
        for position, item in enumerate(tree["items"]):
            _paths(item, prefix + [str(position)], paths)
    elif tree["kind"] == "dict":
        for key, item in zip(tree["keys"], tree["items"]):
            _paths(item, prefix + [key], paths)
