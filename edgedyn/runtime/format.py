"""The bundle format: one zip file (stored, not compressed) holding `manifest.json` and the members it lists.

The manifest records the SHA-256 and size of every member; `Bundle` checks the zip directory (stored, unique,
non-overlapping members), the manifest's schema (runtime/schema.py), every size and every checksum before anything
is used, so what a load copies is bounded by the file's own size. Nothing in a bundle is ever unpickled: arrays
are `.npz` files of stored `.npy` members, each header checked against its member's size before an array exists.
Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
import hashlib
import io
import json
import os
import platform
import struct
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union  # noqa: F401 (type comments)

import numpy as np

from edgedyn.runtime import bucket_schema, schema, signing
from edgedyn.runtime.frames import check_preprocess
from edgedyn.runtime.errors import BundleError, ChecksumError

FORMAT_NAME = "edgedyn-bundle"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SUFFIX = ".edgedyn"

PathLike = Union[str, "os.PathLike[str]"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Note: the one alias table for CPU architectures (boards, bundles, the runtime all use it). Only 64-bit names map
# to aarch64: "armv8l" is a 32-bit userland on a 64-bit kernel and cannot load aarch64 code.
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def host_arch() -> str:
    """This machine's CPU architecture in the names boards and bundles use (x86_64, aarch64)."""
    machine = platform.machine().lower()
    return _ARCH_ALIASES.get(machine, machine)


MAX_MEMBERS = 4096  # zip entries in a bundle or an .npz; far above what an export writes, far below a zip bomb
MAX_JSON_BYTES = 16 << 20  # a JSON member; the manifest of a large export is a few hundred KiB


class Bundle:
    """An opened, checksum-verified bundle: the manifest plus access to its members."""

    def __init__(self, path: PathLike, trusted_keys: Optional[Sequence[signing.KeySource]] = None) -> None:
        """`trusted_keys` (default: EDGEDYN_TRUSTED_KEYS): when any, only a bundle signed by one of them opens."""
        self.path = Path(path)
        if self.path.is_dir():
            raise BundleError("bundle {} is a folder, not a bundle file".format(self.path),
                              hint="give the .edgedyn file inside it, e.g. {}".format(self.path / "model.edgedyn"))
        if not self.path.is_file():
            raise BundleError(
                "bundle {} does not exist".format(self.path),
                hint="create one with `edgedyn export MODEL.py:NAME --board BOARD -o {}`".format(self.path.name),
            )
        label = "bundle {}".format(self.path)
        try:
            data = self.path.read_bytes()
        except OSError as error:
            raise BundleError("cannot read bundle {}: {}".format(self.path, error))
        entries = zip_entries(data, label, "copy the bundle to the board again and compare its size and sha256 "
                                           "with the original")
        if MANIFEST_NAME not in entries:
            raise BundleError("{} has no {}; it is not an edgedyn bundle".format(self.path, MANIFEST_NAME))
        manifest_entry = entries[MANIFEST_NAME]
        if manifest_entry.size > MAX_JSON_BYTES:
            raise BundleError("bundle {}: its manifest is {} bytes, above the {} this runtime reads".format(
                self.path, manifest_entry.size, MAX_JSON_BYTES), hint=schema.HINT)
        manifest_bytes = manifest_entry.bytes(data)
        keys = signing.trusted_keys(trusted_keys)
        self.signed_by = None  # type: Optional[str]
        if keys:  # before the manifest is parsed and before any member is read
            signature = entries.get(signing.SIGNATURE_NAME)
            self.signed_by = signing.check(manifest_bytes, signature.bytes(data) if signature else None, keys,
                                           self.path)
        if zlib.crc32(manifest_bytes) != manifest_entry.crc:
            raise ChecksumError("bundle {}: its manifest is damaged (CRC mismatch)".format(self.path),
                                hint="copy the bundle again or export it again; never edit a bundle by hand")
        self.manifest = _parse_manifest(manifest_bytes, self.path)
        self._members = self._verified_members(data, entries)
        self.sha256 = sha256_bytes(data)  # the file is read once: no second pass over it to hash it

    def _verified_members(self, data: bytes, entries: Dict[str, "ZipEntry"]) -> Dict[str, bytes]:
        """Every listed member's bytes, after its presence, declared size and SHA-256 are checked."""
        listed = self.manifest["members"]
        missing = sorted(set(listed) - set(entries))
        if missing:
            raise BundleError("bundle {} lacks members listed in its manifest: {}".format(
                self.path, schema.bounded(missing)), hint=schema.HINT)
        extra = sorted(set(entries) - set(listed) - {MANIFEST_NAME, signing.SIGNATURE_NAME})
        if extra:
            raise BundleError("bundle {} holds members its manifest does not list: {}".format(
                self.path, schema.bounded(extra)), hint=schema.HINT)
        resized = sorted(name for name in listed if entries[name].size != listed[name]["size"])
        if resized:
            raise BundleError("bundle {}: members whose size differs from the manifest's: {}".format(
                self.path, schema.bounded(resized)), hint=schema.HINT)
        members = {}
        for name, record in sorted(listed.items()):
            content = entries[name].bytes(data)
            actual = sha256_bytes(content)
            if actual != record["sha256"]:
                raise ChecksumError(
                    "bundle {}: checksum mismatch in {} (expected sha256 {}..., got {}...); "
                    "the file was modified or damaged".format(self.path, name, record["sha256"][:12], actual[:12]),
                    hint="copy the bundle again or export it again; never edit a bundle by hand",
                )
            members[name] = content
        return members

    def read(self, name: str) -> bytes:
        if name not in self.manifest["members"]:
            raise BundleError("bundle {} has no member {}".format(self.path, name))
        return self._members[name]

    def arrays(self, name: str) -> Dict[str, np.ndarray]:
        """Arrays of an `.npz` member, read without pickle (read-only views of the member's bytes)."""
        return read_npz(self.read(name), "bundle {}: member {}".format(self.path, name))

    def json(self, name: str) -> Any:
        return read_json(self.read(name), "bundle {}: member {}".format(self.path, name))

    def extract(self, name: str) -> Path:
        """Writes one member to a content-addressed cache file and returns its path (for dlopen and friends)."""
        record = self.manifest["members"][name]
        directory = cache_dir() / "members" / record["sha256"][:32]
        target = directory / Path(name).name
        if target.is_file() and sha256_file(target) == record["sha256"]:
            return target
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=str(directory), prefix=".partial-")
        with os.fdopen(handle, "wb") as out:
            out.write(self.read(name))
        os.replace(temporary, str(target))
        return target

    def member_sizes(self) -> Dict[str, int]:
        return {name: record["size"] for name, record in self.manifest["members"].items()}


class MemoryBundle:
    """Members held in memory before any bundle file exists (export-time checks), read the way a Bundle is read.

    `directory` receives the members executors need as files; give a fresh one per use, since dlopen caches
    libraries by path (docs/stack-notes.md), so a path must never be reused for other bytes.
    """

    def __init__(self, members: Dict[str, bytes], directory: PathLike) -> None:
        for name in members:
            schema.check_member_name(name, "in memory")
        self._members = dict(members)
        self._directory = Path(directory)
        self.path = Path("<in-memory bundle>")  # what messages name

    def read(self, name: str) -> bytes:
        if name not in self._members:
            raise BundleError("in-memory bundle has no member {}".format(name))
        return self._members[name]

    def arrays(self, name: str) -> Dict[str, np.ndarray]:
        return read_npz(self.read(name), "in-memory member {}".format(name))

    def json(self, name: str) -> Any:
        return read_json(self.read(name), "in-memory member {}".format(name))

    def extract(self, name: str) -> Path:
        path = self._directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.read(name))
        return path


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_END_RECORD = struct.Struct("<4s4H2LH")


class ZipEntry(NamedTuple):
    """Where a stored member's bytes lie in the archive, and its zip CRC."""
    start: int
    size: int
    crc: int

    def bytes(self, data: bytes) -> bytes:
        return data[self.start:self.start + self.size]


def zip_entries(data: bytes, label: str, hint: str = schema.HINT) -> Dict[str, ZipEntry]:
    """The members of a zip held in `data`, refused unless each is stored, unique, plainly named, inside the file
    and apart from every other: overlapping entries would let a small file make a load copy the same bytes again
    and again. `label` starts every message (the bundle, or the bundle and its `.npz` member)."""
    _check_entry_count(data, label, hint)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except Exception as error:  # zipfile raises BadZipFile, NotImplementedError, ValueError, struct.error, ...
        raise BundleError("{} is not a readable zip archive (truncated, damaged or not a bundle at all): {}".format(
            label, schema.short(str(error), 200)), hint=hint)
    entries = {}  # type: Dict[str, ZipEntry]
    spans = []  # type: List[Tuple[int, int, str]]
    for info in infos:
        name = info.filename
        if name in entries:
            raise BundleError("{}: member {} appears twice".format(label, schema.short(name)), hint=hint)
        schema.check_member_name(name, label)
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            raise BundleError("{}: member {} is compressed or encrypted; edgedyn writes stored members only".format(
                label, schema.short(name)), hint=hint)
        if info.compress_size != info.file_size:
            raise BundleError("{}: member {} declares {} stored bytes but {} uncompressed".format(
                label, schema.short(name), info.compress_size, info.file_size), hint=hint)
        start = _data_start(data, info, label, hint)
        entries[name] = ZipEntry(start, info.file_size, info.CRC)
        spans.append((info.header_offset, start + info.file_size, name))
    directory = _directory_offset(data)
    previous_end, previous = 0, ""
    for begin, end, name in sorted(spans):
        if begin < previous_end:
            raise BundleError("{}: members {} and {} overlap in the file".format(
                label, schema.short(previous), schema.short(name)), hint=hint)
        if end > directory:
            raise BundleError("{}: member {} runs past the end of its data (cut short?)".format(
                label, schema.short(name)), hint=hint)
        previous_end, previous = end, name
    return entries


def _end_record(data: bytes) -> Tuple[int, int]:
    """(entries, central directory offset) from the end-of-directory record; (-1, -1) when there is none."""
    position = data.rfind(b"PK\x05\x06", max(0, len(data) - _END_RECORD.size - 0xFFFF))
    if position < 0 or position + _END_RECORD.size > len(data):
        return -1, -1
    fields = _END_RECORD.unpack_from(data, position)
    return fields[4], fields[6]


def _check_entry_count(data: bytes, label: str, hint: str) -> None:
    """Counts the entries before zipfile builds an object for each of them."""
    count, _ = _end_record(data)
    if count > MAX_MEMBERS:
        raise BundleError("{} lists {} zip entries, more than the {} this runtime reads".format(
            label, count, MAX_MEMBERS), hint=hint)


def _directory_offset(data: bytes) -> int:
    _, offset = _end_record(data)
    return offset if offset >= 0 else len(data)


def _data_start(data: bytes, info: zipfile.ZipInfo, label: str, hint: str) -> int:
    """Where a member's bytes begin, after its local header, which must agree with the directory."""
    offset = info.header_offset
    if offset < 0 or offset + _LOCAL_HEADER.size > len(data):
        raise BundleError("{}: member {} starts outside the file".format(label, schema.short(info.filename)),
                          hint=hint)
    fields = _LOCAL_HEADER.unpack_from(data, offset)
    name_start = offset + _LOCAL_HEADER.size
    local_name = data[name_start:name_start + fields[9]]
    if fields[0] != b"PK\x03\x04" or local_name.decode("cp437" if not fields[2] & 0x800 else "utf-8",
                                                          "replace") != info.orig_filename:
        raise BundleError("{}: the local header of member {} does not match the directory".format(
            label, schema.short(info.filename)), hint=hint)
    return name_start + fields[9] + fields[10]


# Note: numpy's own np.load allocates the array a header declares before reading its bytes, so a damaged header
# could ask for gigabytes; here the header is checked against the member's size first.
def read_npz(data: bytes, label: str) -> Dict[str, np.ndarray]:
    """The arrays of `.npz` bytes: stored `.npy` members with numeric dtypes whose data fills them exactly."""
    arrays = {}
    for name, entry in zip_entries(data, label).items():
        if not name.endswith(".npy"):
            raise BundleError("{}: holds {}, which is not an .npy array".format(label, schema.short(name)),
                              hint=schema.HINT)
        arrays[name[:-4]] = _read_npy(entry.bytes(data), "{}, array {}".format(label, schema.short(name[:-4])))
    return arrays


def _read_npy(data: bytes, label: str) -> np.ndarray:
    handle = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
        else:
            raise ValueError("unsupported .npy version {}".format(version))
    except Exception as error:  # numpy raises ValueError, SyntaxError or TypeError for a damaged header
        raise BundleError("{}: damaged .npy header ({})".format(label, schema.short(str(error), 200)),
                          hint=schema.HINT)
    if dtype.name not in schema.DTYPES or dtype.byteorder not in ("=", "|", "<" if sys.byteorder == "little" else ">"):
        raise BundleError("{}: dtype {} is not one a bundle may hold ({})".format(
            label, schema.short(str(dtype)), ", ".join(schema.DTYPES)), hint=schema.HINT)
    count = 1
    for size in shape:
        count *= size
    body = len(data) - handle.tell()
    if count * dtype.itemsize != body:
        raise BundleError("{}: shape {} of {} needs {} bytes, the member holds {}".format(
            label, schema.short(shape), dtype, count * dtype.itemsize, body), hint=schema.HINT)
    array = np.frombuffer(data, dtype=dtype, count=count, offset=handle.tell())
    return array.reshape(shape, order="F" if fortran else "C")


def read_json(data: bytes, label: str) -> Any:
    """A JSON member, with every way it can fail to parse reported as a BundleError naming the member."""
    if len(data) > MAX_JSON_BYTES:
        raise BundleError("{} is {} bytes, above the {} this runtime reads".format(label, len(data), MAX_JSON_BYTES),
                          hint=schema.HINT)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise BundleError("{} is not valid JSON ({})".format(label, schema.short(str(error), 200)), hint=schema.HINT)


def cache_dir() -> Path:
    root = os.environ.get("EDGEDYN_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "edgedyn"


def _parse_manifest(data: bytes, path: Path) -> Dict[str, Any]:
    manifest = read_json(data, "bundle {}: manifest".format(path))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise BundleError("{} is not an edgedyn bundle (manifest format is {})".format(path, schema.short(
            manifest.get("format") if isinstance(manifest, dict) else None)))
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        producer = manifest.get("producer")
        raise BundleError(
            "bundle {} has format version {}, this runtime reads version {}".format(
                path, schema.short(version), FORMAT_VERSION),
            hint="install the edgedyn version that made it ({}) on the board, or export again with this one".format(
                schema.short(producer.get("edgedyn", "unknown") if isinstance(producer, dict) else "unknown")),
        )
    manifest = schema.check_manifest(manifest, path, MANIFEST_NAME)
    bucket_schema.check_buckets(schema.Checker(path, MANIFEST_NAME), manifest)
    check_preprocess(schema.Checker(path, MANIFEST_NAME), manifest)
    return manifest


def read_manifest(path: PathLike) -> Dict[str, Any]:
    """The verified manifest of a bundle."""
    return Bundle(path).manifest


FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def pack_arrays(arrays: Dict[str, np.ndarray]) -> bytes:
    """Serializes arrays to deterministic `.npz` bytes (fixed timestamps, no pickle)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for key in arrays:
            value = np.asarray(arrays[key], order="C")
            if value.dtype == object:
                raise ValueError("array {!r} has dtype object; bundles never hold pickled data".format(key))
            member = io.BytesIO()
            np.lib.format.write_array(member, value, allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(key + ".npy", date_time=FIXED_ZIP_TIME), member.getvalue())
    return buffer.getvalue()


def kept_artifact(record: Dict[str, Any]) -> Dict[str, Any]:
    """The CPU artifact the export chose for a specialization's manifest record: its last one, or the one before
    an fp32 fallback (selection mode "fallback": edgedyn/selection.py)."""
    artifacts = record["artifacts"]
    if len(artifacts) > 1 and artifacts[-1].get("selection", {}).get("mode") == "fallback":
        return artifacts[-2]
    return artifacts[-1]
