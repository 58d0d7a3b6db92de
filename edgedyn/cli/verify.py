"""`edgedyn verify`: on the board, run the bundle's reference inputs and compare with torch eager's outputs."""
from pathlib import Path
from typing import Any, Dict, Optional

import typer
from rich.table import Table
from typing_extensions import Annotated

from edgedyn.cli.common import KeyOption, RemoteOption, AllBoardsOption, err, out, print_json, remote_reports


def verify_command(
    bundle: Annotated[Path, typer.Argument(help="The .edgedyn bundle to check.")],
    json_: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="Threads for the executor.")] = None,
    device: Annotated[str, typer.Option(help="auto: GPU artifact when this machine can run it, else CPU; or cpu, gpu.")]
    = "auto",
    remote: RemoteOption = None,
    key: KeyOption = None,
    all_boards: AllBoardsOption = False,
) -> None:
    """Run every specialization on its reference inputs; exit 1 when an output differs beyond tolerance."""
    from edgedyn.fleet.device import verify_report

    if remote is None:
        reports = [verify_report(str(bundle), threads, device)]
    else:
        reports = remote_reports(remote, key, bundle, "verify", {"threads": threads, "device": device}, all_boards)
    failed = sum(_show(bundle, report, json_) for report in reports)
    if json_:  # one report, or one per board with --remote --all
        shown = [{name: value for name, value in r.items() if name != "using"} for r in reports]
        print_json(shown[0] if len(shown) == 1 else shown)
    if failed:
        raise typer.Exit(1)


def _show(bundle: Path, report: Dict[str, Any], json_: bool) -> int:
    """Prints one board's verify table (unless --json) and summary line; returns how many outputs failed."""
    results = report["results"]
    failed = [r for r in results if not r["ok"]]
    for line in report["using"]:
        err.print("using {}".format(line))
    if not json_:
        table = Table(title="verify {}{}".format(bundle.name, " on " + report["remote"]["name"]
                                                 if "remote" in report else ""))
        for column in ("specialization", "output", "artifact", "max abs err", "max rel err", "tolerance", "result"):
            table.add_column(column)
        for r in results:
            table.add_row(r["specialization"], r["output"], r["artifact"], "{:.3g}".format(r["max_abs"]),
                          "{:.3g}".format(r["max_rel"]), "rtol {:g}".format(r.get("rtol", 0)),
                          "ok" if r["ok"] else "MISMATCH")
        out.print(table)
    if failed:
        err.print("error: {} of {} outputs differ from torch eager beyond tolerance".format(len(failed), len(results)))
    else:
        err.print("verified {} output(s) of {} specialization(s) on {}".format(
            len(results), len(report["selection"]), report.get("remote", {}).get("name") or report["arch"]))
    return len(failed)
