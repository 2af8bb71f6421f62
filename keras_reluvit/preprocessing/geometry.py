"""Where a recipe takes an image: the resize target, the crop (or pad)
box and Pillow's pass order, in integer arithmetic on Python ints (shapes
known) or TensorFlow scalars (a graph's dynamic shapes)."""

import math

import keras


class Static:
    """The names the shared algorithms use, on static shapes: Python ints
    for the arithmetic and `keras.ops` for the tensors (`tf_ops.TF` has
    the same names in TensorFlow)."""
    minimum, maximum = staticmethod(min), staticmethod(max)

    @staticmethod
    def logical_and(a, b):
        return a and b

    @staticmethod
    def round_div(a, b):  # round(a / b), half to even, as Python
        return int(round(a / b))

    @staticmethod
    def ratio(a, b, c, d, larger=False):  # min(a / b, c / d), or the max
        return (max if larger else min)(a / b, c / d)

    @staticmethod
    def select(cond, a, b):
        return a if cond else b

    @staticmethod
    def shape(x):
        return tuple(int(d) for d in x.shape)

    @staticmethod
    def pad(x, pads):
        return keras.ops.pad(x, [(int(a), int(b)) for a, b in pads])

    @staticmethod
    def stack(xs, axis):
        return keras.ops.stack(xs, axis=axis)


def _half(d, how):
    """`d // 2`, or `round(d / 2)` half to even, in integer arithmetic."""
    q = d // 2
    return q if how == "floor" else q + (d % 2) * (q % 2)


def resized_side(side, p):
    """The resize target of a model side `side` under recipe `p`:
    `side / crop_pct` made whole by `p["resize_rounding"]`."""
    if p["resize_rounding"] == "round":
        return int(round(side / p["crop_pct"]))
    return math.floor(side / p["crop_pct"] + 1e-6)


def plan(h, w, size, p, xp=Static):
    """Where the recipe `p` takes an `h` x `w` image for a model of `size`:
    `(crop_before, resize_to, crop_after)`, boxes as `(top, left, height,
    width)`, `crop_before` None except for `"crop_resize"`. Integer
    arithmetic on ints or (with `xp=tf_ops.TF`) TensorFlow scalars."""
    th, tw = size
    if p["resize"] == "crop_resize":  # keras' Resizing(crop_to_aspect_ratio=True)
        ch = xp.maximum(xp.minimum(h, w * th // tw), 1)
        cw = xp.maximum(xp.minimum(w, h * tw // th), 1)
        return ((h - ch) // 2, (w - cw) // 2, ch, cw), (th, tw), (0, 0, th, tw)
    sh, sw = resized_side(th, p), resized_side(tw, p)
    if p["resize"] == "border":  # timm: ResizeKeepRatio(longest=1), CenterCropOrPad
        ratio = xp.ratio(h, sh, w, sw, larger=True)
        rh, rw = xp.round_div(h, ratio), xp.round_div(w, ratio)
        # a negative offset pads: (t - r) // 2 before, the rest after
        top, left = (xp.select(r >= t, _half(r - t, "round"), -((t - r) // 2))
                     for r, t in ((rh, th), (rw, tw)))
        return None, (rh, rw), (top, left, th, tw)
    if p["resize"] == "squash":
        rh, rw = sh, sw
    elif sh == sw and p["resize_rounding"] == "round":  # big_vision's resize_small: both sides rounded
        short = xp.minimum(h, w)
        rh, rw = xp.round_div(sh * h, short), xp.round_div(sw * w, short)
    elif sh == sw:  # torchvision Resize(int): the shorter side, the other truncated
        short = xp.minimum(h, w)
        rh = xp.maximum(sh, sh * h // short)
        rw = xp.maximum(sw, sw * w // short)
    else:  # timm ResizeKeepRatio: the tighter side fits, both rounded
        ratio = xp.ratio(h, sh, w, sw)
        rh, rw = xp.round_div(h, ratio), xp.round_div(w, ratio)
    top, left = _half(rh - th, p["crop_offset"]), _half(rw - tw, p["crop_offset"])
    return None, (rh, rw), (top, left, th, tw)


def vertical_first(h, w, rh, rw, p, xp=Static):
    """Whether the recipe's uint8-rounded resampling of `h` x `w` to `rh` x
    `rw` runs the vertical pass first: Pillow 13 (`ImagingResampleInner`)
    does when the height shrinks by more pixels than twice the width does;
    Pillow 12 and older (`pass_order="horizontal"`) never."""
    if not p["round_uint8"] or p["pass_order"] == "horizontal":
        return False
    return xp.logical_and(h - rh > 0, h - rh > 2 * (w - rw))


def border_fill(p):
    """timm's padding colour for `crop_mode="border"`: `round(255 mean)`."""
    return [float(round(255 * m)) for m in p["mean"]]


def crop_or_pad(x, top, left, th, tw, p, ops):
    """`x[..., top:top + th, left:left + tw, :]` where a negative offset or
    a window past the edge pads with `border_fill(p)` (timm's
    `center_crop_or_pad`). `ops`: keras.ops, or TensorFlow (dynamic)."""
    if p["resize"] != "border":
        return x[..., top:top + th, left:left + tw, :]
    fill = border_fill(p)
    h, w = ops.shape(x)[-3], ops.shape(x)[-2]
    pads = [(ops.maximum(-top, 0), ops.maximum(top + th - h, 0)),
            (ops.maximum(-left, 0), ops.maximum(left + tw - w, 0))]
    channels = []
    for c in range(3):
        y = ops.pad(x[..., c] - fill[c], [*([(0, 0)] * (len(x.shape) - 3)), *pads])
        channels.append(y + fill[c])
    x = ops.stack(channels, axis=-1)
    top, left = ops.maximum(top, 0), ops.maximum(left, 0)
    return x[..., top:top + th, left:left + tw, :]
