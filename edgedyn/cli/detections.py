"""`edgedyn run` on a detector: its detections as rows (label, score, box) and drawn on the input image."""
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgedyn.errors import EdgedynError
from edgedyn.runtime.detections import groups

# Colours cycled by label, readable on photos (the matplotlib tab10 palette).
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))


def detection_rows(named: Dict[str, np.ndarray]) -> List[Dict[str, Any]]:
    """Every image's valid rows of every detection group among the outputs: [{"group", "image", "label",
    "score", "box"}], by group, image and descending score as the bundle returned them."""
    names = list(named)
    arrays = [named[name] for name in names]
    rows = []  # type: List[Dict[str, Any]]
    for group in groups(names):
        prefix = names[group["boxes"]][:-len("boxes")]
        counts = np.asarray(arrays[group["count"]])
        for image in np.ndindex(*counts.shape):
            for row in range(int(counts[image])):
                rows.append({"group": prefix.rstrip("."), "image": list(image),
                             "label": int(arrays[group["labels"]][image][row]),
                             "score": float(arrays[group["scores"]][image][row]),
                             "box": [float(v) for v in arrays[group["boxes"]][image][row]]})
    return rows


def label_name(label: int, names: Optional[List[str]]) -> str:
    if names is not None and 0 <= label < len(names):
        return "{} {}".format(label, names[label])
    return str(label)


def print_table(console: Any, rows: List[Dict[str, Any]], names: Optional[List[str]], limit: int = 50) -> None:
    """The detections as a table (label, score, box), the first `limit` of them."""
    from rich.table import Table

    table = Table(title="{} detection{}".format(len(rows), "" if len(rows) == 1 else "s"), title_justify="left")
    several = len({(r["group"], tuple(r["image"])) for r in rows}) > 1
    if several:
        table.add_column("image")
    for column in ("label", "score", "x1", "y1", "x2", "y2"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for row in rows[:limit]:
        cells = [label_name(row["label"], names), "{:.4f}".format(row["score"])]
        cells += ["{:.1f}".format(v) for v in row["box"]]
        table.add_row(*([" ".join(map(str, [row["group"]] + row["image"])).strip()] if several else []) + cells)
    console.print(table)
    if len(rows) > limit:
        console.print("... and {} more (--json has all)".format(len(rows) - limit))


def draw(image_path: Path, rows: Sequence[Dict[str, Any]], model_hw: Optional[Tuple[int, int]], output: Path,
         names: Optional[List[str]]) -> int:
    """Draws the first image's boxes on `image_path`, scaled from the model's input size to the photo's (None: the
    boxes are in the photo's pixels already), into `output` (format from its suffix); returns how many it drew."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise EdgedynError("--draw needs Pillow, which is not installed",
                           hint="pip install 'edgedyn[images]'")
    with Image.open(str(image_path)) as source:
        image = source.convert("RGB")
    scale_x, scale_y = (1.0, 1.0) if model_hw is None else (image.width / model_hw[1], image.height / model_hw[0])
    canvas = ImageDraw.Draw(image)
    width = max(1, round(min(image.size) / 200))
    drawn = 0
    for row in rows:
        if any(row["image"]):
            continue  # the photo is the first image of the batch
        x1, y1, x2, y2 = row["box"]
        box = [x1 * scale_x, y1 * scale_y, x2 * scale_x, y2 * scale_y]
        colour = PALETTE[row["label"] % len(PALETTE)]
        canvas.rectangle([min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])],
                         outline=colour, width=width)
        canvas.text((min(box[0], box[2]) + width, min(box[1], box[3]) + width),
                    "{} {:.2f}".format(label_name(row["label"], names), row["score"]), fill=colour)
        drawn += 1
    try:
        image.save(str(output))
    except (OSError, ValueError) as error:
        raise EdgedynError("cannot write {}: {}".format(output, error), hint="give a .jpg or .png path")
    return drawn
