"""Example inputs: parsing `--input` and normalizing the Python API's example_inputs into specialization sets.

`--input NAME=VALUE` names one argument. VALUE is a shape `1x3x64x64` (a float32 tensor; `scalar` for a 0-d
tensor) with an optional dtype suffix `:float16` / `:int64`, or a Python scalar `4`, `0.5`, `true`.
A dtype suffix makes a tensor of a bare number: `x=8:float32` is a 1-d tensor, `n=8` is the int 8.
Repeating a name starts a new specialization that keeps the other arguments of the previous one:
`--input x=1x3x64x64 --input x=8x3x64x64` exports batch 1 and batch 8 into one bundle.
One dimension of a shape may list sizes, `input_ids=1x{16,32,64}:int64`: buckets, one specialization per size
(frontend/buckets.py expands them; inputs bucketed in one set take their sizes together).
"""
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple, Union

from edgedyn.errors import CaptureError

DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
MAX_EXAMPLE_ELEMENTS = 1 << 32  # 16 GiB of float32: beyond any board edgedyn targets
_SHAPE = re.compile(r"^(scalar|\d+(x\d+)*)$")
_BUCKETED = re.compile(r"^(\d+x)*\{\d+(,\d+)*\}(x\d+)*$")
MAX_BUCKETS = 64  # sizes in one {...}: each is a specialization the bundle carries


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument given by shape and dtype; its values are drawn at random (never zeros)."""

    shape: Tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise CaptureError("unknown dtype {!r}; choose from: {}".format(self.dtype, ", ".join(DTYPES)))
        if any(size <= 0 for size in self.shape):
            raise CaptureError("shape {} has a zero or negative size; export needs real sizes".format(self.shape),
                               hint="give every dimension a size of 1 or more, e.g. 1x3x224x224")
        count = 1
        for size in self.shape:
            count *= size
        if count > MAX_EXAMPLE_ELEMENTS:  # checked before torch tries to allocate the example tensor
            raise CaptureError("shape {} has {:.3g} elements; an example tensor that large cannot be built".format(
                "x".join(map(str, self.shape)), float(count)),
                hint="give the shape the model sees on the board (at most {:.0e} elements)".format(
                    float(MAX_EXAMPLE_ELEMENTS)))


@dataclass(frozen=True)
class Buckets:
    """A tensor argument with one dimension listed as sizes, `1x{16,32,64}`: one specialization per size."""

    shape: Tuple[int, ...]  # with the smallest size at `axis`
    dtype: str
    axis: int
    sizes: Tuple[int, ...]  # increasing
    text: str  # as given, for guard sources and hints: `input_ids=1x{16,32,64}:int64`

    def at(self, size: int) -> TensorSpec:
        return TensorSpec(self.shape[:self.axis] + (size,) + self.shape[self.axis + 1:], self.dtype)


Value = Union[TensorSpec, Buckets, int, float, bool, Any]
InputSet = Dict[str, Value]


def parse_value(name: str, text: str) -> Value:
    shape_text, _, dtype = text.partition(":")
    lowered = shape_text.lower()
    if not dtype:
        if lowered in ("true", "false"):
            return lowered == "true"
        if re.fullmatch(r"-?\d+", shape_text):
            return int(shape_text)
        try:
            return float(shape_text)
        except ValueError:
            pass
    if "{" in lowered:
        return _buckets(name, text, lowered, dtype or "float32")
    if not _SHAPE.match(lowered):
        raise CaptureError(
            "cannot read --input {}={}".format(name, text),
            hint="give a shape like {}=1x3x224x224 (optionally :float16 / :int64) or a number like n=4".format(name),
        )
    shape = () if lowered == "scalar" else tuple(int(size) for size in lowered.split("x"))
    return TensorSpec(shape, dtype or "float32")


def _buckets(name: str, text: str, shape_text: str, dtype: str) -> Buckets:
    if not _BUCKETED.match(shape_text):
        raise CaptureError(
            "cannot read --input {}={}".format(name, text),
            hint="list the sizes of one dimension in braces, e.g. {}=1x{{16,32,64}}:int64 (one bucketed dimension "
                 "per input; quote the option so the shell leaves the braces alone)".format(name))
    dims = shape_text.split("x")
    axis = next(i for i, dim in enumerate(dims) if dim.startswith("{"))
    listed = [int(size) for size in dims[axis][1:-1].split(",")]
    sizes = tuple(sorted(set(listed)))
    if len(sizes) != len(listed) or len(sizes) > MAX_BUCKETS:
        raise CaptureError("--input {}={}: {}".format(name, text, "a size is listed twice" if len(sizes) != len(
            listed) else "{} sizes, at most {} buckets".format(len(listed), MAX_BUCKETS)),
            hint="list each bucket size once, e.g. {}=1x{{16,32,64}}".format(name))
    shape = tuple(sizes[0] if i == axis else int(dim) for i, dim in enumerate(dims))
    for size in sizes:  # each bucket is a real shape: the same checks as a plain --input
        TensorSpec(shape[:axis] + (size,) + shape[axis + 1:], dtype)
    return Buckets(shape, dtype, axis, sizes, "{}={}".format(name, text))


def parse_input_options(options: Sequence[str]) -> List[InputSet]:
    """Turns repeated `--input NAME=VALUE` options into specialization sets (see the module docstring)."""
    sets = []  # type: List[InputSet]
    current = {}  # type: InputSet
    for option in options:
        name, separator, text = option.partition("=")
        name = name.strip()
        if not separator or not name.isidentifier() or not text:
            raise CaptureError("cannot read --input {!r}".format(option), hint="write it as NAME=VALUE, e.g. x=1x3x224x224")
        if name in current:
            sets.append(current)
            current = dict(current)
        current[name] = parse_value(name, text.strip())
    if current:
        sets.append(current)
    return sets


def normalize_examples(examples: Any) -> List[Union[Tuple[Any, ...], Dict[str, Any]]]:
    """The Python API's example_inputs: a tuple or dict is one set; a list of them is several specializations."""
    if isinstance(examples, list):
        if not examples:
            raise CaptureError("example_inputs is an empty list", hint="give at least one tuple or dict of inputs")
        for item in examples:
            if not isinstance(item, (tuple, dict)):
                raise CaptureError(
                    "example_inputs is a list, so each item must be one specialization (a tuple or a dict), "
                    "got {}".format(type(item).__name__),
                    hint="for one set of inputs pass a tuple, e.g. (torch.randn(1, 3, 64, 64),)",
                )
        return list(examples)
    if isinstance(examples, (tuple, dict)):
        return [examples]
    return [(examples,)]
