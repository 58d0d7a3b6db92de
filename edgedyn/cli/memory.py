"""`edgedyn inspect --memory`: the memory plan of each specialization as a table and as an SVG picture.

The picture is the arena over time: one rectangle per planned tensor, x = execution steps it is live, y = its
offset in the arena, so the step where memory peaks and the tensors that make the peak are plain to see.
SVG written by hand: no plotting library on the board.
"""
import json
from pathlib import Path
from typing import Any, Dict, List
from xml.sax.saxutils import escape

from rich.table import Table

from edgedyn.cli.common import err, human_bytes, out

COLOURS = {"input": "#4e79a7", "intermediate": "#f28e2b", "output": "#59a14f", "workspace": "#bab0ac"}
WIDTH, HEIGHT, MARGIN = 960, 540, 60


def show_memory(bundle: Any, directory: Path) -> List[Path]:
    """Prints each specialization's plan summary and writes its picture into `directory`; returns the paths."""
    table = Table(title="memory plan of {}".format(bundle.path.name), box=None, pad_edge=False)
    for column in ("specialization", "plan of", "tensors", "in place", "naive", "arena", "lower bound",
                   "arena/bound", "arena/naive", "peak at"):
        table.add_column(column, justify="left" if column in ("specialization", "plan of", "peak at") else "right",
                         no_wrap=column == "plan of")
    written = []
    for index, spec in enumerate(bundle.manifest["specializations"]):
        memory = spec.get("memory")
        if not memory:
            err.print("{}: no memory plan recorded (bundle made before edgedyn recorded one)".format(spec["name"]))
            continue
        label = plan_label(spec)
        table.add_row(spec["name"], label, str(memory["tensors"]), str(memory["inplace"]),
                      human_bytes(memory["naive_bytes"]), human_bytes(memory["arena_bytes"]),
                      human_bytes(memory["lower_bound_bytes"]),
                      _ratio(memory["arena_bytes"], memory["lower_bound_bytes"]),
                      _ratio(memory["arena_bytes"], memory["naive_bytes"]),
                      "step {} ({})".format(memory["peak_step"], str(memory.get("peak_op", "")).replace("aten.", "")))
        plan = json.loads(bundle.read(memory["plan"]).decode("utf-8"))
        path = directory / "{}.memory-{}.svg".format(bundle.path.name.rsplit(".", 1)[0], index)
        path.write_text(render_svg(plan, "{} {}".format(bundle.manifest["model"]["name"], spec["name"]), label))
        written.append(path)
    out.print(table)
    fit = bundle.manifest.get("fit")
    if fit:
        out.print("board fit  {}: {} of {} budget ({})".format(fit["board"], human_bytes(fit["total_bytes"]),
                                                           human_bytes(fit["budget_bytes"]), fit["status"]))
    for path in written:
        err.print("wrote {}".format(path))
    return written


def plan_label(spec: Dict[str, Any]) -> str:
    """Whose arena the plan is: the executor's own (portable runs in it), or only the graph's plan, which backends
    that allocate their own memory (onnxruntime, LiteRT, TVM) never use."""
    source = spec["memory"].get("source", "graph")
    if source == "graph":
        executors = sorted({artifact["executor"] for artifact in spec["artifacts"]})
        return "planned, not used by {}".format(", ".join(executors))
    return "used by the {} executor".format(source)


def _ratio(a: int, b: int) -> str:
    return "{:.2f}".format(a / b) if b else "-"


def render_svg(plan: Dict[str, Any], title: str, label: str = "arena") -> str:
    """The arena over time: a rectangle per tensor (x = steps live, y = offset), the lower bound as a line."""
    steps = max(plan["steps"], 1)
    arena = max(plan["arena_bytes"], 1)
    sx = (WIDTH - 2 * MARGIN) / steps
    sy = (HEIGHT - 2 * MARGIN) / arena
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" '
        'font-family="sans-serif" font-size="12">'.format(WIDTH, HEIGHT, WIDTH, HEIGHT),
        '<rect x="0" y="0" width="{}" height="{}" fill="white"/>'.format(WIDTH, HEIGHT),
        '<text x="{}" y="24" font-size="15">{}: arena {}, {} (lower bound {}, naive {})</text>'.format(
            MARGIN, escape(title), human_bytes(plan["arena_bytes"]), escape(label), human_bytes(plan["lower_bound_bytes"]),
            human_bytes(plan["naive_bytes"])),
        '<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>'.format(
            MARGIN, MARGIN, WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN),
    ]
    for tensor in plan["tensors"]:
        x = MARGIN + tensor["first"] * sx
        y = HEIGHT - MARGIN - (tensor["offset"] + tensor["size"]) * sy  # offset 0 at the bottom
        parts.append(
            '<rect class="tensor" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}" '
            'stroke="black" stroke-width="0.3"><title>{} ({}): {} at offset {}, steps {}-{}</title></rect>'.format(
                x, y, max((tensor["last"] - tensor["first"] + 1) * sx, 0.5), max(tensor["size"] * sy, 0.5),
                COLOURS.get(tensor["kind"], "#999"), escape(", ".join(tensor["values"]) or tensor["name"]),
                tensor["kind"], human_bytes(tensor["size"]), tensor["offset"], tensor["first"], tensor["last"]))
    bound = HEIGHT - MARGIN - plan["lower_bound_bytes"] * sy
    parts.append('<line x1="{}" x2="{}" y1="{:.2f}" y2="{:.2f}" stroke="red" stroke-dasharray="4 3"/>'.format(
        MARGIN, WIDTH - MARGIN, bound, bound))
    parts.append('<text x="{}" y="{:.2f}" fill="red" text-anchor="end">lower bound</text>'.format(
        WIDTH - MARGIN - 4, bound - 4))
    parts.append('<text x="{}" y="{}" text-anchor="middle">execution step (0-{})</text>'.format(
        WIDTH // 2, HEIGHT - MARGIN + 30, steps - 1))
    parts.append('<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">arena offset (0-{})'
                 '</text>'.format(HEIGHT // 2, HEIGHT // 2, human_bytes(plan["arena_bytes"])))
    legend_x = MARGIN
    for kind, colour in COLOURS.items():
        parts.append('<rect x="{}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>'.format(
            legend_x, HEIGHT - 18, colour, legend_x + 14, HEIGHT - 9, kind))
        legend_x += 110
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
