"""DeiT III's 3-Augment (facebookresearch/deit `augment.py`) and
torchvision's `ColorJitter`, in tf.data with keyed draws.

Per image, after the crop and flip: one of grayscale, solarization and
Gaussian blur, drawn uniformly (`RandomChoice` of the three at p=1), then
colour jitter (brightness, contrast and saturation factors uniform in
`[1 - j, 1 + j]`, applied in a random order). The operations are Pillow's,
which DeiT and torchvision run on PIL images (`convert("L")`,
`ImageOps.solarize`, `ImageFilter.GaussianBlur`, `ImageEnhance`), on float
0-255 pixels: no rounding to uint8 between steps, and the blur is an exact
Gaussian where Pillow approximates it by three box blurs.

Keras' layers (`RandomGrayscale`, `Solarization`, `RandomGaussianBlur`,
`RandomColorJitter`) differ where it matters: additive brightness, contrast
around each channel's own mean, a fixed order of the jitter's operations and
a 3-tap blur by default; hence these few lines.
"""

from keras_reluvit.data.tfds import _tf

GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma: Pillow's convert("L")
SOLARIZE_THRESHOLD = 128.0  # ImageOps.solarize: pixels >= 128 inverted
BLUR_SIGMA = (0.1, 2.0)  # deit augment.GaussianBlur: radius uniform in it
BLUR_TAPS = 6  # each side: 3 sigma at the largest sigma


def grayscale(image):
    """Pillow's `convert("L")` as three equal channels (`[H, W, 3]`)."""
    tf = _tf()
    gray = tf.tensordot(image, tf.constant(GRAY_WEIGHTS, image.dtype), 1)[..., None]
    return tf.tile(gray, [1, 1, 3])


def solarize(image):
    """Pillow's `ImageOps.solarize(image, 128)`: `255 - x` where `x >= 128`."""
    tf = _tf()
    return tf.where(image < SOLARIZE_THRESHOLD, image, 255.0 - image)


def gaussian_blur(image, sigma):
    """A Gaussian blur of standard deviation `sigma` (Pillow's radius), the
    edges repeated; separable, `2 * BLUR_TAPS + 1` taps."""
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
    return tf.nn.depthwise_conv2d(out, cols, [1, 1, 1, 1], "VALID")[0]


def adjust_brightness(image, factor):
    """`ImageEnhance.Brightness`: a blend with black, `factor * x`."""
    return _tf().clip_by_value(image * factor, 0.0, 255.0)


def adjust_contrast(image, factor):
    """`ImageEnhance.Contrast`: a blend with the mean gray level of the image."""
    tf = _tf()
    mean = tf.reduce_mean(grayscale(image)[..., 0])
    return tf.clip_by_value(mean + factor * (image - mean), 0.0, 255.0)


def adjust_saturation(image, factor):
    """`ImageEnhance.Color`: a blend with the image's grayscale."""
    tf = _tf()
    gray = grayscale(image)
    return tf.clip_by_value(gray + factor * (image - gray), 0.0, 255.0)


def color_jitter(image, strength, key):
    """torchvision's `ColorJitter(strength, strength, strength)` of one float
    0-255 image: brightness, contrast and saturation factors each uniform in
    `[max(0, 1 - strength), 1 + strength]`, applied in a uniformly random
    order. Stateless, drawn from `key`."""
    tf = _tf()
    k_factors, k_order = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    factors = tf.random.stateless_uniform([3], k_factors, max(0.0, 1.0 - strength),
                                          1.0 + strength)
    order = tf.argsort(tf.random.stateless_uniform([3], k_order))
    ops = (adjust_brightness, adjust_contrast, adjust_saturation)
    for position in range(3):
        image = tf.switch_case(order[position], [
            lambda op=op, i=i, im=image: op(im, factors[i]) for i, op in enumerate(ops)])
        image = tf.ensure_shape(image, [None, None, 3])
    return image


THREE_AUGMENT_OPS = ("grayscale", "solarize", "gaussian_blur")


def three_augment(image, key):
    """DeiT III's 3-Augment of one float 0-255 image `[H, W, 3]`: grayscale,
    solarization or a Gaussian blur (sigma uniform in `BLUR_SIGMA`), one of
    the three uniformly. Stateless, drawn from `key`."""
    tf = _tf()
    k_choice, k_sigma = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    choice = tf.random.stateless_uniform([], k_choice, 0, 3, dtype=tf.int32)
    sigma = tf.random.stateless_uniform([], k_sigma, *BLUR_SIGMA)
    image = tf.switch_case(choice, [lambda: grayscale(image), lambda: solarize(image),
                                    lambda: gaussian_blur(image, sigma)])
    return tf.ensure_shape(image, [None, None, 3])
