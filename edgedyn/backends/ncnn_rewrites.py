"""Rewrites of the .param text pnnx writes, into the layers ncnn runs fastest: what pnnx from a torch module writes
for the same computation, where pnnx from edgedyn's ONNX model writes something slower. Each takes the text and
returns it unchanged when nothing matches; the backend checks the result (edgedyn's checker, then torch eager)."""
from typing import Any, Dict, List, Tuple

from edgedyn.runtime.executors.ncnn_param import Layer, check_shapes, parse_param
from edgedyn.runtime.executors.ncnn_shapes import ELEMENTWISE

LABEL = "the ncnn model pnnx wrote"


def fuse_swish(param: bytes) -> bytes:
    """The .param text with every x * sigmoid(x) that pnnx left in three layers (Split, Sigmoid, BinaryOp multiply)
    as one Swish layer: one pass over the tensor instead of three. pnnx fuses SiLU when each call site has its own
    module, and leaves the decomposed form where one SiLU module is called at several places (ultralytics' Conv
    shares one `default_act` among all its layers: 11 of YOLO11n's 77). The rewrite needs the Split's two copies
    and the sigmoid's result to have no other reader; anything else stays as it is."""
    lines = param.decode("ascii").splitlines()
    rows = [line.split() for line in lines[2:] if line.strip()]
    readers = {}  # type: Dict[str, List[int]]
    for index, row in enumerate(rows):
        for blob in row[4:4 + int(row[2])]:
            readers.setdefault(blob, []).append(index)
    gone, replaced = set(), {}  # type: Any, Dict[int, List[str]]
    for index, row in enumerate(rows):
        if row[0] != "Split" or row[2:4] != ["1", "2"]:
            continue
        source, copies = row[4], row[5:7]
        users = [readers.get(blob, []) for blob in copies]
        if any(len(u) != 1 for u in users):
            continue
        for at, by, straight in ((users[0][0], users[1][0], copies[1]), (users[1][0], users[0][0], copies[0])):
            sigmoid, product = rows[at], rows[by]
            if sigmoid[0] != "Sigmoid" or len(sigmoid) != 6 or product[0] != "BinaryOp" or product[2:4] != ["2", "1"]:
                continue
            if product[7:] != ["0=2"] or sorted(product[4:6]) != sorted([straight, sigmoid[5]]):
                continue
            if readers.get(sigmoid[5], []) != [by]:
                continue
            gone.update({index, at})
            replaced[by] = ["Swish", sigmoid[1] + "_swish", "1", "1", source, product[6]]
            break
    if not replaced:
        return param
    kept = [replaced.get(i, row) for i, row in enumerate(rows) if i not in gone]
    layers, blobs = (int(v) for v in lines[1].split())
    header = "{} {}".format(layers - 2 * len(replaced), blobs - 3 * len(replaced))
    return "\n".join([lines[0], header] + [" ".join(row) for row in kept] + [""]).encode("ascii")


def fuse_global_pooling(param: bytes, inputs: Dict[str, Tuple[int, ...]]) -> bytes:
    """The .param text with every mean over both spatial axes of a (c, h, w) blob (a Reduction, which pnnx writes
    for the ONNX ReduceMean of a global average pool or a squeeze-excite block) as ncnn's global average Pooling.
    ncnn's Reduction takes no packed layout and no fp16 storage: ncnn unpacks the whole feature map for it (and casts
    it to fp32) before reducing, where Pooling reads it packed (pnnx from the torch module writes Pooling for
    `AdaptiveAvgPool2d(1)`; ResNet-18 counted 0.1% more instructions per call on the emulated Pi 5 with Reduction).
    Pooling makes a 1-d blob (c): a Reduction that dropped the axes becomes Pooling; one that kept them, read only by
    a Reshape to (c), becomes Pooling in place of both; any other becomes Pooling and a Reshape to (c, 1, 1).
    `inputs`: each input blob's per-item shape (the ranks decide which axes are h and w)."""
    layers, shapes, readers = _walked(param, inputs)
    taken = set(shapes)
    gone, replaced = set(), {}  # type: Any, Dict[int, List[List[str]]]
    for index, layer in enumerate(layers):
        if layer.type != "Reduction" or len(layer.bottoms) != 1 or len(shapes[layer.bottoms[0]]) != 3:
            continue
        axes = layer.params.get(3, ())
        axes = axes if isinstance(axes, tuple) else (axes,)
        params = layer.params
        if params.get(0) != 3 or params.get(1, 1) != 0 or params.get(5) != 1 or sorted(axes) != [1, 2] or set(
                params) - {0, 1, 3, 4, 5}:
            continue
        source, made = layer.bottoms[0], layer.tops[0]
        pooling = ["Pooling", layer.name, "1", "1", source, made, "0=1", "4=1"]
        if not params.get(4, 0):
            replaced[index] = [pooling]
            continue
        users = readers.get(made, [])
        if len(users) == 1 and layers[users[0]].type == "Reshape" and len(shapes[layers[users[0]].tops[0]]) == 1:
            gone.add(index)
            replaced[users[0]] = [pooling[:5] + [layers[users[0]].tops[0]] + pooling[6:]]
            continue
        pooled = _fresh(made + "_gap", taken)
        replaced[index] = [pooling[:5] + [pooled] + pooling[6:],
                           ["Reshape", layer.name + "_keepdims", "1", "1", pooled, made, "0=1", "1=1", "2=-1"]]
    return _rewritten(param, gone, replaced, _rows(param))


# A Convolution that is a matrix product on a (c, 1, 1) blob: kernel, dilation and stride 1, no pads, float weights
# in the file. Its parameters as InnerProduct's (outputs, bias, weight count, activation and its parameters).
POINTWISE_ONES, POINTWISE_ZEROS = (1, 11, 2, 12, 3, 13), (4, 14, 15, 16, 8, 19)
AS_INNER_PRODUCT = {0: 0, 5: 1, 6: 2, 9: 9, 10: 10}
POINTWISE_KEYS = set(POINTWISE_ONES + POINTWISE_ZEROS + (18,)) | set(AS_INNER_PRODUCT)


def fuse_pooled_convolutions(param: bytes, inputs: Dict[str, Tuple[int, ...]]) -> bytes:
    """The .param text with the 1x1 convolutions on a pooled vector (a squeeze-excite block's two, the image
    pooling branch of DeepLabV3's ASPP) as ncnn's InnerProduct on the (c) blob that global Pooling makes. The ONNX
    model keeps the pooled map as (c, 1, 1), so pnnx writes a Reshape to (c, 1, 1) and Convolutions, where pnnx from
    the torch module writes InnerProduct (MobileNetV3-Large counted 0.8% more instructions per call on the emulated
    Pi 5 with its nine blocks as Convolutions). The rewrite starts at a Reshape of a (c) blob to (c, 1, 1) and
    follows its only reader through such Convolutions and elementwise layers, each blob read once; those become
    InnerProduct (the same weights and bias in the same order in the .bin) and the elementwise layers read the
    vector. The Reshape moves to the end of the chain, or goes where the chain ends in a BinaryOp with a (c, h, w)
    blob of as many channels (ncnn's BinaryOp lays a 1-d operand on the channels then, as pnnx writes it), or goes
    with the Reshape to (c) that flattens the chain's end (MobileNetV4's head: a pooled 1x1 convolution, then the
    classifier's flatten; 0.07% more instructions on the emulated Pi 4 with both Reshapes left)."""
    layers, shapes, readers = _walked(param, inputs)
    taken = set(shapes)
    gone, replaced = set(), {}  # type: Any, Dict[int, List[List[str]]]
    rows = _rows(param)
    for index, layer in enumerate(layers):
        if layer.type != "Reshape" or len(shapes[layer.bottoms[0]]) != 1:
            continue
        if shapes[layer.tops[0]] != shapes[layer.bottoms[0]] + (1, 1):
            continue
        chain, blob = [], layer.tops[0]
        while len(readers.get(blob, [])) == 1 and _vector_op(layers[readers[blob][0]]):
            chain.append(readers[blob][0])
            blob = layers[chain[-1]].tops[0]
        if not any(layers[at].type == "Convolution" for at in chain):
            continue
        gone.add(index)
        for at in chain:
            row = _inner_product(rows[at]) if layers[at].type == "Convolution" else list(rows[at])
            if at == chain[0]:
                row[4] = layer.bottoms[0]
            replaced[at] = [row]
        flattened = _flattened(blob, layers, shapes, readers)
        if flattened is not None:  # read once, by a Reshape to (c): the chain's vector is what that makes
            gone.add(flattened)
            replaced[chain[-1]][0][5] = layers[flattened].tops[0]
        elif not _lays_on_channels(blob, shapes[blob][0], layers, shapes, readers):
            vector = _fresh(blob + "_vec", taken)
            last = replaced[chain[-1]][0]
            last[5] = vector
            replaced[chain[-1]].append(["Reshape", layer.name + "_moved", "1", "1", vector, blob, "0=1", "1=1",
                                        "2=-1"])
    return _rewritten(param, gone, replaced, rows)


def _flattened(blob: str, layers: List[Layer], shapes: Dict[str, Tuple[int, ...]],
               readers: Dict[str, List[int]]) -> Any:
    """The index of the one layer reading `blob` when it is a Reshape to (c) (a classifier's flatten), else None."""
    users = readers.get(blob, [])
    if len(users) != 1 or layers[users[0]].type != "Reshape" or len(layers[users[0]].tops) != 1:
        return None
    return users[0] if shapes[layers[users[0]].tops[0]] == (shapes[blob][0],) else None


def _vector_op(layer: Layer) -> bool:
    """A layer that computes the same on the (c) vector as on the (c, 1, 1) map."""
    if len(layer.bottoms) != 1 or len(layer.tops) != 1:
        return False
    if layer.type != "Convolution":
        return layer.type in ELEMENTWISE
    params = layer.params
    return not set(params) - POINTWISE_KEYS and all(params.get(k, 1) == 1 for k in POINTWISE_ONES) and all(
        params.get(k, 0) == 0 for k in POINTWISE_ZEROS)


def _inner_product(row: List[str]) -> List[str]:
    """A pointwise Convolution's row as InnerProduct's: its name and blobs, the parameters InnerProduct reads."""
    params = []
    for token in row[6:]:
        key, value = token.split("=", 1)
        number = int(key)
        array = number <= -23300
        number = -(number + 23300) if array else number
        if number in AS_INNER_PRODUCT:
            mapped = AS_INNER_PRODUCT[number]
            params.append("{}={}".format(-23300 - mapped if array else mapped, value))
    return ["InnerProduct"] + row[1:6] + params


def _lays_on_channels(blob: str, channels: int, layers: List[Layer], shapes: Dict[str, Tuple[int, ...]],
                      readers: Dict[str, List[int]]) -> bool:
    """Whether `blob` is read once, by a BinaryOp whose other operand is (channels, h, w)."""
    users = readers.get(blob, [])
    if len(users) != 1 or layers[users[0]].type != "BinaryOp" or len(layers[users[0]].bottoms) != 2:
        return False
    others = [shapes[b] for b in layers[users[0]].bottoms if b != blob]
    return len(others) == 1 and len(others[0]) == 3 and others[0][0] == channels


def _walked(param: bytes, inputs: Dict[str, Tuple[int, ...]]) -> Tuple[List[Layer], Dict[str, Tuple[int, ...]],
                                                                       Dict[str, List[int]]]:
    """The layers, every blob's per-item shape and each blob's readers (layer indices)."""
    layers = parse_param(param, LABEL)
    shapes = check_shapes(layers, dict(inputs), 1 << 62, LABEL)
    readers = {}  # type: Dict[str, List[int]]
    for index, layer in enumerate(layers):
        for blob in layer.bottoms:
            readers.setdefault(blob, []).append(index)
    return layers, shapes, readers


def _rows(param: bytes) -> List[List[str]]:
    return [line.split() for line in param.decode("ascii").splitlines()[2:] if line.strip()]


def _fresh(name: str, taken: Any) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _rewritten(param: bytes, gone: Any, replaced: Dict[int, List[List[str]]], rows: List[List[str]]) -> bytes:
    """The text (whose layer rows are `rows`) with layers `gone` dropped and each replaced one by its rows; every
    layer added or dropped makes or takes exactly one blob."""
    if not replaced and not gone:
        return param
    lines = param.decode("ascii").splitlines()
    kept = [row for i, old in enumerate(rows) if i not in gone for row in replaced.get(i, [old])]
    count, blobs = (int(v) for v in lines[1].split())
    added = len(kept) - len(rows)
    header = "{} {}".format(count + added, blobs + added)
    return "\n".join([lines[0], header] + [" ".join(row) for row in kept] + [""]).encode("ascii")


def static_reshapes(param: bytes, weights: bytes, ncnn: Any, inputs: Dict[str, Tuple[int, ...]]) -> bytes:
    """The .param text with each Reshape that pnnx gave a shape expression (parameter 6, a string such as "0w,-1"
    or "0w,1h,1c" over its input blobs' axes: pnnx writes one around each Gemm of a Linear on rows) as a Reshape to
    the fixed shape ncnn computes for it here, reading its first input alone. The shapes are fixed by the bundle's
    guards, so the expression always gives that one shape; and edgedyn's checker (ncnn_param.py) takes numbers only:
    evaluating an expression language inside the runtime's border is what it keeps out. ncnn itself loads the text
    and runs once on random inputs of `inputs`' per-item shapes to say each shape; the backend then checks the
    result and compares it with torch eager as it does every model."""
    import numpy as np

    from edgedyn.runtime.errors import BundleError
    from edgedyn.runtime.executors.ncnn import load_net

    rows = _rows(param)
    found = {i: row for i, row in enumerate(rows) if row[0] == "Reshape" and any(t.startswith("6=") for t in row[4:])}
    if not found:
        return param
    net = ncnn.Net()
    try:
        try:
            load_net(net, param, weights, LABEL)
        except BundleError:
            return param  # ncnn refused it: the checker names what it refuses
        extractor = net.create_extractor()
        rng = np.random.default_rng(0)
        for name, shape in inputs.items():
            extractor.input(name, ncnn.Mat(rng.standard_normal(shape).astype(np.float32)).clone())
        replaced = {}  # type: Dict[int, List[List[str]]]
        for index, row in found.items():
            top = row[4 + int(row[2])]
            code, mat = extractor.extract(top)
            if code != 0:
                return param
            dims = {1: [(0, mat.w)], 2: [(0, mat.w), (1, mat.h)], 3: [(0, mat.w), (1, mat.h), (2, mat.c)],
                    4: [(0, mat.w), (1, mat.h), (11, mat.d), (2, mat.c)]}.get(mat.dims)
            if dims is None:
                return param
            replaced[index] = [["Reshape", row[1], "1", "1", row[4], top] + ["{}={}".format(k, v) for k, v in dims]]
        del extractor
    finally:
        net.clear()
    return _rewritten(param, set(), replaced, rows)
