"""The shape of every blob of an ncnn model, inferred from its inputs' shapes as ncnn itself computes them, and every
layer's parameters checked against the shapes it receives: ncnn does neither, and a layer whose kernel, pads,
channels or axes disagree with its input reads or writes outside its buffers.

Each layer type edgedyn's files may hold has a rule here, written from ncnn's own `forward` (src/layer/*.cpp): the
output shapes, and a ShapeError for any parameter ncnn would trust into memory it does not own. A layer type without
a rule is refused by the checker (ncnn_param.py), so this list is also the list of what edgedyn's ncnn runs.
Shapes are numpy's order of an ncnn Mat: (w,), (h, w), (c, h, w), (c, d, h, w). Standard library only, Python 3.8.
"""
import itertools
from typing import Callable, Dict, List, Sequence, Tuple

Shape = Tuple[int, ...]
Get = Callable[[int, int], int]

MAX_PAD = 1 << 16
SAME = (-233, -234)  # "SAME_UPPER" and "SAME_LOWER" padding, given for every side at once
UNARY_OPS = 28  # ncnn's UnaryOp operations 0-27
BINARY_OPS = 19  # and BinaryOp's 0-18
ACTIVATION_PARAMS = {0: 0, 1: 0, 2: 1, 3: 2, 4: 0, 5: 0, 6: 2}  # a fused activation -> the parameters it reads
# Permute's order_type k: the k-th permutation, in lexicographic order, of the input's axes (numpy order).
PERMUTATIONS = {dims: list(itertools.permutations(range(dims))) for dims in (1, 2, 3, 4)}


class ShapeError(Exception):
    """A layer's parameters or inputs that ncnn would compute out of bounds with."""


def need(condition: bool, what: str) -> None:
    if not condition:
        raise ShapeError(what)


def _dims(shape: Shape, allowed: Sequence[int], what: str = "input") -> None:
    need(len(shape) in allowed, "{} of shape {}; this layer takes {}-d blobs".format(
        what, list(shape), "/".join(str(d) for d in allowed)))


def _same(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    return [shapes[0]]


def resolved(p: Get, keys: Sequence[Tuple[int, int]]) -> List[int]:
    """Parameters `keys` (id, the id whose value is its default, or -1 for 0), ncnn's defaults applied in order."""
    values = {}  # type: Dict[int, int]
    for key, default in keys:
        values[key] = p(key, values[default] if default >= 0 else 0)
    return [values[key] for key, _ in keys]


def _pads(p: Get, keys: Sequence[Tuple[int, int]]) -> List[int]:
    """Pads, each 0-MAX_PAD, or all one of the SAME modes."""
    pads = resolved(p, keys)
    need(all(0 <= v <= MAX_PAD for v in pads) or (pads[0] in SAME and len(set(pads)) == 1),
         "pads {} are neither all 0-{} nor one SAME mode for every side".format(pads, MAX_PAD))
    return pads


def _window(size: int, kernel: int, dilation: int, stride: int, before: int, after: int) -> int:
    """A convolution's output size along one axis: explicit pads, or SAME's (input rounded up to the stride)."""
    extent = dilation * (kernel - 1) + 1
    if before in SAME:
        padded = max(size, extent + (size - 1) // stride * stride)
    else:
        padded = size + before + after
    need(padded >= extent, "a kernel spanning {} over {} values".format(extent, padded))
    return (padded - extent) // stride + 1


def _activation(p: Get, params: Dict[int, object]) -> None:
    kind = p(9, 0)
    need(kind in ACTIVATION_PARAMS, "activation type {}".format(kind))
    values = params.get(10)
    need(ACTIVATION_PARAMS[kind] == 0 or isinstance(values, tuple) and len(values) >= ACTIVATION_PARAMS[kind],
         "activation {} reads {} parameters".format(kind, ACTIVATION_PARAMS[kind]))


def convolution(depthwise: bool, rank: int) -> Callable[..., List[Shape]]:
    """Convolution(1D) and ConvolutionDepthWise(1D): weights of outputs x inputs/group x kernel."""
    def rule(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
        (shape,) = shapes
        _dims(shape, (rank + 1,))
        need(p(19, 0) == 0, "weights given as an input")
        outputs, group, channels = p(0, 0), p(7, 1) if depthwise else 1, shape[0]
        need(channels % group == 0 and outputs % group == 0, "{} inputs and {} outputs in {} groups".format(
            channels, outputs, group))
        kernel = [p(1, 0)] if rank == 1 else [p(11, p(1, 0)), p(1, 0)]
        dilation = [p(2, 1)] if rank == 1 else [p(12, p(2, 1)), p(2, 1)]
        stride = [p(3, 1)] if rank == 1 else [p(13, p(3, 1)), p(3, 1)]
        if rank == 1:
            left, right = _pads(p, ((4, -1), (15, 4)))
            sides = [(left, right)]
        else:
            left, right, top, bottom = _pads(p, ((4, -1), (15, 4), (14, 4), (16, 14)))
            sides = [(top, bottom), (left, right)]
        expected = outputs * channels // group
        for k in kernel:
            expected *= k
        need(p(6, 0) == expected, "{} weights; {} outputs x {} inputs / {} groups x kernel {} take {}".format(
            p(6, 0), outputs, channels, group, kernel, expected))
        _activation(p, params)
        spatial = [_window(n, k, d, s, a, b) for n, k, d, s, (a, b) in zip(shape[1:], kernel, dilation, stride, sides)]
        return [(outputs,) + tuple(spatial)]
    return rule


def deconvolution(depthwise: bool) -> Callable[..., List[Shape]]:
    def rule(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
        (shape,) = shapes
        _dims(shape, (3,))
        need(p(28, 0) == 0, "weights given as an input")
        outputs, group, channels = p(0, 0), p(7, 1) if depthwise else 1, shape[0]
        need(channels % group == 0 and outputs % group == 0, "{} inputs and {} outputs in {} groups".format(
            channels, outputs, group))
        kw, kh = p(1, 0), p(11, p(1, 0))
        dw, dh, sw, sh = p(2, 1), p(12, p(2, 1)), p(3, 1), p(13, p(3, 1))
        need(p(6, 0) == outputs * channels // group * kw * kh, "{} weights for {} x {} / {} x {} x {}".format(
            p(6, 0), outputs, channels, group, kh, kw))
        _activation(p, params)
        left, right, top, bottom = _pads(p, ((4, -1), (15, 4), (14, 4), (16, 14)))
        pad_w, pad_h = p(18, 0), p(19, p(18, 0))
        need(0 <= pad_w <= MAX_PAD and 0 <= pad_h <= MAX_PAD, "output pads {}, {}".format(pad_w, pad_h))
        full = ((shape[1] - 1) * sh + dh * (kh - 1) + 1 + pad_h, (shape[2] - 1) * sw + dw * (kw - 1) + 1 + pad_w)
        out_w, out_h = p(20, 0), p(21, p(20, 0))
        if left in SAME:
            need(0 < out_h <= full[0] and 0 < out_w <= full[1] or out_w <= 0,
                 "output size {}x{} beyond {}".format(out_h, out_w, full))
            size = (out_h, out_w) if out_w > 0 and out_h > 0 else full
        else:
            need(out_w <= 0, "an output size with explicit pads")
            size = (full[0] - top - bottom, full[1] - left - right)
            need(min(size) > 0, "pads {} cut the whole output {}".format([left, right, top, bottom], full))
        return [(outputs,) + size]
    return rule


def pooling(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    _dims(shape, (3,))
    need(p(0, 0) in (0, 1), "pooling type {}".format(p(0, 0)))
    channels, h, w = shape
    if p(4, 0):
        return [(channels,)]
    if p(7, 0):
        out_w, out_h = p(8, 0), p(18, p(8, 0))
        out_w, out_h = w if out_w == -233 else out_w, h if out_h == -233 else out_h
        need(out_w >= 1 and out_h >= 1, "adaptive output {}x{}".format(out_h, out_w))
        return [(channels, out_h, out_w)]
    kw, kh, sw, sh = p(1, 0), p(11, p(1, 0)), p(2, 1), p(12, p(2, 1))
    left, right, top, bottom = resolved(p, ((3, -1), (14, 3), (13, 3), (15, 13)))
    need(kw >= 1 and kh >= 1 and all(0 <= v <= MAX_PAD for v in (left, right, top, bottom)),
         "kernel {}x{}, pads {}".format(kh, kw, [left, right, top, bottom]))
    mode = p(5, 0)
    need(mode in (0, 1, 2, 3), "pad mode {}".format(mode))
    sizes = []
    for size, kernel, stride, before, after in ((h, kh, sh, top, bottom), (w, kw, sw, left, right)):
        if mode == 0:
            padded = size + before + after
            need(padded >= kernel, "a {}-wide window over {} values".format(kernel, padded))
            tail = (padded - kernel) % stride
            padded += stride - tail if tail else 0
        elif mode == 1:
            padded = size + before + after
        else:
            padded = max(size, kernel + (size - 1) // stride * stride)
        need(padded >= kernel, "a {}-wide window over {} values".format(kernel, padded))
        sizes.append((padded - kernel) // stride + 1)
    return [(channels,) + tuple(sizes)]


def inner_product(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    outputs, weights = p(0, 0), p(2, 0)
    need(weights % outputs == 0, "{} weights for {} outputs".format(weights, outputs))
    inputs = weights // outputs
    _activation(p, params)
    if len(shape) == 2 and shape[1] == inputs:
        return [(shape[0], outputs)]
    need(_size(shape) == inputs, "an input of shape {} for {} inputs".format(list(shape), inputs))
    return [(outputs,)]


def binary(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    need(0 <= p(0, 0) < BINARY_OPS, "operation {}".format(p(0, 0)))
    if p(1, 0):
        need(len(shapes) == 1, "a scalar operand and {} inputs".format(len(shapes)))
        return [shapes[0]]
    need(len(shapes) == 2, "{} inputs".format(len(shapes)))
    a, b = shapes
    rank = max(len(a), len(b))
    a, b = _expanded(a, b, rank), _expanded(b, a, rank)
    need(all(x == y or x == 1 or y == 1 for x, y in zip(a, b)), "shapes {} and {} do not broadcast".format(
        list(shapes[0]), list(shapes[1])))
    return [tuple(max(x, y) for x, y in zip(a, b))]


def _expanded(shape: Shape, other: Shape, rank: int) -> Shape:
    """ncnn's BinaryOp: a lower-rank operand aligns with the outer axes, a 1-d one with the other's outermost axis
    when their sizes match, else with its innermost."""
    if len(shape) == rank:
        return shape
    if len(shape) == 1:
        return shape + (1,) * (rank - 1) if shape[0] == other[0] else (1,) * (rank - 1) + shape
    return shape + (1,) * (rank - len(shape))


def matmul(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """numpy's matmul, B given transposed under transB; batch axes aligned on the right, each equal or 1."""
    a, b = shapes
    need(p(0, 0) in (0, 1), "transB {}".format(p(0, 0)))
    if len(b) >= 2 and p(0, 0):
        b = b[:-2] + (b[-1], b[-2])
    inner = (a[-1], b[0] if len(b) == 1 else b[-2])
    need(inner[0] == inner[1], "inner sizes {} and {}".format(*inner))
    if len(a) == 1:
        return [(1,)] if len(b) == 1 else [b[:-2] + b[-1:]]
    if len(b) == 1:
        return [a[:-1]]
    rank = max(len(a), len(b))
    batch_a, batch_b = (1,) * (rank - len(a)) + a[:-2], (1,) * (rank - len(b)) + b[:-2]
    need(all(x == y or x == 1 or y == 1 for x, y in zip(batch_a, batch_b)), "batch axes {} and {}".format(
        list(batch_a), list(batch_b)))
    return [tuple(max(x, y) for x, y in zip(batch_a, batch_b)) + (a[-2], b[-1])]


def eltwise(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    need(p(0, 0) in (0, 1, 2) and len(set(shapes)) == 1, "operation {} on shapes {}".format(p(0, 0), shapes))
    coefficients = params.get(1)
    need(coefficients is None or isinstance(coefficients, tuple) and len(coefficients) == len(shapes),
         "coefficients for another number of inputs")
    return [shapes[0]]


def _axis(axis: int, rank: int) -> int:
    need(-rank <= axis < rank, "axis {} of a {}-d blob".format(axis, rank))
    return axis % rank


def concat(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    rank = len(shapes[0])
    axis = _axis(p(0, 0), rank)
    need(all(len(s) == rank and s[:axis] + s[axis + 1:] == shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes),
         "shapes {} differ off axis {}".format([list(s) for s in shapes], axis))
    return [shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]]


def slice_(shapes: List[Shape], p: Get, params: Dict[int, object], tops: int) -> List[Shape]:
    (shape,) = shapes
    axis = _axis(p(1, 0), len(shape))
    size, taken, out = shape[axis], 0, []
    slices, indices = params.get(0), params.get(2)
    for index in range(tops):
        if indices is not None:
            need(isinstance(indices, tuple) and len(indices) >= tops - 1, "indices for fewer outputs")
            end = size if index == tops - 1 else (indices[index] % size if indices[index] < 0 else indices[index])
            part = end - taken
        else:
            need(isinstance(slices, tuple) and len(slices) == tops, "slices for another number of outputs")
            part = slices[index]
            part = (size - taken) // (tops - index) if part == -233 else part
        need(isinstance(part, int) and part >= 1 and taken + part <= size, "slice {} of {} values from {}".format(
            part, size, taken))
        out.append(shape[:axis] + (part,) + shape[axis + 1:])
        taken += part
    return out


def reduction(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    need(0 <= p(0, 0) <= 10, "operation {}".format(p(0, 0)))
    axes = params.get(3, ())
    axes = axes if isinstance(axes, tuple) else (axes,)
    reduced = set(range(len(shape)))
    if not p(1, 1):
        need(not axes or p(5, 0) == 1, "axes without the fixbug0 flag")
        need(all(isinstance(a, int) for a in axes), "axes {}".format(axes))
        named = {_axis(a, len(shape)) for a in axes}  # type: ignore[arg-type]
        reduced = reduced if len(shape) == 1 else named
    if p(4, 0):
        return [tuple(1 if i in reduced else n for i, n in enumerate(shape))]
    kept = tuple(n for i, n in enumerate(shape) if i not in reduced)
    return [kept or (1,)]


def reshape(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    need(all(key in (0, 1, 2, 11) for key in params), "parameters {}".format(sorted(params)))
    wanted = [p(2, -233), p(11, -233), p(1, -233), p(0, -233)]  # c, d, h, w
    rank = 4 if wanted[1] != -233 else 3 if wanted[0] != -233 else 2 if wanted[2] != -233 else 1
    order = {1: [3], 2: [2, 3], 3: [0, 2, 3], 4: [0, 1, 2, 3]}[rank]
    padded = {1: lambda: (1, 1, 1) + shape, 2: lambda: (1, 1) + shape, 3: lambda: shape[:1] + (1,) + shape[1:],
              4: lambda: shape}[len(shape)]()  # the input's c, d, h, w (1 where absent)
    sizes = [padded[i] if wanted[i] == 0 else wanted[i] for i in order]
    known = 1
    for size in sizes:
        need(size == -1 or size >= 1, "a reshape to {}".format(sizes))
        known *= size if size != -1 else 1
    need(sizes.count(-1) <= 1, "a reshape to {}".format(sizes))
    total = _size(shape)
    sizes = [total // known if s == -1 else s for s in sizes]
    need(_size(tuple(sizes)) == total, "a reshape of {} values to {}".format(total, sizes))
    return [tuple(sizes)]


def permute(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    order = p(0, 0)
    need(0 <= order < len(PERMUTATIONS[len(shape)]), "order {} of a {}-d blob".format(order, len(shape)))
    return [tuple(shape[i] for i in PERMUTATIONS[len(shape)][order])]


def softmax(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    _axis(p(0, 0), len(shapes[0]))
    return [shapes[0]]


def interp(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    need(p(0, 0) in (1, 2, 3) and p(5, 0) == 0, "resize type {} (or a size from a second input)".format(p(0, 0)))

    def size(key: int, scale_key: int, current: int) -> int:
        scale = params.get(scale_key, 1.0)
        out = p(key, 0) or int(current * (scale if isinstance(scale, (int, float)) else 0))
        need(1 <= out <= 1 << 16, "an output size of {}".format(out))
        return out

    if len(shape) == 2:
        return [(shape[0], size(4, 2, shape[1]))]
    _dims(shape, (3,))
    return [(shape[0], size(3, 1, shape[1]), size(4, 2, shape[2]))]


def padding(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    top, bottom, left, right, front, behind = (p(k, 0) for k in (0, 1, 2, 3, 7, 8))
    pads = [top, bottom, left, right, front, behind]
    need(all(0 <= v <= MAX_PAD for v in pads) and p(4, 0) in (0, 1, 2), "pads {} of type {}".format(pads, p(4, 0)))
    w = shape[-1] + left + right
    out = {1: lambda: (w,), 2: lambda: (shape[0] + top + bottom, w),
           3: lambda: (shape[0] + front + behind, shape[1] + top + bottom, w),
           4: lambda: (shape[0], shape[1] + front + behind, shape[2] + top + bottom, w)}[len(shape)]()
    if p(4, 0) == 2:  # reflect: each pad shorter than its axis
        need(max(left, right) < shape[-1] and (len(shape) < 2 or max(top, bottom) < shape[-2]), "reflect pads")
    need(p(6, 0) == 0 or len(shape) >= 3 and p(6, 0) == shape[0], "per-channel pads for another channel count")
    return [out]


def layer_norm(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    size = p(0, 0)
    need(size == shape[-1] or len(shape) >= 3 and size == shape[-1] * shape[-2], "{} values normalized over {}".format(
        size, list(shape)))
    return [shape]


def pixel_shuffle(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    (shape,) = shapes
    _dims(shape, (3,))
    factor = p(0, 1)
    need(p(1, 0) in (0, 1) and shape[0] % (factor * factor) == 0, "factor {} for {} channels".format(factor, shape[0]))
    return [(shape[0] // (factor * factor), shape[1] * factor, shape[2] * factor)]


def memory_data(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    need(p(21, 1) in (0, 1), "load type {}".format(p(21, 1)))
    w, h, d, c = p(0, 0), p(1, 0), p(11, 0), p(2, 0)
    shape = (c, d, h, w) if d else (c, h, w) if c else (h, w) if h else (w,) if w else (1,)
    need(all(n >= 1 for n in shape), "a blob of shape {}".format(list(shape)))
    return [shape]


def unary(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    need(0 <= p(0, 0) < UNARY_OPS, "operation {}".format(p(0, 0)))
    return [shapes[0]]


def flatten(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    return [(_size(shapes[0]),)]


def _size(shape: Shape) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


ELEMENTWISE = ("AbsVal", "BNLL", "CELU", "Clip", "Dropout", "ELU", "Erf", "Exp", "GELU", "HardSigmoid", "HardSwish",
               "Log", "LogSigmoid", "Mish", "Noop", "Power", "ReLU", "SELU", "Sigmoid", "Softplus", "Swish", "TanH")
RULES = dict({name: _same for name in ELEMENTWISE}, **{
    "BinaryOp": binary, "Concat": concat, "Convolution": convolution(False, 2), "Convolution1D": convolution(False, 1),
    "ConvolutionDepthWise": convolution(True, 2), "ConvolutionDepthWise1D": convolution(True, 1),
    "Deconvolution": deconvolution(False), "DeconvolutionDepthWise": deconvolution(True), "Eltwise": eltwise,
    "Flatten": flatten, "InnerProduct": inner_product, "Interp": interp, "LayerNorm": layer_norm,
    "MatMul": matmul, "MemoryData": memory_data, "Padding": padding, "Permute": permute, "PixelShuffle": pixel_shuffle,
    "Pooling": pooling, "Reduction": reduction, "Reshape": reshape, "Softmax": softmax, "UnaryOp": unary,
})  # type: Dict[str, Callable[..., List[Shape]]]
# Input, Split and Slice are handled by the walk itself (their outputs are named by the inputs or the tops).
