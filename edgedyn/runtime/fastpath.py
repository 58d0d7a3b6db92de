"""The common call, decided without binding arguments: see FastDispatch. Runs on the board (Python 3.8, numpy)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.runtime import guards as guard_checks

Specialization = Any  # edgedyn.runtime.program.Specialization (which imports this module)
Row = Tuple[Specialization, List[Tuple[int, Any, Any]], List[int]]  # a specialization, its checks, its inputs' order


class FastDispatch:
    """The common call without binding: every argument positional, tensors as C-contiguous numpy arrays of exactly
    one specialization's dtype and shape, constants of exactly the captured type and value.

    Note: an optimization only, never a second rule. `match` returns the specialization the guards would choose,
    or None; on None `Program.__call__` takes the general path, which binds, checks every guard and words the
    errors. Specializations are tried in manifest order, as `dispatch` does, and the search stops at the first
    one whose guards this class cannot read (dispatch would reach it before any later one). The tables are built
    once and never written again: safe to share between threads.
    """

    def __init__(self, signature: List[Dict[str, Any]], specializations: List[Specialization]) -> None:
        names = [param["name"] for param in signature]
        self._arity = len(names)
        self._table = []  # type: List[Row]
        for spec in specializations:
            checks = _fast_checks(spec.guards, names)
            if checks is None:
                break
            self._table.append((spec, checks, [names.index(name) for name in spec.inputs]))
        # The rows by the first tensor argument's (dtype, shape), in table order: a call is compared with the rows
        # that can hold it only (a bundle with buckets has one row per bucket, and a padded call matches none).
        firsts = {next((c[0] for c in checks if c[1] is None), None) for _, checks, _ in self._table}
        self._first = firsts.pop() if len(firsts) == 1 else None  # type: Optional[int]
        self._rows = {}  # type: Dict[Tuple[Any, Any], List[Row]]
        if self._first is not None:
            for row in self._table:
                expected = next(c[2] for c in row[1] if c[0] == self._first)
                self._rows.setdefault(expected, []).append(row)

    def match(self, args: Sequence[Any]) -> Optional[Tuple[Specialization, List[np.ndarray]]]:
        """(the specialization and its executor inputs) when the fast rules decide it, else None."""
        if len(args) != self._arity:
            return None
        table = self._table
        if self._first is not None:
            first = args[self._first]
            if type(first) is not np.ndarray:
                return None
            table = self._rows.get((first.dtype, first.shape), ())
        for spec, checks, order in table:
            for position, kind, expected in checks:
                value = args[position]
                if kind is None:  # a tensor: (dtype, shape), and C order, which the executors need
                    if type(value) is not np.ndarray or value.dtype != expected[0] or value.shape != expected[1] \
                            or not value.flags.c_contiguous:
                        break
                elif type(value) is not kind or value != expected:
                    break
            else:
                return spec, [args[position] for position in order]
        return None


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
