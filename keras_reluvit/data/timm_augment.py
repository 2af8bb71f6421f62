"""timm's automatic augmentations by their names (`--aa`): RandAugment
(`rand-m9-mstd0.5-inc1`, DeiT's) and AugMix (`augmix-m3-w3-d-1`), in tf.data
with keyed draws (`timm.data.auto_augment` semantics).

Each operation is Pillow's, as timm runs it on PIL images (`pillow_ops`:
float 0-255 pixels, no rounding to uint8 between operations, bilinear
sampling where timm draws bilinear or bicubic). The magnitude scale is
timm's: 0-10 (`M`), each operation's argument a function of it (`_OPS`, timm's
level functions), with a random sign where timm negates.

Keras' `RandAugment` and `AugMix` differ from timm's: other operations and
strengths (Keras' factor in [0, 1] for every op, additive brightness, no
magnitude noise, every chosen op applied), hence these operations.
AutoAugment's fixed policies (`v0`, `original`) are not here.
"""

import re

from keras_reluvit.data.pillow_ops import auto_contrast
from keras_reluvit.data.pillow_ops import brightness
from keras_reluvit.data.pillow_ops import color
from keras_reluvit.data.pillow_ops import contrast
from keras_reluvit.data.pillow_ops import equalize
from keras_reluvit.data.pillow_ops import invert
from keras_reluvit.data.pillow_ops import posterize
from keras_reluvit.data.pillow_ops import rotate
from keras_reluvit.data.pillow_ops import sharpness
from keras_reluvit.data.pillow_ops import shear_x
from keras_reluvit.data.pillow_ops import shear_y
from keras_reluvit.data.pillow_ops import solarize
from keras_reluvit.data.pillow_ops import solarize_add
from keras_reluvit.data.pillow_ops import translate_x_rel
from keras_reluvit.data.pillow_ops import translate_y_rel
from keras_reluvit.data.tfds import _tf

LEVEL_MAX = 10.0  # timm's _LEVEL_DENOM: M10 is the strongest


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
    from keras_reluvit.data.pillow_ops import blend

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
    return blend(image, tf.clip_by_value(mixed, 0.0, 255.0), m_blend)


def _sections(name, kind, known, shown=None):
    """The sections of `name` (as rewritten by `parse`); errors quote
    `shown`, the name as the user wrote it."""
    parts = name.split("-")
    out = {}
    for part in parts[1:]:
        found = re.fullmatch(r"([a-z]+)(-?[\d.]+|inf)?", part)
        if not found or found.group(1) not in known or found.group(2) is None:
            raise ValueError(f"Unknown {kind} section {part!r} in {shown or name!r}; timm's are "
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
        s = _sections(name_, "RandAugment", ("m", "n", "p", "mstd", "mmax", "inc"), name)
        mstd = float(s.get("mstd", 0.0))
        return rand_augment, dict(
            magnitude=float(s.get("m", LEVEL_MAX)), num_layers=int(s.get("n", 2)),
            mstd=float("inf") if mstd > 100 else mstd,
            mmax=float(s["mmax"]) if "mmax" in s else None,
            increasing=bool(int(s.get("inc", 0))), prob=float(s.get("p", 0.5)))
    if head == "augmix":
        s = _sections(name_, "AugMix", ("m", "w", "d", "a", "mstd"), name)
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
