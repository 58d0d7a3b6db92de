"""TOML-backed frozen records, each field spelled once: its TOML place, its check, its default, how it is written.

A record is a frozen dataclass whose fields are declared with `key(...)`; `check_fields`, `check_layout`,
`parse` and `to_dict` read those declarations, so a field added there is checked, parsed and written back
without a second list. Used by `edgedyn.boards` on the host and on the board: Python 3.8 syntax, stdlib only.
"""
import dataclasses
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from edgedyn.errors import BoardError

Check = Callable[[str, str, Any], None]  # (file, dotted key, value); raises BoardError

_META = "edgedyn.toml"
_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Key:
    """Where one record field lives in its TOML file and what it may hold."""

    section: str  # "" for the top level
    name: str
    check: Optional[Check]  # None where the record's own cross-field checks cover it
    default: Any  # _REQUIRED when the file must give it
    omit_none: bool  # to_dict leaves the key out when it is None (else writes None)
    free_table: bool  # a table passed on as it is (to TVM): no layout check, frozen on construction
    record: Optional[type]  # a nested record read from the table `name` (the board's [gpu])

    @property
    def dotted(self) -> str:
        return "{}.{}".format(self.section, self.name) if self.section else self.name

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    @property
    def is_table(self) -> bool:
        return self.free_table or self.record is not None


def key(section: str, name: str, check: Optional[Check] = None, default: Any = _REQUIRED, omit_none: bool = False,
        free_table: bool = False, record: Optional[type] = None) -> Any:
    """A dataclass field read from `[section] name` of the file (`section` "" is the top level)."""
    spec = Key(section, name, check, default, omit_none, free_table, record)
    # Free tables are mappings: unhashable, so kept out of the record's hash.
    return dataclasses.field(hash=not free_table, metadata={_META: spec})


def keys(cls: type) -> List[Tuple[str, Key]]:
    """(attribute, Key) of each TOML field of a record class, in declaration order."""
    return [(f.name, f.metadata[_META]) for f in dataclasses.fields(cls) if _META in f.metadata]


# --- checks: every failure names the file, the field, what was given and what is expected ---

def fail(where: str, key_name: str, expected: str, got: Any, hint: Optional[str] = None) -> None:
    raise BoardError("{}: {}: expected {}, got {!r}".format(where, key_name, expected, got), hint)


def text(pattern: Any = None, expected: str = "a non-empty string") -> Check:
    """A non-empty string, matching `pattern` (a compiled regex) when given."""
    def check(where: str, name: str, value: Any) -> None:
        if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
            fail(where, name, expected, value)
    return check


def integer(low: int, high: Optional[int] = None, expected: Optional[str] = None) -> Check:
    """An int (not a bool) from `low` to `high`."""
    if expected is None:
        expected = "an integer >= {}".format(low) if high is None else "an integer from {} to {}".format(low, high)

    def check(where: str, name: str, value: Any) -> None:
        if not (type(value) is int and value >= low and (high is None or value <= high)):
            fail(where, name, str(expected), value)
    return check


def boolean() -> Check:
    """true or false (TOML's booleans, not 0/1 or strings)."""
    def check(where: str, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            fail(where, name, "true or false", value)
    return check


def choice(choices: Tuple[str, ...]) -> Check:
    """One of `choices`."""
    def check(where: str, name: str, value: Any) -> None:
        if value not in choices:
            fail(where, name, "one of " + ", ".join(choices), value)
    return check


def names(choices: Optional[Callable[[], Sequence[str]]] = None, allow_empty: bool = True) -> Check:
    """A list of distinct non-empty strings, drawn from `choices()` when given (asked at each check, so a
    registry's current names are the ones used)."""

    def check(where: str, name: str, value: Any) -> None:
        allowed = None if choices is None else tuple(choices())
        expected = "a list of strings" if allowed is None else "a list drawn from " + ", ".join(allowed)
        if not isinstance(value, tuple) or (not value and not allow_empty):
            fail(where, name, expected if allow_empty else "a non-empty " + expected[2:], value)
        for item in value:
            if not isinstance(item, str) or not item or (allowed is not None and item not in allowed):
                fail(where, name, expected, list(value))
        if len(set(value)) != len(value):
            fail(where, name, "each entry once", list(value))
    return check


def frozen(value: Any) -> Any:
    """A read-only copy of TOML data: dicts become mappings, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def plain(value: Any) -> Any:
    """The JSON-ready (and TVM-ready) form of `frozen` data."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def check_fields(record: Any, where: str) -> None:
    """Runs each field's own check (from a record's `__post_init__`) and freezes its free tables."""
    for attribute, spec in keys(type(record)):
        value = getattr(record, attribute)
        if spec.free_table and value is not None:
            object.__setattr__(record, attribute, frozen(value))
        elif spec.record is not None and value is not None and not isinstance(value, spec.record):
            fail(where, spec.dotted, "a [{}] table".format(spec.name), value)
        elif spec.check is not None and not (value is None and not spec.required):
            spec.check(where, spec.dotted, value)


# --- reading and writing the TOML layout ---

def check_layout(data: Mapping[str, Any], cls: type, where: str) -> None:
    """Rejects unknown sections and keys, so a misspelt optional field is not silently ignored."""
    specs = [spec for _, spec in keys(cls)]
    top = [s.name for s in specs if not s.section and not s.is_table]
    tables = {}  # type: Dict[str, List[str]]  # section -> its keys, in declaration order
    for spec in specs:
        if spec.section:
            tables.setdefault(spec.section, []).append(spec.name)
        elif spec.record is not None:
            tables[spec.name] = [s.name for _, s in keys(spec.record)]
        elif spec.free_table:
            tables.setdefault(spec.name, [])
    free = {s.name for s in specs if s.free_table}
    for name, value in data.items():
        if name in free:
            continue
        if name in tables:
            if not isinstance(value, dict):
                fail(where, name, "a [{}] table".format(name), value)
            for sub in value:
                if sub not in tables[name]:
                    fail(where, "{}.{}".format(name, sub), "one of the fields " + ", ".join(tables[name]),
                         "unknown field")
        elif name not in top:
            fail(where, name, "one of " + ", ".join(top + ["[{}]".format(t) for t in tables]), "unknown field")


def _lookup(data: Mapping[str, Any], spec: Key) -> Any:
    table = data.get(spec.section, {}) if spec.section else data
    value = table.get(spec.name) if isinstance(table, dict) else None
    return tuple(value) if isinstance(value, list) else value


def parse(cls: type, data: Mapping[str, Any], where: str, **extra: Any) -> Any:
    """A `cls` record from TOML data whose layout `check_layout` accepted; `extra` fills the non-TOML fields."""
    values = dict(extra)
    for attribute, spec in keys(cls):
        value = _lookup(data, spec)
        if value is None:
            if spec.required:
                fail(where, spec.dotted, "a value (the field is required)", None,
                     hint="add {} to the [{}] table; boards/*.toml and `edgedyn boards show x86-64` show every "
                          "field".format(spec.name, spec.section) if spec.section else
                     "add {} at the top of the file".format(spec.name))
            value = spec.default
        elif spec.record is not None:
            value = _parse_nested(spec, value, where)
        values[attribute] = value
    return cls(**values)


def _parse_nested(spec: Key, data: Mapping[str, Any], where: str) -> Any:
    """A nested record; its own messages say `gpu: arch: ...`, which become `FILE: gpu.arch: ...`."""
    assert spec.record is not None
    own = "{}: ".format(spec.name)
    try:
        return parse(spec.record, data, own[:-2])
    except BoardError as error:
        if error.message.startswith(own):
            raise BoardError("{}: {}.{}".format(where, spec.name, error.message[len(own):]), error.hint) from None
        raise


def to_dict(record: Any) -> Dict[str, Any]:
    """JSON-ready, in the layout of the record's TOML file: top-level keys first, then each table."""
    top, tables = {}, {}  # type: Dict[str, Any], Dict[str, Any]
    for attribute, spec in keys(type(record)):
        value = getattr(record, attribute)
        if value is None and spec.omit_none:
            continue
        if spec.record is not None and value is not None:
            value = to_dict(value)
        if spec.section:
            tables.setdefault(spec.section, {})[spec.name] = plain(value)
        elif spec.is_table:
            tables[spec.name] = plain(value)
        else:
            top[spec.name] = plain(value)
    top.update(tables)
    return top
