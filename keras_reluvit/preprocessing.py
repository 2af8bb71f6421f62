"""How a model's images are prepared: resize, crop and normalise, as its
checkpoint was trained and evaluated.

A ViT carries this recipe in its config (`ViT(preprocessing=...)`, saved
with `.keras` files and presets); every checkpoint reader fills it from its
source (timm's `pretrained_cfg`, transformers' `preprocessor_config.json`,
keras-hub's `image_converter.json`, big_vision's eval pipeline), and it is
applied wherever images enter: `model.preprocessor(images)` /
`keras_reluvit.preprocess(model, images)` in a notebook, the SavedModel's
`serving_default` and `serve_bytes`, the tf.data pipelines of
`keras_reluvit.data` and `keras-reluvit eval | predict`.

The recipe (`ViT(preprocessing={...})`; every key optional):

- `resize`: `"shorter"` — the shorter side to `floor(size / crop_pct)`
  (the longer side in proportion, truncated), then a centre crop of
  `size` (timm's `crop_mode="center"`, transformers' `shortest_edge` +
  centre crop, big_vision's `resize_small | central_crop`);
  `"squash"` — both sides to `floor(size / crop_pct)`, then the centre crop
  (transformers' `{"height", "width"}` sizes, timm's `crop_mode="squash"`);
  `"crop_resize"` — the largest centred region of the model's aspect
  ratio, resized to `size` (keras-hub's `crop_to_aspect_ratio=True`);
  `"border"` — the longer side (relative to the model's) to
  `floor(size / crop_pct)`, the other in proportion (both rounded), then
  centre-cropped or padded with the mean colour `round(255 mean)` (timm's
  `crop_mode="border"`: `ResizeKeepRatio(longest=1)` + `CenterCropOrPad`).
- `crop_pct`: the crop's fraction of the resized image, in (0, 1].
- `interpolation`: `"bicubic"`, `"bilinear"` or `"area"` (box averaging,
  big_vision's and our own evaluation); Pillow's other filters
  `"nearest"`, `"box"`, `"hamming"` and `"lanczos"` (timm's names; Pillow's
  own weights, computed as its `precompute_coeffs` does).
- `antialias`: widen the bilinear / bicubic filter when downsampling, as
  PIL (and so timm and transformers) always do.
- `round_uint8`: round to uint8 after each resampling pass, as Pillow does
  on 8-bit images (timm, transformers' PIL backend): halves up
  (`floor(x + 0.5)`, Pillow's fixed-point rounding), clipped to [0, 255].
- `pass_order`: which pass runs first when `round_uint8`: `"pillow"` —
  Pillow 13's rule: vertical first when the height shrinks by more pixels
  than twice the width does (`H - h > max(0, 2 (W - w))`), else horizontal
  first; `"horizontal"` — always horizontal first (Pillow 12 and older).
- `clip`: clip the resized pixels to [0, 255] (bicubic overshoots at
  sharp edges). True for every source but keras-hub's bicubic converter,
  which keeps the overshoot.
- `alpha`: what becomes of a transparent image's alpha channel: `"drop"`
  (PIL's `convert("RGB")`: timm, big_vision, keras-hub) or `"white"`
  (composited onto white as Pillow's `alpha_composite` does:
  transformers' `convert_to_rgb`, `do_convert_rgb=True`). Applied to
  `[H, W, 4]` images given to the preprocessor and to every decoded file
  (`load_image`, `serve_bytes`, the data pipelines).
- `input_scale`: the pixel values `model.preprocessor` takes for float
  images: `255` (0-255 pixels, the default) or `1` ([0, 1] floats:
  transformers' `do_rescale=False`, whose processor is handed images
  already in [0, 1]); floats above 1 are then refused. uint8 images are
  0-255 pixels either way.
- `crop_offset`: `"floor"` (`(H - h) // 2`: transformers, big_vision,
  keras) or `"round"` (`round((H - h) / 2)`, half to even: torchvision's
  `CenterCrop`, i.e. timm).
- `resize_rounding`: how the resized size is made whole: `"floor"`
  (timm: `floor(size / crop_pct)`, the longer side truncated, as
  torchvision's `Resize`) or `"round"` (big_vision's `resize_small`: both
  rounded, half to even).
- `mean`, `std`: per channel, in units of [0, 1] pixels: the model takes
  `(pixel / 255 - mean) / std`. `[-1, 1]` (big_vision, ours) is
  mean = std = 0.5.

The default is our own (and big_vision's) evaluation recipe: `"shorter"`,
`crop_pct` 0.875 (224 of 256), `"area"`, `crop_offset="floor"`,
`resize_rounding="round"`, [-1, 1].
"""

import math

import keras
import numpy as np

RESIZE_MODES = ("shorter", "squash", "crop_resize", "border")
PILLOW_FILTERS = ("nearest", "box", "hamming", "lanczos")
INTERPOLATIONS = ("bicubic", "bilinear", "area") + PILLOW_FILTERS
CROP_OFFSETS = ("floor", "round")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

PASS_ORDERS = ("pillow", "horizontal")
ALPHA_RULES = ("drop", "white")

DEFAULT = dict(resize="shorter", crop_pct=0.875, interpolation="area", antialias=True,
               round_uint8=False, pass_order="pillow", clip=True, alpha="drop",
               input_scale=255.0, crop_offset="floor", resize_rounding="round",
               mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _triple(value, key):
    try:
        values = [float(v) for v in (value if isinstance(value, (list, tuple, np.ndarray))
                                     else [value])]
    except (TypeError, ValueError):
        values = []
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"preprocessing {key!r} must be one number or three (RGB), "
                         f"got {value!r}.")
    return tuple(values)


def check_preprocessing(preprocessing=None):
    """The recipe, complete and canonical (a plain dict, JSON-friendly):
    `None` is `DEFAULT`; a dict overrides `DEFAULT`'s keys. A bad key or
    value raises a ValueError naming it."""
    if preprocessing is None:
        return dict(DEFAULT)
    if not isinstance(preprocessing, dict):
        raise ValueError("preprocessing must be a dict of "
                         f"{sorted(DEFAULT)}, got {type(preprocessing).__name__}.")
    unknown = sorted(set(preprocessing) - set(DEFAULT))
    if unknown:
        raise ValueError(f"Unknown preprocessing key(s) {unknown}; valid: {sorted(DEFAULT)}.")
    p = dict(DEFAULT, **preprocessing)
    for key, valid in (("resize", RESIZE_MODES), ("interpolation", INTERPOLATIONS),
                       ("crop_offset", CROP_OFFSETS), ("resize_rounding", CROP_OFFSETS),
                       ("pass_order", PASS_ORDERS), ("alpha", ALPHA_RULES)):
        if p[key] not in valid:
            raise ValueError(f"preprocessing {key!r} must be one of {valid}, got {p[key]!r}.")
    try:
        crop = float(p["crop_pct"])
    except (TypeError, ValueError):
        crop = float("nan")
    if not 0 < crop <= 1:
        raise ValueError(f"preprocessing 'crop_pct' must be in (0, 1], got {p['crop_pct']!r}.")
    if p["resize"] == "crop_resize" and crop != 1:
        raise ValueError("preprocessing resize='crop_resize' crops the whole centred region; "
                         f"it takes crop_pct=1, got {crop}.")
    for key in ("antialias", "round_uint8", "clip"):
        if not isinstance(p[key], (bool, np.bool_)):
            raise ValueError(f"preprocessing {key!r} must be True or False, got {p[key]!r}.")
    if isinstance(p["input_scale"], bool) or p["input_scale"] not in (1, 255):
        raise ValueError("preprocessing 'input_scale' must be 255 (0-255 pixels) or 1 "
                         f"([0, 1] floats), got {p['input_scale']!r}.")
    mean, std = _triple(p["mean"], "mean"), _triple(p["std"], "std")
    if min(std) <= 0:
        raise ValueError(f"preprocessing 'std' must be positive, got {std}.")
    return dict(p, crop_pct=crop, antialias=bool(p["antialias"]),
                round_uint8=bool(p["round_uint8"]), clip=bool(p["clip"]),
                input_scale=float(p["input_scale"]), mean=mean, std=std)


# ---------------------------------------------------------------- geometry
class _Int:
    """Integer arithmetic on Python ints (shapes known) ..."""
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


class _TFInt:
    """... and on TensorFlow int32 scalars (dynamic shapes in a graph)."""

    def __init__(self):
        import tensorflow as tf

        self.tf = tf
        self.minimum, self.maximum = tf.minimum, tf.maximum
        self.logical_and = tf.logical_and

    def round_div(self, a, b):
        tf = self.tf
        return tf.cast(tf.round(tf.cast(a, tf.float64) / tf.cast(b, tf.float64)), tf.int32)

    def ratio(self, a, b, c, d, larger=False):
        tf = self.tf
        f = lambda v: tf.cast(v, tf.float64)  # noqa: E731
        return (tf.maximum if larger else tf.minimum)(f(a) / f(b), f(c) / f(d))

    def select(self, cond, a, b):
        return self.tf.where(cond, a, b)


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


def plan(h, w, size, p, xp=_Int):
    """Where the recipe `p` takes an `h` x `w` image for a model of `size`:
    `(crop_before, resize_to, crop_after)`, boxes as `(top, left, height,
    width)`, `crop_before` None except for `"crop_resize"`. Integer
    arithmetic on ints or (with `xp=_TFInt()`) TensorFlow scalars."""
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


def vertical_first(h, w, rh, rw, p, xp=_Int):
    """Whether the recipe's uint8-rounded resampling of `h` x `w` to `rh` x
    `rw` runs the vertical pass first: Pillow 13 (`ImagingResampleInner`)
    does when the height shrinks by more pixels than twice the width does;
    Pillow 12 and older (`pass_order="horizontal"`) never."""
    if not p["round_uint8"] or p["pass_order"] == "horizontal":
        return False
    return xp.logical_and(h - rh > 0, h - rh > 2 * (w - rw))


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


# ------------------------------------------------- Pillow's other filters
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
    with `xp` a TensorFlow namespace (`_TFWeights`) int32 scalars."""
    xp = xp or _NPWeights
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


class _NPWeights:
    """The array names `pillow_weights` uses: numpy's ..."""
    float64 = np.float64
    abs, where, sin, cos, floor, trunc = np.abs, np.where, np.sin, np.cos, np.floor, np.trunc
    maximum, minimum, arange, cumsum = np.maximum, np.minimum, np.arange, np.cumsum

    @staticmethod
    def cast(v, dtype):
        return np.asarray(v, dtype)

    @staticmethod
    def sum(v, axis, keepdims):
        return np.sum(v, axis=axis, keepdims=keepdims)


class _TFWeights:
    """... and TensorFlow's (dynamic sizes)."""

    def __init__(self):
        import tensorflow as tf

        self.float64, self.cast, self.abs = tf.float64, tf.cast, tf.abs
        self.where = lambda c, a, b: tf.where(c, tf.cast(a, tf.float64), tf.cast(b, tf.float64))
        self.sin, self.cos, self.floor = tf.sin, tf.cos, tf.floor
        self.maximum, self.minimum, self.arange = tf.maximum, tf.minimum, tf.range
        self.cumsum = tf.math.cumsum
        self.trunc = lambda v: tf.where(v < 0, tf.math.ceil(v), tf.floor(v))  # toward zero
        self.sum = lambda v, axis, keepdims: tf.reduce_sum(v, axis=axis, keepdims=keepdims)


def _area_matrix(n_in, n_out):
    """`(n_out, n_in)` box-averaging weights: output pixel i averages input
    [i * s, (i + 1) * s), s = n_in / n_out, by overlap (TensorFlow's
    `resize(method="area")`)."""
    s = n_in / n_out
    lo = np.arange(n_out)[:, None] * s
    j = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(j + 1, lo + s) - np.maximum(j, lo), 0, None)
    return (overlap / s).astype("float32")


# ----------------------------------------------------------- the two paths
def _resize_generic(x, to, p):
    """`keras.ops` resampling of a float batch `[N, H, W, 3]` (static shape)."""
    ops = keras.ops
    rh, rw = to
    if p["interpolation"] == "area":
        my = ops.convert_to_tensor(_area_matrix(int(x.shape[1]), rh))
        mx = ops.convert_to_tensor(_area_matrix(int(x.shape[2]), rw))
        return ops.einsum("ih,nhwc,jw->nijc", my, x, mx)
    if p["interpolation"] in PILLOW_FILTERS:
        h, w = int(x.shape[1]), int(x.shape[2])
        my, mx = (ops.convert_to_tensor(pillow_weights(n, m, p["interpolation"]).astype("float32"))
                  for n, m in ((h, rh), (w, rw)))
        return _pillow_passes(x, my, mx, vertical_first(h, w, rh, rw, p), p, ops)
    if not p["round_uint8"]:
        return ops.image.resize(x, (rh, rw), interpolation=p["interpolation"],
                                antialias=p["antialias"])
    h, w = int(x.shape[1]), int(x.shape[2])
    middle = (rh, w) if vertical_first(h, w, rh, rw, p) else (h, rw)
    for target in (middle, (rh, rw)):  # Pillow: one pass per axis, each rounded
        x = ops.image.resize(x, target, interpolation=p["interpolation"],
                             antialias=p["antialias"])
        x = round_half_up(x, ops)
    return x


def normalise(x, p, convert=None):
    """0-255 pixels -> `(x / 255 - mean) / std` (TensorFlow / tf.data; with
    `convert=keras.ops.convert_to_tensor`, any backend), computed as
    `x / (255 std) - mean / std`: for [-1, 1], `x / 127.5 - 1`."""
    std = np.asarray(p["std"], "float64")
    scale, shift = (255.0 * std).astype("float32"), (np.asarray(p["mean"]) / std).astype("float32")
    # TensorFlow: the same float32 operations per value in the cheapest form
    # it runs -- scalars when the channels agree ([-1, 1]), else constants of
    # the image's own shape (a per-channel broadcast costs ~10x on CPU). Not
    # for other backends: PyTorch divides by a scalar as a multiplication by
    # its reciprocal (other values).
    if convert is None and (scale == scale[0]).all() and (shift == shift[0]).all():
        scale, shift = scale[0], shift[0]
    elif convert is None and x.shape[-3:].is_fully_defined():
        scale, shift = (np.broadcast_to(v, tuple(x.shape[-3:])) for v in (scale, shift))
    if convert is not None:
        scale, shift = convert(scale), convert(shift)
    return x / scale - shift


def _pillow_passes(x, rows, cols, vertical, p, ops, cond=None):
    """Two passes of weight matrices (`rows` `(h', H)`, `cols` `(w', W)`)
    over `x` `[..., H, W, C]`, each rounded as Pillow's 8-bit images are
    (`round_uint8`), in Pillow's pass order (`vertical`: a bool, or a
    TensorFlow predicate for `cond`)."""
    def along_rows(y):
        y = ops.einsum("ih,...hwc->...iwc", rows, y)
        return round_half_up(y, ops) if p["round_uint8"] else y

    def along_cols(y):
        y = ops.einsum("jw,...hwc->...hjc", cols, y)
        return round_half_up(y, ops) if p["round_uint8"] else y

    if cond is not None:
        return cond(vertical, lambda: along_cols(along_rows(x)), lambda: along_rows(along_cols(x)))
    return along_cols(along_rows(x)) if vertical else along_rows(along_cols(x))


def to_rgb(x, p, ops):
    """0-255 pixels with 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA)
    channels -> RGB `[..., 3]`, a transparent image by the recipe's `alpha`
    rule: the one conversion every path uses (preprocessor, tf.data
    pipelines, `data.for_model`, SavedModels). The channel count must be
    known (`tf_to_rgb` takes any in a TensorFlow graph)."""
    channels = x.shape[-1]
    if channels == 3:
        return x
    if channels == 1:  # grey: its value in R, G and B
        return ops.concatenate([x] * 3, axis=-1)
    if channels == 2:  # grey + alpha: RGBA, then the alpha rule
        x = ops.concatenate([x[..., :1]] * 3 + [x[..., 1:]], axis=-1)
    elif channels != 4:
        raise ValueError(f"Images have 1 (grey), 2, 3 (RGB) or 4 (RGBA) channels, got "
                         f"{channels}.")
    if p["alpha"] == "drop":
        return x[..., :3]
    q = ops.cast(x, "int32")
    return ops.cast(composite_on_white(q[..., :3], q[..., 3:], ops), "float32")


def tf_to_rgb(image, p=None):
    """`to_rgb` in TensorFlow ops for a graph that may not know the channel
    count (decoded files, `data.for_model`'s inputs): float32 0-255 RGB."""
    import tensorflow as tf

    p = check_preprocessing(p)
    x = tf.cast(image, tf.float32)
    if x.shape[-1] is not None:
        return to_rgb(x, p, _TFOps)
    lead = [None] * (x.shape.rank - 1)

    def branch(channels):  # to_rgb with the channel count made static
        return lambda: tf.ensure_shape(to_rgb(tf.ensure_shape(x, lead + [channels]), p, _TFOps),
                                       lead + [3])

    return tf.switch_case(tf.shape(x)[-1] - 1, [branch(c) for c in (1, 2, 3, 4)])


def border_fill(p):
    """timm's padding colour for `crop_mode="border"`: `round(255 mean)`."""
    return [float(round(255 * m)) for m in p["mean"]]


def _crop_or_pad(x, top, left, th, tw, p, ops):
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


def _generic(images, size, p):
    ops = keras.ops
    x = to_rgb(ops.cast(images, "float32"), p, ops)
    h, w = int(x.shape[1]), int(x.shape[2])
    before, to, (top, left, th, tw) = plan(h, w, size, p)
    if before is not None:
        t, l_, ch, cw = before
        x = x[:, t:t + ch, l_:l_ + cw]
    x = _resize_generic(x, to, p)
    x = _crop_or_pad(x, top, left, th, tw, p, _IntOps)
    if p["clip"]:
        x = ops.clip(x, 0.0, 255.0)
    return normalise(x, p, ops.convert_to_tensor)


def tf_preprocess(images, size, p=None, normalize=True):
    """The recipe `p` in TensorFlow ops, for graphs with dynamic image sizes
    (tf.data, SavedModel signatures): `images` `[H, W, 3]` or
    `[N, H, W, 3]` (one size per batch) of any dtype holding 0-255 pixel
    values -> float32 model inputs (0-255 pixels without `normalize`).
    Equal to the `keras.ops` path (tested)."""
    import tensorflow as tf

    p = check_preprocessing(p)
    x = tf_to_rgb(images, p)
    shape = tf.shape(x)
    h, w = shape[-3], shape[-2]
    before, (rh, rw), (top, left, th, tw) = plan(h, w, size, p, _TFInt())
    if before is not None:
        t, l_, ch, cw = before
        x = x[..., t:t + ch, l_:l_ + cw, :]
    method = p["interpolation"]
    antialias = p["antialias"] and method != "area"
    if method in PILLOW_FILTERS:
        # Pillow's weights, only the crop's rows and columns of them.
        ih, iw = tf.shape(x)[-3], tf.shape(x)[-2]
        rows = tf.cast(pillow_weights(ih, rh, method, _TFWeights())[top:top + th], tf.float32)
        cols = tf.cast(pillow_weights(iw, rw, method, _TFWeights())[left:left + tw], tf.float32)
        x = _pillow_passes(x, rows, cols, vertical_first(ih, iw, rh, rw, p, _TFInt()), p,
                           _TFOps, cond=_cond)
    elif antialias and before is None and p["resize"] != "border":
        # Only the crop's pixels: TensorFlow's scale-and-translate (what
        # `resize(antialias=True)` runs) samples the resized image at the
        # crop's positions directly, PIL's pass order kept (columns, then
        # rows) -- the same values as resizing everything and cropping.
        x = _crop_resample(tf, x, (h, w), (rh, rw), (top, left, th, tw), method, p)
    else:
        if p["round_uint8"] and method != "area":
            ih, iw = tf.shape(x)[-3], tf.shape(x)[-2]

            def passes(middle):
                y = tf.image.resize(x, tf.stack(middle), method=method, antialias=antialias)
                y = tf.image.resize(round_half_up(y, _TFOps), tf.stack([rh, rw]),
                                    method=method, antialias=antialias)
                return round_half_up(y, _TFOps)

            x = _cond(vertical_first(ih, iw, rh, rw, p, _TFInt()),
                      lambda: passes([rh, iw]), lambda: passes([ih, rw]))
        else:
            x = tf.image.resize(x, tf.stack([rh, rw]), method=method, antialias=antialias)
        x = _crop_or_pad(x, top, left, th, tw, p, _TFOps)
    x = tf.ensure_shape(x, [*([None] * (len(images.shape) - 3)), th, tw, 3])
    if p["clip"]:
        x = tf.clip_by_value(x, 0.0, 255.0)
    return normalise(x, p) if normalize else x


def _cond(pred, true_fn, false_fn):
    """`tf.cond`, or the branch itself where `pred` is already a bool."""
    if isinstance(pred, (bool, np.bool_)):
        return true_fn() if pred else false_fn()
    import tensorflow as tf

    return tf.cond(pred, true_fn, false_fn)


class _IntOps:
    """`_crop_or_pad` on static shapes: Python ints and `keras.ops`."""
    maximum = staticmethod(max)

    @staticmethod
    def shape(x):
        return tuple(int(d) for d in x.shape)

    @staticmethod
    def pad(x, pads):
        return keras.ops.pad(x, [(int(a), int(b)) for a, b in pads])

    @staticmethod
    def stack(xs, axis):
        return keras.ops.stack(xs, axis=axis)


class _TFOpsNamespace:
    """The few `keras.ops` names the shared helpers use, in TensorFlow (for
    graphs under any Keras backend); TensorFlow is imported at first use."""

    def __getattr__(self, name):
        import tensorflow as tf

        def pad(x, pads):
            return tf.pad(x, tf.stack([tf.stack([tf.cast(a, tf.int32), tf.cast(b, tf.int32)])
                                       for a, b in pads]))

        ops = dict(shape=tf.shape, maximum=tf.maximum, pad=pad, stack=tf.stack,
                   clip=tf.clip_by_value, floor=tf.floor, floor_divide=tf.math.floordiv,
                   cast=tf.cast, einsum=tf.einsum,
                   concatenate=lambda xs, axis=0: tf.concat(xs, axis))
        self.__dict__.update(ops)  # looked up here once, then plain attributes
        if name not in ops:
            raise AttributeError(name)
        return ops[name]


_TFOps = _TFOpsNamespace()


def _crop_resample(tf, x, hw, resized, crop, method, p):
    """`resize(x, resized)[crop]` (antialiased) computing only the crop."""
    batched = len(x.shape) == 4
    x = x if batched else x[None]
    (h, w), (rh, rw), (top, left, th, tw) = hw, resized, crop
    f = lambda v: tf.cast(v, tf.float32)  # noqa: E731

    def sample(images, size, scale, translation):
        return tf.raw_ops.ScaleAndTranslate(
            images=images, size=tf.stack(size), scale=tf.stack(scale),
            translation=tf.stack(translation), antialias=True,
            kernel_type={"bicubic": "keyscubic", "bilinear": "triangle"}[method])

    if p["round_uint8"]:  # Pillow: one pass per axis, each rounded to uint8
        def columns(y, rows):
            y = sample(y, [rows, tw], [1.0, f(rw) / f(w)], [0.0, -f(left)])
            return round_half_up(y, _TFOps)

        def rows(y, cols):
            y = sample(y, [th, cols], [f(rh) / f(h), 1.0], [-f(top), 0.0])
            return round_half_up(y, _TFOps)

        x = _cond(vertical_first(h, w, rh, rw, p, _TFInt()),
                  lambda: columns(rows(x, w), th), lambda: rows(columns(x, h), tw))
    else:
        x = sample(x, [th, tw], [f(rh) / f(h), f(rw) / f(w)], [-f(top), -f(left)])
    return x if batched else x[0]


def _in_tf_graph():
    try:
        import tensorflow as tf
    except ImportError:
        return False
    return not tf.executing_eagerly()


@keras.saving.register_keras_serializable(package="keras_reluvit")
class ImagePreprocessor(keras.layers.Layer):
    """Prepares images for a model as its checkpoint expects them.

    Takes pixel images (uint8, or floats holding 0-255 values; [0, 1]
    floats for an `input_scale=1` recipe) of any size: one `[H, W, 3]`
    array, a batch `[N, H, W, 3]`, or a list of arrays of different sizes;
    RGBA (`[..., 4]`) images lose their alpha channel by the recipe's
    `alpha` rule. Returns the float32 model inputs `[N, *image_size, 3]`.
    Runs on every backend (`keras.ops`), and in TensorFlow graphs with
    dynamic sizes (tf.data, SavedModels) through TensorFlow's own resize,
    which computes the same thing.

    Args:
        image_size: `(height, width)` the model takes.
        **recipe: the keys of `keras_reluvit.preprocessing` (`resize`,
            `crop_pct`, `interpolation`, `antialias`, `round_uint8`,
            `pass_order`, `clip`, `alpha`, `input_scale`, `crop_offset`,
            `resize_rounding`, `mean`, `std`); missing ones take our
            default.

    Example:

    >>> import numpy as np, keras_reluvit
    >>> pre = keras_reluvit.ImagePreprocessor((32, 32), interpolation="bicubic")
    >>> photo = np.random.randint(0, 256, (48, 64, 3), dtype="uint8")
    >>> tuple(pre(photo).shape)
    (1, 32, 32, 3)
    """

    def __init__(self, image_size=(224, 224), name=None, dtype=None, **recipe):
        kwargs = {k: recipe.pop(k) for k in ("trainable",) if k in recipe}
        super().__init__(name=name, dtype=dtype, **kwargs)
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = tuple(int(s) for s in image_size)
        self.recipe = check_preprocessing(recipe)

    def __call__(self, images, *args, **kwargs):
        # Inside tf.data (a TensorFlow graph) under JAX or PyTorch, Keras'
        # Layer.__call__ would convert the symbolic tf.Tensor to the backend's
        # arrays and fail; the TensorFlow path computes the same thing, as
        # Keras' own preprocessing layers do in tf.data.
        if keras.backend.backend() != "tensorflow" and _in_tf_graph():
            return self.call(images)
        return super().__call__(images, *args, **kwargs)

    def call(self, images):
        if isinstance(images, (list, tuple)):
            return keras.ops.concatenate([self.call(image) for image in images], axis=0)
        if len(images.shape) == 3:
            images = images[None]
        if len(images.shape) != 4 or images.shape[-1] not in (1, 2, 3, 4, None):
            raise ValueError(f"ImagePreprocessor takes images [H, W, C] or [N, H, W, C] of "
                             f"1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA) channels, got "
                             f"shape {tuple(images.shape)}.")
        graph = keras.backend.backend() == "tensorflow" or _in_tf_graph()
        images = self._pixels(images, graph)
        if graph:
            return tf_preprocess(images, self.image_size, self.recipe)
        return _generic(images, self.image_size, self.recipe)

    def _pixels(self, images, graph):
        """0-255 pixel values: float images of an `input_scale=1` recipe are
        [0, 1] values (refused above 1 where the values can be seen),
        times 255 -- rounded to whole pixels where the source resamples
        uint8 images (Pillow)."""
        if self.recipe["input_scale"] == 255.0:
            return images
        dtype = keras.backend.standardize_dtype(images.dtype)
        if "float" not in dtype:
            return images
        if graph:
            import tensorflow as tf

            x = tf.cast(images, tf.float32)
            if tf.executing_eagerly() and int(tf.size(x)):
                self._check_unit_range(float(tf.reduce_max(x)))
            x = x * 255.0
            return tf.round(x) if self.recipe["round_uint8"] else x
        ops = keras.ops
        x = ops.cast(images, "float32")
        if int(np.prod(x.shape)):
            self._check_unit_range(float(ops.convert_to_numpy(ops.max(x))))
        x = x * 255.0
        return ops.round(x) if self.recipe["round_uint8"] else x

    @staticmethod
    def _check_unit_range(top):
        if top > 1.0:
            raise ValueError(
                f"This model's preprocessing takes float images in [0, 1] (input_scale=1: its "
                f"source's processor has do_rescale=False), got values up to {top:g}. Pass "
                "uint8 pixels, or floats divided by 255.")

    def compute_output_spec(self, images):
        n = None if isinstance(images, (list, tuple)) else (
            images.shape[0] if len(images.shape) == 4 else 1)
        return keras.KerasTensor((n, *self.image_size, 3), "float32")

    def get_config(self):
        config = super().get_config()
        config.update(image_size=self.image_size, **self.recipe)
        return config


def preprocess(model, images):
    """`model.preprocessor(images)`: pixel images of any size (uint8 or 0-255
    floats; one image, a batch or a list) -> the model's inputs."""
    return model.preprocessor(images)


def decode_image(data, dct_method="INTEGER_ACCURATE", alpha="drop"):
    """Encoded image bytes (a TensorFlow string scalar) -> uint8 `[H, W, 3]`
    in TensorFlow ops: JPEG with the accurate integer DCT (as PIL, i.e. timm
    and transformers, decode; `dct_method=""` is TensorFlow's default, what
    tfds decodes with), PNG / GIF / BMP / WebP with `tf.io.decode_image`.

    `alpha`: a transparent image's alpha channel is dropped (`"drop"`, PIL's
    `convert("RGB")`), composited onto white (`"white"`, transformers'
    `convert_to_rgb`; see `composite_on_white`) or kept (`"keep"`: always
    `[H, W, 4]`, alpha 255 where the file has none, for a preprocessor to
    apply its recipe's rule). Grayscale images become RGB."""
    import tensorflow as tf

    if alpha not in ALPHA_RULES + ("keep",):
        raise ValueError(f"alpha must be 'drop', 'white' or 'keep', got {alpha!r}.")
    if alpha == "drop":
        return tf.cond(
            tf.io.is_jpeg(data),
            lambda: tf.io.decode_jpeg(data, channels=3, dct_method=dct_method),
            lambda: tf.io.decode_image(data, channels=3, expand_animations=False))

    def opaque(x):  # a channel of 255 beside x
        return tf.fill(tf.concat([tf.shape(x)[:-1], [1]], 0), tf.constant(255, x.dtype))

    def rgba():
        x = tf.io.decode_image(data, channels=0, expand_animations=False)
        c = tf.shape(x)[-1]  # 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA)
        rgb = tf.cond(c >= 3, lambda: x[..., :3], lambda: tf.repeat(x[..., :1], 3, axis=-1))
        a = tf.cond(tf.equal(c % 2, 0), lambda: x[..., -1:], lambda: opaque(x))
        return tf.concat([rgb, a], -1)

    def jpeg():  # no alpha channel in a JPEG
        x = tf.io.decode_jpeg(data, channels=3, dct_method=dct_method)
        return tf.concat([x, opaque(x)], -1) if alpha == "keep" else x

    def other():
        x = tf.ensure_shape(rgba(), [None, None, 4])
        if alpha == "keep":
            return x
        q = tf.cast(x, tf.int32)
        return tf.cast(composite_on_white(q[..., :3], q[..., 3:], _TFOps), tf.uint8)

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other),
                           [None, None, 4 if alpha == "keep" else 3])


def load_image(path, alpha="auto"):
    """An image file (JPEG, PNG, GIF, BMP, WebP) as uint8 numpy pixels,
    decoded as the SavedModel's `serve_bytes` decodes it: TensorFlow, JPEG
    with the accurate integer DCT (the pixels PIL gives).

    `alpha`: `"auto"` (default) gives `[H, W, 3]` for an opaque image and
    `[H, W, 4]` for one with transparent pixels, which `model.preprocessor`
    turns into RGB by the checkpoint's own rule (transformers' CLIP / DINOv2
    composite onto white, timm drops the channel) -- so
    `model.preprocessor(kr.load_image(path))` is right for every image, as
    `keras-reluvit predict`. `"keep"` always `[H, W, 4]`; `"drop"` /
    `"white"` RGB by that rule (see `decode_image`). Needs TensorFlow (the
    `[train]` extra)."""
    if alpha not in ALPHA_RULES + ("keep", "auto"):
        raise ValueError(f"alpha must be 'auto', 'keep', 'drop' or 'white', got {alpha!r}.")
    with open(path, "rb") as f:
        data = f.read()
    import tensorflow as tf

    try:
        x = decode_image(tf.constant(data), alpha="keep" if alpha == "auto" else alpha).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(f"{path}: not a readable JPEG, PNG, GIF, BMP or WebP image "
                         f"({e.message}).") from None
    if alpha == "auto" and bool(np.all(x[..., 3] == 255)):  # opaque: every rule agrees
        x = np.ascontiguousarray(x[..., :3])
    return x


def probabilities(logits, activation="softmax"):
    """Logits `[N, C]` -> probabilities (softmax, or sigmoid for models
    trained with a sigmoid cross-entropy), as numpy."""
    z = np.asarray(keras.ops.convert_to_numpy(logits), "float64")
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if activation != "softmax":
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}.")
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------- labels
def imagenet1k_labels():
    """The 1000 ImageNet-1k class names in the standard class order
    (WordNet lemmas, e.g. "tench, Tinca tinca"; the same strings as
    transformers' ImageNet checkpoints)."""
    import importlib.resources

    text = importlib.resources.files("keras_reluvit").joinpath(
        "resources/imagenet1k_labels.txt").read_text(encoding="utf-8")
    return [line.split("\t", 1)[1] for line in text.splitlines() if line]


def decode_predictions(predictions, model=None, top=5, label_names=None, from_logits=False):
    """The `top` classes of each row of `predictions` (`[N, C]`
    probabilities; logits with `from_logits=True`, turned into softmax
    probabilities) as lists of `(class name, probability)`, best first.

    Class names come from `label_names`, else `model.label_names` (what the
    checkpoint stored), else `"class_<i>"`.

    Example:

    >>> import numpy as np, keras_reluvit
    >>> keras_reluvit.decode_predictions(np.array([[0.1, 0.7, 0.2]]),
    ...                                  label_names=["cat", "dog", "eel"], top=2)
    [[('dog', 0.7), ('eel', 0.2)]]
    """
    p = (probabilities(predictions) if from_logits
         else np.asarray(keras.ops.convert_to_numpy(predictions), "float64"))
    if p.ndim != 2:
        raise ValueError(f"decode_predictions takes [N, classes] scores, got shape {p.shape}.")
    names = label_names if label_names is not None else getattr(model, "label_names", None)
    if names is not None and len(names) != p.shape[1]:
        raise ValueError(f"{len(names)} label names for {p.shape[1]} classes.")
    k = min(int(top), p.shape[1])
    out = []
    for row in p:
        idx = np.argsort(-row, kind="stable")[:k]
        out.append([(names[i] if names is not None else f"class_{i}", float(row[i]))
                    for i in idx])
    return out
