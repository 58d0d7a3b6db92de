"""`edgedyn keygen`: an Ed25519 key pair for signing bundles (`export --sign`, `verify --trusted-keys`)."""
import os
from pathlib import Path

import typer
from typing_extensions import Annotated

from edgedyn.cli.common import err, out, output_file


def keygen_command(
    key: Annotated[Path, typer.Argument(help="Private key file to write (PEM); the public key goes to KEY.pub.")],
) -> None:
    """Make a key pair: KEY signs bundles on the build machine, KEY.pub goes to the boards that trust them."""
    from edgedyn.errors import EdgedynError
    from edgedyn.runtime import signing

    public = key.with_name(key.name + ".pub")
    for path in (key, public):
        output_file(path, "KEY")
        if path.exists():
            raise EdgedynError("{} exists; keygen never overwrites a key".format(path),
                               hint="choose another name, or remove the old key pair first")
    pem, public_hex = signing.generate()
    handle = os.open(str(key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the private key: owner only
    with os.fdopen(handle, "wb") as stream:
        stream.write(pem)
    public.write_text(public_hex + "\n")
    err.print("wrote private key {} (keep it on the build machine) and public key {}".format(key, public))
    out.print(public_hex)
