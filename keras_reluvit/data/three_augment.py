"""DeiT III's 3-Augment (facebookresearch/deit `augment.py`) and
torchvision's `ColorJitter`, in tf.data with keyed draws.

Per image, after the crop and flip: one of grayscale, solarization and
Gaussian blur, drawn uniformly (`RandomChoice` of the three at p=1), then
colour jitter (brightness, contrast and saturation factors uniform in
`[1 - j, 1 + j]`, applied in a random order). The operations are Pillow's,
which DeiT and torchvision run on PIL images (`convert("L")`,
`ImageOps.solarize`, `ImageFilter.GaussianBlur`, `ImageEnhance`; see
`pillow_ops`).

Keras' layers (`RandomGrayscale`, `Solarization`, `RandomGaussianBlur`,
`RandomColorJitter`) differ where it matters: additive brightness, contrast
around each channel's own mean, a fixed order of the jitter's operations and
a 3-tap blur by default; hence Pillow's operations here.
"""

from keras_reluvit.data import lazy
from keras_reluvit.data.augment import resize_crop
from keras_reluvit.data.pillow_ops import brightness
from keras_reluvit.data.pillow_ops import color
from keras_reluvit.data.pillow_ops import contrast
from keras_reluvit.data.pillow_ops import gaussian_blur
from keras_reluvit.data.pillow_ops import grayscale
from keras_reluvit.data.pillow_ops import solarize

BLUR_SIGMA = (0.1, 2.0)  # deit augment.GaussianBlur: radius uniform in it


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
