"""Pillow's image operations (`ImageOps`, `ImageEnhance`, `ImageFilter`,
affine transforms), which timm, DeiT and torchvision run on PIL images, on
0-255 pixels `[H, W, 3]` (float32) in tf.data: what `timm_augment` and
`three_augment` are made of. Each writes the uint8 levels Pillow writes (its
rounding: a blend truncates, the gray level of `convert("L")` rounds in
fixed point, a bilinear transform truncates, a filter rounds), so a chain of
them on a uint8 image is Pillow's chain: `pillow_levels` turns a float
image (a resized crop) into levels first, as Pillow's resize does. Bilinear
sampling; the Gaussian blur is exact where Pillow approximates it by three
box blurs. Each is checked against Pillow in the tests
(`tests/test_timm_augment.py`, `tests/test_three_augment.py`)."""

import math

from keras_reluvit.data.tfds import _tf

FILL = (124, 116, 104)  # timm's img_mean fill: round(255 * ImageNet mean), as DeiT runs it
BLUR_TAPS = 6  # each side of the Gaussian: 3 sigma at DeiT's largest sigma, 2


def pillow_levels(image):
    """A float image as the uint8 levels Pillow's resampling writes: clipped
    to 0-255, rounded half up."""
    tf = _tf()
    return tf.floor(tf.clip_by_value(image, 0.0, 255.0) + 0.5)


def truncated_levels(image):
    """A float image as NumPy's `astype(uint8)` after `np.clip(0, 255)`
    writes it (timm's AugMix mix): truncated levels."""
    tf = _tf()
    return tf.floor(tf.clip_by_value(image, 0.0, 255.0))


def blend(degenerate, image, factor):
    """Pillow's `Image.blend(degenerate, image, factor)`: in float32,
    `degenerate + factor * (image - degenerate)`, truncated to a level."""
    tf = _tf()
    factor = tf.cast(factor, image.dtype)
    return tf.clip_by_value(tf.floor(degenerate + factor * (image - degenerate)), 0.0, 255.0)


def _gray(image):
    """Pillow's `convert("L")` of levels: `(R 19595 + G 38470 + B 7471 +
    2^15) >> 16` (ITU-R 601-2 in 16-bit fixed point; exact in float32)."""
    tf = _tf()
    weights = tf.constant([19595.0, 38470.0, 7471.0], image.dtype)
    return tf.floor((tf.tensordot(image, weights, 1) + 32768.0) / 65536.0)[..., None]


def grayscale(image):
    """Pillow's `convert("L")` as three equal channels (`[H, W, 3]`)."""
    return _tf().tile(_gray(image), [1, 1, 3])


def auto_contrast(image):
    """`ImageOps.autocontrast`: each channel stretched from its min..max to
    0..255 by Pillow's table, `int(x * scale + offset)` in double (a flat
    channel kept)."""
    tf = _tf()
    x = tf.cast(image, tf.float64)
    lo = tf.reduce_min(x, axis=[0, 1])
    hi = tf.reduce_max(x, axis=[0, 1])
    scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1e-6), 1.0)
    offset = tf.where(hi > lo, -lo * scale, 0.0)
    out = tf.clip_by_value(tf.floor(x * scale + offset), 0.0, 255.0)
    return tf.cast(out, image.dtype)


def equalize(image):
    """`ImageOps.equalize`: per channel, the histogram's lookup table of
    Pillow (`(step // 2 + pixels below) // step`, `step` the count without
    the last level's, over 255); a channel of one level, or a zero step, kept."""
    tf = _tf()
    levels = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.int32)

    def channel(c):
        values = levels[..., c]
        hist = tf.math.bincount(tf.reshape(values, [-1]), minlength=256, maxlength=256)
        nonzero = tf.boolean_mask(hist, hist > 0)
        step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
        below = tf.cumsum(hist, exclusive=True)
        lut = tf.minimum((step // 2 + below) // tf.maximum(step, 1), 255)
        out = tf.cast(tf.gather(lut, values), image.dtype)
        return tf.where(step > 0, out, image[..., c])

    return tf.stack([channel(c) for c in range(3)], -1)


def invert(image):
    return 255.0 - image


def posterize(image, bits):
    """`ImageOps.posterize`: the `bits` high bits of each level kept (8: as is)."""
    tf = _tf()
    shift = tf.cast(8 - bits, image.dtype)
    step = tf.pow(2.0, shift)
    levels = tf.clip_by_value(tf.round(image), 0.0, 255.0)
    return tf.where(bits >= 8, image, tf.floor(levels / step) * step)


def solarize(image, threshold=128.0):
    """`ImageOps.solarize`: `255 - x` where `x >= threshold`."""
    tf = _tf()
    return tf.where(image < tf.cast(threshold, image.dtype), image, 255.0 - image)


def solarize_add(image, add, threshold=128.0):
    """timm's `solarize_add`: `min(255, x + add)` where `x < threshold`."""
    tf = _tf()
    return tf.where(image < threshold, tf.minimum(image + tf.cast(add, image.dtype), 255.0),
                    image)


def color(image, factor):
    """`ImageEnhance.Color`: a blend with the image's grayscale."""
    return blend(_gray(image), image, factor)


def contrast(image, factor):
    """`ImageEnhance.Contrast`: a blend with the mean of `convert("L")`,
    rounded (Pillow's `int(mean + 0.5)`)."""
    tf = _tf()
    mean = tf.floor(tf.reduce_mean(tf.cast(_gray(image), tf.float64)) + 0.5)
    mean = tf.cast(mean, image.dtype)
    return blend(mean, image, factor)


def brightness(image, factor):
    """`ImageEnhance.Brightness`: a blend with black."""
    return blend(0.0, image, factor)


def sharpness(image, factor):
    """`ImageEnhance.Sharpness`: a blend with `ImageFilter.SMOOTH` (3x3,
    centre 5 of 13), whose one-pixel border is the image's own."""
    tf = _tf()
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0]
    smooth = tf.floor(smooth + 0.5)  # Pillow's filter writes levels, rounded half up
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    smooth = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
    rows, cols = tf.range(h)[:, None, None], tf.range(w)[None, :, None]
    border = (rows == 0) | (rows == h - 1) | (cols == 0) | (cols == w - 1)
    return blend(tf.where(border, image, smooth), image, factor)


INTERPOLATIONS = ("bilinear", "bicubic")  # Pillow's filters of the geometric operations


def _cubic(v1, v2, v3, v4, d):
    """Pillow's bicubic interpolation between `v2` and `v3` (`Geometry.c`'s
    `BICUBIC`: the cubic convolution with a = -1), its operations in its order."""
    p2 = -v1 + v3
    p3 = 2.0 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def _linear(v1, v2, d):
    return v1 + (v2 - v1) * d


def affine(image, matrix, fill=FILL, interpolation="bilinear"):
    """Pillow's `Image.transform(size, AFFINE, matrix, resample, fillcolor=fill)`
    on levels: output pixel centre `(x + 0.5, y + 0.5)` reads the input at
    `(a x' + b y' + c, d x' + e y' + f)`, in doubles as Pillow
    (`ImagingGenericTransform`); `fill` where that falls outside the image;
    `"bilinear"` (2 x 2 pixels) or `"bicubic"` (4 x 4, Pillow's a = -1
    kernel), the edge pixels repeated, truncated to a level (bicubic clipped
    to 0-255 first)."""
    tf = _tf()
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    a, b, c, d, e, f = [tf.cast(m, tf.float64) for m in matrix]
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    xs = tf.cast(tf.range(w), tf.float64)[None, :] + 0.5
    ys = tf.cast(tf.range(h), tf.float64)[:, None] + 0.5
    xin, yin = a * xs + b * ys + c, d * xs + e * ys + f
    inside = ((xin >= 0.0) & (xin < tf.cast(w, tf.float64))
              & (yin >= 0.0) & (yin < tf.cast(h, tf.float64)))
    xin, yin = xin - 0.5, yin - 0.5
    x0, y0 = tf.floor(xin), tf.floor(yin)
    dx, dy = (xin - x0)[..., None], (yin - y0)[..., None]
    taps = (0, 1) if interpolation == "bilinear" else (-1, 0, 1, 2)
    x0 = tf.cast(tf.clip_by_value(x0, -3.0, tf.cast(w, tf.float64)), tf.int32)
    y0 = tf.cast(tf.clip_by_value(y0, -3.0, tf.cast(h, tf.float64)), tf.int32)
    cols = [tf.clip_by_value(x0 + t, 0, w - 1) for t in taps]
    rows = [tf.clip_by_value(y0 + t, 0, h - 1) for t in taps]
    src = tf.cast(image, tf.float64)
    lines = []
    for r in rows:
        values = [tf.gather_nd(src, tf.stack([r, col], -1)) for col in cols]
        lines.append(_linear(*values, dx) if len(taps) == 2 else _cubic(*values, dx))
    v = _linear(*lines, dy) if len(taps) == 2 else _cubic(*lines, dy)
    v = tf.floor(tf.clip_by_value(v, 0.0, 255.0))  # (UINT8) v: truncation
    out = tf.where(inside[..., None], v, tf.constant(fill, tf.float64))
    return tf.cast(out, image.dtype)


def rotate(image, degrees, interpolation="bilinear"):
    """`Image.rotate(degrees)`: counter-clockwise about the centre `(w/2, h/2)`,
    its matrix in doubles as Pillow writes it (each entry rounded to 15 decimals)."""
    tf = _tf()
    angle = -(tf.cast(degrees, tf.float64) * (math.pi / 180.0))

    def r15(v):  # Python's round(v, 15)
        return tf.round(v * 1e15) / 1e15

    cos, sin, nsin = r15(tf.cos(angle)), r15(tf.sin(angle)), r15(-tf.sin(angle))
    cx = tf.cast(tf.shape(image)[1], tf.float64) / 2.0
    cy = tf.cast(tf.shape(image)[0], tf.float64) / 2.0
    c = cos * -cx + sin * -cy + 0.0 + cx
    f = nsin * -cx + cos * -cy + 0.0 + cy
    return affine(image, (cos, sin, c, nsin, cos, f), interpolation=interpolation)


def shear_x(image, factor, interpolation="bilinear"):
    return affine(image, (1.0, factor, 0.0, 0.0, 1.0, 0.0), interpolation=interpolation)


def shear_y(image, factor, interpolation="bilinear"):
    return affine(image, (1.0, 0.0, 0.0, factor, 1.0, 0.0), interpolation=interpolation)


def translate_x_rel(image, pct, interpolation="bilinear"):
    tf = _tf()
    pixels = tf.cast(pct, tf.float64) * tf.cast(tf.shape(image)[1], tf.float64)
    return affine(image, (1.0, 0.0, pixels, 0.0, 1.0, 0.0), interpolation=interpolation)


def translate_y_rel(image, pct, interpolation="bilinear"):
    tf = _tf()
    pixels = tf.cast(pct, tf.float64) * tf.cast(tf.shape(image)[0], tf.float64)
    return affine(image, (1.0, 0.0, 0.0, 0.0, 1.0, pixels), interpolation=interpolation)


def gaussian_blur(image, sigma):
    """A Gaussian blur of standard deviation `sigma` (Pillow's radius), the
    edges repeated; separable, `2 * BLUR_TAPS + 1` taps; written as levels."""
    tf = _tf()
    x = tf.range(-BLUR_TAPS, BLUR_TAPS + 1, dtype=image.dtype)
    taps = tf.exp(-0.5 * tf.square(x / tf.cast(sigma, image.dtype)))
    taps = taps / tf.reduce_sum(taps)
    padded = tf.concat([tf.repeat(image[:1], BLUR_TAPS, 0), image,
                        tf.repeat(image[-1:], BLUR_TAPS, 0)], 0)
    padded = tf.concat([tf.repeat(padded[:, :1], BLUR_TAPS, 1), padded,
                        tf.repeat(padded[:, -1:], BLUR_TAPS, 1)], 1)
    channels = image.shape[-1] or 3
    rows = tf.tile(tf.reshape(taps, [-1, 1, 1, 1]), [1, 1, channels, 1])
    cols = tf.tile(tf.reshape(taps, [1, -1, 1, 1]), [1, 1, channels, 1])
    out = tf.nn.depthwise_conv2d(padded[None], rows, [1, 1, 1, 1], "VALID")
    return pillow_levels(tf.nn.depthwise_conv2d(out, cols, [1, 1, 1, 1], "VALID")[0])
