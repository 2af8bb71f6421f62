"""Pillow's resampling of 8-bit images, as timm and transformers run it:
its filters' weights in fixed point, the two separable passes each rounded
to uint8 in Pillow's pass order, its rounding and its alpha compositing."""

import math

import numpy as np


def round_half_up(x, ops):
    """Pillow's rounding of a resampled 8-bit value: `floor(x + 0.5)` (its
    fixed-point sum starts at one half and is shifted down), clipped."""
    return ops.clip(ops.floor(x + 0.5), 0.0, 255.0)


def composite_on_white(rgb, alpha, ops):
    """Pillow's `alpha_composite(white, image)` on integer `rgb` `[..., 3]`
    and `alpha` `[..., 1]` (int32 holding 0-255): each channel
    `c a / 255 + 255 (1 - a / 255)` in its 7-bit fixed point with the
    division by 255 rounded as Pillow does (`SHIFTFORDIV255`). Exact."""
    fd = ops.floor_divide
    t = 128 * (rgb * alpha + 255 * (255 - alpha)) + 128 * 128
    return fd(fd(fd(t, 256) + t, 256), 128)


def branch(pred, true_fn, false_fn):
    """`tf.cond`, or the branch itself where `pred` is already a bool."""
    if isinstance(pred, (bool, np.bool_)):
        return true_fn() if pred else false_fn()
    import tensorflow as tf

    return tf.cond(pred, true_fn, false_fn)


def two_passes(x, vertical, along_rows, along_cols, p, ops):
    """Pillow's separable resampling: `along_rows(y)` resamples the
    vertical axis, `along_cols(y)` the horizontal one; the vertical pass
    first when `vertical` (a bool, or a TensorFlow predicate), each pass rounded as Pillow rounds 8-bit images when the
    recipe `p` has `round_uint8`. The one place the pass order and the
    rounding are written; every resampler of both paths goes through it."""
    def rounded(f):
        return (lambda y: round_half_up(f(y), ops)) if p["round_uint8"] else f

    rows, cols = rounded(along_rows), rounded(along_cols)
    return branch(vertical, lambda: cols(rows(x)), lambda: rows(cols(x)))


def weight_passes(x, rows, cols, vertical, p, ops):
    """`two_passes` of weight matrices (`rows` `(h', H)`, `cols` `(w', W)`)
    over `x` `[..., H, W, C]`."""
    return two_passes(x, vertical, lambda y: ops.einsum("ih,...hwc->...iwc", rows, y),
                      lambda y: ops.einsum("jw,...hwc->...hjc", cols, y), p, ops)


def _pillow_filter(name, x, xp):
    """Pillow's filter `name` at `x` (`Resample.c`), and its support."""
    a = xp.abs(x)
    if name == "box":
        return xp.where((x > -0.5) & (x <= 0.5), 1.0, 0.0)
    pi_x = math.pi * xp.where(a == 0, 1.0, a)
    sinc = xp.where(a == 0, 1.0, xp.sin(pi_x) / pi_x)
    if name == "hamming":
        return xp.where(a >= 1, 0.0, sinc * (0.54 + 0.46 * xp.cos(math.pi * a)))
    third = math.pi * xp.where(a == 0, 1.0, a / 3)
    sinc3 = xp.where(a == 0, 1.0, xp.sin(third) / third)
    return xp.where((x >= -3) & (x < 3), sinc * sinc3, 0.0)  # lanczos


_SUPPORT = {"box": 0.5, "hamming": 1.0, "lanczos": 3.0}


def pillow_weights(n_in, n_out, name, xp=None):
    """`(n_out, n_in)` weights of Pillow's resampling along one axis with
    filter `name` (`"nearest"`: the source pixel `floor((i + 0.5) * scale)`,
    as its affine nearest sampling), each row normalised and rounded to its
    22-bit fixed point as on 8-bit images. `n_in`, `n_out`: ints (numpy), or
    with `xp=tf_ops.TF` int32 scalars."""
    xp = xp or _NumPy
    f64 = xp.float64
    scale = xp.cast(n_in, f64) / xp.cast(n_out, f64)
    o = xp.cast(xp.arange(n_out), f64)[:, None]
    i = xp.cast(xp.arange(n_in), f64)[None, :]
    if name == "nearest":
        # ImagingScaleAffine: x_0 = scale / 2, x_{k+1} = x_k + scale, truncated
        # (accumulated in float64 as Pillow does: 0.6 + 1.2 + 1.2 < 3).
        steps = xp.where(o == 0, 0.5 * scale, scale)
        src = xp.floor(xp.cumsum(steps, axis=0))
        return xp.where(i == xp.minimum(src, xp.cast(n_in, f64) - 1), 1.0, 0.0)
    filterscale = xp.maximum(scale, 1.0)
    support = _SUPPORT[name] * filterscale
    center = (o + 0.5) * scale
    lo = xp.maximum(xp.floor(center - support + 0.5), 0.0)
    hi = xp.minimum(xp.floor(center + support + 0.5), xp.cast(n_in, f64))
    w = _pillow_filter(name, (i - center + 0.5) / filterscale, xp)
    w = xp.where((i >= lo) & (i < hi), w, 0.0)
    total = xp.sum(w, axis=1, keepdims=True)
    w = w / xp.where(total == 0, 1.0, total)
    fixed = w * float(1 << 22)  # Pillow's normalize_coeffs_8bpc
    return xp.trunc(fixed + xp.where(fixed < 0, -0.5, 0.5)) / float(1 << 22)


class _NumPy:
    """The array names `pillow_weights` uses, in numpy (`tf_ops.TF` has them in
    TensorFlow, for dynamic sizes)."""
    float64 = np.float64
    abs, where, sin, cos, floor, trunc = np.abs, np.where, np.sin, np.cos, np.floor, np.trunc
    maximum, minimum, arange, cumsum = np.maximum, np.minimum, np.arange, np.cumsum

    @staticmethod
    def cast(v, dtype):
        return np.asarray(v, dtype)

    @staticmethod
    def sum(v, axis, keepdims):
        return np.sum(v, axis=axis, keepdims=keepdims)
