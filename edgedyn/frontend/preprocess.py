"""`export --preprocess`: the bundle takes camera frames and does its own resize and scaling (runtime/frames.py).

The option is a comma-separated list: first how the frame is resized, `letterbox` (YOLO: aspect kept, padded) or
`stretch` (torchvision detectors, classifiers), optionally with the model's size (`letterbox=640`, checked against
the captured input); then any of `normalize=unit|imagenet|none` (default unit: pixel / 255), `order=rgb|bgr`
(the frames' channel order, default rgb), `pad=0..255` (letterbox's grey, default 114), `max=WIDTHxHEIGHT` (the
largest frame accepted, default 4096x4096) and `input=NAME` (default: the model's only 1x3xHxW float input).
"""
from typing import Any, Dict, List, Optional, Tuple

from edgedyn.errors import EdgedynError
from edgedyn.runtime.frames import DEFAULT_MAX_FRAME, DEFAULT_PAD, MAX_SIDE, NORMALIZE, ORDERS, RESIZES

SYNTAX = "--preprocess letterbox[=SIZE][,normalize=unit|imagenet|none][,order=rgb|bgr][,pad=N][,max=WxH][,input=NAME]"
EXAMPLES = "e.g. --preprocess letterbox (YOLO) or --preprocess stretch,normalize=imagenet (a classifier)"


def parse_preprocess(text: Any) -> Optional[Dict[str, Any]]:
    """The options in `text` (or a dict of them), checked and with defaults filled; None for no pre-processing."""
    if text is None or text == "":
        return None
    items = dict(text) if isinstance(text, dict) else _items(str(text))
    resize = [key for key in items if key in RESIZES]
    if len(resize) != 1:
        raise _error("name one resize first, letterbox or stretch (got {})".format(", ".join(items) or "nothing"))
    options = {"resize": resize[0], "size": _size(items.pop(resize[0]), resize[0]), "input": items.pop("input", None),
               "normalize": _choice(items.pop("normalize", "unit"), "normalize", NORMALIZE),
               "order": _choice(items.pop("order", "rgb"), "order", ORDERS),
               "pad": _integer(items.pop("pad", DEFAULT_PAD), "pad", 0, 255),
               "max_frame": _frame(items.pop("max", None))}
    if items:
        raise _error("unknown option{} {}".format("s" if len(items) > 1 else "", ", ".join(sorted(items))))
    return options


def preprocess_record(options: Dict[str, Any], signature: List[Dict[str, Any]],
                      shapes: List[Dict[str, Tuple[Tuple[int, ...], str]]]) -> Dict[str, Any]:
    """The manifest's `preprocess` record for a model whose tensor inputs have, per specialization, `shapes`
    ({name: (shape, dtype)}): the image input resolved and its size taken from (and checked against) the model."""
    tensors = [p["name"] for p in signature if p.get("kind") == "tensor"]
    images = [n for n in tensors if all(_is_image(s.get(n)) for s in shapes)]
    name = options["input"]
    if name is None:
        if len(images) != 1:
            raise _error("the model has {} inputs of shape 1x3xHxW (float32): {}".format(
                len(images), ", ".join(images) or "none"), "name the image with input=NAME" if images else
                "--preprocess needs one image input of batch 1 and 3 channels")
        name = images[0]
    if name not in tensors:
        raise _error("input={}: the model's tensor inputs are {}".format(name, ", ".join(tensors)))
    sizes = {tuple(s[name][0][2:]) for s in shapes if name in s}
    if name not in images or len(sizes) != 1:
        raise _error("input {} has shape{} {}: frames become one 1x3xHxW float32 tensor".format(
            name, "s" if len(shapes) > 1 else "", " and ".join(sorted({_shape(s[name]) for s in shapes}))),
            "export {} at one size, e.g. --input {}=1x3x640x640".format(name, name))
    (size,) = sizes
    if options["size"] is not None and tuple(options["size"]) != size:
        raise _error("{}={} but the model's input {} is 1x3x{}x{}".format(
            options["resize"], "x".join(map(str, options["size"])), name, size[0], size[1]),
            "export at that size (--input {}=1x3x{s}x{s}) or leave the size out".format(name, s=options["size"][0]))
    return {"input": name, "resize": options["resize"], "size": [int(size[0]), int(size[1])], "pad": options["pad"],
            "normalize": options["normalize"], "order": options["order"], "max_frame": options["max_frame"]}


def _items(text: str) -> Dict[str, Optional[str]]:
    items = {}  # type: Dict[str, Optional[str]]
    for part in text.split(","):
        key, equals, value = part.strip().partition("=")
        if not key or key in items:
            raise _error("'{}' is empty or repeated".format(part.strip()))
        items[key] = value.strip() if equals else None
    return items


def _size(value: Optional[str], resize: str) -> Optional[List[int]]:
    if value is None:
        return None
    if value.isdigit():
        return [_integer(value, resize, 1, MAX_SIDE)] * 2
    height, _, width = value.partition("x")
    return [_integer(height, resize, 1, MAX_SIDE), _integer(width, resize, 1, MAX_SIDE)]


def _frame(value: Optional[str]) -> List[int]:
    """max=WIDTHxHEIGHT (as camera resolutions are written), stored as [height, width]."""
    if value is None:
        return list(DEFAULT_MAX_FRAME)
    width, cross, height = value.partition("x")
    if not cross:
        raise _error("max={}: expected WIDTHxHEIGHT, e.g. max=1920x1080".format(value))
    return [_integer(height, "max", 1, MAX_SIDE), _integer(width, "max", 1, MAX_SIDE)]


def _choice(value: Optional[str], key: str, choices: Tuple[str, ...]) -> str:
    if value not in choices:
        raise _error("{}={}: choose from {}".format(key, value, ", ".join(choices)))
    return str(value)


def _integer(value: Any, key: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _error("{}={}: expected a whole number from {} to {}".format(key, value, low, high))
    if not low <= number <= high:
        raise _error("{}={}: expected a whole number from {} to {}".format(key, value, low, high))
    return number


def _is_image(entry: Optional[Tuple[Tuple[int, ...], str]]) -> bool:
    return entry is not None and len(entry[0]) == 4 and tuple(entry[0][:2]) == (1, 3) and entry[1] == "float32"


def _shape(entry: Tuple[Tuple[int, ...], str]) -> str:
    return "{}:{}".format("x".join(map(str, entry[0])), entry[1])


def _error(what: str, hint: str = EXAMPLES) -> EdgedynError:
    return EdgedynError("--preprocess: {}".format(what), hint="{} ({})".format(hint, SYNTAX) if hint == EXAMPLES
                        else hint)
