"""`edgedyn run`: a bundle on your own data: inputs from .npy/.npz/images (or stdin), outputs to an .npz (or stdout)."""
import io
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import typer
from typing_extensions import Annotated

from edgedyn.cli.common import STDOUT, JsonOption, emit_json, err, out
from edgedyn.errors import EdgedynError
from edgedyn.runtime.detections import groups

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
PREPROCESS = ("auto", "imagenet", "unit", "none")
# torchvision's ImageNet normalization, which the classifiers people export were trained with.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
IMAGES_HINT = "pip install 'edgedyn[images]'  (Pillow reads .png and .jpg)"


def run_command(
    bundle: Annotated[Path, typer.Argument(help="The .edgedyn bundle to run.")],
    input_: Annotated[List[str], typer.Option(
        "--input", "-i", help="NAME=FILE: an .npy, an .npz (its array NAME, or its only array), an image (.png, "
                              ".jpg; see --preprocess) or '-' for an .npy on stdin; NAME=NUMBER for a Python scalar "
                              "argument. Repeat for each input.")] = [],  # noqa: B006 (typer reads the default)
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the outputs, by name, to this .npz ('-' for stdout).")] = None,
    preprocess: Annotated[str, typer.Option(
        help="How an image becomes a tensor: imagenet (resize to the input's HxW, RGB, scale to 0-1, ImageNet mean "
             "and std, NCHW), unit (resize, RGB, scale to 0-1, NCHW: what YOLO and torchvision's detectors take), "
             "none (resize, RGB, the 0-255 pixel values as float32, NCHW) or auto (unit for a bundle that returns "
             "detections, else imagenet; a bundle exported with --preprocess takes the image as it is).")] = "auto",
    print_top: Annotated[Optional[int], typer.Option(
        "--print-top", help="Print the K highest scores (class indices) of each output.")] = None,
    labels: Annotated[Optional[Path], typer.Option(help="A text file with one class name per line, for --print-top.")]
    = None,
    draw: Annotated[Optional[Path], typer.Option(
        "--draw", help="For a detector run on an image: write that image with the detected boxes drawn on it "
                       "(.jpg, .png).")] = None,
    json_path: JsonOption = None,
    threads: Annotated[Optional[int], typer.Option(help="Threads for the executor.")] = None,
    device: Annotated[str, typer.Option(help="auto: GPU artifact when this machine can run it, else CPU; or cpu, gpu.")]
    = "auto",
) -> None:
    """Run BUNDLE on your inputs: checks the guards, runs, and writes the outputs by their names."""
    import edgedyn.runtime as rt
    from edgedyn.runtime.program import flatten_outputs

    if preprocess not in PREPROCESS:
        raise EdgedynError("unknown --preprocess '{}'; choose from: {}".format(preprocess, ", ".join(PREPROCESS)))
    if output == STDOUT and json_path == STDOUT:
        raise EdgedynError("-o - and --json both want stdout", hint="write one of them to a file")
    from edgedyn.cli import detections

    program = rt.load(bundle, threads=threads, device=device)
    if program.frames is not None:
        refuse_preprocess(program.frames, preprocess, bundle.name)
    detector = any(groups([o["name"] for o in spec.outputs]) for spec in program.specializations)
    if draw is not None and not detector:
        raise EdgedynError("--draw: {} returns no detections (outputs boxes, scores, labels, count)".format(
            bundle.name), hint="export the detector with its NMS inside (--nms for a YOLO head)")
    values = read_inputs(program, input_, "unit" if preprocess == "auto" and detector else
                         "imagenet" if preprocess == "auto" else preprocess)
    spec, result = program.run_routed(*program.route_call((), values))  # routed once: a frame is resized once
    err.print("using {}".format(spec.selection()))
    flat = flatten_outputs(spec.output_tree, result)
    named = {record["name"]: array for record, array in zip(spec.outputs, flat)}
    if output is not None:
        _write_npz(named, output)
    names = _labels(labels) if labels is not None else None
    report = {"bundle": str(bundle), "specialization": spec.name, "artifact": spec.artifact["backend"],
              "outputs": {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in named.items()}}
    if print_top:
        for name, array in named.items():
            report["outputs"][name]["top"] = top_classes(array, print_top, names)
    rows = detections.detection_rows(named) if detector else None
    if rows is not None:
        report["detections"] = rows
    if draw is not None:
        image, name = _drawn_image(input_, spec)
        report["drawn"] = {"path": str(draw), "boxes": detections.draw(
            image, rows or [], None if program.frames is not None else tuple(_image_shape(program, name)[2:]), draw,
            names)}
        err.print("wrote {} ({} boxes)".format(draw, report["drawn"]["boxes"]))
    if emit_json(report, json_path):
        return
    # With the outputs on stdout, what a person reads goes to stderr.
    console = err if output == STDOUT else out
    if rows is not None:
        detections.print_table(console, rows, names)
        return
    for name, record in report["outputs"].items():
        console.print("{} {}[{}]".format(name, record["dtype"], "x".join(str(d) for d in record["shape"])))
        for rank, item in enumerate(record.get("top", []), 1):
            console.print("  #{} {:<24} score {:.4g}  p {:.4f}".format(
                rank, "class {}".format(item["class"]) + (" {}".format(item["label"]) if "label" in item else ""),
                item["score"], item["probability"]))


def _drawn_image(options: Sequence[str], spec: Any) -> Tuple[Path, str]:
    """The image file given for the detector's image input, and that input's name (--draw draws on it)."""
    for option in options:
        name, _, source = option.partition("=")
        if Path(source).suffix.lower() in IMAGE_SUFFIXES and name in spec.inputs:
            return Path(source), name
    raise EdgedynError("--draw needs an image as the input (--input {}=photo.jpg)".format(
        spec.inputs[0] if spec.inputs else "x"), hint="give a .jpg or .png")


def read_inputs(program: Any, options: Sequence[str], preprocess: str) -> Dict[str, Any]:
    """The arguments named by --input NAME=FILE options, read and (images) preprocessed for the bundle's shapes."""
    names = [p["name"] for p in program.signature]
    values = {}  # type: Dict[str, Any]
    for option in options:
        name, sep, source = option.partition("=")
        if not sep or not name or not source:
            raise EdgedynError("cannot read --input {}: expected NAME=FILE".format(option),
                               hint="e.g. --input {}=image.png or --input {}=x.npy".format(names[0], names[0])
                               if names else None)
        if name not in names:
            raise EdgedynError("--input {}: the model has no argument '{}'; its arguments are: {}".format(
                option, name, ", ".join(names)))
        if name in values:
            raise EdgedynError("--input {} given twice".format(name))
        values[name] = _read_one(program, name, source, preprocess)
    tensors = [p["name"] for p in program.signature if p["kind"] == "tensor"]
    missing = [name for name in tensors if name not in values]
    if missing:
        raise EdgedynError("no --input for {}; the model's tensor inputs are: {}".format(
            ", ".join(missing), ", ".join(tensors)), hint="add --input {}=FILE".format(missing[0]))
    return values


def _read_one(program: Any, name: str, source: str, preprocess: str) -> Any:
    if source == STDOUT:
        return _npy(sys.stdin.buffer.read(), "stdin")
    path = Path(source)
    suffix = path.suffix.lower()
    if not path.exists():
        number = _number(source)
        if number is not None:
            return number
        raise EdgedynError("--input {}={}: no such file".format(name, source),
                           hint="give an .npy, .npz or image file, '-' for an .npy on stdin, or a number")
    if suffix == ".npy":
        return _npy(path.read_bytes(), source)
    if suffix == ".npz":
        return _npz_member(path, name)
    if suffix in IMAGE_SUFFIXES:
        if program.frames is not None and name == program.frames.input:
            return read_frame(path)  # the bundle resizes and scales it (export --preprocess)
        return read_image(path, _image_shape(program, name), preprocess)
    raise EdgedynError("--input {}={}: cannot read {} files".format(name, source, suffix or "extension-less"),
                       hint="give an .npy, .npz, .png or .jpg file")


def _npy(data: bytes, where: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as error:
        raise EdgedynError("cannot read an .npy from {}: {}".format(where, error),
                           hint="write it with numpy.save; pickled objects are refused")


def _npz_member(path: Path, name: str) -> np.ndarray:
    try:
        with np.load(str(path), allow_pickle=False) as data:
            keys = list(data.files)
            for key in (name, "input." + name):
                if key in keys:
                    return data[key]
            if len(keys) == 1:
                return data[keys[0]]
    except (OSError, ValueError) as error:
        raise EdgedynError("cannot read {}: {}".format(path, error), hint="write it with numpy.savez")
    raise EdgedynError("{} has no array '{}' (it has: {})".format(path, name, ", ".join(keys) or "none"),
                       hint="save it with numpy.savez(path, {}=array)".format(name))


def _number(text: str) -> Any:
    if text in ("true", "false", "True", "False"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _image_shape(program: Any, name: str) -> Tuple[int, int, int, int]:
    """The NCHW shape an image must become: the first specialization's shape for this input."""
    for spec in program.specializations:
        for record in spec.record["inputs"]:
            if record["name"] == name:
                shape = tuple(int(d) for d in record["shape"])
                if len(shape) != 4 or shape[1] not in (1, 3):
                    raise EdgedynError("--input {}: an image needs an input of shape Nx3xHxW (or Nx1xHxW), this "
                                       "one is {}".format(name, "x".join(map(str, shape))),
                                       hint="pass an .npy of that shape instead")
                return shape  # type: ignore[return-value]
    raise EdgedynError("--input {}: the model takes no tensor '{}'".format(name, name))


def refuse_preprocess(frames: Any, preprocess: str, name: str) -> None:
    """A bundle exported with --preprocess resizes and scales images itself: any --preprocess but auto is a mistake."""
    if preprocess != "auto":
        raise EdgedynError("--preprocess {}: {} pre-processes images itself ({})".format(
            preprocess, name, frames.describe()), hint="leave --preprocess out")


def read_frame(path: Path) -> np.ndarray:
    """An image file as it is: uint8 RGB, height x width x 3 (for a bundle that pre-processes frames itself)."""
    try:
        from PIL import Image
    except ImportError:
        raise EdgedynError("reading {} needs Pillow, which is not installed".format(path.name), hint=IMAGES_HINT)
    with Image.open(str(path)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


def read_image(path: Path, shape: Tuple[int, int, int, int], preprocess: str) -> np.ndarray:
    """An image file as a float32 NCHW batch of `shape`: resized, RGB (or grey), normalized as `preprocess` says."""
    try:
        from PIL import Image
    except ImportError:
        raise EdgedynError("reading {} needs Pillow, which is not installed".format(path.name), hint=IMAGES_HINT)
    batch, channels, height, width = shape
    with Image.open(str(path)) as image:
        pixels = image.convert("RGB" if channels == 3 else "L").resize((width, height), Image.BILINEAR)
        array = np.asarray(pixels, dtype=np.float32).reshape(height, width, channels)
    if preprocess in ("imagenet", "unit"):
        array = array / 255.0
        if channels == 3 and preprocess == "imagenet":
            array = (array - IMAGENET_MEAN) / IMAGENET_STD
    chw = np.asarray(array.transpose(2, 0, 1), dtype=np.float32, order="C")
    return np.repeat(chw[None], batch, axis=0)


def top_classes(array: np.ndarray, k: int, labels: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The k highest scores of the first row (classes along the last axis), with softmax probabilities."""
    if k < 1:
        raise EdgedynError("--print-top {}: expected K >= 1".format(k))
    row = np.asarray(array, dtype=np.float64).reshape(-1, array.shape[-1] if array.ndim else 1)[0]
    probabilities = np.exp(row - row.max())
    probabilities /= probabilities.sum()
    top = []
    for index in np.argsort(-row, kind="stable")[:k]:
        item = {"class": int(index), "score": float(row[index]), "probability": float(probabilities[index])}
        if labels is not None and index < len(labels):
            item["label"] = labels[index]
        top.append(item)
    return top


def _labels(path: Path) -> List[str]:
    if not path.is_file():
        raise EdgedynError("--labels {}: no such file".format(path), hint="one class name per line")
    return [line.strip() for line in path.read_text().splitlines()]


def _write_npz(named: Dict[str, np.ndarray], output: str) -> None:
    if output == STDOUT:
        buffer = io.BytesIO()
        np.savez(buffer, **named)
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.buffer.flush()
        return
    path = Path(output if output.endswith(".npz") else output + ".npz")  # numpy would add it silently
    np.savez(str(path), **named)
    err.print("wrote {} ({})".format(path, ", ".join(named)))
