"""`edgedyn verify`: on the board, run the bundle's reference inputs and compare with torch eager's outputs."""
import contextlib
import io
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import STDOUT, JsonOption, emit_json, err, out, output_file
from edgedyn.errors import EdgedynError


def verify_command(
    bundle: Annotated[Path, typer.Argument(help="The .edgedyn bundle to check.")],
    json_: JsonOption = None,
    threads: Annotated[Optional[int], typer.Option(help="Threads for the executor.")] = None,
    device: Annotated[str, typer.Option(help="auto: GPU artifact when this machine can run it, else CPU; or cpu, gpu.")]
    = "auto",
    trusted_keys: Annotated[Optional[List[Path]], typer.Option(
        "--trusted-keys", help="Public key file (KEY.pub from `edgedyn keygen`); repeat for several. Only a bundle "
                               "signed by one of them is opened. Default: the files in EDGEDYN_TRUSTED_KEYS.")] = None,
    emulate: Annotated[bool, typer.Option("--emulate", help="Verify on an emulated board of the bundle's kind: its "
                                          "Debian arm64 root filesystem (built once, cached) under qemu-user with "
                                          "the board's CPU.")] = False,
) -> None:
    """Run every specialization on its reference inputs; exit 1 when an output differs beyond tolerance."""
    import edgedyn.runtime as rt
    from edgedyn.runtime.format import host_arch

    if emulate:
        from edgedyn.emulate import verify_emulated

        if trusted_keys:
            raise EdgedynError("--trusted-keys is checked by the runtime that opens the bundle, and --emulate does "
                               "not pass keys to the emulated board yet",
                               hint="verify the signature here first (edgedyn verify BUNDLE --trusted-keys KEY.pub "
                                    "on a machine of the bundle's architecture), or drop one of the two options")
        if json_ in (None, STDOUT):
            raise typer.Exit(verify_emulated(bundle, json_=json_ is not None, threads=threads, device=device))
        # --json PATH: the board's JSON report (it prints no table then) goes into the file.
        output_file(Path(json_), "--json")
        report_text = io.StringIO()
        with contextlib.redirect_stdout(report_text):
            status = verify_emulated(bundle, json_=True, threads=threads, device=device)
        Path(json_).write_text(report_text.getvalue())
        err.print("wrote {}".format(json_))
        raise typer.Exit(status)
    program = rt.load(bundle, threads=threads, device=device, trusted_keys=trusted_keys or None)
    if program.bundle.signed_by:
        err.print("signature ok: signed by trusted key {}...".format(program.bundle.signed_by[:16]))
    for spec in program.specializations:
        err.print("using {}".format(spec.selection()))
    results = program.verify()
    failed = [r for r in results if not r["ok"]]
    report = {"bundle": str(bundle), "ok": not failed, "arch": host_arch(), "results": results,
              "selection": {s.name: {"artifact": s.artifact, "skipped": s.skipped} for s in program.specializations}}
    if not emit_json(report, json_):
        table = Table(title="verify {}".format(bundle.name))
        for column in ("specialization", "output", "artifact", "max abs err", "max rel err", "tolerance", "result"):
            table.add_column(column)
        for r in results:
            table.add_row(r["specialization"], r["output"], r["artifact"], "{:.3g}".format(r["max_abs"]),
                          "{:.3g}".format(r["max_rel"]), "rtol {:g}".format(r.get("rtol", 0)),
                          "ok" if r["ok"] else "MISMATCH")
        out.print(table)
    if failed:
        err.print("error: {} of {} outputs differ from torch eager beyond tolerance".format(len(failed), len(results)))
        raise typer.Exit(1)
    err.print("verified {} output(s) of {} specialization(s) on {}".format(
        len(results), len(program.specializations), host_arch()))
