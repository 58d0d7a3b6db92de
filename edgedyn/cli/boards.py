"""`edgedyn boards`: the boards edgedyn knows, as a table or JSON; `edgedyn boards show NAME` for one."""
import json
from typing import Any, List, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typing_extensions import Annotated

from edgedyn.boards import Board, list_boards, load_board
from edgedyn.cli.common import JsonOption, emit_json
from edgedyn.emulate.rootfs import cpu_words
from edgedyn.fleet.server import tvm_wheel_note


app = typer.Typer(
    invoke_without_command=True,
    help="List the boards edgedyn can target; `edgedyn boards show NAME` describes one.",
    add_completion=False,
)



@app.callback()
def boards(
    ctx: typer.Context,
    as_json: JsonOption = None,
    remote: Annotated[Optional[str], typer.Option(
        "--remote", help="List the fleet registered at this RPC tracker (HOST:PORT) instead: keys, free, pending.")]
    = None,
) -> None:
    """List the boards edgedyn can target (or, with --remote, the boards registered at a tracker)."""
    if ctx.invoked_subcommand is not None:
        return
    if remote is not None:
        _show_fleet(remote, as_json)
        return
    found = list_boards()
    if not emit_json([board.to_dict() for board in found], as_json):
        _stdout().print(_boards_table(found))


@app.command()
def show(
    board: Annotated[str, typer.Argument(help="A board name (see `edgedyn boards`) or the path to a board .toml.")],
    as_json: JsonOption = None,
) -> None:
    """Everything edgedyn knows about one board, with its compile targets and notes."""
    found = load_board(board)
    targets = {device: target.to_dict() for device, target in found.targets().items()}
    if not emit_json({"board": found.to_dict(), "targets": targets}, as_json):
        typer.echo("\n".join(_describe(found)))


def _show_fleet(remote: str, as_json: Optional[str]) -> None:
    from edgedyn.fleet.client import fleet_summary, parse_address

    keys = fleet_summary(parse_address(remote))
    if emit_json(keys, as_json):
        return
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, caption="tracker {}".format(remote),
                  caption_justify="left")
    for header in ("key", "boards", "free", "pending", "servers"):
        table.add_column(header)
    for key, entry in sorted(keys.items()):
        table.add_row(Text(key), str(entry["total"]), str(entry["free"]), str(entry["pending"]),
                      Text(", ".join(entry["servers"]) or "-"))
    _stdout().print(table)


def _stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        # Piped output keeps one board per line rather than wrapping at 80 columns.
        console.width = max(console.width, 200)
    return console


def _gb(mb: int) -> str:
    return "{:g}G".format(round(mb / 1024, 1))  # short: the table must fit 80 columns


def _gpu(board: Board) -> str:
    if board.gpu is None:
        return "-"
    return board.gpu.arch


def _software(board: Board) -> str:
    parts = [board.os if board.jetpack is None else "JetPack {}".format(board.jetpack),
             "Python {}".format(board.python)]
    if board.cuda is not None:
        parts.append("CUDA {}".format(board.cuda))
    return ", ".join(parts)


def _boards_table(found: List[Board]) -> Table:
    # Short cells and no vertical rules, so that an 80-column terminal wraps only the last two columns;
    # `edgedyn boards show` has the long descriptions.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  caption="RAM: total/what a model may use", caption_justify="left")
    for header in ["board", "arch", "CPU", "RAM", "GPU"]:
        table.add_column(header, no_wrap=True)
    table.add_column("OS, Python, CUDA", ratio=3)
    table.add_column("backends", ratio=2, overflow="fold")
    for board in found:
        cells = [board.name, board.arch, "{}x {}".format(board.cpu_cores, board.target("cpu").mcpu),
                 "{}/{}".format(_gb(board.ram_mb), _gb(board.ram_budget_mb)), _gpu(board), _software(board),
                 ", ".join(board.backends)]
        table.add_row(*[Text(cell) for cell in cells])  # Text: descriptions may contain [brackets]
    return table


def _describe(board: Board) -> List[str]:
    """One board as aligned `field  value` lines that read the same with or without a terminal."""
    features = ", ".join(board.cpu_features) or "none listed"
    rows = [
        ("arch", board.arch),
        ("cpu", "{}x {} ({})".format(board.cpu_cores, board.cpu_model, features)),
        ("memory", "{} MB, of which a model may use {} MB".format(board.ram_mb, board.ram_budget_mb)),
        ("gpu", "none usable" if board.gpu is None else "{}: {}, compute capability {}, {} CUDA cores".format(
            board.gpu.name, board.gpu.arch, board.gpu.compute_capability, board.gpu.cuda_cores)),
        ("os", board.os),
        ("python", board.python),
        ("cuda", _optional(board.cuda)),
        ("jetpack", _optional(board.jetpack)),
        ("glibc", board.glibc),
        ("emulation",
         "-" if board.qemu_cpu is None else "qemu-aarch64-static -cpu {}".format(cpu_words(board.qemu_cpu))),
        ("fleet", tvm_wheel_note(board.python) or "edgedyn serve (TVM's Python RPC server); see docs/fleet.md"),
        ("backends", ", ".join(board.backends) + " (CPU artifact, in order of preference)"),
        ("gpu code", ", ".join(board.gpu_backends) or "-"),
        ("file", str(board.path)),
    ]
    lines = ["{}: {}".format(board.name, board.description)]
    lines += ["  {:<10} {}".format(key, value) for key, value in rows]
    lines.append("targets")
    for device, target in board.targets().items():
        lines.append("  {:<10} {} ({}): {}".format(device, target.name, target.kind, target.description))
        lines.append("  {:<10} tvm {}".format("", json.dumps(target.to_dict()["tvm"])))
        if target.tvm_host is not None:
            lines.append("  {:<10} host {}".format("", json.dumps(target.to_dict()["tvm_host"])))
        if target.cross_compiler is not None:
            lines.append("  {:<10} cross compiler {}".format("", target.cross_compiler))
    if board.notes:
        lines.append("notes")
        lines += ["  - {}".format(note) for note in board.notes]
    return lines


def _optional(value: Optional[str]) -> str:
    return "-" if value is None else value
