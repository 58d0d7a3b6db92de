"""ncnn's Gemm layer, beside ncnn_shapes.py's rules for the rest: pnnx writes it for a torch Linear applied to a blob
of several rows (timm's ConvNeXt runs its MLPs on the (h * w, c) rows of each stage). Its shape rule, written from
ncnn's src/layer/gemm.cpp and its Arm and x86 versions, and how its weights lie in the .bin. Standard library only,
Python 3.8.

Those versions take M, N and K of a constant operand from the parameters and pack it before the first call: an input
whose K differs from `constantK` is read past its end, and a bias of M rows (broadcast types 1-3) is sized by
`constantM`, not by the input. So only the form pnnx writes for a Linear is taken: A the one input, a 2-d blob
(M, K) in numpy order, not transposed; B the weights, constant, transposed or not; C a constant bias or none; the
output (M, N) in plain float (no output transposition, packing or element type, no int8 or block-quantized weights,
no tile sizes).
"""
from typing import Callable, Dict, List, Tuple  # noqa: F401 (type comments)

from edgedyn.runtime.executors.ncnn_shapes import Get, Shape, need

# Parameters a Linear's Gemm leaves at 0: output_N1M, output_elempack, output_elemtype, output_transpose,
# quantize_term (int8 or block-quantized weights), constant_TILE_M/N/K.
ZERO = (11, 12, 13, 14, 18, 20, 21, 22)
# constant_broadcast_type_C -> whether the bias it loads is sized by M (1: M, 2: M x 1, 3: M x N).
BY_ROWS = {-1: False, 0: False, 1: True, 2: True, 3: True, 4: False}


def gemm(shapes: List[Shape], p: Get, params: Dict[int, object]) -> List[Shape]:
    """The output (M, N) of A (M, K) times the constant B, plus the constant C: see the module docstring."""
    (shape,) = shapes
    alpha, beta = params.get(0, 1.0), params.get(1, 1.0)
    need(all(isinstance(v, (int, float)) for v in (alpha, beta)), "alpha {} and beta {}".format(alpha, beta))
    trans_a, trans_b, constant_a, constant_b, constant_c = (p(key, 0) for key in (2, 3, 4, 5, 6))
    need((trans_a, constant_a, constant_b) == (0, 0, 1) and trans_b in (0, 1) and constant_c in (0, 1),
         "transA {}, transB {}, constantA {}, constantB {}, constantC {}: edgedyn's files hold an input times "
         "constant weights".format(trans_a, trans_b, constant_a, constant_b, constant_c))
    zero = [key for key in ZERO if p(key, 0) != 0]
    need(not zero, "parameter(s) {} set: output options, quantized weights or tile sizes".format(zero))
    rows, outputs, inner, broadcast = p(7, 0), p(8, 0), p(9, 0), p(10, 0)
    need(outputs >= 1 and inner >= 1, "constantN {} and constantK {}".format(outputs, inner))
    need(len(shape) == 2 and shape[1] == inner, "an input of shape {} for constantK {}".format(list(shape), inner))
    need(rows in (0, shape[0]), "an input of {} rows for constantM {}".format(shape[0], rows))
    if constant_c:
        need(broadcast in BY_ROWS, "constant_broadcast_type_C {}".format(broadcast))
        need(not BY_ROWS[broadcast] or rows == shape[0], "a bias by rows (broadcast type {}) for constantM {} and "
                                                          "an input of {} rows".format(broadcast, rows, shape[0]))
    return [(shape[0], outputs)]


def _weights(p: Get) -> List[Tuple[int, bool]]:
    """Gemm's load_model: A (M x K) when constant, B (N x K), then C by its broadcast type; each tagged."""
    rows, outputs, inner, broadcast = p(7, 0), p(8, 0), p(9, 0), p(10, 0)
    arrays = [(rows * inner, True)] if p(4, 0) == 1 else []
    arrays += [(outputs * inner, True)] if p(5, 0) == 1 else []
    if p(6, 0) == 1 and broadcast != -1:
        arrays.append(({0: 1, 1: rows, 2: rows, 3: rows * outputs, 4: outputs}.get(broadcast, -1), True))
    return arrays


RULES = {"Gemm": gemm}  # type: Dict[str, Callable[..., List[Shape]]]
WEIGHTS = {"Gemm": _weights}  # type: Dict[str, Callable[..., List[Tuple[int, bool]]]]
