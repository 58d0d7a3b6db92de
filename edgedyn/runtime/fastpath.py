"""The common call, decided without binding arguments: see FastDispatch. Runs on the board (Python 3.8, numpy)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import guards as guard_checks

Specialization = Any  # edgedyn.runtime.program.Specialization (which imports this module)


class FastDispatch:
    """The common call without binding: every argument positional, tensors as C-contiguous numpy arrays of exactly
    one specialization's dtype and shape, constants of exactly the captured type and value.

    Note: an optimization only, never a second rule. `match` returns the specialization the guards would choose,
    or None; on None `Program.__call__` takes the general path, which binds, checks every guard and words the
    errors. A call is looked up by its call_key (each argument's dtype and shape, or type and value); where two
    specializations accept the same key the first in manifest order has it, as in `dispatch`, and the table stops
    at the first specialization whose guards this class cannot read (dispatch would reach it before any later
    one). The table is built once and never written again: safe to share between threads.
    """

    def __init__(self, signature: List[Dict[str, Any]], specializations: List[Specialization]) -> None:
        names = [param["name"] for param in signature]
        # Each specialization under the call key (call_key) its guards accept, with the positions of its tensors
        # and of its inputs; the first in manifest order keeps a key.
        self._keyed = {}  # type: Dict[Tuple[Any, ...], Tuple[Specialization, List[int], List[int]]]
        for spec in specializations:
            checks = _fast_checks(spec.guards, names)
            if checks is None:
                break
            key = tuple(expected if kind is None else (kind, expected) for _, kind, expected in checks)
            self._keyed.setdefault(key, (spec, [position for position, kind, _ in checks if kind is None],
                                         [names.index(name) for name in spec.inputs]))

    def match(self, args: Sequence[Any]) -> Optional[Tuple[Specialization, List[np.ndarray]]]:
        """(the specialization and its executor inputs) when the fast rules decide it, else None."""
        key = call_key(args)
        routed = None if key is None else self.match_key(key, args)
        return None if routed is None else routed[:2]

    def match_key(self, key: Tuple[Any, ...], args: Sequence[Any]) -> Optional[Tuple[Specialization, List[np.ndarray],
                                                                                     None]]:
        """The route of a call (as Program.route_call returns it: nothing to cut back) when the fast rules decide
        it, given the call's call_key (computed once per call, and shared with the buckets' fast path)."""
        row = self._keyed.get(key)
        if row is None:
            return None
        spec, tensors, order = row
        for position in tensors:  # C order, which the executors need
            if not args[position].flags.c_contiguous:
                return None
        return spec, [args[position] for position in order], None


def call_key(values: Sequence[Any]) -> Optional[Tuple[Any, ...]]:
    """What the guards read of a call: each array's dtype and shape, each constant's type and value; None when an
    argument is anything else (a list, a torch tensor, a numpy subclass: the general path binds and converts it)."""
    key = []  # type: List[Any]
    for value in values:
        if type(value) is np.ndarray:
            key.append((value.dtype, value.shape))
        elif type(value) in (int, float, bool):
            key.append((type(value), value))
        else:
            return None
    return tuple(key)


def _fast_checks(guards: List[Dict[str, Any]], names: List[str]) -> Optional[List[Tuple[int, Any, Any]]]:
    """Per argument (position, None, (dtype, shape)) for a tensor or (position, type, value) for a constant, when
    `guards` say exactly that and nothing else; None when they hold a guard this fast form cannot express."""
    tensors = {}  # type: Dict[str, Dict[str, Any]]
    constants = {}  # type: Dict[str, Tuple[Any, Any]]
    for guard in guards:
        kind, name = guard["kind"], guard["input"]
        if name not in names:
            return None
        if kind in ("tensor", "dtype", "rank", "dim"):
            entry = tensors.setdefault(name, {"dims": {}})
            if kind == "dtype":
                entry["dtype"] = guard["expected"]
            elif kind == "rank":
                entry["rank"] = guard["expected"]
            elif kind == "dim":
                entry["dims"][guard["index"]] = guard["expected"]
            else:
                entry["tensor"] = True
        elif kind == "constant" and guard["type"] in guard_checks._SCALAR_TYPES:
            constants[name] = (guard_checks._SCALAR_TYPES[guard["type"]], guard["expected"])
        else:
            return None
    checks = []  # type: List[Tuple[int, Any, Any]]
    for position, name in enumerate(names):
        if name in constants and name not in tensors:
            checks.append((position, constants[name][0], constants[name][1]))
            continue
        entry = tensors.get(name)
        if entry is None or not entry.get("tensor") or "dtype" not in entry or "rank" not in entry:
            return None
        if sorted(entry["dims"]) != list(range(entry["rank"])):
            return None
        shape = tuple(int(entry["dims"][index]) for index in range(entry["rank"]))
        checks.append((position, None, (np.dtype(entry["dtype"]), shape)))
    return checks
