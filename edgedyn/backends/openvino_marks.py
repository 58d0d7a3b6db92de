"""OpenVINO IRs edited at export: the computing layers cut into the groups a mixed artifact may keep in fp32, the
first of them marked to stay fp32 (a bf16/fp16 artifact that misses its gate, an int8 one's float prefix), and a
model written out as IR bytes. Used by the openvino backend (backends/openvino.py), its int8 (openvino_int8.py) and
benchmarks/mixed_layers.py.
"""
import tempfile
from pathlib import Path
from typing import Any, List, Tuple


# The layers a mixed artifact counts and marks: what computes (not the weights, the inputs and outputs, or the
# Converts that decompress weights).
NOT_COMPUTING = ("Const", "Parameter", "Result", "Convert")
# The marked layers end just before one of these: the CPU plugin fuses a convolution with the adds and activation
# after it, and refuses to compile ("object is not initialized") a fused group that is part f32, part bf16
# (DeepLabV3-MobileNetV3: every cut between a convolution and its residual add failed, none before a convolution).
GROUP_STARTS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData", "MatMul")
# OpenVINO's runtime attribute that keeps a layer in its original precision (the CPU plugin leaves a layer that may
# not be converted to f16 in f32 under a bf16 or f16 inference precision): from any element type to f16.
KEEP_FP32 = ("DisablePrecisionConversion", "0", "dynamic:f16")


def keep_first_layers_fp32(xml: bytes, share: float) -> Tuple[bytes, int, int]:
    """(the IR with its first `share` of computing layers marked to stay fp32, up to the next convolution or matrix
    product, how many were marked, how many compute). An IR lists its layers in topological order: the first ones
    are those nearest the inputs, where a reduced precision's rounding has the whole network to grow through
    (DeepLabV3-MobileNetV3 in bf16: cosine 0.9969 to torch with every layer bf16, 0.9991 with the first tenth fp32,
    0.9998 with half; benchmarks/mixed_layers.py measures each convolution group alone)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.fromstring(xml)
    layers, total = first_layers(root, share)
    mark_fp32(layers)
    return ElementTree.tostring(root, encoding="utf-8"), len(layers), total


def first_layers(root: Any, share: float) -> Tuple[List[Any], int]:
    """(the first `share` of a parsed IR's computing layers, extended up to the next layer of GROUP_STARTS, how many
    layers compute): the prefix a mixed artifact keeps out of its reduced precision or out of int8."""
    import math

    computing = [layer for group in computing_groups(root) for layer in group]
    count = min(len(computing), int(math.ceil(share * len(computing))))
    while 0 < count < len(computing) and computing[count].get("type") not in GROUP_STARTS:
        count += 1
    return computing[:count], len(computing)


def mark_named_fp32(xml: bytes, names: Any) -> bytes:
    """The IR with the layers named in `names` marked to stay fp32 (an int8 IR's float prefix: NNCF keeps the
    names of the layers it leaves alone)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.fromstring(xml)
    mark_fp32([layer for layer in root.iter("layer") if layer.get("name") in names])
    return ElementTree.tostring(root, encoding="utf-8")


def serialized(openvino: Any, model: Any, compress: bool = False) -> Tuple[bytes, bytes]:
    """(model.xml, weights.bin) of an OpenVINO model, weights in fp16 when `compress`."""
    with tempfile.TemporaryDirectory(prefix="edgedyn-openvino-") as workdir:
        xml = Path(workdir) / "model.xml"
        openvino.save_model(model, str(xml), compress_to_fp16=compress)
        return xml.read_bytes(), xml.with_suffix(".bin").read_bytes()


def computing_groups(root: Any) -> List[List[Any]]:
    """The computing layers of a parsed IR in order, cut before each layer of GROUP_STARTS: the units a mixed
    artifact may keep in fp32 (the first group also holds whatever computes before the first convolution)."""
    groups = []  # type: List[List[Any]]
    for layer in root.iter("layer"):
        if layer.get("type") in NOT_COMPUTING:
            continue
        if not groups or layer.get("type") in GROUP_STARTS:
            groups.append([])
        groups[-1].append(layer)
    return groups


def mark_fp32(layers: List[Any]) -> None:
    """Marks each layer (an IR's <layer> element) with KEEP_FP32, beside any runtime attributes it has."""
    import xml.etree.ElementTree as ElementTree

    name, version, value = KEEP_FP32
    for layer in layers:
        info = layer.find("rt_info")
        if info is None:
            info = ElementTree.Element("rt_info")
            layer.insert(0, info)
        ElementTree.SubElement(info, "attribute", {"name": name, "version": version, "value": value})
