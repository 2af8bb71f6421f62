"""Pillow's arithmetic as TensorFlow ops: graph-only pipelines (a
SavedModel, tf.data service) and DeiT III's operations write the uint8 levels
Pillow writes, without calling Pillow. A blend truncates (`Image.blend`), the
grey level of `convert("L")` rounds in 16-bit fixed point, a resampled float
becomes a level rounded half up (`pillow_levels`). So a chain of them on a
uint8 image is Pillow's chain. Pillow itself, called from tf.data, is
`pillow_calls`; Pillow's resize as TensorFlow ops is
`kr.preprocessing.pillow_resize`. Each op is checked against Pillow in
tests/test_three_augment.py and tests/test_timm_augment.py."""

from keras_reluvit.data import lazy


def pillow_levels(image):
    """A float image as the uint8 levels Pillow's resampling writes: clipped
    to 0-255, rounded half up."""
    tf = lazy.tensorflow()
    return tf.floor(tf.clip_by_value(image, 0.0, 255.0) + 0.5)


def blend(degenerate, image, factor):
    """Pillow's `Image.blend(degenerate, image, factor)`: in float32,
    `degenerate + factor * (image - degenerate)`, truncated to a level."""
    tf = lazy.tensorflow()
    factor = tf.cast(factor, image.dtype)
    return tf.clip_by_value(tf.floor(degenerate + factor * (image - degenerate)), 0.0, 255.0)


def _gray(image):
    """Pillow's `convert("L")` of levels: `(R 19595 + G 38470 + B 7471 +
    2^15) >> 16` (ITU-R 601-2 in 16-bit fixed point; exact in float32)."""
    tf = lazy.tensorflow()
    weights = tf.constant([19595.0, 38470.0, 7471.0], image.dtype)
    return tf.floor((tf.tensordot(image, weights, 1) + 32768.0) / 65536.0)[..., None]


def grayscale(image):
    """Pillow's `convert("L")` as three equal channels (`[H, W, 3]`)."""
    return lazy.tensorflow().tile(_gray(image), [1, 1, 3])


def solarize(image, threshold=128.0):
    """`ImageOps.solarize`: `255 - x` where `x >= threshold`."""
    tf = lazy.tensorflow()
    return tf.where(image < tf.cast(threshold, image.dtype), image, 255.0 - image)


def color(image, factor):
    """`ImageEnhance.Color`: a blend with the image's grayscale."""
    return blend(_gray(image), image, factor)


def contrast(image, factor):
    """`ImageEnhance.Contrast`: a blend with the mean of `convert("L")`,
    rounded (Pillow's `int(mean + 0.5)`)."""
    tf = lazy.tensorflow()
    mean = tf.floor(tf.reduce_mean(tf.cast(_gray(image), tf.float64)) + 0.5)
    mean = tf.cast(mean, image.dtype)
    return blend(mean, image, factor)


def brightness(image, factor):
    """`ImageEnhance.Brightness`: a blend with black."""
    return blend(0.0, image, factor)
