"""Elementwise ops, matrix products and copies (reductions and normalization: reduce.py)."""
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from edgedyn.runtime.kernels.base import Run, Shapes, Unsupported, _view


# --- elementwise ---

def _unary(ufunc: Any) -> Callable[..., Run]:
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        out, x = outs[0], args[0]
        return lambda: ufunc(x, out=out)
    return prepare


def _relu(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    return lambda: np.maximum(x, 0, out=out)


def _clamp_between(out: np.ndarray, x: np.ndarray, low: Optional[float], high: Optional[float]) -> Run:
    def run() -> None:
        if low is not None and high is not None:
            np.maximum(x, low, out=out)
            np.minimum(out, high, out=out)
        elif low is not None:
            np.maximum(x, low, out=out)
        elif high is not None:
            np.minimum(x, high, out=out)
        else:
            np.copyto(out, x)
    return run


def _hardtanh(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    low = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
    high = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
    return _clamp_between(outs[0], args[0], low, high)


def _clamp(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    low = args[1] if len(args) > 1 else kwargs.get("min")
    high = args[2] if len(args) > 2 else kwargs.get("max")
    return _clamp_between(outs[0], args[0], low, high)


def _sigmoid_into(out: np.ndarray, x: np.ndarray) -> None:
    np.negative(x, out=out)
    np.exp(out, out=out)
    np.add(out, 1.0, out=out)
    np.reciprocal(out, out=out)


def _sigmoid(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    return lambda: _sigmoid_into(out, x)


def _hardsigmoid_into(out: np.ndarray, x: np.ndarray) -> None:
    np.add(x, 3.0, out=out)
    np.maximum(out, 0.0, out=out)
    np.minimum(out, 6.0, out=out)
    np.multiply(out, 1.0 / 6.0, out=out)


def _hardsigmoid(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    return lambda: _hardsigmoid_into(out, x)


def _gated(gate_into: Callable[[np.ndarray, np.ndarray], None]) -> Callable[..., Run]:
    """x * gate(x) with the gate computed into scratch: silu (sigmoid gate) and hardswish (hard-sigmoid gate)."""
    def build(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        out, x, s = outs[0], args[0], scratch[0]

        def run() -> None:
            gate_into(s, x)
            np.multiply(x, s, out=out)
        return run
    return build


_silu = _gated(_sigmoid_into)
_hardswish = _gated(_hardsigmoid_into)


# erf by Abramowitz and Stegun 7.1.26 (|error| <= 1.5e-7): numpy has no erf, and scipy is not on the board.
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def _gelu(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    z, b = scratch[0], scratch[1]
    approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    if approximate == "tanh":
        def run_tanh() -> None:
            # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            np.multiply(x, x, out=z)
            np.multiply(z, 0.044715, out=z)
            np.add(z, 1.0, out=z)
            np.multiply(z, x, out=z)
            np.multiply(z, math.sqrt(2.0 / math.pi), out=z)
            np.tanh(z, out=z)
            np.add(z, 1.0, out=z)
            np.multiply(x, 0.5, out=b)
            np.multiply(b, z, out=out)
        return run_tanh

    def run() -> None:
        # x is read only here: afterwards `out` (which may be x) serves as a third buffer. x = z * sqrt(2).
        np.multiply(x, 1.0 / math.sqrt(2.0), out=z)
        np.abs(z, out=out)
        np.multiply(out, _ERF_P, out=out)
        np.add(out, 1.0, out=out)
        np.reciprocal(out, out=out)  # t
        np.multiply(out, _ERF_A[0], out=b)
        for coefficient in _ERF_A[1:]:
            np.add(b, coefficient, out=b)
            np.multiply(b, out, out=b)  # b = polynomial(t)
        np.multiply(z, z, out=out)
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.multiply(b, out, out=b)
        np.subtract(1.0, b, out=b)  # erf(|z|)
        np.copysign(b, z, out=b)  # erf(z)
        np.add(b, 1.0, out=b)
        np.multiply(z, math.sqrt(0.5), out=out)  # 0.5 * x
        np.multiply(out, b, out=out)
    return run


def _binary(ufunc: Any) -> Callable[..., Run]:
    def prepare(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
        out, a, b = outs[0], args[0], args[1]
        alpha = kwargs.get("alpha", 1)
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported("div with rounding_mode={!r}".format(kwargs["rounding_mode"]))
        if alpha != 1:
            if not isinstance(b, np.ndarray):
                b = b * alpha
            else:
                scaled = scratch[0]

                def run_scaled() -> None:
                    np.multiply(b, alpha, out=scaled)
                    ufunc(a, scaled, out=out)
                return run_scaled
        return lambda: ufunc(a, b, out=out)
    return prepare


def _binary_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    if kwargs.get("alpha", 1) != 1 and isinstance(args[1], np.ndarray):
        return [tuple(args[1].shape)]
    return []


def _pow(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x, exponent = outs[0], args[0], args[1]
    if exponent == 2:
        return lambda: np.multiply(x, x, out=out)
    return lambda: np.power(x, exponent, out=out)


def _rsqrt(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]

    def run() -> None:
        np.sqrt(x, out=out)
        np.reciprocal(out, out=out)
    return run


# --- matrix products ---

def _mm(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, a, b = outs[0], args[0], args[1]
    return lambda: np.matmul(a, b, out=out)


def _addmm(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, bias, a, b = outs[0], args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)

    def run() -> None:
        np.matmul(a, b, out=out)
        if alpha != 1:
            np.multiply(out, alpha, out=out)
        if beta == 1:
            np.add(out, bias, out=out)
        elif beta != 0:
            raise ValueError("addmm with beta {} is not supported".format(beta))
    if beta not in (0, 1):
        raise Unsupported("addmm with beta={}".format(beta))
    return run


def _linear(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x, weight = outs[0], args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    transposed = weight.T

    def run() -> None:
        np.matmul(x, transposed, out=out)
        if bias is not None:
            np.add(out, bias, out=out)
    return run


# --- copies ---

def _copy(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    return lambda: np.copyto(out, x, casting="unsafe")


def _copy_from(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    """aten.copy(self, src): src's values in self's shape and dtype (what `self[...].copy_(src)` becomes once
    functionalized; torchvision batches its detectors' images that way)."""
    out, source = outs[0], args[1]
    return lambda: np.copyto(out, source, casting="unsafe")


def _cat(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out = outs[0]
    dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0)) % out.ndim
    pieces, start = [], 0
    for part in args[0]:
        if part.size == 0 and part.ndim == 1:
            continue  # torch.cat skips legacy empty tensors
        index = [slice(None)] * out.ndim
        index[dim] = slice(start, start + part.shape[dim])
        pieces.append((out[tuple(index)], part))
        start += part.shape[dim]

    def run() -> None:
        for target, part in pieces:
            np.copyto(target, part, casting="unsafe")
    return run


def _constant_pad(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x, pad = outs[0], args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0.0)
    if any(p < 0 for p in pad):
        raise Unsupported("constant_pad_nd with negative padding")
    index = [slice(None)] * x.ndim
    for k in range(len(pad) // 2):
        axis = x.ndim - 1 - k
        index[axis] = slice(pad[2 * k], pad[2 * k] + x.shape[axis])
    inner = out[tuple(index)]

    def run() -> None:
        out.fill(value)
        np.copyto(inner, x)
    return run


def _div_mode(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    """div with rounding_mode: floor (integer lengths in transformers' audio models, `(n - k) // stride`) or trunc."""
    out, a, b = outs[0], args[0], args[1]
    mode = args[2] if len(args) > 2 else kwargs.get("rounding_mode")
    if mode is None:
        return lambda: np.true_divide(a, b, out=out)
    if mode == "floor" and out.dtype.kind in "iu":
        return lambda: np.floor_divide(a, b, out=out)
    if mode in ("floor", "trunc") and out.dtype.kind == "f":
        rounding = np.floor if mode == "floor" else np.trunc

        def run() -> None:
            np.true_divide(a, b, out=out)
            rounding(out, out=out)
        return run
    raise Unsupported("div with rounding_mode={!r} on {}".format(mode, out.dtype))


def _flip(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    out, x = outs[0], args[0]
    dims = tuple(int(d) % max(x.ndim, 1) for d in (args[1] if len(args) > 1 else kwargs["dims"]))
    flipped = np.flip(x, dims)  # a view: the copy is the only work
    return lambda: np.copyto(out, flipped)


def _repeat(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    """Tiling without a temporary: the output seen as (r0, s0, r1, s1, ...) takes x broadcast over the r axes."""
    out, x, repeats = outs[0], args[0], [int(r) for r in args[1]]
    if len(repeats) < x.ndim or not out.flags.c_contiguous:
        raise Unsupported("repeat of a {}-d tensor {} times into a non-contiguous output".format(x.ndim, repeats))
    sizes = (1,) * (len(repeats) - x.ndim) + tuple(x.shape)
    source = x
    for _ in range(len(repeats) - x.ndim):  # views of x, never copies: prepare runs once, the arena changes
        source = np.expand_dims(source, 0)
    for position in range(len(sizes)):  # a size-1 axis before each dim: views, never copies
        source = np.expand_dims(source, 2 * position)
    target = _view(out, [n for pair in zip(repeats, sizes) for n in pair])
    return lambda: np.copyto(target, source)


KERNELS = {
    "aten.relu.default": _relu,
    "aten.hardtanh.default": _hardtanh,
    "aten.clamp.default": _clamp,
    "aten.sigmoid.default": _sigmoid,
    "aten.tanh.default": _unary(np.tanh),
    "aten.neg.default": _unary(np.negative),
    "aten.exp.default": _unary(np.exp),
    "aten.sqrt.default": _unary(np.sqrt),
    "aten.abs.default": _unary(np.abs),
    "aten.rsqrt.default": _rsqrt,
    "aten.gelu.default": _gelu,
    "aten.silu.default": _silu,
    "aten.hardswish.default": _hardswish,
    "aten.hardsigmoid.default": _hardsigmoid,
    "aten.add.Tensor": _binary(np.add),
    "aten.sub.Tensor": _binary(np.subtract),
    "aten.mul.Tensor": _binary(np.multiply),
    "aten.div.Tensor": _binary(np.true_divide),
    "aten.add.Scalar": _binary(np.add),
    "aten.sub.Scalar": _binary(np.subtract),
    "aten.mul.Scalar": _binary(np.multiply),
    "aten.div.Scalar": _binary(np.true_divide),
    "aten.div.Tensor_mode": _div_mode,
    "aten.flip.default": _flip,
    "aten.repeat.default": _repeat,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.mm.default": _mm,
    "aten.bmm.default": _mm,
    "aten.addmm.default": _addmm,
    "aten.linear.default": _linear,
    "aten.clone.default": _copy,
    "aten._to_copy.default": _copy,
    "aten.copy.default": _copy_from,
    "aten.cat.default": _cat,
    "aten.constant_pad_nd.default": _constant_pad,
}  # type: Dict[str, Callable[..., Run]]

# Scratch each kernel needs besides its outputs (shapes in the first output's dtype); absent means none.
SCRATCH = {
    "aten.silu.default": lambda outs, args, kwargs: [tuple(outs[0].shape)],
    "aten.hardswish.default": lambda outs, args, kwargs: [tuple(outs[0].shape)],
    "aten.gelu.default": lambda outs, args, kwargs: [tuple(outs[0].shape)] * 2,
    "aten.add.Tensor": _binary_scratch,
    "aten.sub.Tensor": _binary_scratch,
}  # type: Dict[str, Callable[[List[Any], List[Any], Dict[str, Any]], Shapes]]
