"""ncnn files that keep some layers in fp32 inside an fp16 network, written so that ncnn computes them safely.

ncnn's per-layer feature mask (parameter 31; 3 turns fp16 arithmetic and fp16 storage off for that layer) runs one
layer in fp32 while the rest of the network stores and computes in fp16. But ncnn 1.0.20261020 converts a layer's
input to that layer's storage only under the layer's own options (net.cpp `convert_layout`), which the mask turned
off: a masked layer reading an fp16 layer's output reads fp16 data as fp32, and computes NaN or crashes the process
(SIGSEGV; timm's MobileNetV4 and torchvision's MobileNetV2 on the emulated Pi 5). The other direction is sound: an
fp16 layer reading an fp32 blob converts it. So a masked layer may read only blobs that are fp32 for certain: the
network's inputs, other masked layers' outputs, or the output of an unmasked Dropout of scale 1, an identity for
which ncnn has no fp16 kernel, so that ncnn converts its input to fp32 (packed four to a lane, ncnn's fast path)
whatever the rest computes in, and passes it on. `mark_fp32` writes such a Dropout before each masked layer that
reads an unmasked one; `mask_problem` finds any other use of a mask (the runtime's checker refuses the file: a
crafted mask would crash the process), and `entry_computes_fp32` asks the installed ncnn whether its Dropout still
has no fp16 kernel (the executor refuses a mixed file where it has one, rather than compute wrong).

Python 3.8 syntax and the standard library: the runtime checks these files on the board, and the export writes them.
"""
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set

FEATMASK = 31  # the layer parameter that holds its feature mask
FP32_MASK = 3  # bit 0: no fp16 arithmetic; bit 1: no fp16 storage (nor packed fp16)
ENTRY = "Dropout"  # the identity an fp32 region starts with (scale 1: parameter 0 absent or 1)
# The layers a probe may keep in fp32 (layer_probe.py): those that multiply and add, where fp16 arithmetic rounds.
PROBED = ("Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise", "InnerProduct", "Gemm",
          "MatMul", "MultiHeadAttention", "Convolution1D", "ConvolutionDepthWise1D")


def mark_fp32(param: str, names: Iterable[str]) -> str:
    """The .param text with the layers named in `names` computing in fp32 (`31=3`), each input they read from an
    fp16 layer passed through an entry Dropout first. Layers are listed in topological order, as ncnn requires."""
    lines = param.split("\n")
    if len(lines) < 2:
        raise ValueError("not an ncnn .param text")
    wanted = set(names)
    layers = [line.split() for line in lines[2:] if line.strip()]
    blobs = {blob for tokens in layers for blob in tokens[4:4 + int(tokens[2]) + int(tokens[3])]}
    layer_names = {tokens[1] for tokens in layers}
    fp32 = set()  # type: Set[str]
    entries = {}  # type: Dict[str, str]  # an fp16 blob -> the entry Dropout's fp32 output
    written = []  # type: List[List[str]]
    for tokens in layers:
        kind, name, bottom_count, top_count = tokens[0], tokens[1], int(tokens[2]), int(tokens[3])
        bottoms = tokens[4:4 + bottom_count]
        tops = tokens[4 + bottom_count:4 + bottom_count + top_count]
        params = [p for p in tokens[4 + bottom_count + top_count:] if p.split("=")[0] != str(FEATMASK)]
        scale = {int(k): float(v) for k, v in (p.split("=", 1) for p in params)} if kind == ENTRY else {}
        if kind == "Input" or name not in wanted and _is_entry(kind, scale, tops):
            fp32.update(tops)  # an input, or an entry written before (marking twice changes nothing)
        elif name in wanted:
            for index, blob in enumerate(bottoms):
                if blob in fp32:
                    continue
                if blob not in entries:
                    entries[blob] = _unused("{}_fp32".format(blob), blobs)
                    written.append([ENTRY, _unused("fp32_entry_{}".format(len(entries)), layer_names), "1", "1",
                                    blob, entries[blob]])
                bottoms[index] = entries[blob]
            params.append("{}={}".format(FEATMASK, FP32_MASK))
            fp32.update(tops)
        written.append([kind, name, str(bottom_count), str(top_count)] + bottoms + tops + params)
    layer_count, blob_count = (int(n) for n in lines[1].split())
    header = [lines[0], "{} {}".format(layer_count + len(entries), blob_count + len(entries))]
    return "\n".join(header + [" ".join(tokens) for tokens in written]) + "\n"


def _unused(name: str, taken: Set[str]) -> str:
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = "{}{}".format(name, number)
    taken.add(candidate)
    return candidate


def mask_problem(layers: Sequence[Any]) -> Optional[str]:
    """None when every feature mask of a parsed file (ncnn_param.Layer: type, name, bottoms, tops, params) is a
    masked layer that reads only fp32 blobs, as `mark_fp32` writes them; else what is wrong, in words."""
    fp32 = set()  # type: Set[str]
    for layer in layers:
        mask = layer.params.get(FEATMASK)
        if mask is None:
            if layer.type == "Input" or _is_entry(layer.type, layer.params, layer.tops):
                fp32.update(layer.tops)
            continue
        if mask != FP32_MASK:
            return "layer {!r} has feature mask {!r} (31={} is the only one: fp32 inside an fp16 network)".format(
                layer.name, mask, FP32_MASK)
        unsure = [blob for blob in layer.bottoms if blob not in fp32]
        if unsure:
            return ("layer {!r} computes in fp32 (31={}) but reads {!r}, which may be fp16: an fp32 layer reads the "
                    "inputs, other fp32 layers or a {} of scale 1 (ncnn would read fp16 as fp32)".format(
                        layer.name, FP32_MASK, unsure[0], ENTRY))
        fp32.update(layer.tops)
    return None


def _is_entry(kind: str, params: Dict[int, Any], tops: Sequence[str]) -> bool:
    """Whether an unmasked layer is an entry: a Dropout of scale 1 (parameter 0 absent or 1) with one output."""
    return kind == ENTRY and params.get(0, 1.0) in (1, 1.0) and len(tops) == 1


def probed_layers(layers: Sequence[Any]) -> List[str]:
    """The names of a parsed file's layers of PROBED, in order."""
    return [layer.name for layer in layers if layer.type in PROBED]


def masked(layers: Sequence[Any]) -> List[str]:
    """The names of a parsed file's layers that compute in fp32 inside an fp16 network."""
    return [layer.name for layer in layers if layer.params.get(FEATMASK) == FP32_MASK]


def entry_computes_fp32(ncnn: Any) -> bool:
    """Whether the installed ncnn has no fp16 kernel for the entry Dropout, so that it converts its input to fp32."""
    return not bool(ncnn.create_layer(ENTRY).support_fp16_storage)
