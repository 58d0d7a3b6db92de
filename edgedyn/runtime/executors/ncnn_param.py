"""Checks of an ncnn model (model.param text + weights.bin) before ncnn parses it: the border where a bundle's bytes
become allocations.

ncnn trusts its files. `Net::load_param` sizes its layer and blob tables from the header and writes past them when
the lines hold more; it allocates any array length a parameter states; a layer whose parameters divide by zero
(an InnerProduct with no outputs, a pooling stride of 0) stops the process. `Net::load_model` reads each layer's
weights from the .bin in an order and size the parameters alone decide, allocating before it reads. And at run time
no layer checks its parameters against its input: a kernel wider than the padded input, weights for other channels
or an axis the blob lacks read and write outside their buffers (seen here: a tampered kernel size or pad crashed
the process). So, before ncnn sees a byte:
- the text is parsed strictly (printable ASCII, the tokens ncnn's scanner reads whole, numbers only, no string
  parameters and no shape hints) against an allow-list of the float layers edgedyn's files use, a feature mask
  only where ncnn computes it safely (ncnn_mixed.py);
- each layer's weights are walked through the .bin with ncnn's own rules (a 4-byte tag before tagged arrays: 0 for
  fp32, the fp16 tag): every array inside the file, and the file ending where the last one does;
- every blob's shape is inferred from the inputs' as ncnn computes it, each layer's parameters checked against the
  shapes it receives (ncnn_shapes.py), and all blobs together bounded by what the manifest says a call takes.
Standard library only, Python 3.8 syntax.
"""
import re
import struct
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError
from edgedyn.runtime.executors import ncnn_attention, ncnn_channels, ncnn_gemm, ncnn_mixed
from edgedyn.runtime.executors.ncnn_shapes import RULES as SHAPE_RULES, Shape, ShapeError, need, slice_

MAGIC = 7767517
MAX_PARAM_BYTES = 32 << 20
MAX_LAYERS = 100000
MAX_BLOBS = 200000
MAX_LINKS = 64  # bottoms or tops of one layer
MAX_TOKEN = 255  # ncnn scans names with %255s
MAX_VALUE = 15  # and each parameter value with %15[^,\n ]
PARAM_IDS = 32  # NCNN_MAX_PARAM_COUNT
SHAPE_HINTS = 30  # top-blob shape hints: edgedyn's files carry none, and ncnn reads them without a bound
# A layer's feature mask: only 31=3 (fp32 inside an fp16 network), and only where ncnn computes it safely
# (ncnn_mixed.py `mask_problem`: any other use computes NaN or crashes ncnn).
FEATMASK = ncnn_mixed.FEATMASK
MAX_ARRAY = 4096
MAX_INT = 1 << 24  # any integer parameter: dims, axes, counts (weight sizes are checked against the .bin instead)
FP32_TAG, FP16_TAG = 0, 0x01306B47  # the tags ncnn's ModelBin reads before a tagged array, in edgedyn's files

Value = Union[int, float, Tuple[Union[int, float], ...]]
Params = Dict[int, Value]


class Layer(NamedTuple):
    type: str
    name: str
    bottoms: Tuple[str, ...]
    tops: Tuple[str, ...]
    params: Params


# Note: the layers an edgedyn ncnn file may hold: those with a shape rule (ncnn_shapes.py, ncnn_channels.py), each
# with how its weights lie in the .bin: a function of its parameters giving (element count, tagged) per array, in
# ncnn's load_model order.
Weights = Callable[[Callable[[int, int], int]], List[Tuple[int, bool]]]
RULES = dict(SHAPE_RULES, **ncnn_channels.RULES, **ncnn_gemm.RULES, **ncnn_attention.RULES)


def _conv(dynamic: int) -> Weights:
    """The convolution family: weights (tagged) unless they come from a second input, then the bias."""
    return lambda p: [] if p(dynamic, 0) else [(p(6, 0), True)] + ([(p(0, 0), False)] if p(5, 0) else [])


def _memory(p: Callable[[int, int], int]) -> List[Tuple[int, bool]]:
    w, h, d, c = p(0, 0), p(1, 0), p(11, 0), p(2, 0)
    dims = [w, h, d, c] if d else [w, h, c] if c else [w, h] if h else [w] if w else []
    count = 1
    for dim in dims:
        count *= dim
    return [(count, p(21, 1) == 0)] if dims else []


WALKED = ("Input", "Split", "Slice")  # shaped by the walk in check_shapes itself
WEIGHTS = dict({name: (lambda p: []) for name in tuple(RULES) + WALKED}, **{
    "Convolution": _conv(19), "Convolution1D": _conv(19), "ConvolutionDepthWise": _conv(19),
    "ConvolutionDepthWise1D": _conv(19), "Deconvolution": _conv(28), "DeconvolutionDepthWise": _conv(28),
    "InnerProduct": lambda p: [(p(2, 0), True)] + ([(p(0, 0), False)] if p(1, 0) else []),
    "LayerNorm": lambda p: [(p(0, 0), False)] * 2 if p(2, 1) else [],
    "MemoryData": _memory,
    "Padding": lambda p: [(p(6, 0), False)] if p(6, 0) else [],
}, **ncnn_channels.WEIGHTS, **ncnn_gemm.WEIGHTS, **ncnn_attention.WEIGHTS)  # type: Dict[str, Weights]

# Parameters ncnn divides by, or sizes loops with, that must be at least 1 when given: (id, default) per layer.
_CONV = ((0, 0), (1, 0), (2, 1), (3, 1), (11, 1), (12, 1), (13, 1))
CONVOLUTIONS = tuple(name for name in WEIGHTS if "onvolution" in name)
POSITIVE = dict({name: _CONV + (((7, 1),) if "DepthWise" in name else ()) for name in CONVOLUTIONS}, **{
    "Pooling": ((2, 1), (12, 1)), "InnerProduct": ((0, 0),), "PixelShuffle": ((0, 1),),
})  # type: Dict[str, Tuple[Tuple[int, int], ...]]
# Parameters that make a layer integer-valued (int8 scales): edgedyn's files are float.
INT8_PARAMS = {"Convolution": 8, "ConvolutionDepthWise": 8, "InnerProduct": 8, "Gemm": 18,
               "MultiHeadAttention": 18}
# The parameter holding a layer's weight count, which the .bin bounds (MAX_INT does not apply to it).
WEIGHT_SIZE = dict({name: 6 for name in CONVOLUTIONS}, InnerProduct=2)
# What a layer's parameters and shapes may make: the manifest's estimate of one call's tensors (every intermediate,
# unplanned, in bytes) with room; without one, a fixed bound.
SHAPE_SLACK = 4
UNDECLARED_LIMIT = 1 << 30

_NAME = re.compile(r"[A-Za-z0-9_.:/\-]+\Z")
_INT = re.compile(r"-?\d+\Z")
_FLOAT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\Z")


def check_model(param: bytes, weights: bytes, label: str, inputs: Dict[str, Shape],
                declared: Optional[int] = None) -> List[Layer]:
    """The layers of an ncnn model whose text, weights and shapes (from `inputs`, each blob name's per-item shape)
    pass the checks in the module docstring; BundleError naming `label` (the bundle and member) otherwise.
    `declared`: the bytes the manifest says one call's tensors take (bounds what the layers may make)."""
    layers = parse_param(param, label)
    check_weights(layers, weights, label)
    limit = SHAPE_SLACK * (declared + len(weights)) + (16 << 20) if declared is not None else max(
        UNDECLARED_LIMIT, SHAPE_SLACK * len(weights))
    check_shapes(layers, inputs, limit, label)
    return layers


def parse_param(param: bytes, label: str) -> List[Layer]:
    if len(param) > MAX_PARAM_BYTES:
        raise _bad(label, "the .param text is {} bytes, above {}".format(len(param), MAX_PARAM_BYTES))
    if any(byte > 126 or (byte < 32 and byte not in (9, 10, 13)) for byte in param):
        raise _bad(label, "the .param text holds bytes other than printable ASCII")
    lines = [line.split() for line in param.decode("ascii").splitlines() if line.strip()]
    if not lines or lines[0] != [str(MAGIC)]:
        raise _bad(label, "expected the ncnn magic number {} on the first line".format(MAGIC))
    if len(lines) < 2 or len(lines[1]) != 2 or not all(_INT.match(t) for t in lines[1]):
        raise _bad(label, "expected 'LAYERS BLOBS' on the second line")
    count, blobs = int(lines[1][0]), int(lines[1][1])
    if not (0 < count <= MAX_LAYERS and 0 < blobs <= MAX_BLOBS):
        raise _bad(label, "{} layers and {} blobs: expected 1-{} and 1-{}".format(count, blobs, MAX_LAYERS,
                                                                                    MAX_BLOBS))
    if len(lines) - 2 != count:
        raise _bad(label, "the header says {} layers, the text has {}".format(count, len(lines) - 2))
    made = {}  # type: Dict[str, int]
    layers = []
    for index, tokens in enumerate(lines[2:]):
        layer = _layer(tokens, index, label)
        missing = [b for b in layer.bottoms if b not in made]
        if missing:
            raise _bad(label, "layer {} ({}) reads blob {} before any layer makes it".format(
                index, layer.name, schema.short(missing[0], 60)))
        for top in layer.tops:
            if top in made:
                raise _bad(label, "layer {} ({}) makes blob {} again".format(index, layer.name, top))
            made[top] = index
        layers.append(layer)
    if len(made) != blobs:
        raise _bad(label, "the header says {} blobs, the layers make {}".format(blobs, len(made)))
    problem = ncnn_mixed.mask_problem(layers)
    if problem:
        raise _bad(label, problem)
    return layers


def _layer(tokens: List[str], index: int, label: str) -> Layer:
    where = "layer {}".format(index)
    if len(tokens) < 4 or not (_INT.match(tokens[2]) and _INT.match(tokens[3])):
        raise _bad(label, "{}: expected 'TYPE NAME BOTTOMS TOPS ...'".format(where))
    kind, name, bottoms, tops = tokens[0], tokens[1], int(tokens[2]), int(tokens[3])
    if kind not in WEIGHTS:
        raise _bad(label, "{}: layer type {!r} is not one edgedyn's ncnn files use".format(
            where, schema.short(kind, 60)))
    for token in tokens[1:4 + bottoms + tops] if 0 <= bottoms + tops <= 2 * MAX_LINKS else tokens[1:2]:
        if len(token) > MAX_TOKEN or not _NAME.match(token):
            raise _bad(label, "{}: name {!r} is not 1-{} of [A-Za-z0-9_.:/-]".format(where, schema.short(token, 60),
                                                                                    MAX_TOKEN))
    where = "layer {} ({} {})".format(index, kind, name)
    if not (0 <= bottoms <= MAX_LINKS and 0 <= tops <= MAX_LINKS) or len(tokens) < 4 + bottoms + tops:
        raise _bad(label, "{}: {} inputs and {} outputs (at most {} each, all named)".format(
            where, bottoms, tops, MAX_LINKS))
    sources = kind in ("Input", "MemoryData")
    if sources and (bottoms, tops) != (0, 1) or not sources and (bottoms == 0 or tops == 0):
        raise _bad(label, "{}: {} inputs and {} outputs".format(where, bottoms, tops))
    params = _params(tokens[4 + bottoms + tops:], label, where)
    layer = Layer(kind, name, tuple(tokens[4:4 + bottoms]), tuple(tokens[4 + bottoms:4 + bottoms + tops]), params)
    _check_values(layer, label, where)
    return layer


def _params(tokens: Sequence[str], label: str, where: str) -> Params:
    params = {}  # type: Params
    for token in tokens:
        key, _, text = token.partition("=")
        if not _INT.match(key) or not text:
            raise _bad(label, "{}: parameter {!r} is not ID=VALUE".format(where, schema.short(token, 40)))
        number = int(key)
        array = number <= -23300
        number = -number - 23300 if array else number
        if not 0 <= number < PARAM_IDS or number == SHAPE_HINTS or array and number == FEATMASK or number in params:
            raise _bad(label, "{}: parameter id {} (ids are 0-{}, each once; no shape hints)".format(
                where, key, PARAM_IDS - 1))
        values = [_number(v, label, where) for v in text.split(",")]
        if array:
            if not isinstance(values[0], int) or values[0] != len(values) - 1:
                raise _bad(label, "{}: array {} says {} items and holds {}".format(where, key, values[0],
                                                                                 len(values) - 1))
            values = values[1:]
        if len(values) > MAX_ARRAY:
            raise _bad(label, "{}: array {} of {} items, above {}".format(where, key, len(values), MAX_ARRAY))
        params[number] = tuple(values) if array or len(values) > 1 else values[0]
    return params


def _number(text: str, label: str, where: str) -> Union[int, float]:
    if len(text) <= MAX_VALUE and _INT.match(text):
        return int(text)
    if len(text) <= MAX_VALUE and _FLOAT.match(text):
        return float(text)
    raise _bad(label, "{}: value {!r} is not a number of at most {} characters".format(
        where, schema.short(text, 40), MAX_VALUE))


def _check_values(layer: Layer, label: str, where: str) -> None:
    weighted = {WEIGHT_SIZE.get(layer.type, -1)}
    for key, value in layer.params.items():
        items = value if isinstance(value, tuple) else (value,)
        if key not in weighted and any(isinstance(v, int) and abs(v) > MAX_INT for v in items):
            raise _bad(label, "{}: parameter {} = {} is beyond +-{}".format(where, key, schema.short(value, 40),
                                                                            MAX_INT))
    get = _getter(layer.params)
    for key, default in POSITIVE.get(layer.type, ()):
        if get(key, default) < 1:
            raise _bad(label, "{}: parameter {} must be at least 1, got {}".format(where, key, layer.params[key]))
    if layer.type in INT8_PARAMS and get(INT8_PARAMS[layer.type], 0) != 0:
        raise _bad(label, "{}: an int8 layer; edgedyn's ncnn files are float".format(where))


def _getter(params: Params) -> Callable[[int, int], int]:
    def get(key: int, default: int) -> int:
        value = params.get(key, default)
        return value if isinstance(value, int) else -1  # a float or an array where a count belongs: refused
    return get


def check_weights(layers: List[Layer], weights: bytes, label: str) -> int:
    """Walks every layer's arrays through `weights` as ncnn's load_model will; returns the bytes they hold."""
    offset = 0
    for index, layer in enumerate(layers):
        for count, tagged in WEIGHTS[layer.type](_getter(layer.params)):
            where = "layer {} ({} {})".format(index, layer.type, layer.name)
            if count < 0:
                raise _bad(label, "{}: a weight array of {} items".format(where, count))
            size = 4 * count
            if tagged:
                if offset + 4 > len(weights):
                    raise _bad(label, "{}: its weights start at byte {}, past the {}-byte .bin".format(
                        where, offset, len(weights)))
                (tag,) = struct.unpack_from("<I", weights, offset)
                if tag not in (FP32_TAG, FP16_TAG):
                    raise _bad(label, "{}: weights tagged {:#x} at byte {}; edgedyn writes fp32 (0) or fp16 "
                                      "({:#x})".format(where, tag, offset, FP16_TAG))
                offset += 4
                size = size if tag == FP32_TAG else (2 * count + 3) // 4 * 4
            if offset + size > len(weights):
                raise _bad(label, "{}: {} weights at bytes {}..{} lie outside the {}-byte .bin".format(
                    where, count, offset, offset + size, len(weights)))
            offset += size
    if offset != len(weights):
        raise _bad(label, "the layers read {} bytes of weights, the .bin holds {}".format(offset, len(weights)))
    return offset


def check_shapes(layers: List[Layer], inputs: Dict[str, Shape], limit: int, label: str) -> Dict[str, Shape]:
    """Every blob's shape, each layer's parameters checked against the shapes it receives (ncnn_shapes.py); the
    bytes of all blobs together at most `limit`."""
    shapes = {}  # type: Dict[str, Shape]
    total = 0
    for index, layer in enumerate(layers):
        where = "layer {} ({} {})".format(index, layer.type, layer.name)
        received = [shapes[name] for name in layer.bottoms]
        try:
            made = _made(layer, received, inputs)
            need(len(made) == len(layer.tops), "{} outputs for {} tops".format(len(made), len(layer.tops)))
        except ShapeError as error:
            raise _bad(label, "{}: {} (inputs {})".format(where, error, [list(s) for s in received]))
        except ValueError:  # a rule unpacking more or fewer inputs than the layer has
            raise _bad(label, "{}: {} inputs, which this layer does not take".format(where, len(received)))
        for top, shape in zip(layer.tops, made):
            size = 4
            for dim in shape:
                size *= dim
            if not 1 <= len(shape) <= 4 or min(shape) < 1:
                raise _bad(label, "{}: makes a blob of shape {}".format(where, list(shape)))
            shapes[top] = shape
            total += size
        if total > limit:
            raise _bad(label, "{}: its blobs take {} bytes by now, above the {} the manifest allows".format(
                where, total, limit))
    return shapes


def _made(layer: Layer, received: List[Shape], inputs: Dict[str, Shape]) -> List[Shape]:
    get = _getter(layer.params)
    if layer.type == "Input":
        need(layer.tops[0] in inputs, "an input the manifest does not name")
        return [inputs[layer.tops[0]]]
    if layer.type == "Split":
        (shape,) = received
        return [shape] * len(layer.tops)
    if layer.type == "Slice":
        return slice_(received, get, layer.params, len(layer.tops))
    return RULES[layer.type](received, get, layer.params)


def _bad(label: str, what: str) -> BundleError:
    return BundleError("{} is not a valid ncnn model: {}".format(label, what), hint=schema.HINT)
