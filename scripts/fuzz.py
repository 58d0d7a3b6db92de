"""Mutates real bundles and checks that the runtime refuses them cleanly: no crash, no exception other than an
EdgedynError subclass from `load` + one call + `verify()`, and no load whose peak RSS grows by more than twice the
bundle's declared sizes over what the unmutated bundle costs.

    python3 scripts/fuzz.py BUNDLE... [--mutants N] [--seed S] [--table docs-table.md] [--signed]

Each mutant runs in a worker process (one per backend, restarted after a crash), so a segfault is caught and
counted. Tampered TVM `model.so` files are native code that dlopen runs: without signing they are out of scope for
"no crash" and are counted in their own family (`native`). With `--signed`, each bundle is signed and the worker
trusts only that key: then every mutant that changes the manifest or a member must be refused, native ones included.
tests/test_fuzz.py runs a bounded number of mutants.
"""
import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: F401 (type comments)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's edgedyn, for signing the bundles of a --signed campaign

FIXED_TIME = (1980, 1, 1, 0, 0, 0)
MANIFEST = "manifest.json"
EVIL_VALUES = [-1, 0, -100000, 1 << 40, 1 << 63, 1e308, float("nan"), "O", "object", "x" * 5000, None, True, [], {},
               [1] * 50, {"value": -1}, {"dtype": "O"}]
SLACK = 8 << 20  # allocator and interpreter noise a load may add over the unmutated bundle's own cost
Members = List[Tuple[str, bytes]]


# --- zip helpers ---

def read_members(data: bytes) -> Members:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [(info.filename, archive.read(info.filename)) for info in archive.infolist()]


def write_members(members: Members, deflate: Tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w") as archive:
        warnings.simplefilter("ignore")  # duplicate names are one of the mutations
        for name, content in members:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED
            archive.writestr(info, content)
    return buffer.getvalue()


def with_manifest(members: Members, manifest: Dict[str, Any]) -> Members:
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return [(name, text if name == MANIFEST else content) for name, content in members]


def resealed(members: Members, manifest: Dict[str, Any]) -> bytes:
    """The members with the manifest's sizes and SHA-256 recomputed: tampering a checksum cannot see."""
    listed = manifest["members"]
    for name, content in members:
        if name in listed:
            listed[name] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}
    return write_members(with_manifest(members, manifest))


# --- JSON edits ---

def json_paths(value: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths.extend(json_paths(item, prefix + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths.extend(json_paths(item, prefix + (index,)))
    return paths


def edit_json(document: Any, rng: random.Random) -> Tuple[Any, str]:
    """One random edit in a JSON document: a replaced value, a deleted key, a duplicated item, deep nesting."""
    paths = [p for p in json_paths(document) if p]
    path = rng.choice(paths)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rng.choice(["replace", "replace", "replace", "delete", "duplicate", "nest", "numeric"])
    if action == "delete" and isinstance(parent, dict):
        del parent[key]
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    elif action == "nest":
        nested = 0  # type: Any
        for _ in range(rng.choice([10, 40, 100])):
            nested = [nested]
        parent[key] = nested
    elif action == "numeric" and isinstance(parent[key], int) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + rng.choice([-1, 1, -100000, 100000, 1 << 31]) if parent[key] else -1
    else:
        action = "replace"
        parent[key] = json.loads(json.dumps(rng.choice(EVIL_VALUES)))
    return document, "{} {}".format(action, "/".join(str(k) for k in path))


def deep_json(rng: random.Random) -> bytes:
    depth = rng.choice([1000, 10000, 100000])
    return b"[" * depth + b"]" * depth


# --- member tampering by kind ---

def flip(data: bytes, rng: random.Random, count: int = 0) -> bytes:
    out = bytearray(data)
    for _ in range(count or rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def tamper_npz(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    inner = read_members(data)
    index = rng.randrange(len(inner))
    name, content = inner[index]
    action = rng.choice(["header", "header", "dtype", "flip", "truncate", "deflate", "duplicate"])
    if action == "header":
        header_end = content.index(b"\n") + 1
        header = content[:header_end].decode("latin1")
        start, end = header.index("'shape': (") + 10, header.index(")", header.index("'shape': ("))
        shape = rng.choice(["100000, 100000", "-1,", "3, 0", "1" * 12 + ",", "2, 2, 2, 2"])
        text = (header[:start] + shape + header[end:]).rstrip("\n")
        content = text.encode("latin1") + b"\n" + content[header_end:]
        content = content[:8] + struct.pack("<H", len(text) + 1) + content[10:] if content[6] == 1 else content
    elif action == "dtype":
        content = content.replace(b"'<f4'", rng.choice([b"'|O' ", b"'<f8'", b"'>f4'", b"'V4' "]), 1)
    elif action == "flip":
        content = flip(content, rng)
    elif action == "truncate":
        content = content[:rng.randrange(len(content))]
    elif action == "deflate":
        return write_members(inner, deflate=(name,)), "npz deflate " + name
    else:
        inner.append((name, content))
        return write_members(inner), "npz duplicate " + name
    inner[index] = (name, content)
    return write_members(inner), "npz {} {}".format(action, name)


def tamper_member(name: str, data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    if name.endswith(".json"):
        if rng.random() < 0.1:
            return deep_json(rng), "deep nesting"
        document, what = edit_json(json.loads(data), rng)
        return json.dumps(document).encode(), what
    if name.endswith(".npz"):
        return tamper_npz(data, rng)
    if name.endswith(".xml") and rng.random() < 0.7:
        return tamper_xml(data, rng)
    if name.endswith(".param") and rng.random() < 0.8:
        return tamper_param(data, rng)
    if not data:  # an ncnn model without weights has an empty .bin
        return b"\0" * 4, "bytes added to an empty member"
    action = rng.choice(["flip", "flip", "truncate", "int"])
    if action == "truncate":
        return data[:rng.randrange(len(data))], "truncate"
    if action == "int" and len(data) > 8:
        position = rng.randrange(len(data) - 4) & ~3
        value = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 100000, 0])
        return data[:position] + struct.pack("<I", value) + data[position + 4:], "int32 at {}".format(position)
    return flip(data, rng), "flip"


EVIL_NUMBERS = [b"0", b"-1", b"4294967295", b"99999999999999", b"1e9", b"", b"x"]


def tamper_xml(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    """An OpenVINO IR's XML with one number (an offset, size, dim or id) set to an evil value, an entity
    declaration added, or a tag cut: what a checker of the IR must refuse before OpenVINO allocates from it."""
    import re

    action = rng.choice(["number", "number", "number", "entity", "cut"])
    if action == "entity":
        bomb = b'<!DOCTYPE net [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        return data.replace(b"<net", bomb + b"<net", 1), "entity declaration"
    if action == "cut":
        position = data.find(b"</", rng.randrange(len(data)))
        return (data[:position] + data[position + 2:], "cut a closing tag") if position >= 0 else (data[:-1], "cut")
    numbers = list(re.finditer(rb'(?<=[">])\d+(?=[",<])', data))
    if not numbers:
        return flip(data, rng), "flip"
    match = rng.choice(numbers)
    value = rng.choice(EVIL_NUMBERS)
    return data[:match.start()] + value + data[match.end():], "number {} -> {}".format(
        match.group().decode(), value.decode() or "empty")


EVIL_PARAM_NUMBERS = [b"0", b"-1", b"2147483647", b"4294967296", b"99999999999999", b"-233", b"1e38", b"nan",
                      b"x", b""]


def tamper_param(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    """An ncnn .param with one number (a count, a size, a parameter) set to an evil value, a layer line dropped or
    repeated, a layer's type swapped, an array's stated length or a name made wrong, a string parameter, shape hints
    or a byte outside ASCII added: what a checker of the text must refuse before ncnn sizes anything from it."""
    import re

    lines = data.split(b"\n")
    layer = rng.randrange(2, max(3, len([line for line in lines if line.strip()])))
    action = rng.choice(["number", "number", "number", "line", "type", "array", "name", "extra"])
    if action == "line" and layer < len(lines):
        copy = rng.random() < 0.5
        lines[layer:layer + 1] = [lines[layer]] * 2 if copy else []
        return b"\n".join(lines), "{} layer line {}".format("repeat" if copy else "drop", layer)
    if action == "type" and layer < len(lines) and lines[layer].strip():
        kind = rng.choice([b"InnerProduct", b"Convolution", b"MemoryData", b"Gemm", b"Python", b"LSTM"])
        old = lines[layer].split()[0]
        lines[layer] = kind + lines[layer][lines[layer].index(old) + len(old):]
        return b"\n".join(lines), "layer {} type {} -> {}".format(layer, old.decode(), kind.decode())
    if action == "array":
        arrays = list(re.finditer(rb"-233\d\d=(\d+)", data))
        if arrays:
            match = rng.choice(arrays)
            value = rng.choice([b"999999999", b"0", b"-5", b"100"])
            return data[:match.start(1)] + value + data[match.end(1):], "array length -> " + value.decode()
    if action == "name" and layer < len(lines) and lines[layer].strip():
        tokens = lines[layer].split()
        tokens[1 if rng.random() < 0.5 else -1 if len(tokens) > 4 else 1] = rng.choice([b"n" * 300, b"undefined"])
        lines[layer] = b" ".join(tokens)
        return b"\n".join(lines), "layer {} name or blob".format(layer)
    if action == "extra" and layer < len(lines) and lines[layer].strip():
        extra = rng.choice([b' 9="abc"', b" 30=4,1,1,1", b" -23330=4,99", b" 31=1", b" 40=1", b"\xff"])
        lines[layer] = lines[layer] + extra
        return b"\n".join(lines), "layer {} gets {!r}".format(layer, extra.decode("latin1"))
    numbers = list(re.finditer(rb"(?<=[ =,])-?\d+(?=[ ,\n])", data)) + list(re.finditer(rb"^\d+", data, re.M))
    match = rng.choice(numbers)
    value = rng.choice(EVIL_PARAM_NUMBERS)
    return data[:match.start()] + value + data[match.end():], "number {} -> {}".format(
        match.group().decode(), value.decode() or "empty")


def member_kind(name: str) -> str:
    suffix = name.rsplit(".", 1)[-1]
    return "native" if suffix == "so" else suffix


# --- mutation families ---

def mutate_bytes(data: bytes, rng: random.Random) -> Tuple[str, bytes, str]:
    if rng.random() < 0.5:
        return "bytes", flip(data, rng), "flip"
    return "truncate", data[:rng.randrange(len(data))], "truncate"


def mutate_zip(data: bytes, rng: random.Random) -> Tuple[str, bytes, str]:
    members = read_members(data)
    names = [name for name, _ in members]
    action = rng.choice(["drop", "duplicate", "extra", "deflate", "rename", "overlap", "many"])
    pick = rng.choice(names)
    if action == "drop":
        return "zip", write_members([m for m in members if m[0] != pick]), "drop " + pick
    if action == "duplicate":
        return "zip", write_members(members + [m for m in members if m[0] == pick]), "duplicate " + pick
    if action == "extra":
        return "zip", write_members(members + [("extra/file.bin", os.urandom(64))]), "extra member"
    if action == "deflate":
        return "zip", write_members(members, deflate=(pick,)), "deflate " + pick
    if action == "rename":
        return "zip", write_members([("../" + n if n == pick else n, c) for n, c in members]), "rename " + pick
    if action == "many":
        extra = [("unlisted/{:06d}".format(i), b"") for i in range(rng.choice([5000, 60000]))]
        return "zip", write_members(members + extra), "{} unlisted members".format(len(extra))
    return "zip", overlapping(data, rng.choice([10, 200])), "overlapping entries"


def overlapping(data: bytes, copies: int) -> bytes:
    """The bundle with `copies` more directory entries that all point at its largest member."""
    end = data.rfind(b"PK\x05\x06")
    count, size, offset = struct.unpack_from("<HLL", data, end + 10)
    directory = data[offset:offset + size]
    entries, position = [], 0
    while position < len(directory):
        n, m, k = struct.unpack_from("<3H", directory, position + 28)
        entries.append(directory[position:position + 46 + n + m + k])
        position += 46 + n + m + k
    largest = max(entries, key=lambda e: struct.unpack_from("<L", e, 20)[0])
    n = struct.unpack_from("<H", largest, 28)[0]
    added = []
    for i in range(copies):
        name = largest[46:46 + n]
        name = name[:-6] + "{:06d}".format(i).encode()
        added.append(largest[:46] + name + largest[46 + n:])
    directory = directory + b"".join(added)
    record = bytearray(data[end:])
    struct.pack_into("<HHLL", record, 8, count + copies, count + copies, len(directory), offset)
    return data[:offset] + directory + bytes(record)


def mutate_manifest(data: bytes, rng: random.Random) -> Tuple[str, bytes, str]:
    members = read_members(data)
    manifest = json.loads(dict(members)[MANIFEST])
    if rng.random() < 0.05:
        return "manifest", write_members([(n, deep_json(rng) if n == MANIFEST else c) for n, c in members]), "deep"
    manifest, what = edit_json(manifest, rng)
    return "manifest", write_members(with_manifest(members, manifest)), what


def mutate_tamper(data: bytes, rng: random.Random, kind: Optional[str] = None) -> Tuple[str, bytes, str]:
    members = read_members(data)
    manifest = json.loads(dict(members)[MANIFEST])
    candidates = [n for n, _ in members if n != MANIFEST and (kind is None or member_kind(n) == kind)]
    name = rng.choice(candidates)
    content, what = tamper_member(name, dict(members)[name], rng)
    members = [(n, content if n == name else c) for n, c in members]
    return "native" if member_kind(name) == "native" else "tamper-" + member_kind(name), resealed(members, manifest), \
        "{}: {}".format(name, what)


FAMILIES = {
    "bytes": mutate_bytes,
    "zip": mutate_zip,
    "manifest": mutate_manifest,
    "tamper": mutate_tamper,
}  # type: Dict[str, Callable[[bytes, random.Random], Tuple[str, bytes, str]]]


def mutants(data: bytes, count: int, seed: int, native: bool) -> List[Tuple[str, bytes, str]]:
    """`count` mutants spread over the families; tampering visits every member kind in turn."""
    rng = random.Random(seed)
    kinds = sorted({member_kind(n) for n, _ in read_members(data) if n != MANIFEST})
    if not native:
        kinds = [k for k in kinds if k != "native"]
    result = []
    for index in range(count):
        family = ["bytes", "zip", "manifest", "tamper", "tamper"][index % 5]
        if family == "tamper":
            result.append(mutate_tamper(data, rng, kinds[(index // 5) % len(kinds)]))
        else:
            result.append(FAMILIES[family](data, rng))
    return result


# --- the worker: one process that loads mutants until one crashes it ---

def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current RSS (Linux)


def run_one(path: str) -> Dict[str, Any]:
    """load + one call on reference-shaped random inputs + verify(); what happened and the peak RSS growth."""
    import edgedyn.runtime as rt

    _reset_peak()
    before = _status("VmRSS")
    outcome = {"outcome": "ok"}  # type: Dict[str, Any]
    printed = io.StringIO()  # the runtime must not print on the caller's stdout: what it prints is a finding
    try:
        with contextlib.redirect_stdout(printed):
            _load_call_verify(rt, path)
    except rt.EdgedynError as error:
        outcome = {"outcome": "refused", "type": type(error).__name__, "length": len(str(error)),
                   "message": str(error)[:300]}
    except BaseException as error:  # the point of the harness: anything else is a finding
        outcome = {"outcome": "wrong-exception", "type": type(error).__name__, "message": str(error)[:300]}
    outcome["rss_growth"] = _status("VmHWM") - before
    if printed.getvalue():
        outcome["stdout"] = printed.getvalue()[:300]
    return outcome


def _load_call_verify(rt: Any, path: str) -> None:
    import numpy as np

    program = rt.load(path)
    spec = program.specializations[0]
    values = dict(spec.record["constants"])
    rng = np.random.default_rng(0)
    for record in spec.record["inputs"]:
        values[record["name"]] = rng.standard_normal(record["shape"]).astype(record["dtype"])
    program(**values)
    program.verify()


def worker() -> None:
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    import logging

    logging.disable(logging.CRITICAL)
    for line in sys.stdin:
        result = run_one(line.strip())
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


class Worker:
    """A worker process; `run` returns its answer, or a crash or hang outcome (and starts a fresh worker)."""

    def __init__(self, timeout: float, warmup: str, env: Optional[Dict[str, str]] = None) -> None:
        self.timeout = timeout
        self.env = env or {}
        self.warmup = warmup  # the unmutated bundle: a fresh worker loads it first, so imports are not counted
        self.process = None  # type: Optional[subprocess.Popen]

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO), **self.env)
        return subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env, bufsize=1)

    def run(self, path: str) -> Dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
            for _ in range(2):
                self.baseline = self._ask(self.warmup)
                assert self.baseline["outcome"] == "ok", (self.warmup, self.baseline)
        return self._ask(path)

    def _ask(self, path: str) -> Dict[str, Any]:
        assert self.process is not None
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(path + "\n")
        self.process.stdin.flush()
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        ready = selector.select(self.timeout)
        selector.close()
        line = self.process.stdout.readline() if ready else ""
        printed = ""
        while line and not line.startswith("{"):  # native code wrote on the worker's stdout: a finding
            printed += line
            line = self.process.stdout.readline()
        if line:
            answer = json.loads(line)
            if printed:
                answer["stdout"] = (printed + answer.get("stdout", ""))[:300]
            return answer
        if not ready:
            self.process.kill()
        code = self.process.wait()
        self.process = None
        return {"outcome": "hang" if not ready else "crash", "type": "signal {}".format(-code), "rss_growth": 0}

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()


def declared_bytes(path: Path) -> int:
    """What a bundle declares it needs: its members' sizes plus the arenas its artifacts planned."""
    with zipfile.ZipFile(str(path)) as archive:
        manifest = json.loads(archive.read(MANIFEST))
    arenas = sum(int(spec.get("memory", {}).get("arena_bytes", 0)) for spec in manifest["specializations"])
    return sum(record["size"] for record in manifest["members"].values()) + arenas


def _signed(bundle: Path, directory: Path) -> Tuple[Path, Dict[str, str]]:
    """A signed copy of the bundle and the environment that trusts only its key."""
    from edgedyn.bundle import sign_bundle
    from edgedyn.runtime import signing

    pem, public = signing.generate()
    (directory / "key").write_bytes(pem)
    (directory / "key.pub").write_text(public + "\n")
    copy = directory / ("signed-" + bundle.name)
    copy.write_bytes(bundle.read_bytes())
    sign_bundle(copy, directory / "key")
    return copy, {signing.ENVIRONMENT: str(directory / "key.pub")}


def campaign(bundles: List[Path], count: int, seed: int, timeout: float = 60.0,
             native: bool = True, signed: bool = False) -> List[Dict[str, Any]]:
    """Runs `count` mutants of each bundle (signed copies with `signed`); one record per mutant."""
    records = []
    with tempfile.TemporaryDirectory(prefix="edgedyn-fuzz-") as directory:
        for bundle in bundles:
            env = {}  # type: Dict[str, str]
            if signed:
                bundle, env = _signed(bundle, Path(directory))
            original = bundle.read_bytes()
            runner = Worker(timeout, str(bundle), env)
            baseline = runner.run(str(bundle))  # the unmutated bundle's own cost, after the imports
            declared = declared_bytes(bundle)
            for index, (family, data, what) in enumerate(mutants(original, count, seed, native)):
                target = Path(directory) / "{}-{}{}".format(bundle.stem, index, bundle.suffix)
                target.write_bytes(data)
                result = runner.run(str(target))
                target.unlink()
                if family == "native" and runner.process is not None:
                    runner.close()  # native code ran: never trust that process again
                    runner.process = None
                result.update(bundle=bundle.name, family=family, mutation=what, signed=signed,
                              limit=2 * max(declared, len(data)) + max(baseline["rss_growth"], 0) + SLACK)
                records.append(result)
            runner.close()
    return records


def table(records: List[Dict[str, Any]]) -> str:
    """The result table: per bundle and family, mutants, accepted, refused, wrong exceptions, crashes, peak RSS."""
    rows = defaultdict(list)  # type: Dict[Tuple[str, str], List[Dict[str, Any]]]
    for record in records:
        rows[(record["bundle"], record["family"])].append(record)
    lines = ["| bundle | family | mutants | ran | refused (EdgedynError) | wrong exceptions | crashes | hangs | "
             "over RSS limit | peak RSS growth |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (bundle, family), items in sorted(rows.items()):
        count = defaultdict(int)  # type: Dict[str, int]
        for item in items:
            count[item["outcome"]] += 1
        over = sum(1 for item in items if item["rss_growth"] > item["limit"])
        peak = max(item["rss_growth"] for item in items) / (1 << 20)
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1f} MiB |".format(
            bundle, family, len(items), count["ok"], count["refused"], count["wrong-exception"], count["crash"],
            count["hang"], over, peak))
    return "\n".join(lines)


def findings(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Mutants that break a rule: a wrong exception, a crash or hang outside native code (anywhere when signed), text
    printed on stdout, or too much memory; signed, also any changed manifest or member not refused by its signature (before parsing)."""
    bad = []
    for record in records:
        signed = record.get("signed", False)
        native = record["family"] == "native" and not signed
        tampered = record["family"] == "manifest" or record["family"].startswith("tamper") \
            or record["family"] == "native"
        signature_ok = not (signed and tampered and record.get("type") != "SignatureError")
        if record["outcome"] == "wrong-exception" or (record["outcome"] in ("crash", "hang") and not native) \
                or record["rss_growth"] > record["limit"] or not signature_ok or record.get("stdout"):
            bad.append(record)
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="*", type=Path)
    parser.add_argument("--mutants", type=int, default=500, help="mutants per bundle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", type=Path, help="write the result table (markdown) here")
    parser.add_argument("--signed", action="store_true", help="sign each bundle and trust only its key")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker()
        return 0
    started = time.time()
    records = campaign(options.bundles, options.mutants, options.seed, signed=options.signed)
    text = table(records)
    print(text)
    bad = findings(records)
    for record in bad[:20]:
        print("finding:", json.dumps(record)[:400])
    print("{} mutants in {:.0f} s, {} findings".format(len(records), time.time() - started, len(bad)))
    if options.table:
        options.table.write_text(text + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
