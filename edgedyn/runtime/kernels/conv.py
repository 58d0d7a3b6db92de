"""Convolution (im2col + matmul, 1x1 as a matmul, depthwise per tap) and pooling, NCHW."""
from typing import Any, Callable, Dict, List, Tuple  # noqa: F401 (type comments)

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgedyn.runtime.kernels.base import Run, Shapes, Unsupported, _pair, _view


# --- convolution and pooling, NCHW ---

def _conv_geometry(args: List[Any]) -> Tuple[Tuple[int, int], Tuple[int, int], Tuple[int, int], int]:
    stride, padding, dilation = _pair(args[3]), _pair(args[4]), _pair(args[5])
    if args[6]:
        raise Unsupported("transposed convolution")
    if args[0].ndim != 4:
        raise Unsupported("{}-d convolution (only 2-d)".format(args[0].ndim - 2))
    return stride, padding, dilation, int(args[8])


def _padded_shape(x: np.ndarray, out: np.ndarray, kernel: Tuple[int, int], stride: Tuple[int, int],
                  padding: Tuple[int, int], dilation: Tuple[int, int]) -> Tuple[int, ...]:
    """The input grown by its padding, and enough more that every window of `out` lies inside (ceil_mode)."""
    rows = max(x.shape[2] + 2 * padding[0], (out.shape[2] - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1)
    cols = max(x.shape[3] + 2 * padding[1], (out.shape[3] - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1)
    return (x.shape[0], x.shape[1], rows, cols)


def _windows(padded: np.ndarray, out: np.ndarray, kernel: Tuple[int, int], stride: Tuple[int, int],
             dilation: Tuple[int, int]) -> np.ndarray:
    """A view (N, C, kh, kw, OH, OW) of every input element each output position reads."""
    n, c, h, w = padded.strides
    shape = padded.shape[:2] + kernel + out.shape[2:]
    return as_strided(padded, shape, (n, c, h * dilation[0], w * dilation[1], h * stride[0], w * stride[1]),
                      writeable=False)


def _padding_of(x: np.ndarray, padded: np.ndarray, padding: Tuple[int, int], fill: float) -> Run:
    """Copies x into the padded buffer (when there is one), filling the border."""
    if padded is x:
        return lambda: None
    inner = padded[:, :, padding[0]:padding[0] + x.shape[2], padding[1]:padding[1] + x.shape[3]]

    def run() -> None:
        padded.fill(fill)
        np.copyto(inner, x)
    return run


def _needs_padding(x: np.ndarray, shape: Tuple[int, ...]) -> bool:
    return tuple(x.shape) != tuple(shape)


def _conv_kind(outs: List[Any], args: List[Any]) -> str:
    x, weight = args[0], args[1]
    stride, padding, dilation, groups = _conv_geometry(args)
    if groups == x.shape[1] and weight.shape[0] == groups:
        return "depthwise"
    if weight.shape[2:] == (1, 1) and stride == (1, 1) and padding == (0, 0) and groups == 1 \
            and x.flags.c_contiguous:
        return "pointwise"
    return "im2col"


def _conv_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    x, weight, out = args[0], args[1], outs[0]
    stride, padding, dilation, groups = _conv_geometry(args)
    kernel = (int(weight.shape[2]), int(weight.shape[3]))
    if not out.flags.c_contiguous:
        raise Unsupported("convolution writing a non-contiguous output")
    kind = _conv_kind(outs, args)
    if kind == "pointwise":
        return []
    padded = _padded_shape(x, out, kernel, stride, padding, dilation)
    shapes = [padded] if _needs_padding(x, padded) or not x.flags.c_contiguous else []
    if kind == "depthwise":
        return shapes + [tuple(out.shape)]
    n, c = x.shape[0], x.shape[1]
    return shapes + [(n, groups, c // groups * kernel[0] * kernel[1], out.shape[2] * out.shape[3])]


def _conv(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, weight, bias, out = args[0], args[1], args[2], outs[0]
    stride, padding, dilation, groups = _conv_geometry(args)
    kernel = (int(weight.shape[2]), int(weight.shape[3]))
    n, o = out.shape[0], out.shape[1]
    kind = _conv_kind(outs, args)
    out3 = _view(out, (n, o, -1))
    add_bias = (lambda: np.add(out3, _view(bias, (o, 1)), out=out3)) if bias is not None else (lambda: None)
    if kind == "pointwise":
        x3, w2 = _view(x, (n, x.shape[1], -1)), _view(weight, (o, -1))

        def run_pointwise() -> None:
            np.matmul(w2, x3, out=out3)
            add_bias()
        return run_pointwise
    padded_shape = _padded_shape(x, out, kernel, stride, padding, dilation)
    has_padded = _needs_padding(x, padded_shape) or not x.flags.c_contiguous
    padded = scratch[0].reshape(padded_shape) if has_padded else x
    fill = _padding_of(x, padded, padding, 0.0)
    windows = _windows(padded, out, kernel, stride, dilation)  # (N, C, kh, kw, OH, OW)
    work = scratch[1 if has_padded else 0]
    if kind == "depthwise":
        taps = [(i, j, windows[:, :, i, j], weight[:, 0, i, j].reshape(o, 1, 1))
                for i in range(kernel[0]) for j in range(kernel[1])]
        product = work.reshape(out.shape)

        def run_depthwise() -> None:
            fill()
            first = True
            for _, _, window, tap in taps:
                if first:
                    np.multiply(window, tap, out=out)
                    first = False
                else:
                    np.multiply(window, tap, out=product)
                    np.add(out, product, out=out)
            add_bias()
        return run_depthwise
    c = x.shape[1]
    columns = _view(work, (n, groups, c // groups, kernel[0], kernel[1], out.shape[2], out.shape[3]))
    source = _view(windows, (n, groups, c // groups, kernel[0], kernel[1], out.shape[2], out.shape[3]))
    matrix = _view(work, (n, groups, -1, out.shape[2] * out.shape[3]))
    w3 = _view(weight, (groups, o // groups, -1))
    out4 = _view(out, (n, groups, o // groups, -1))

    def run_im2col() -> None:
        fill()
        np.copyto(columns, source)
        np.matmul(w3, matrix, out=out4)
        add_bias()
    return run_im2col


def _pool_geometry(args: List[Any], kwargs: Dict[str, Any]) -> Tuple[Tuple[int, int], ...]:
    kernel = _pair(args[1])
    stride = _pair(args[2]) if len(args) > 2 and args[2] else kernel
    padding = _pair(args[3]) if len(args) > 3 else (0, 0)
    dilation = _pair(args[4]) if len(args) > 4 else (1, 1)
    return kernel, stride, padding, dilation


def _max_pool_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    if len(outs) > 1 and outs[1] is not None:
        raise Unsupported("max_pool2d indices (only the pooled values are computed)")
    x = args[0]
    if x.ndim != 4:
        raise Unsupported("{}-d input to max_pool2d (only NCHW)".format(x.ndim))
    kernel, stride, padding, dilation = _pool_geometry(args, kwargs)
    padded = _padded_shape(x, outs[0], kernel, stride, padding, dilation)
    return [padded] if _needs_padding(x, padded) else []


def _max_pool(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = args[0], outs[0]
    kernel, stride, padding, dilation = _pool_geometry(args, kwargs)
    padded = scratch[0].reshape(_padded_shape(x, out, kernel, stride, padding, dilation)) if scratch else x
    fill = _padding_of(x, padded, padding, -np.inf)
    windows = _windows(padded, out, kernel, stride, dilation)
    taps = [windows[:, :, i, j] for i in range(kernel[0]) for j in range(kernel[1])]

    def run() -> None:
        fill()
        np.copyto(out, taps[0])
        for tap in taps[1:]:
            np.maximum(out, tap, out=out)
    return run


def _avg_pool_scratch(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> Shapes:
    ceil_mode = args[4] if len(args) > 4 else kwargs.get("ceil_mode", False)
    include_pad = args[5] if len(args) > 5 else kwargs.get("count_include_pad", True)
    divisor = args[6] if len(args) > 6 else kwargs.get("divisor_override")
    kernel, stride, padding, _ = _pool_geometry(args[:4], kwargs)
    if ceil_mode or divisor is not None or (padding != (0, 0) and not include_pad):
        raise Unsupported("avg_pool2d with ceil_mode, divisor_override or count_include_pad=False")
    padded = _padded_shape(args[0], outs[0], kernel, stride, padding, (1, 1))
    return [padded] if _needs_padding(args[0], padded) else []


def _avg_pool(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = args[0], outs[0]
    kernel, stride, padding, _ = _pool_geometry(args[:4], kwargs)
    padded = scratch[0].reshape(_padded_shape(x, out, kernel, stride, padding, (1, 1))) if scratch else x
    fill = _padding_of(x, padded, padding, 0.0)
    windows = _windows(padded, out, kernel, stride, (1, 1))
    taps = [windows[:, :, i, j] for i in range(kernel[0]) for j in range(kernel[1])]
    scale = 1.0 / (kernel[0] * kernel[1])

    def run() -> None:
        fill()
        np.copyto(out, taps[0])
        for tap in taps[1:]:
            np.add(out, tap, out=out)
        np.multiply(out, scale, out=out)
    return run


def _adaptive_avg_pool(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = args[0], outs[0]
    rows, cols = x.shape[-2] // out.shape[-2], x.shape[-1] // out.shape[-1]
    if x.shape[-2] % out.shape[-2] or x.shape[-1] % out.shape[-1]:
        raise Unsupported("adaptive_avg_pool2d from {} to {} (sizes must divide)".format(x.shape, out.shape))
    s = x.strides
    windows = as_strided(x, out.shape + (rows, cols), s[:-2] + (s[-2] * rows, s[-1] * cols, s[-2], s[-1]),
                         writeable=False)
    return lambda: np.mean(windows, axis=(-2, -1), out=out)


KERNELS = {
    "aten.convolution.default": _conv,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.max_pool2d.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
}  # type: Dict[str, Callable[..., Run]]

# Scratch each kernel needs besides its outputs (shapes in the first output's dtype); absent means none.
SCRATCH = {
    "aten.convolution.default": _conv_scratch,
    "aten.max_pool2d_with_indices.default": _max_pool_scratch,
    "aten.max_pool2d.default": _max_pool_scratch,
    "aten.avg_pool2d.default": _avg_pool_scratch,
}  # type: Dict[str, Callable[[List[Any], List[Any], Dict[str, Any]], Shapes]]
