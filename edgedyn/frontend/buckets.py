"""Buckets and padding as the user gives them: `--input 'input_ids=1x{16,32,64}:int64'` and `--pad input_ids=0`.

A dimension listed as sizes makes one specialization per size (a bucket). Inputs bucketed in one input set take
their sizes together, the i-th size of each in the i-th bucket (`input_ids` and the `attention_mask` beside it), and
form one `BucketGroup`. `--pad NAME=VALUE` says what fills the bucketed dimension of each input when a call is
shorter than a bucket; frontend/padding.py then proves at export that padding leaves the outputs' valid part
unchanged, and the runtime (edgedyn/runtime/buckets.py) pads, runs and slices back.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgedyn.errors import CaptureError
from edgedyn.frontend.inputs import Buckets, InputSet
from edgedyn.runtime.bucket_schema import PAD_SIDES

PadValue = Union[int, float, bool]


@dataclass
class BucketGroup:
    """Inputs bucketed together: the dimension of each, the sizes, and the specialization made for each size."""

    inputs: Dict[str, int]  # input name -> bucketed axis
    sizes: Tuple[int, ...]
    specializations: List[int]  # indices into Captured.specializations, one per size
    source: str  # the --input options as given, for guard sources and hints
    padding: Optional[Dict[str, Any]] = field(default=None)  # the proven padding record (frontend/padding.py)
    # Per bucket, one proven call: (its length, its bucketed inputs, torch eager's outputs), for `verify`.
    references: List[Tuple[int, Dict[str, np.ndarray], List[np.ndarray]]] = field(default_factory=list)

    def to_record(self) -> Dict[str, Any]:
        """The manifest's `buckets` entry (checked on the board by edgedyn/runtime/buckets.py)."""
        record = {"inputs": dict(self.inputs), "sizes": list(self.sizes),
                  "specializations": list(self.specializations), "source": self.source}  # type: Dict[str, Any]
        if self.padding is not None:
            record["padding"] = self.padding
        return record


def expand_buckets(sets: List[InputSet]) -> Tuple[List[InputSet], List[BucketGroup]]:
    """Each input set holding bucketed inputs becomes one set per size; the groups say which sets those are."""
    expanded = []  # type: List[InputSet]
    groups = []  # type: List[BucketGroup]
    for values in sets:
        bucketed = {name: value for name, value in values.items() if isinstance(value, Buckets)}
        if not bucketed:
            expanded.append(values)
            continue
        sizes = sorted({value.sizes for value in bucketed.values()})
        if len(sizes) > 1:
            listed = ", ".join("{} {{{}}}".format(name, ",".join(map(str, value.sizes)))
                               for name, value in bucketed.items())
            raise CaptureError("inputs bucketed together list different sizes: {}".format(listed),
                               hint="give every bucketed input of one call the same sizes (the i-th size of each "
                                    "goes into the i-th bucket), e.g. --input 'input_ids=1x{16,32}:int64' --input "
                                    "'attention_mask=1x{16,32}:int64'")
        group = BucketGroup({name: value.axis for name, value in bucketed.items()}, sizes[0], [],
                            " ".join("--input '{}'".format(value.text) for value in bucketed.values()))
        for size in group.sizes:
            group.specializations.append(len(expanded))
            expanded.append({name: value.at(size) if isinstance(value, Buckets) else value
                             for name, value in values.items()})
        groups.append(group)
    return expanded, groups


@dataclass(frozen=True)
class Padding:
    """`--pad`: the value each bucketed input is padded with, and on which side of the bucketed dimension."""

    values: Dict[str, PadValue]
    side: str = "right"

    def __post_init__(self) -> None:
        if self.side not in PAD_SIDES:
            raise CaptureError("unknown padding side {!r}; choose from: {}".format(self.side, ", ".join(PAD_SIDES)))

    @property
    def source(self) -> str:
        text = "--pad " + ",".join("{}={}".format(name, _text(value)) for name, value in self.values.items())
        return text if self.side == "right" else text + " --pad-side " + self.side


def parse_pad(pad: Any, side: str = "right") -> Optional[Padding]:
    """`--pad` as given: "input_ids=0,attention_mask=0", a list of such strings, or a dict; None for no padding."""
    if pad is None or pad == [] or pad == {}:
        return None
    if isinstance(pad, dict):
        values = {}  # type: Dict[str, PadValue]
        for name, value in pad.items():
            if type(value) not in (int, float, bool):
                raise CaptureError("pad value for '{}' is a {}; give a number".format(name, type(value).__name__),
                                   hint="e.g. pad={{'{}': 0}}".format(name))
            values[str(name)] = value
        return Padding(values, side)
    texts = [pad] if isinstance(pad, str) else list(pad)
    values = {}
    for item in (part.strip() for text in texts for part in str(text).split(",")):
        name, separator, number = item.partition("=")
        name = name.strip()
        if not separator or not name.isidentifier():
            raise CaptureError("cannot read --pad {!r}".format(item),
                               hint="write it as NAME=VALUE[,NAME=VALUE], e.g. --pad input_ids=0,attention_mask=0")
        if name in values:
            raise CaptureError("--pad gives '{}' twice".format(name), hint="give one pad value per input")
        values[name] = _number(name, number.strip())
    return Padding(values, side)


def _number(name: str, text: str) -> PadValue:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise CaptureError("cannot read --pad {}={}: the pad value must be a number".format(name, text),
                           hint="e.g. --pad {}=0".format(name))


def _text(value: PadValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_padding(padding: Padding, groups: Sequence[BucketGroup], dtypes: Dict[str, str]) -> None:
    """Every bucketed input has a pad value its dtype holds exactly, and --pad names nothing else."""
    bucketed = sorted({name for group in groups for name in group.inputs})
    if not bucketed:
        raise CaptureError("--pad is given, but no input is bucketed",
                           hint="list the sizes of the padded dimension, e.g. --input 'input_ids=1x{16,32,64}:int64' "
                                "--pad input_ids=0")
    unknown = sorted(set(padding.values) - set(bucketed))
    if unknown:
        raise CaptureError("--pad names {}, which {} not bucketed; the bucketed inputs are: {}".format(
            ", ".join(unknown), "is" if len(unknown) == 1 else "are", ", ".join(bucketed)),
            hint="pad only inputs given with sizes in braces")
    missing = [name for name in bucketed if name not in padding.values]
    if missing:
        raise CaptureError("--pad gives no value for bucketed input(s) {}".format(", ".join(missing)),
                           hint="every input padded to a bucket needs its pad value, e.g. --pad {}".format(
                               ",".join("{}=0".format(name) for name in bucketed)))
    for name, value in padding.values.items():
        dtype = np.dtype(dtypes[name])
        exact = bool(np.isfinite(value)) if dtype.kind == "f" else np.array(value).astype(dtype).item() == value
        if not exact or (dtype == np.bool_) != isinstance(value, bool):
            raise CaptureError("--pad {}={}: input '{}' is {}, which cannot hold that value exactly".format(
                name, _text(value), name, dtype),
                hint="give a value of the input's dtype ({})".format(
                    "true or false" if dtype == np.bool_ else "a whole number" if dtype.kind in "iu" else "a number"))
