"""`edgedyn verify`: on the board, run the bundle's reference inputs and compare with torch eager's outputs.

Here, on the board emulated under qemu (--emulate), or on boards of a fleet (--remote, docs/fleet.md).
"""
import contextlib
import io
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import (STDOUT, AllBoardsOption, JsonOption, KeyOption, RemoteOption, emit_json, err, out,
                                output_file, remote_reports)
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
    remote: RemoteOption = None,
    key: KeyOption = None,
    all_boards: AllBoardsOption = False,
) -> None:
    """Run every specialization on its reference inputs; exit 1 when an output differs beyond tolerance."""
    if emulate:
        raise typer.Exit(_verify_emulated(bundle, json_, threads, device, trusted_keys, remote))
    if remote is not None:
        if trusted_keys:
            raise EdgedynError("--trusted-keys applies to the runtime that opens the bundle: with --remote that is the "
                               "board's, which reads its own EDGEDYN_TRUSTED_KEYS",
                               hint="set EDGEDYN_TRUSTED_KEYS in the environment of `edgedyn serve` on the board")
        reports = remote_reports(remote, key, bundle, "verify", {"threads": threads, "device": device}, all_boards)
    else:
        from edgedyn.fleet.device import verify_report

        reports = [verify_report(str(bundle), threads, device, trusted_keys=trusted_keys or None)]
    to_stdout = json_ == STDOUT
    failed = sum(_show(bundle, report, table=not to_stdout) for report in reports)
    shown = [{name: value for name, value in r.items() if name != "using"} for r in reports]
    emit_json(shown[0] if len(shown) == 1 else shown, json_)  # one report, or one per board with --remote --all
    if failed:
        raise typer.Exit(1)


def _show(bundle: Path, report: Dict[str, Any], table: bool) -> int:
    """Prints one board's verify table (unless the JSON goes to stdout) and summary line; returns how many outputs
    failed."""
    results = report["results"]
    failed = [r for r in results if not r["ok"]]
    where = report.get("remote", {}).get("name")
    if report.get("signed_by"):
        err.print("signature ok: signed by trusted key {}...".format(report["signed_by"][:16]))
    for line in report["using"]:
        err.print("using {}".format(line))
    if table:
        shown = Table(title="verify {}{}".format(bundle.name, " on " + where if where else ""))
        for column in ("specialization", "output", "artifact", "max abs err", "max rel err", "tolerance", "result"):
            shown.add_column(column)
        for r in results:
            shown.add_row(r["specialization"], r["output"], _artifact(r), "{:.3g}".format(r["max_abs"]),
                          "{:.3g}".format(r["max_rel"]), _tolerance(r), "ok" if r["ok"] else "MISMATCH")
        out.print(shown)
    if failed:
        err.print("error: {} of {} outputs differ from torch eager beyond tolerance".format(len(failed), len(results)))
    else:
        err.print("verified {} output(s) of {} specialization(s) on {}".format(
            len(results), len(report["selection"]), where or report["arch"]))
    return len(failed)


def _artifact(result: Dict[str, Any]) -> str:
    """The artifact column: its backend, and the precision it computed in when that is not fp32."""
    precision = result.get("precision")
    return result["artifact"] + (" ({})".format(precision) if precision and precision != "fp32" else "")


def _tolerance(result: Dict[str, Any]) -> str:
    """fp32 and int8 outputs are held to a relative tolerance, bf16/fp16 ones to the cosine their gate measured."""
    if "min_cosine" in result:
        return "cosine {:.6f} >= {:g}".format(result.get("cosine", float("nan")), result["min_cosine"])
    return "rtol {:g}".format(result.get("rtol") or 0)


def _verify_emulated(bundle: Path, json_: Optional[str], threads: Optional[int], device: str,
                     trusted_keys: Optional[List[Path]], remote: Optional[str]) -> int:
    """The exit status of verify on the bundle's board emulated under qemu (edgedyn/emulate)."""
    from edgedyn.emulate import verify_emulated

    if trusted_keys or remote is not None:
        raise EdgedynError("--emulate runs the bundle on an emulated board here, and takes neither --trusted-keys "
                           "(the emulated board is not given keys yet) nor --remote",
                           hint="verify the signature on a machine of the bundle's architecture, or drop one of "
                                "the options")
    if json_ in (None, STDOUT):
        return verify_emulated(bundle, json_=json_ is not None, threads=threads, device=device)
    # --json PATH: the board's JSON report (it prints no table then) goes into the file.
    output_file(Path(json_), "--json")
    report_text = io.StringIO()
    with contextlib.redirect_stdout(report_text):
        status = verify_emulated(bundle, json_=True, threads=threads, device=device)
    Path(json_).write_text(report_text.getvalue())
    err.print("wrote {}".format(json_))
    return status
