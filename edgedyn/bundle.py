"""Writes bundles: one zip file (see edgedyn/runtime/format.py) whose manifest lists every member's SHA-256.

Deterministic: members are written in sorted order with fixed timestamps, so exporting the same model twice gives
byte-identical members and the same manifest apart from its `created` time.
"""
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, Union

from edgedyn.runtime.format import FIXED_ZIP_TIME, FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, sha256_bytes


def sign_bundle(path: Union[str, Path], private_key: Union[str, Path]) -> str:
    """Adds `manifest.sig` (Ed25519 over the manifest bytes) to a written bundle; the manifest is unchanged.
    Returns the public key's hex."""
    from edgedyn.errors import EdgedynError
    from edgedyn.runtime import signing

    key_path = Path(private_key)
    try:
        pem = key_path.read_bytes()
    except OSError as error:
        raise EdgedynError("cannot read signing key {}: {}".format(key_path, error),
                           hint="make a key pair with `edgedyn keygen KEY`")
    with zipfile.ZipFile(str(path)) as archive:
        if signing.SIGNATURE_NAME in archive.namelist():
            raise EdgedynError("bundle {} is already signed".format(path), hint="export it again to sign it anew")
        manifest = archive.read(MANIFEST_NAME)
    signature = signing.sign(manifest, pem)
    with zipfile.ZipFile(str(path), "a", zipfile.ZIP_STORED) as archive:
        archive.writestr(zipfile.ZipInfo(signing.SIGNATURE_NAME, date_time=FIXED_ZIP_TIME), signature)
    return json.loads(signature)["key"]


class BundleWriter:
    """Collects members (identical contents are stored once) and writes the bundle file atomically."""

    def __init__(self) -> None:
        self.members = {}  # type: Dict[str, bytes]
        self._names_by_hash = {}  # type: Dict[str, str]

    def add(self, name: str, data: bytes) -> str:
        """Adds a member and returns the name it is stored under (an earlier identical member's, if any)."""
        digest = sha256_bytes(data)
        if digest in self._names_by_hash:
            return self._names_by_hash[digest]
        if name in self.members:
            raise ValueError("bundle member {} added twice with different contents".format(name))
        self.members[name] = data
        self._names_by_hash[digest] = name
        return name

    def write(self, path: Union[str, Path], manifest: Dict[str, Any]) -> Path:
        path = Path(path)
        manifest = dict(manifest, format=FORMAT_NAME, format_version=FORMAT_VERSION)
        manifest["members"] = {name: {"sha256": sha256_bytes(data), "size": len(data)}
                               for name, data in sorted(self.members.items())}
        encoded = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=str(path.parent), prefix=".{}.".format(path.name), suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
                archive.writestr(zipfile.ZipInfo(MANIFEST_NAME, date_time=FIXED_ZIP_TIME), encoded)
                for name, data in sorted(self.members.items()):
                    archive.writestr(zipfile.ZipInfo(name, date_time=FIXED_ZIP_TIME), data)
            os.replace(temporary, str(path))
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        return path
