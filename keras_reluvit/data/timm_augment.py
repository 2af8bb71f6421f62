"""timm's automatic augmentations by their names (`--aa`): RandAugment
(`rand-m9-mstd0.5-inc1`, DeiT's) and AugMix (`augmix-m3-w3-d-1`), in tf.data
with keyed draws (`timm.data.auto_augment` semantics).

Each operation is Pillow's, as timm runs it on PIL images, computed on float
0-255 pixels (no rounding to uint8 between operations; bilinear sampling
where timm draws bilinear or bicubic), and checked against Pillow in
`tests/test_timm_augment.py`. The magnitude scale is timm's: 0-10 (`M`),
each operation's argument a function of it (`_LEVELS`), with a random sign
where timm negates.

Keras' `RandAugment` and `AugMix` differ from timm's: other operations and
strengths (Keras' factor in [0, 1] for every op, additive brightness, no
magnitude noise, every chosen op applied), hence these operations.
AutoAugment's fixed policies (`v0`, `original`) are not here.
"""

import math
import re

from keras_reluvit.data.tfds import _tf

LEVEL_MAX = 10.0  # timm's _LEVEL_DENOM: M10 is the strongest
FILL = (124, 116, 104)  # timm's img_mean fill: round(255 * ImageNet mean), as DeiT runs it


def _blend(degenerate, image, factor):
    """Pillow's `Image.blend(degenerate, image, factor)`, clipped."""
    return _tf().clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def _gray(image):
    from keras_reluvit.data.three_augment import GRAY_WEIGHTS

    tf = _tf()
    return tf.tensordot(image, tf.constant(GRAY_WEIGHTS, image.dtype), 1)[..., None]


def auto_contrast(image):
    """`ImageOps.autocontrast`: each channel stretched from its min..max to
    0..255 (a flat channel kept)."""
    tf = _tf()
    lo = tf.reduce_min(image, axis=[0, 1])
    hi = tf.reduce_max(image, axis=[0, 1])
    scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1e-6), 1.0)
    offset = tf.where(hi > lo, lo, 0.0)
    return tf.clip_by_value((image - offset) * scale, 0.0, 255.0)


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


def solarize(image, threshold):
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
    return _blend(_gray(image), image, factor)


def contrast(image, factor):
    """`ImageEnhance.Contrast`: a blend with the mean gray level (rounded, as Pillow's)."""
    tf = _tf()
    mean = tf.floor(tf.reduce_mean(_gray(image)) + 0.5)
    return _blend(mean, image, factor)


def brightness(image, factor):
    """`ImageEnhance.Brightness`: a blend with black."""
    return _blend(0.0, image, factor)


def sharpness(image, factor):
    """`ImageEnhance.Sharpness`: a blend with `ImageFilter.SMOOTH` (3x3,
    centre 5 of 13), whose one-pixel border is the image's own."""
    tf = _tf()
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0]
    smooth = tf.round(smooth)  # Pillow's filter writes uint8
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    smooth = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
    rows, cols = tf.range(h)[:, None, None], tf.range(w)[None, :, None]
    border = (rows == 0) | (rows == h - 1) | (cols == 0) | (cols == w - 1)
    return _blend(tf.where(border, image, smooth), image, factor)


def affine(image, matrix, fill=FILL):
    """Pillow's `Image.transform(size, AFFINE, matrix)`: output pixel
    centre `(x, y)` reads the input at `(a x + b y + c, d x + e y + f)`,
    bilinear, `fill` outside."""
    tf = _tf()
    a, b, c, d, e, f = [tf.cast(m, tf.float32) for m in matrix]
    # Pillow's coordinates are pixel centres at + 0.5; TensorFlow's at the index.
    transform = tf.stack([a, b, a * 0.5 + b * 0.5 + c - 0.5,
                          d, e, d * 0.5 + e * 0.5 + f - 0.5, 0.0, 0.0])[None]
    size = tf.shape(image)[:2]
    stacked = tf.concat([image, tf.ones_like(image[..., :1])], -1)[None]
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=stacked, transforms=transform, output_shape=size, fill_value=0.0,
        interpolation="BILINEAR", fill_mode="CONSTANT")[0]
    inside = out[..., 3:]
    return out[..., :3] + (1.0 - inside) * tf.constant(fill, image.dtype)


def rotate(image, degrees):
    """`Image.rotate(degrees)`: counter-clockwise about the centre `(w/2, h/2)`."""
    tf = _tf()
    angle = -tf.cast(degrees, tf.float32) * math.pi / 180.0
    cos, sin = tf.cos(angle), tf.sin(angle)
    h, w = tf.cast(tf.shape(image)[0], tf.float32), tf.cast(tf.shape(image)[1], tf.float32)
    cx, cy = w / 2.0, h / 2.0
    return affine(image, (cos, sin, cos * -cx + sin * -cy + cx,
                          -sin, cos, -sin * -cx + cos * -cy + cy))


def shear_x(image, factor):
    return affine(image, (1.0, factor, 0.0, 0.0, 1.0, 0.0))


def shear_y(image, factor):
    return affine(image, (1.0, 0.0, 0.0, factor, 1.0, 0.0))


def translate_x_rel(image, pct):
    tf = _tf()
    return affine(image, (1.0, 0.0, pct * tf.cast(tf.shape(image)[1], tf.float32),
                          0.0, 1.0, 0.0))


def translate_y_rel(image, pct):
    tf = _tf()
    return affine(image, (1.0, 0.0, 0.0, 0.0, 1.0,
                          pct * tf.cast(tf.shape(image)[0], tf.float32)))


# Each operation: (function, its argument from the magnitude m (0-10) and a
# random sign s (+-1)), timm's level functions.
def _enhance(m, s):
    return m / LEVEL_MAX * 1.8 + 0.1


def _enhance_increasing(m, s):
    return _tf().maximum(0.1, 1.0 + s * m / LEVEL_MAX * 0.9)


def _posterize_bits(m):
    return _tf().cast(m / LEVEL_MAX * 4.0, _tf().int32)  # int(): truncation


def _solarize_threshold(m):
    return _tf().floor(m / LEVEL_MAX * 256.0)


_OPS = {
    "AutoContrast": (lambda x, a: auto_contrast(x), None),
    "Equalize": (lambda x, a: equalize(x), None),
    "Invert": (lambda x, a: invert(x), None),
    "Rotate": (rotate, lambda m, s: s * m / LEVEL_MAX * 30.0),
    "Posterize": (posterize, lambda m, s: _posterize_bits(m)),
    "PosterizeIncreasing": (posterize, lambda m, s: 4 - _posterize_bits(m)),
    "Solarize": (solarize, lambda m, s: _solarize_threshold(m)),
    "SolarizeIncreasing": (solarize, lambda m, s: 256.0 - _solarize_threshold(m)),
    "SolarizeAdd": (solarize_add, lambda m, s: _tf().floor(m / LEVEL_MAX * 110.0)),
    "Color": (color, _enhance),
    "ColorIncreasing": (color, _enhance_increasing),
    "Contrast": (contrast, _enhance),
    "ContrastIncreasing": (contrast, _enhance_increasing),
    "Brightness": (brightness, _enhance),
    "BrightnessIncreasing": (brightness, _enhance_increasing),
    "Sharpness": (sharpness, _enhance),
    "SharpnessIncreasing": (sharpness, _enhance_increasing),
    "ShearX": (shear_x, lambda m, s: s * m / LEVEL_MAX * 0.3),
    "ShearY": (shear_y, lambda m, s: s * m / LEVEL_MAX * 0.3),
    "TranslateXRel": (translate_x_rel, lambda m, s: s * m / LEVEL_MAX * 0.45),
    "TranslateYRel": (translate_y_rel, lambda m, s: s * m / LEVEL_MAX * 0.45),
}
RAND_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
            "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
            "TranslateXRel", "TranslateYRel")
RAND_INCREASING_OPS = tuple({"Posterize": "PosterizeIncreasing",
                             "Solarize": "SolarizeIncreasing", "Color": "ColorIncreasing",
                             "Contrast": "ContrastIncreasing",
                             "Brightness": "BrightnessIncreasing",
                             "Sharpness": "SharpnessIncreasing"}.get(op, op) for op in RAND_OPS)
AUGMIX_OPS = ("AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
              "SharpnessIncreasing", "Equalize", "Rotate", "PosterizeIncreasing",
              "SolarizeIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def apply_op(name, image, magnitude, sign):
    """timm's operation `name` at `magnitude` (0-10) with `sign` (+-1)."""
    fn, level = _OPS[name]
    return fn(image, None if level is None else level(magnitude, sign))


def _draw_magnitude(magnitude, mstd, mmax, key):
    """timm's `AugmentOp` magnitude: `N(m, mstd)` (uniform in [0, m] for an
    infinite `mstd`), clipped to [0, mmax]."""
    tf = _tf()
    m = tf.constant(float(magnitude))
    if mstd == float("inf"):
        m = tf.random.stateless_uniform([], key, 0.0, float(magnitude))
    elif mstd > 0:
        m = m + float(mstd) * tf.random.stateless_normal([], key)
    return tf.clip_by_value(m, 0.0, float(mmax or LEVEL_MAX))


def _one_of(ops, index, image, magnitude, sign):
    tf = _tf()
    out = tf.switch_case(index, [lambda n=n: apply_op(n, image, magnitude, sign) for n in ops])
    return tf.ensure_shape(out, [None, None, 3])


def rand_augment(image, key, num_layers=2, magnitude=10, mstd=0.0, mmax=None,
                 increasing=False, prob=0.5):
    """timm's `RandAugment` of one float 0-255 image: `num_layers` operations
    drawn uniformly with replacement from timm's 15 (`RAND_OPS`, or with
    `increasing` `RAND_INCREASING_OPS`), each applied with probability `prob`
    at a magnitude drawn per operation (`_draw_magnitude`). Stateless, from `key`."""
    tf = _tf()
    ops = RAND_INCREASING_OPS if increasing else RAND_OPS
    for layer in range(int(num_layers)):
        keys = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(key, layer), 4)
        index = tf.random.stateless_uniform([], keys[0], 0, len(ops), dtype=tf.int32)
        m = _draw_magnitude(magnitude, mstd, mmax, keys[1])
        sign = tf.where(tf.random.stateless_uniform([], keys[2]) > 0.5, -1.0, 1.0)
        apply = tf.random.stateless_uniform([], keys[3]) < prob
        image = tf.cond(apply, lambda im=image, i=index, m=m, s=sign: _one_of(ops, i, im, m, s),
                        lambda im=image: im)
    return image


def augmix(image, key, magnitude=3, width=3, depth=-1, alpha=1.0, mstd=float("inf")):
    """timm's `AugMixAugment` (its basic mode) of one float 0-255 image:
    `width` chains of `depth` operations (-1: 1 to 3) of `AUGMIX_OPS`, each
    applied (probability 1) at a magnitude drawn per operation, mixed with
    Dirichlet(alpha) weights, clipped, and blended with the image by
    `Beta(alpha, alpha)`. Stateless, from `key`."""
    from keras_reluvit.data.augment import _beta

    tf = _tf()
    keys = tf.random.experimental.stateless_split(key, 3)
    gammas = tf.random.stateless_gamma([width], keys[0], alpha=alpha)
    weights = gammas / tf.reduce_sum(gammas)  # Dirichlet(alpha, ..., alpha)
    b1, b2 = tf.unstack(tf.random.experimental.stateless_split(keys[1], 2))
    m_blend = _beta([], alpha, b1, b2)
    mixed = tf.zeros_like(image)
    for chain in range(int(width)):
        ck = tf.random.experimental.stateless_fold_in(keys[2], chain)
        k_depth, k_ops = tf.unstack(tf.random.experimental.stateless_split(ck, 2))
        n = (tf.constant(depth) if depth > 0
             else tf.random.stateless_uniform([], k_depth, 1, 4, dtype=tf.int32))
        aug = image
        for step in range(depth if depth > 0 else 3):
            sk = tf.random.experimental.stateless_split(
                tf.random.experimental.stateless_fold_in(k_ops, step), 3)
            index = tf.random.stateless_uniform([], sk[0], 0, len(AUGMIX_OPS), dtype=tf.int32)
            m = _draw_magnitude(magnitude, mstd, None, sk[1])
            sign = tf.where(tf.random.stateless_uniform([], sk[2]) > 0.5, -1.0, 1.0)
            aug = tf.where(step < n, _one_of(AUGMIX_OPS, index, aug, m, sign), aug)
        mixed = mixed + weights[chain] * aug
    return _blend(image, tf.clip_by_value(mixed, 0.0, 255.0), m_blend)


def _sections(name, kind, known):
    parts = name.split("-")
    out = {}
    for part in parts[1:]:
        found = re.fullmatch(r"([a-z]+)(-?[\d.]+|inf)?", part)
        if not found or found.group(1) not in known or found.group(2) is None:
            raise ValueError(f"Unknown {kind} section {part!r} in {name!r}; timm's are "
                             f"{', '.join(known)} (e.g. {known[0]}9).")
        out[found.group(1)] = found.group(2)
    return out


def parse(name):
    """timm's `--aa` name -> `(function, keyword arguments)` of `rand_augment`
    or `augmix`; a name or section timm does not know is an error."""
    if not isinstance(name, str):
        raise ValueError(f"auto_augment must be one of timm's names such as "
                         f"'rand-m9-mstd0.5-inc1', got {name!r}.")
    # timm's AugMix writes its depth as 'd-1' (random): one section with its sign
    name_ = name.replace("-d-1", "-d0")
    head = name_.split("-")[0]
    if head == "rand":
        s = _sections(name_, "RandAugment", ("m", "n", "p", "mstd", "mmax", "inc"))
        mstd = float(s.get("mstd", 0.0))
        return rand_augment, dict(
            magnitude=float(s.get("m", LEVEL_MAX)), num_layers=int(s.get("n", 2)),
            mstd=float("inf") if mstd > 100 else mstd,
            mmax=float(s["mmax"]) if "mmax" in s else None,
            increasing=bool(int(s.get("inc", 0))), prob=float(s.get("p", 0.5)))
    if head == "augmix":
        s = _sections(name_, "AugMix", ("m", "w", "d", "a", "mstd"))
        depth = int(s.get("d", -1))
        return augmix, dict(magnitude=float(s.get("m", 3)), width=int(s.get("w", 3)),
                            depth=depth if depth > 0 else -1, alpha=float(s.get("a", 1.0)),
                            mstd=float(s.get("mstd", "inf")))
    raise ValueError(f"Unknown auto_augment {name!r}: timm's RandAugment ('rand-m9-mstd0.5-"
                     "inc1') or AugMix ('augmix-m3-w3-d-1'); AutoAugment's fixed policies "
                     "('v0', 'original') are not here.")


def timm_augment(image, name, key):
    """The augmentation timm's `--aa name` names, of one float 0-255 image."""
    fn, kwargs = parse(name)
    return fn(image, key, **kwargs)
