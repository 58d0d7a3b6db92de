"""Guards: the assumptions a capture made, stored as data and checked on every call.

A guard record is a JSON object written at export time, e.g.
    {"kind": "dim", "input": "x", "index": 0, "expected": 1, "source": "--input x=1x3x64x64"}
`check` returns None when the value satisfies the guard, or a sentence saying what failed.
Standard library and numpy only, Python 3.8 syntax.
"""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from edgedyn.runtime.schema import short

Guard = Dict[str, Any]

_SCALAR_TYPES = {"int": int, "float": float, "bool": bool}


def tensor_guards(name: str, shape: Sequence[int], dtype: str, source: str) -> List[Guard]:
    """The guards of one tensor input captured at a fixed shape: it is a tensor, its dtype, rank and each dim."""
    guards = [
        {"kind": "tensor", "input": name, "source": source},
        {"kind": "dtype", "input": name, "expected": dtype, "source": source},
        {"kind": "rank", "input": name, "expected": len(shape), "source": source},
    ]
    for index, size in enumerate(shape):
        guards.append({"kind": "dim", "input": name, "index": index, "expected": int(size), "source": source})
    return guards


def constant_guard(name: str, value: Any, source: str) -> Guard:
    """A Python scalar that was specialized into the graph."""
    type_name = type(value).__name__
    if type_name not in _SCALAR_TYPES:
        raise TypeError("only int, float and bool arguments can be specialized, got {}".format(type_name))
    return {"kind": "constant", "input": name, "type": type_name, "expected": value, "source": source}


def describe(guard: Guard) -> str:
    """The guard as a person reads it: `x.shape[0] == 1`, `n == 4`."""
    kind, name = guard["kind"], guard["input"]
    if kind == "tensor":
        return "{} is a tensor".format(name)
    if kind == "dtype":
        return "{}.dtype == {}".format(name, guard["expected"])
    if kind == "rank":
        return "{}.ndim == {}".format(name, guard["expected"])
    if kind == "dim":
        return "{}.shape[{}] == {}".format(name, guard["index"], guard["expected"])
    if kind == "constant":
        return "{} == {!r}".format(name, guard["expected"])
    raise ValueError("unknown guard kind {!r}".format(kind))


def check(guard: Guard, value: Any) -> Optional[str]:
    """None when `value` satisfies the guard, else what failed, in words."""
    kind, name = guard["kind"], guard["input"]
    if kind in ("tensor", "dtype", "rank", "dim") and not isinstance(value, np.ndarray):
        return "input '{}': expected a numpy array, got {}".format(name, type(value).__name__)
    if kind == "tensor":
        return None
    if kind == "dtype":
        if str(value.dtype) != guard["expected"]:
            return "input '{}' dtype: expected {}, got {}".format(name, guard["expected"], value.dtype)
        return None
    if kind == "rank":
        if value.ndim != guard["expected"]:
            return "input '{}' rank: expected {} dims, got {} (shape {})".format(
                name, guard["expected"], value.ndim, format_shape(value.shape))
        return None
    if kind == "dim":
        if guard["index"] >= value.ndim:
            return "input '{}' has {} dims, no dim {}".format(name, value.ndim, guard["index"])
        actual = value.shape[guard["index"]]
        if actual != guard["expected"]:
            return "input '{}' dim {}: expected {}, got {}".format(name, guard["index"], guard["expected"], actual)
        return None
    if kind == "constant":
        expected_type = _SCALAR_TYPES[guard["type"]]
        # bool is an int in Python; keep them apart, as the capture did.
        if type(value) is not expected_type and not (
            isinstance(value, np.generic) and type(value.item()) is expected_type
        ):
            return "argument '{}': expected a Python {} equal to {!r}, got {} {}".format(
                name, guard["type"], guard["expected"], type(value).__name__, short(value))
        if value != guard["expected"]:
            return "argument '{}': this specialization was captured with {} == {!r}, got {}".format(
                name, name, guard["expected"], short(value))
        return None
    raise ValueError("unknown guard kind {!r}".format(kind))


def first_failure(guards: Sequence[Guard], values: Dict[str, Any]) -> Optional[str]:
    """The first guard that fails for these bound arguments, in words; None when all hold."""
    for guard in guards:
        failure = check(guard, values[guard["input"]])
        if failure is not None:
            return failure
    return None


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(size)) for size in shape) if len(shape) else "scalar"


def input_spec(name: str, value: Any) -> str:
    """How `--input` would name this value, for hints: `x=8x3x64x64`, `x=1x3:float16`, `n=5`."""
    if isinstance(value, np.ndarray):
        text = "{}={}".format(name, format_shape(value.shape) if value.ndim else "scalar")
        return text if value.dtype == np.float32 else "{}:{}".format(text, value.dtype)
    return "{}={}".format(name, short(value))


# Who reads a hint: Python code calling a loaded bundle ("python": the hint names edgedyn.export(inputs=...) and
# numpy casts) or a person at the `edgedyn` command line ("cli": --input options, numpy.save); the CLI sets "cli".
HINT_STYLES = ("python", "cli")
hint_style = "python"


def no_match_hint(signature: Sequence[Dict[str, Any]], specializations: Sequence[Sequence[Guard]],
                  values: Dict[str, Any]) -> str:
    """What to do when no specialization matches: cast when a dtype is off, else export again for these values."""
    try:
        wanted = _export_form([input_spec(p["name"], values[p["name"]]) for p in signature])
    except Exception:  # an argument of a kind we cannot describe: the message above already says what failed
        return "pass arguments with the shapes and dtypes listed above"
    cast = _cast_hint(specializations, values)
    if cast is not None:
        return "{}; or, if the model should take that dtype, export again with {}".format(cast, wanted)
    return "pass arguments matching one specialization, or export again adding: {}".format(wanted)


def _cast_hint(specializations: Sequence[Sequence[Guard]], values: Dict[str, Any]) -> Optional[str]:
    """The cast that gives an array the dtype the bundle was exported for (numpy's float64 default is the usual
    miss), or None when every array's dtype is one the bundle takes."""
    for name, value in values.items():
        expected = sorted({g["expected"] for guards in specializations for g in guards
                           if g["kind"] == "dtype" and g["input"] == name})
        if not isinstance(value, np.ndarray) or not expected or str(value.dtype) in expected:
            continue
        if hint_style == "cli":
            return "save '{}' as {}: numpy.save(path, array.astype(numpy.{}))".format(name, expected[0], expected[0])
        return "cast '{}' to {}: {}.astype(np.{})".format(name, expected[0], name, expected[0])
    return None


def _export_form(specs: Sequence[str]) -> str:
    """`--input x=2x3 --input n=5` for the command line, `edgedyn.export(..., inputs=[...])` for Python."""
    if hint_style == "cli":
        return " ".join("--input " + spec for spec in specs)
    return "edgedyn.export(model, inputs=[<the inputs exported before>, {}])".format(
        ", ".join('"{}"'.format(spec) for spec in specs))
