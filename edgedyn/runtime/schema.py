"""What a bundle's manifest may contain, and the checker every bundle document is read with.

Everything a bundle says is checked before any array is built from it: types, ranges, the dtype allow-list and
member names here, for the manifest; every view of a portable `graph.json` in graph_schema.py, with this module's
Checker and limits. A bundle may arrive over a network: a value that would make numpy read outside a buffer,
allocate without bound or build an object array is refused with a BundleError naming the member and the field.
Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.precision import PRECISIONS

# Note: numeric dtypes only. An object dtype would make numpy treat raw bytes as pointers; structured and string
# dtypes are never written by edgedyn.
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")
GUARD_KINDS = ("tensor", "dtype", "rank", "dim", "constant")
SCALAR_TYPES = ("int", "float", "bool")
OUTPUT_KINDS = ("tensor", "none", "constant", "tuple", "list", "dict")
MAX_RANK = 16
MAX_NAME = 1024  # characters in any name or string field
MAX_DEPTH = 32  # nesting of output trees and step arguments
LISTED = 4  # items a message lists before "and N more"
HINT = "copy the bundle again or export it again; never edit a bundle by hand"


def bounded(items: Iterable[Any], limit: int = LISTED) -> str:
    """A few items, then how many more: messages stay short whatever a bundle holds."""
    items = [str(item) for item in items]
    shown = ", ".join(short(item) for item in items[:limit])
    return shown + (" and {} more".format(len(items) - limit) if len(items) > limit else "")


def short(value: Any, limit: int = 80) -> str:
    """repr() cut to `limit` characters, for values that come from a bundle or a caller."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "...({} characters)".format(len(text))


class Checker:
    """Checks one JSON document; every failure names the bundle, the member and the field path."""

    def __init__(self, bundle: Any, member: str) -> None:
        self.bundle = bundle
        self.member = member  # the member checked, for messages

    def fail(self, where: str, what: str) -> BundleError:
        return BundleError("bundle {}: {} is invalid at {}: {}".format(self.bundle, self.member, where, what),
                           hint=HINT)

    def obj(self, value: Any, where: str, required: Sequence[str] = ()) -> Dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "expected an object, got {}".format(type(value).__name__))
        missing = [key for key in required if key not in value]
        if missing:
            raise self.fail(where, "lacks {}".format(bounded(missing)))
        return value

    def items(self, value: Any, where: str, length: Optional[int] = None) -> List[Any]:
        if not isinstance(value, list):
            raise self.fail(where, "expected a list, got {}".format(type(value).__name__))
        if length is not None and len(value) != length:
            raise self.fail(where, "expected {} items, got {}".format(length, len(value)))
        return value

    def integer(self, value: Any, where: str, low: int = 0, high: Optional[int] = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, "expected an integer, got {}".format(short(value)))
        if value < low or (high is not None and value > high):
            raise self.fail(where, "{} is outside [{}, {}]".format(value, low, "inf" if high is None else high))
        return value

    def number(self, value: Any, where: str, low: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
            raise self.fail(where, "expected a number >= {}, got {}".format(low, short(value)))
        return float(value)

    def text(self, value: Any, where: str, choices: Optional[Sequence[str]] = None) -> str:
        if not isinstance(value, str) or len(value) > MAX_NAME:
            raise self.fail(where, "expected a string, got {}".format(short(value)))
        if choices is not None and value not in choices:
            raise self.fail(where, "{} is not one of {}".format(short(repr(value)), ", ".join(choices)))
        return value

    def dtype(self, value: Any, where: str) -> np.dtype:
        return np.dtype(self.text(value, where, DTYPES))

    def shape(self, value: Any, where: str) -> List[int]:
        dims = self.items(value, where)
        if len(dims) > MAX_RANK:
            raise self.fail(where, "rank {} is above {}".format(len(dims), MAX_RANK))
        return [self.integer(size, "{}[{}]".format(where, i)) for i, size in enumerate(dims)]

    def member_name(self, value: Any, where: str, members: Dict[str, Any]) -> str:
        name = self.text(value, where)
        if name not in members:
            raise self.fail(where, "names member {}, which the manifest does not list".format(short(name)))
        return name


# --- the manifest ---

def check_manifest(manifest: Any, bundle: Any, member: str) -> Dict[str, Any]:
    """Raises BundleError unless every manifest field the runtime reads has the type and range it needs."""
    c = Checker(bundle, member)
    c.obj(manifest, "the top level", ("members", "specializations", "signature", "board", "model"))
    members = c.obj(manifest["members"], "members")
    for name, record in members.items():
        where = "members[{}]".format(short(name))
        check_member_name(c.text(name, where), bundle)
        c.obj(record, where, ("sha256", "size"))
        digest = c.text(record["sha256"], where + ".sha256")
        if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
            raise c.fail(where + ".sha256", "expected 64 lowercase hex digits, got {}".format(short(digest)))
        c.integer(record["size"], where + ".size")
    c.text(c.obj(manifest["model"], "model", ("name",))["name"], "model.name")
    c.obj(manifest["board"], "board")
    names = _check_signature(c, manifest["signature"])
    specs = c.items(manifest["specializations"], "specializations")
    if not specs:
        raise c.fail("specializations", "the list is empty")
    for index, spec in enumerate(specs):
        _check_specialization(c, spec, "specializations[{}]".format(index), names, members)
    return manifest


def _check_signature(c: Checker, signature: Any) -> List[str]:
    names = []
    for index, param in enumerate(c.items(signature, "signature")):
        where = "signature[{}]".format(index)
        c.obj(param, where, ("name", "kind"))
        names.append(c.text(param["name"], where + ".name"))
        c.text(param["kind"], where + ".kind")
    if len(set(names)) != len(names):
        raise c.fail("signature", "argument names repeat")
    return names


def machine_memory() -> int:
    """This machine's physical memory in bytes (2^62 where the OS does not say): no buffer a bundle asks for may
    exceed it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no machine limit to add
        return 1 << 62


def _tensor_bytes(record: Dict[str, Any]) -> int:
    count = 1
    for size in record["shape"]:
        count *= size
    return count * np.dtype(record["dtype"]).itemsize


def declared_tensor_bytes(spec: Dict[str, Any]) -> Optional[int]:
    """What the manifest says one call's tensors take (every intermediate, unplanned), when it says."""
    memory = spec.get("memory")
    value = memory.get("naive_bytes") if isinstance(memory, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _check_specialization(c: Checker, spec: Any, where: str, names: List[str], members: Dict[str, Any]) -> None:
    c.obj(spec, where, ("name", "guards", "inputs", "outputs", "output_tree", "artifacts", "constants", "reference"))
    c.text(spec["name"], where + ".name")
    for index, guard in enumerate(c.items(spec["guards"], where + ".guards")):
        check_guard(c, guard, "{}.guards[{}]".format(where, index), names)
    for key in ("inputs", "outputs"):
        for index, record in enumerate(c.items(spec[key], "{}.{}".format(where, key))):
            at = "{}.{}[{}]".format(where, key, index)
            c.obj(record, at, ("name", "dtype", "shape"))
            c.text(record["name"], at + ".name")
            c.dtype(record["dtype"], at + ".dtype")
            c.shape(record["shape"], at + ".shape")
        # A caller builds arrays of these shapes (`edgedyn bench` and `run` draw random inputs by them): a shape no
        # machine of this size could hold is a tampered manifest, refused before anyone allocates by it.
        size, memory = sum(_tensor_bytes(record) for record in spec[key]), machine_memory()
        if size > memory:
            raise c.fail("{}.{}".format(where, key), "declares {} bytes of tensors, above this machine's {} bytes "
                                                     "of memory".format(size, memory))
    unknown = [name for name in (r["name"] for r in spec["inputs"]) if name not in names]
    if unknown:
        raise c.fail(where + ".inputs", "names arguments the signature lacks: {}".format(bounded(unknown)))
    c.obj(spec["constants"], where + ".constants")
    c.member_name(spec["reference"], where + ".reference", members)
    _check_output_tree(c, spec["output_tree"], where + ".output_tree", len(spec["outputs"]), 0)
    artifacts = c.items(spec["artifacts"], where + ".artifacts")
    if not artifacts:
        raise c.fail(where + ".artifacts", "the list is empty")
    for index, artifact in enumerate(artifacts):
        _check_artifact(c, artifact, "{}.artifacts[{}]".format(where, index), members)


def check_guard(c: Checker, guard: Any, where: str, names: List[str]) -> None:
    c.obj(guard, where, ("kind", "input"))
    kind = c.text(guard["kind"], where + ".kind", GUARD_KINDS)
    c.text(guard["input"], where + ".input", names)
    if kind in ("dtype", "rank", "dim", "constant") and "expected" not in guard:
        raise c.fail(where, "lacks 'expected'")
    if kind == "dtype":
        c.dtype(guard["expected"], where + ".expected")
    elif kind == "rank":
        c.integer(guard["expected"], where + ".expected", 0, MAX_RANK)
    elif kind == "dim":
        c.integer(guard.get("index"), where + ".index", 0, MAX_RANK - 1)
        c.integer(guard["expected"], where + ".expected")
    elif kind == "constant":
        type_name = c.text(guard.get("type"), where + ".type", SCALAR_TYPES)
        expected = guard["expected"]
        ok = isinstance(expected, bool) if type_name == "bool" else (
            isinstance(expected, (int, float) if type_name == "float" else int) and not isinstance(expected, bool))
        if not ok:
            raise c.fail(where + ".expected", "expected a {}, got {}".format(type_name, short(expected)))


def _check_output_tree(c: Checker, tree: Any, where: str, outputs: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise c.fail(where, "nested deeper than {}".format(MAX_DEPTH))
    kind = c.text(c.obj(tree, where, ("kind",))["kind"], where + ".kind", OUTPUT_KINDS)
    if kind == "tensor":
        c.integer(tree.get("index"), where + ".index", 0, outputs - 1)
    elif kind in ("tuple", "list", "dict"):
        items = c.items(tree.get("items"), where + ".items")
        if kind == "dict":
            keys = c.items(tree.get("keys"), where + ".keys", len(items))
            for index, key in enumerate(keys):
                c.text(key, "{}.keys[{}]".format(where, index))
        for index, item in enumerate(items):
            _check_output_tree(c, item, "{}.items[{}]".format(where, index), outputs, depth + 1)


MAX_ARTIFACT_THREADS = 256


def _check_artifact(c: Checker, artifact: Any, where: str, members: Dict[str, Any]) -> None:
    c.obj(artifact, where, ("backend", "executor", "files", "device"))
    c.text(artifact["backend"], where + ".backend")
    c.text(artifact["executor"], where + ".executor")
    c.text(artifact["device"], where + ".device")
    if artifact.get("arch") is not None:
        c.text(artifact["arch"], where + ".arch")
    for key, name in c.obj(artifact["files"], where + ".files").items():
        c.member_name(name, "{}.files.{}".format(where, key), members)
    if "threads" in artifact:  # what `auto` measured faster than every core (edgedyn/selection.py)
        c.integer(artifact["threads"], where + ".threads", 1, MAX_ARTIFACT_THREADS)
    if "tolerance" in artifact:
        tolerance = c.obj(artifact["tolerance"], where + ".tolerance", ("rtol", "atol"))
        c.number(tolerance["rtol"], where + ".tolerance.rtol")
        c.number(tolerance["atol"], where + ".tolerance.atol")
    for key in ("input_names", "output_names", "execution_providers", "weight_order"):
        if key in artifact:
            for index, item in enumerate(c.items(artifact[key], "{}.{}".format(where, key))):
                c.text(item, "{}.{}[{}]".format(where, key, index))
    for key in ("gpu", "requires", "accuracy", "openvino", "ncnn"):
        if key in artifact:
            c.obj(artifact[key], "{}.{}".format(where, key))
    if "precision" in artifact:  # what the artifact computes in (runtime/precision.py)
        c.text(artifact["precision"], where + ".precision", PRECISIONS)


def check_member_name(name: str, bundle: Any) -> None:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise BundleError("bundle {}: member name {} is not a plain relative path; refusing to read it".format(
            bundle, short(name)), hint=HINT)
