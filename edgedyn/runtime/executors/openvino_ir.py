"""Checks of an OpenVINO IR (model.xml + weights.bin) before OpenVINO reads it: the border where a bundle's bytes
become allocations.

OpenVINO trusts its IR: a Const layer's offset and size index the weights buffer, and every port's dims size a
tensor the CPU plugin allocates. A damaged or edited bundle could point outside the buffer or ask for terabytes.
So the XML is parsed here first (no DOCTYPE, so no entity expansion), each Const's slice is checked against the
weights' length and its own shape and element type, and the tensors the ports declare are summed against what the
manifest says one call needs. Standard library and numpy only, Python 3.8 syntax.

Shapes are static but for one thing: NonMaxSuppression returns as many rows as survive (`[-1, 3]`), and the few
layers that pad its rows to the bundle's fixed `max_det` see that dynamic length. A dim of -1 is accepted only on
NonMaxSuppression's outputs and on layers fed (through edges) by a port with a -1 dim; it counts as the most rows
any NonMaxSuppression of the IR can return (batch x classes x boxes, from its static inputs).
"""
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Optional

from edgedyn.runtime import schema
from edgedyn.runtime.errors import BundleError

IR_VERSIONS = ("10", "11")
MAX_LAYERS = 200000
MAX_XML_BYTES = 256 << 20
# Bytes per element of the element types an IR's Const and ports use; any other is refused.
ELEMENT_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u64": 8, "u32": 4,
                 "u16": 2, "u8": 1, "boolean": 1}
# Element types stored as sub-byte packs or strings: not in edgedyn's IRs (it writes float, integer and bool only).
REFUSED_TYPES = ("u1", "u4", "i4", "nf4", "f8e4m3", "f8e5m2", "string", "dynamic", "undefined")


def check_ir(xml: bytes, weights_bytes: int, declared: Optional[int], label: str) -> int:
    """Checks the IR described in the module docstring; returns the bytes its ports declare. BundleError on a
    problem, naming `label` (the bundle and member)."""
    if len(xml) > MAX_XML_BYTES:
        raise _bad(label, "the model XML is {} bytes, above {}".format(len(xml), MAX_XML_BYTES))
    head = xml[:4096].lower()
    if b"<!doctype" in head or b"<!entity" in xml.lower():
        raise _bad(label, "the model XML declares a DOCTYPE or entities; an OpenVINO IR has none")
    try:
        root = ElementTree.fromstring(xml)
    except (ElementTree.ParseError, ValueError) as error:
        raise _bad(label, "the model XML does not parse ({})".format(schema.short(str(error))))
    if root.tag != "net" or root.get("version") not in IR_VERSIONS:
        raise _bad(label, "expected an OpenVINO IR <net version=\"10|11\">, got <{} version={!r}>".format(
            schema.short(root.tag), schema.short(root.get("version"))))
    layers = root.find("layers")
    if layers is None:
        raise _bad(label, "the model XML has no <layers>")
    dynamic = _dynamic_layers(root, layers)
    rows = _most_nms_rows(layers, label)
    declared_total = values = 0
    for index, layer in enumerate(layers):
        if index >= MAX_LAYERS:
            raise _bad(label, "more than {} layers".format(MAX_LAYERS))
        where = "layer {} ({})".format(schema.short(layer.get("name"), 60), schema.short(layer.get("type"), 30))
        if layer.get("type") == "Const":
            values += _check_const(layer, weights_bytes, label, where)
        allowed = rows if layer.get("id") in dynamic else None
        for port in layer.findall("input/port"):
            _port_bytes(port, label, where, allowed)
        for port in layer.findall("output/port"):  # each tensor once: where it is made
            declared_total += _port_bytes(port, label, where, allowed)
    # Note: an int8 IR (NNCF's) keeps each weight as an i8 Const that Convert and Multiply layers turn back into f32
    # ports: up to 4 bytes declared per weight byte, twice, beside the i8 Const itself. Without the manifest's
    # count (the export's own check of a candidate), the activations are bounded by the weights as fp32 (4 bytes a
    # value): their bytes shrink 4x in an int8 IR and 2x in an fp16 one while the activations stay (YOLO11n at 640
    # in int8, its FakeQuantize outputs 85 of its 395 MB, was refused against 16x its i8 bytes).
    # Consts may share bytes, so the values count at most one per weight byte.
    fallback = 16 * 4 * min(max(values, weights_bytes // 4), weights_bytes)
    limit = 4 * (declared if declared is not None else fallback) + 12 * weights_bytes + (1 << 20)
    if declared_total > limit:
        raise _bad(label, "its layers declare tensors of {} bytes, far above the {} its manifest allows".format(
            declared_total, limit))
    return declared_total


def _check_const(layer: ElementTree.Element, weights_bytes: int, label: str, where: str) -> int:
    """Checks a Const layer's slice of the weights; returns how many values it holds."""
    data = layer.find("data")
    if data is None:
        raise _bad(label, "{}: a Const without <data>".format(where))
    element = data.get("element_type", "")
    offset, size = _integer(data.get("offset"), label, where + " offset"), _integer(data.get("size"), label,
                                                                                      where + " size")
    if offset + size > weights_bytes:
        raise _bad(label, "{}: bytes {}..{} lie outside the {}-byte weights".format(where, offset, offset + size,
                                                                                   weights_bytes))
    shape = [_integer(d, label, where + " shape") for d in (data.get("shape") or "").split(",") if d.strip()]
    if element not in ELEMENT_BYTES:
        raise _bad(label, "{}: element type {!r} is not one edgedyn writes".format(where, schema.short(element)))
    expected = ELEMENT_BYTES[element]
    for dim in shape:
        expected *= dim
    if expected != size:
        raise _bad(label, "{}: shape {} of {} takes {} bytes, but its size says {}".format(
            where, shape, element, expected, size))
    return size // ELEMENT_BYTES[element]


def _port_bytes(port: ElementTree.Element, label: str, where: str, dynamic: Optional[int] = None) -> int:
    """The bytes a port declares; a -1 dim (allowed where `dynamic` is given: see the module docstring) counts as
    `dynamic` rows."""
    dims = [_dim(d.text, label, where + " port dim", dynamic) for d in port.findall("dim")]
    if len(dims) > schema.MAX_RANK:
        raise _bad(label, "{}: a port of rank {}, above {}".format(where, len(dims), schema.MAX_RANK))
    element = port.get("precision", "FP32").lower()
    element = {"fp32": "f32", "fp16": "f16", "fp64": "f64", "bool": "boolean"}.get(element, element)
    if element in REFUSED_TYPES:
        raise _bad(label, "{}: a port of element type {!r}".format(where, element))
    total = ELEMENT_BYTES.get(element, 8)
    for dim in dims:
        total *= dim
    return total


def _dim(text: Optional[str], label: str, where: str, dynamic: Optional[int]) -> int:
    if dynamic is not None and _is_dynamic(text):
        return dynamic
    return _integer(text, label, where)


def _is_dynamic(text: Optional[str]) -> bool:
    return (text or "").strip() == "-1"


def _dynamic_layers(root: ElementTree.Element, layers: ElementTree.Element) -> set:
    """Ids of the layers whose ports may have a -1 dim: every NonMaxSuppression, and every layer an edge feeds from
    an output port with a -1 dim of such a layer (in topological order, as IRs list their layers)."""
    by_id = {layer.get("id"): layer for layer in layers}
    dynamic = {key for key, layer in by_id.items() if layer.get("type") == "NonMaxSuppression"}
    if not dynamic:
        return dynamic
    edges = root.find("edges")
    feeds = {}  # type: Dict[str, List[tuple]]
    for edge in (edges if edges is not None else []):
        feeds.setdefault(edge.get("to-layer") or "", []).append((edge.get("from-layer"), edge.get("from-port")))
    for key, layer in by_id.items():  # IR layers come in topological order: one pass reaches every successor
        for source, port_id in feeds.get(key, []):
            if source in dynamic and _has_dynamic_dim(by_id.get(source), port_id):
                dynamic.add(key)
                break
    return dynamic


def _has_dynamic_dim(layer: Optional[ElementTree.Element], port_id: Optional[str]) -> bool:
    if layer is None:
        return False
    for port in layer.findall("output/port"):
        if port.get("id") == port_id:
            return any(_is_dynamic(d.text) for d in port.findall("dim"))
    return False


def _most_nms_rows(layers: ElementTree.Element, label: str) -> int:
    """The most rows any NonMaxSuppression of the IR returns: batch x classes x boxes of its static score input."""
    most = 1
    for layer in layers:
        if layer.get("type") != "NonMaxSuppression":
            continue
        ports = layer.findall("input/port")
        scores = [_integer(d.text, label, "NonMaxSuppression scores dim") for d in ports[1].findall("dim")] \
            if len(ports) > 1 else []
        if len(scores) != 3:
            raise _bad(label, "layer {} (NonMaxSuppression): its scores are not [batch, classes, boxes]".format(
                schema.short(layer.get("name"), 60)))
        most = max(most, scores[0] * scores[1] * scores[2])
    return most


def _integer(text: Optional[str], label: str, where: str) -> int:
    try:
        value = int((text or "").strip())
    except ValueError:
        raise _bad(label, "{}: expected a whole number, got {!r}".format(where, schema.short(text)))
    if value < 0:
        raise _bad(label, "{}: {} is negative (edgedyn's IRs have static shapes)".format(where, value))
    return value


def _bad(label: str, what: str) -> BundleError:
    return BundleError("{} is not a valid OpenVINO IR: {}".format(label, what), hint=schema.HINT)


def outputs_in_order(names: List[str], described: Dict[str, int]) -> List[int]:
    """Indices of `names` among a compiled model's outputs (`described`: name -> index); BundleError when one is
    missing."""
    missing = [name for name in names if name not in described]
    if missing:
        raise BundleError("the OpenVINO model has no output(s) {}; it has {}".format(
            schema.bounded(missing), schema.bounded(sorted(described))), hint=schema.HINT)
    return [described[name] for name in names]
