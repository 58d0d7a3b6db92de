"""The bundle format: one zip file (stored, not compressed) holding `manifest.json` and the members it lists.

The manifest records the SHA-256 of every member; `open_bundle` checks all of them before anything is used.
Nothing in a bundle is ever unpickled: arrays are `.npz` files read with `allow_pickle=False`.
Standard library and numpy only, Python 3.8 syntax: this file runs on the board.
"""
import hashlib
import io
import json
import os
import platform
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, Tuple, Union

import numpy as np

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


def _check_member_name(name: str) -> None:
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise BundleError("bundle member name {!r} is not a plain relative path; refusing to read it".format(name))


class Bundle:
    """An opened, checksum-verified bundle: the manifest plus access to its members."""

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise BundleError(
                "bundle {} does not exist".format(self.path),
                hint="create one with `edgedyn export MODEL.py:NAME --board BOARD -o {}`".format(self.path.name),
            )
        try:
            data = self.path.read_bytes()
            self._members, crcs = _read_stored_members(data, self.path)
        except zipfile.BadZipFile as error:
            raise BundleError(
                "{} is not a readable edgedyn bundle (truncated or not a bundle at all): {}".format(self.path, error),
                hint="copy the bundle to the board again and compare its size and sha256 with the original",
            )
        except (OSError, EOFError, ValueError, struct.error) as error:
            raise BundleError("cannot read bundle {}: {}".format(self.path, error))
        if MANIFEST_NAME not in self._members:
            raise BundleError("{} has no {}; it is not an edgedyn bundle".format(self.path, MANIFEST_NAME))
        if zlib.crc32(self._members[MANIFEST_NAME]) != crcs[MANIFEST_NAME]:
            raise ChecksumError("bundle {}: its manifest is damaged (CRC mismatch)".format(self.path),
                                hint="copy the bundle again or export it again; never edit a bundle by hand")
        self.manifest = _parse_manifest(self._members[MANIFEST_NAME], self.path)
        self._verify_members()
        self.sha256 = sha256_bytes(data)  # the file is read once: no second pass over it to hash it

    def _verify_members(self) -> None:
        listed = self.manifest["members"]
        for name, record in sorted(listed.items()):
            _check_member_name(name)
            if name not in self._members:
                raise BundleError("bundle {} lacks member {} listed in its manifest".format(self.path, name))
            actual = sha256_bytes(self._members[name])
            if actual != record["sha256"]:
                raise ChecksumError(
                    "bundle {}: checksum mismatch in {} (expected sha256 {}..., got {}...); "
                    "the file was modified or damaged".format(self.path, name, record["sha256"][:12], actual[:12]),
                    hint="copy the bundle again or export it again; never edit a bundle by hand",
                )
        extra = sorted(set(self._members) - set(listed) - {MANIFEST_NAME})
        if extra:
            raise BundleError("bundle {} holds members its manifest does not list: {}".format(self.path, ", ".join(extra)))

    def read(self, name: str) -> bytes:
        if name not in self.manifest["members"]:
            raise BundleError("bundle {} has no member {}".format(self.path, name))
        return self._members[name]

    def arrays(self, name: str) -> Dict[str, np.ndarray]:
        """Arrays of an `.npz` member, read without pickle."""
        with np.load(io.BytesIO(self.read(name)), allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

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
            _check_member_name(name)
        self._members = dict(members)
        self._directory = Path(directory)

    def read(self, name: str) -> bytes:
        if name not in self._members:
            raise BundleError("in-memory bundle has no member {}".format(name))
        return self._members[name]

    def arrays(self, name: str) -> Dict[str, np.ndarray]:
        with np.load(io.BytesIO(self.read(name)), allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

    def extract(self, name: str) -> Path:
        path = self._directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.read(name))
        return path


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")


def _read_stored_members(data: bytes, path: Path) -> Tuple[Dict[str, bytes], Dict[str, int]]:
    """Member bytes straight from the file, for stored (uncompressed) members, and their zip CRCs.

    zipfile's reader would stop at the first CRC error with a message naming no checksum; reading the stored bytes
    lets the manifest's SHA-256 say which member is damaged.
    """
    members, crcs = {}, {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise BundleError("bundle {}: member {} is compressed; edgedyn writes stored members only".format(
                    path, info.filename))
            fields = _LOCAL_HEADER.unpack_from(data, info.header_offset)
            if fields[0] != b"PK\x03\x04":
                raise zipfile.BadZipFile("bad local header for {}".format(info.filename))
            start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
            content = data[start:start + info.compress_size]
            if len(content) != info.compress_size:
                raise zipfile.BadZipFile("member {} is cut short".format(info.filename))
            members[info.filename] = content
            crcs[info.filename] = info.CRC
    return members, crcs


def cache_dir() -> Path:
    root = os.environ.get("EDGEDYN_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "edgedyn"


def _parse_manifest(data: bytes, path: Path) -> Dict[str, Any]:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise BundleError("bundle {}: manifest is not valid JSON ({})".format(path, error))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise BundleError("{} is not an edgedyn bundle (manifest format is {!r})".format(path, manifest.get("format")
                          if isinstance(manifest, dict) else None))
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BundleError(
            "bundle {} has format version {}, this runtime reads version {}".format(path, version, FORMAT_VERSION),
            hint="install the edgedyn version that made it ({}) on the board, or export again with this one".format(
                manifest.get("producer", {}).get("edgedyn", "unknown")),
        )
    for key in ("members", "specializations", "signature", "board"):
        if key not in manifest:
            raise BundleError("bundle {}: manifest lacks the {!r} field".format(path, key))
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
            value = np.ascontiguousarray(arrays[key])
            if value.dtype == object:
                raise ValueError("array {!r} has dtype object; bundles never hold pickled data".format(key))
            member = io.BytesIO()
            np.lib.format.write_array(member, value, allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(key + ".npy", date_time=FIXED_ZIP_TIME), member.getvalue())
    return buffer.getvalue()
