"""Pillow's image operations (`ImageOps`, `ImageEnhance`, `ImageFilter`,
affine transforms, resizing), which timm, DeiT and torchvision run on PIL
images, on 0-255 pixels `[H, W, 3]` (float32) in tf.data: what
`timm_augment` and `three_augment` are made of. The point and colour
operations are TensorFlow ops that write the uint8 levels Pillow writes
(its rounding: a blend truncates, the gray level of `convert("L")` rounds
in fixed point, a filter rounds); the resampling ones (the crop's resize,
rotate, shear, translate) are Pillow itself (`through_pillow`). So a chain
of them on a uint8 image is Pillow's chain: `pillow_levels` turns a float
image (a resized crop) into levels first, as Pillow's resize does. The
Gaussian blur is exact where Pillow approximates it by three box blurs.
Each is checked against Pillow in the tests (`tests/test_timm_augment.py`,
`tests/test_three_augment.py`)."""

import numpy as np

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


def through_pillow(image, call, *args, size=None):
    """`call(PIL image, *args as NumPy values)` -> PIL image, run by Pillow
    itself on the levels of `image` `[H, W, 3]` (uint8, or float levels) in
    a tf.data map (`tf.numpy_function`): Pillow's own arithmetic and
    rounding, version for version as timm gets them, at Pillow's speed (it
    lets go of the GIL while it resamples: ~8x faster than the same
    sampling written in TensorFlow ops). float32 levels out, `[*size, 3]`
    (default: the input's height and width). A pipeline holding it runs in
    this Python process (not in tf.data service or a SavedModel)."""
    tf = _tf()

    def run(pixels, *values):
        from PIL import Image

        return np.asarray(call(Image.fromarray(pixels, "RGB"), *values), np.uint8)

    pixels = image if image.dtype == tf.uint8 else tf.saturate_cast(tf.round(image), tf.uint8)
    out = tf.numpy_function(run, [pixels, *args], tf.uint8, stateful=False)
    shape = tf.shape(image)[:2] if size is None else tf.cast(tf.stack(size), tf.int32)
    return tf.cast(tf.reshape(out, tf.concat([shape, [3]], 0)), tf.float32)


def as_double(v):
    """`v` in doubles, as timm computes its arguments: a Python float exactly
    (not through float32: 0.3 stays 0.3), a tensor cast."""
    tf = _tf()
    return tf.cast(v, tf.float64) if tf.is_tensor(v) else tf.constant(v, tf.float64)


def _resample(interpolation):
    from PIL import Image

    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    return {"bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC}[interpolation]


def resize(image, size, interpolation="bicubic"):
    """Pillow's `resize((w, h), resample)` of `image` to `size` `(h, w)`
    (ints or int32 scalars): torchvision's resize of a PIL crop, timm's and
    DeiT's `RandomResizedCrop`. float32 levels out."""
    resample = _resample(interpolation)
    tf = _tf()
    hw = tf.cast(size, tf.int32)  # a pair of ints or of int32 scalars, or a [2] tensor
    h, w = hw[0], hw[1]
    return through_pillow(image, lambda im, h, w: im.resize((int(w), int(h)), resample),
                          h, w, size=(h, w))


def affine(image, matrix, fill=FILL, interpolation="bilinear"):
    """Pillow's `Image.transform(size, AFFINE, matrix, resample,
    fillcolor=fill)` of levels (timm's shear and translate): output pixel
    centre `(x + 0.5, y + 0.5)` reads the input at `(a x' + b y' + c,
    d x' + e y' + f)`; `matrix` six numbers (float64 tensors as timm
    computes them in doubles)."""
    from PIL import Image

    resample = _resample(interpolation)
    tf = _tf()
    matrix = tf.stack([as_double(m) for m in matrix])
    return through_pillow(image, lambda im, m: im.transform(
        im.size, Image.Transform.AFFINE, tuple(float(v) for v in m), resample,
        fillcolor=fill), matrix)


def rotate(image, degrees, interpolation="bilinear"):
    """Pillow's `Image.rotate(degrees, resample, fillcolor=FILL)`:
    counter-clockwise about the centre, as timm's `rotate` calls it."""
    resample = _resample(interpolation)
    return through_pillow(image, lambda im, d: im.rotate(float(d), resample, fillcolor=FILL),
                          as_double(degrees))


def shear_x(image, factor, interpolation="bilinear"):
    return affine(image, (1.0, factor, 0.0, 0.0, 1.0, 0.0), interpolation=interpolation)


def shear_y(image, factor, interpolation="bilinear"):
    return affine(image, (1.0, 0.0, 0.0, factor, 1.0, 0.0), interpolation=interpolation)


def translate_x_rel(image, pct, interpolation="bilinear"):
    tf = _tf()
    pixels = as_double(pct) * tf.cast(tf.shape(image)[1], tf.float64)
    return affine(image, (1.0, 0.0, pixels, 0.0, 1.0, 0.0), interpolation=interpolation)


def translate_y_rel(image, pct, interpolation="bilinear"):
    tf = _tf()
    pixels = as_double(pct) * tf.cast(tf.shape(image)[0], tf.float64)
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
