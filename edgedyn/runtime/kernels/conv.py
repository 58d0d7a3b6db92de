"""Convolution (im2col + matmul, 1x1 as a matmul, depthwise per tap) and pooling, NCHW."""
from typing import Any, Callable, Dict, List, Tuple  # noqa: F401 (type comments)

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgedyn.runtime.kernels.base import Run, Shapes, Unsupported, _pair, _view, is_global_average


# --- convolution and pooling, NCHW ---

def _conv_geometry(args: List[Any]) -> Tuple[Tuple[int, int], Tuple[int, int], Tuple[int, int], int]:
    stride, padding, dilation = _pair(args[3]), _pair(args[4]), _pair(args[5])
    if args[6]:
        raise Unsupported("transposed convolution")
    if args[0].ndim != 4:
        raise Unsupported("{}-d convolution (only 1-d and 2-d)".format(args[0].ndim - 2))
    return stride, padding, dilation, int(args[8])


def _as_2d(outs: List[Any], args: List[Any]) -> Tuple[List[Any], List[Any]]:
    """A 1-d convolution (N, C, L) as the 2-d one over (N, C, 1, L): views only (Whisper, Wav2Vec2)."""
    if args[0].ndim != 3:
        return outs, args
    one = lambda value: [1, int(_pair(value)[0])]  # noqa: E731
    zero = lambda value: [0, int(_pair(value)[0])]  # noqa: E731
    args = [args[0][:, :, None, :], args[1][:, :, None, :], args[2], one(args[3]), zero(args[4]), one(args[5]),
            args[6], zero(args[7]), args[8]]
    return [o[:, :, None, :] if o is not None else None for o in outs], args


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
    outs, args = _as_2d(outs, args)
    x, weight, out = args[0], args[1], outs[0]
    stride, padding, dilation, groups = _conv_geometry(args)
    kernel = (int(weight.shape[2]), int(weight.shape[3]))
    # an output torch strides otherwise (channels last, as ConvNeXt's get) is computed in scratch, then copied
    contiguous = [] if out.flags.c_contiguous else [tuple(out.shape)]
    kind = _conv_kind(outs, args)
    if kind == "pointwise":
        return contiguous
    padded = _padded_shape(x, out, kernel, stride, padding, dilation)
    shapes = [padded] if _needs_padding(x, padded) or not x.flags.c_contiguous else []
    if kind == "depthwise":
        return shapes + [tuple(out.shape)] + contiguous
    n, c = x.shape[0], x.shape[1]
    return shapes + [(n, groups, c // groups * kernel[0] * kernel[1], out.shape[2] * out.shape[3])] + contiguous


def _conv(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    outs, args = _as_2d(outs, args)
    final = outs[0]
    if final.flags.c_contiguous:
        return _conv_into(final, args, scratch)
    out = scratch[-1].reshape(final.shape)  # the last scratch buffer (_conv_scratch)
    run = _conv_into(out, args, scratch[:-1])

    def run_and_copy() -> None:
        run()
        np.copyto(final, out)
    return run_and_copy


def _conv_into(out: np.ndarray, args: List[Any], scratch: List[np.ndarray]) -> Run:
    x, weight, bias = args[0], args[1], args[2]
    stride, padding, dilation, groups = _conv_geometry(args)
    kernel = (int(weight.shape[2]), int(weight.shape[3]))
    n, o = out.shape[0], out.shape[1]
    kind = _conv_kind([out], args)
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
    divisor = args[6] if len(args) > 6 else kwargs.get("divisor_override")
    kernel, stride, padding, _ = _pool_geometry(args[:4], kwargs)
    if _global(outs, args, kwargs):
        return []
    if ceil_mode or divisor is not None:
        raise Unsupported("avg_pool2d with ceil_mode or divisor_override")
    padded = _padded_shape(args[0], outs[0], kernel, stride, padding, (1, 1))
    return [padded] if _needs_padding(args[0], padded) else []


def _global(outs: List[Any], args: List[Any], kwargs: Dict[str, Any]) -> bool:
    kernel, _, padding, _ = _pool_geometry(args[:4], kwargs)
    divisor = args[6] if len(args) > 6 else kwargs.get("divisor_override")
    return divisor is None and args[0].ndim == 4 and is_global_average(
        args[0].shape[2:], outs[0].shape[2:], kernel, padding)


def _avg_pool(outs: List[Any], args: List[Any], kwargs: Dict[str, Any], scratch: List[np.ndarray]) -> Run:
    x, out = args[0], outs[0]
    if _global(outs, args, kwargs):
        return lambda: np.mean(x, axis=(2, 3), keepdims=True, out=out)
    kernel, stride, padding, _ = _pool_geometry(args[:4], kwargs)
    padded = scratch[0].reshape(_padded_shape(x, out, kernel, stride, padding, (1, 1))) if scratch else x
    fill = _padding_of(x, padded, padding, 0.0)
    windows = _windows(padded, out, kernel, stride, (1, 1))
    taps = [windows[:, :, i, j] for i in range(kernel[0]) for j in range(kernel[1])]
    include_pad = args[5] if len(args) > 5 else kwargs.get("count_include_pad", True)
    scale = 1.0 / (kernel[0] * kernel[1]) if include_pad else _inside_counts(x, out, kernel, stride, padding)

    def run() -> None:
        fill()
        np.copyto(out, taps[0])
        for tap in taps[1:]:
            np.add(out, tap, out=out)
        np.multiply(out, scale, out=out)
    return run


def _inside_counts(x: np.ndarray, out: np.ndarray, kernel: Tuple[int, int], stride: Tuple[int, int],
                   padding: Tuple[int, int]) -> np.ndarray:
    """1 / (how many input pixels each window covers), for count_include_pad=False (PoolFormer): computed
    once at load by pooling a mask of the unpadded image."""
    def per_axis(size: int, out_size: int, k: int, s: int, p: int) -> np.ndarray:
        starts = np.arange(out_size) * s - p
        return (np.minimum(starts + k, size) - np.maximum(starts, 0)).astype(np.float64)

    rows = per_axis(x.shape[2], out.shape[2], kernel[0], stride[0], padding[0])
    cols = per_axis(x.shape[3], out.shape[3], kernel[1], stride[1], padding[1])
    return (1.0 / np.outer(rows, cols)).astype(out.dtype)


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
