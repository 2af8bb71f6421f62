"""DeiT III's 3-Augment (facebookresearch/deit `augment.py`) and
torchvision's `ColorJitter`, in tf.data with keyed draws.

Per image, after the crop and flip: one of grayscale, solarization and
Gaussian blur, drawn uniformly (`RandomChoice` of the three at p=1), then
colour jitter (brightness, contrast and saturation factors uniform in
`[1 - j, 1 + j]`, applied in a random order). Grayscale, solarization and
the jitter are Pillow's (`convert("L")`, `ImageOps.solarize`,
`ImageEnhance`), which DeiT and torchvision run on PIL images, as the
TensorFlow ops of `pillow_graph` that write Pillow's levels. The blur is an
exact Gaussian (`gaussian_blur`), where Pillow's `ImageFilter.GaussianBlur`
approximates one by three box blurs: within a level of it on average
(tests/test_three_augment.py).

Keras' layers (`RandomGrayscale`, `Solarization`, `RandomGaussianBlur`,
`RandomColorJitter`) differ where it matters: additive brightness, contrast
around each channel's own mean, a fixed order of the jitter's operations and
a 3-tap blur by default; hence Pillow's operations here.
"""

from keras_reluvit.data import lazy
from keras_reluvit.data.augment import resize_crop
from keras_reluvit.data.pillow_graph import brightness
from keras_reluvit.data.pillow_graph import color
from keras_reluvit.data.pillow_graph import contrast
from keras_reluvit.data.pillow_graph import grayscale
from keras_reluvit.data.pillow_graph import pillow_levels
from keras_reluvit.data.pillow_graph import solarize

BLUR_SIGMA = (0.1, 2.0)  # deit augment.GaussianBlur: radius uniform in it
BLUR_TAPS = 6  # each side of the Gaussian: 3 sigma at DeiT's largest sigma, 2


def color_jitter(image, strength, key):
    """torchvision's `ColorJitter(strength, strength, strength)` of one float
    0-255 image: brightness, contrast and saturation factors each uniform in
    `[max(0, 1 - strength), 1 + strength]`, applied in a uniformly random
    order. Stateless, drawn from `key`."""
    tf = lazy.tensorflow()
    k_factors, k_order = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    factors = tf.random.stateless_uniform([3], k_factors, max(0.0, 1.0 - strength),
                                          1.0 + strength)
    order = tf.argsort(tf.random.stateless_uniform([3], k_order))
    ops = (brightness, contrast, color)  # ImageEnhance's Brightness, Contrast, Color
    for position in range(3):
        image = tf.switch_case(order[position], [
            lambda op=op, i=i, im=image: op(im, factors[i]) for i, op in enumerate(ops)])
        image = tf.ensure_shape(image, [None, None, 3])
    return image


def gaussian_blur(image, sigma):
    """A Gaussian blur of standard deviation `sigma` (Pillow's radius), the
    edges repeated; separable, `2 * BLUR_TAPS + 1` taps; written as levels."""
    tf = lazy.tensorflow()
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


def three_augment(image, key):
    """DeiT III's 3-Augment of one float 0-255 image `[H, W, 3]`: grayscale,
    solarization or a Gaussian blur (sigma uniform in `BLUR_SIGMA`), one of
    the three uniformly. Stateless, drawn from `key`."""
    tf = lazy.tensorflow()
    k_choice, k_sigma = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    choice = tf.random.stateless_uniform([], k_choice, 0, 3, dtype=tf.int32)
    sigma = tf.random.stateless_uniform([], k_sigma, *BLUR_SIGMA)
    image = tf.switch_case(choice, [lambda: grayscale(image), lambda: solarize(image),
                                    lambda: gaussian_blur(image, sigma)])
    return tf.ensure_shape(image, [None, None, 3])


SIMPLE_CROP_PADDING = 4  # DeiT III's RandomCrop(size, padding=4, padding_mode="reflect")


def simple_random_crop(image, size, seed, interpolation="bilinear"):
    """DeiT III's simple random crop (`--src`) of decoded pixels `image`
    (`[H, W, C]`): resized so that it covers `size` with its shorter side
    (square sizes: torchvision's `Resize(int)`, the longer side truncated),
    `interpolation` as `augment.resize_crop` (DeiT III's: Pillow's bicubic),
    `SIMPLE_CROP_PADDING` pixels of reflection padding, a uniformly placed
    crop of `size`; float32 out."""
    tf = lazy.tensorflow()
    hw = tf.shape(image)[:2]
    if size[0] == size[1]:  # torchvision: short = size, long = int(size * long / short)
        short = tf.reduce_min(hw)
        to = tf.where(hw == short, size[0], (size[0] * hw) // short)
    else:
        shape = tf.cast(hw, tf.float32)
        scale = tf.reduce_max(tf.constant(size, tf.float32) / shape)
        to = tf.cast(tf.math.ceil(shape * scale - 1e-3), tf.int32)
    resized = resize_crop(image, to, interpolation)
    p = SIMPLE_CROP_PADDING
    padded = tf.pad(resized, [[p, p], [p, p], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, (*size, tf.shape(image)[-1]), seed)
