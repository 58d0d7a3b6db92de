"""Ed25519 signatures over a bundle's manifest bytes, which hold every member's SHA-256 and size.

The signature lives in its own member, `manifest.sig` (JSON: algorithm, public key, signature, all hex), which the
manifest does not list, so signing never changes the bytes it signs. With trusted keys configured, `Bundle` checks
the signature on the raw manifest bytes before the manifest is parsed, before any member is read and before any
library is loaded. The crypto is the `cryptography` package's (`pip install 'edgedyn[sign]'`), imported only when
signatures are asked for. Standard library only otherwise, Python 3.8 syntax: this file runs on the board.
"""
import json
import os
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

from edgedyn.runtime.errors import BundleError, EdgedynError, MissingDependencyError

SIGNATURE_NAME = "manifest.sig"
ALGORITHM = "ed25519"
ENVIRONMENT = "EDGEDYN_TRUSTED_KEYS"  # public key files, separated like PATH
MAX_SIGNATURE_BYTES = 4096
KeySource = Union[str, "os.PathLike[str]", bytes]


class SignatureError(BundleError):
    """The bundle is unsigned, signed by a key that is not trusted, or its signature does not match."""


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as error:
        raise MissingDependencyError(
            "bundle signatures need the cryptography package ({})".format(error),
            hint="pip install 'edgedyn[sign]'")
    return ed25519


def read_public_key(source: KeySource) -> bytes:
    """A trusted key: 32 raw bytes, or a file holding them as 64 hex digits (what `edgedyn keygen` writes)."""
    if isinstance(source, bytes) and len(source) == 32:
        return source
    path = Path(os.fsdecode(source))
    try:
        text = path.read_text().strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise EdgedynError("cannot read trusted key {}: {}".format(path, error),
                           hint="give the .pub file `edgedyn keygen` wrote (64 hex digits)")
    if len(key) != 32:
        raise EdgedynError("trusted key {} is not an Ed25519 public key (32 bytes)".format(path),
                           hint="give the .pub file `edgedyn keygen` wrote")
    return key


def trusted_keys(given: Optional[Sequence[KeySource]]) -> List[bytes]:
    """The keys to check against: those given, else those named by EDGEDYN_TRUSTED_KEYS; empty means no policy."""
    if given is None:
        given = [item for item in os.environ.get(ENVIRONMENT, "").split(os.pathsep) if item]
    return [read_public_key(item) for item in given]


def check(manifest: bytes, signature: Optional[bytes], keys: List[bytes], bundle: Any) -> str:
    """Raises SignatureError unless `signature` is a valid signature of `manifest` by one of `keys`; returns the
    signing key's hex."""
    hint = "get the bundle again from its publisher, or trust its key (--trusted-keys / {})".format(ENVIRONMENT)
    if signature is None:
        raise SignatureError("bundle {} is not signed, and this runtime only loads signed bundles".format(bundle),
                             hint="sign it at export with `edgedyn export --sign KEY`, or drop --trusted-keys / "
                                  "{} to load unsigned bundles".format(ENVIRONMENT))
    if len(signature) > MAX_SIGNATURE_BYTES:
        raise SignatureError("bundle {}: {} is {} bytes, not a signature".format(bundle, SIGNATURE_NAME,
                                                                                 len(signature)), hint=hint)
    try:
        record = json.loads(signature.decode("utf-8"))
        key, value = bytes.fromhex(record["key"]), bytes.fromhex(record["signature"])
        algorithm = record["algorithm"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
        raise SignatureError("bundle {}: {} is damaged ({})".format(bundle, SIGNATURE_NAME, error), hint=hint)
    if algorithm != ALGORITHM:
        raise SignatureError("bundle {}: signature algorithm is not {}".format(bundle, ALGORITHM), hint=hint)
    if key not in keys:
        raise SignatureError("bundle {} is signed by key {}..., which is not trusted here".format(
            bundle, key.hex()[:16]), hint=hint)
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(value, manifest)
    except (InvalidSignature, ValueError):
        raise SignatureError("bundle {}: the signature does not match the manifest; the bundle was changed after "
                             "it was signed".format(bundle), hint=hint)
    return key.hex()


def sign(manifest: bytes, private_key_pem: bytes) -> bytes:
    """The `manifest.sig` member for these manifest bytes (host side: `edgedyn export --sign`)."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError) as error:
        raise EdgedynError("the signing key is not a PEM private key ({})".format(error),
                           hint="give the private key file `edgedyn keygen` wrote")
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise EdgedynError("the signing key is not an Ed25519 key", hint="make one with `edgedyn keygen`")
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    record = {"algorithm": ALGORITHM, "key": public.hex(), "signature": key.sign(manifest).hex()}
    return json.dumps(record, sort_keys=True).encode("utf-8")


def generate() -> Tuple[bytes, str]:
    """A new key pair: (private key PEM, public key hex)."""
    _crypto()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pem, public.hex()
