"""timm's augmentations, in tf.data with keyed draws: the automatic ones
by their names (`--aa`, `by_name`): RandAugment (`rand-m9-mstd0.5-inc1`,
DeiT's), AugMix (`augmix-m3-w3-d-1`) and AutoAugment's fixed policies
(`v0`, `v0r`, `original`, `originalr`, with `-mstd0.5`)
(`timm.data.auto_augment` semantics); random erasing (`--reprob`, `random_erasing`) and MixUp /
CutMix on batches (`--mixup` / `--cutmix`, `timm_mix`).

Each operation is Pillow's, as timm runs it on PIL images (`pillow_calls`:
float 0-255 pixels holding Pillow's uint8 levels; the geometric ones
sampled bilinear or bicubic as Pillow, `Augment(interpolation=)`). The
magnitude scale is timm's: 0-10 (`M`), each operation's argument a function of it (`_OPS`, timm's
level functions), with a random sign where timm negates.

Keras' `RandAugment` and `AugMix` differ from timm's: other operations and
strengths (Keras' factor in [0, 1] for every op, additive brightness, no
magnitude noise, every chosen op applied), hence these operations.
"""

import math
import re

from keras_reluvit.data import lazy
from keras_reluvit.data.augment import TIMM_MIX_MODES
from keras_reluvit.data.augment import beta_draws
from keras_reluvit.data.pillow_calls import KINDS
from keras_reluvit.data.pillow_calls import as_double
from keras_reluvit.data.pillow_calls import chain as pillow_chain

LEVEL_MAX = 10.0  # timm's _LEVEL_DENOM: M10 is the strongest


# Each operation: (function, its argument from the magnitude m (0-10) and a
# random sign s (+-1)), timm's level functions.
# The arguments in doubles (`as_double`), as timm computes them: AutoAugment's whole
# magnitudes then give Pillow exactly timm's matrix, and Pillow's blend rounds timm's
# double enhance factor to a float as it does timm's.
def _enhance(m, s):
    return as_double(m) / LEVEL_MAX * 1.8 + 0.1


def _enhance_increasing(m, s):
    return lazy.tensorflow().maximum(as_double(0.1), 1.0 + as_double(s) * as_double(m) / LEVEL_MAX * 0.9)


def _posterize_bits(m):
    tf = lazy.tensorflow()
    return tf.cast(m / LEVEL_MAX * 4.0, tf.int32)  # int(): truncation


def _solarize_threshold(m):
    return lazy.tensorflow().floor(m / LEVEL_MAX * 256.0)


_OPS = {
    "AutoContrast": ("auto_contrast", None),
    "Equalize": ("equalize", None),
    "Invert": ("invert", None),
    "Rotate": ("rotate", lambda m, s: as_double(s) * as_double(m) / LEVEL_MAX * 30.0),
    "Posterize": ("posterize", lambda m, s: _posterize_bits(m)),
    "PosterizeIncreasing": ("posterize", lambda m, s: 4 - _posterize_bits(m)),
    "PosterizeOriginal": ("posterize", lambda m, s: _posterize_bits(m) + 4),  # the paper's 4-8 bits
    "Solarize": ("solarize", lambda m, s: _solarize_threshold(m)),
    "SolarizeIncreasing": ("solarize", lambda m, s: 256.0 - _solarize_threshold(m)),
    "SolarizeAdd": ("solarize_add", lambda m, s: lazy.tensorflow().floor(m / LEVEL_MAX * 110.0)),
    "Color": ("color", _enhance),
    "ColorIncreasing": ("color", _enhance_increasing),
    "Contrast": ("contrast", _enhance),
    "ContrastIncreasing": ("contrast", _enhance_increasing),
    "Brightness": ("brightness", _enhance),
    "BrightnessIncreasing": ("brightness", _enhance_increasing),
    "Sharpness": ("sharpness", _enhance),
    "SharpnessIncreasing": ("sharpness", _enhance_increasing),
    "ShearX": ("shear_x", lambda m, s: as_double(s) * as_double(m) / LEVEL_MAX * 0.3),
    "ShearY": ("shear_y", lambda m, s: as_double(s) * as_double(m) / LEVEL_MAX * 0.3),
    "TranslateXRel": ("translate_x_rel", lambda m, s: as_double(s) * as_double(m) / LEVEL_MAX * 0.45),
    "TranslateYRel": ("translate_y_rel", lambda m, s: as_double(s) * as_double(m) / LEVEL_MAX * 0.45),
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



def _policy(text):
    """Sub-policies, one per line: `Op probability magnitude` pairs split by `|`."""
    return tuple(tuple((op, float(p), float(m)) for op, p, m in
                       (pair.split() for pair in line.split("|")))
                 for line in text.strip().splitlines())


# AutoAugment's ImageNet policies: 25 sub-policies of two operations, each
# applied with its probability at its magnitude (0-10). `original`: the
# paper's (Cubuk et al. 2018, arXiv 1805.09501, posterize keeping 4-8 bits);
# `v0`: TPU EfficientNet's. The `r` versions replace their posterize by the
# research code's, which discards more bits as the magnitude grows.
AUTO_AUGMENT = {"original": _policy("""
    PosterizeOriginal 0.4 8 | Rotate 0.6 9
    Solarize 0.6 5 | AutoContrast 0.6 5
    Equalize 0.8 8 | Equalize 0.6 3
    PosterizeOriginal 0.6 7 | PosterizeOriginal 0.6 6
    Equalize 0.4 7 | Solarize 0.2 4
    Equalize 0.4 4 | Rotate 0.8 8
    Solarize 0.6 3 | Equalize 0.6 7
    PosterizeOriginal 0.8 5 | Equalize 1.0 2
    Rotate 0.2 3 | Solarize 0.6 8
    Equalize 0.6 8 | PosterizeOriginal 0.4 6
    Rotate 0.8 8 | Color 0.4 0
    Rotate 0.4 9 | Equalize 0.6 2
    Equalize 0.0 7 | Equalize 0.8 8
    Invert 0.6 4 | Equalize 1.0 8
    Color 0.6 4 | Contrast 1.0 8
    Rotate 0.8 8 | Color 1.0 2
    Color 0.8 8 | Solarize 0.8 7
    Sharpness 0.4 7 | Invert 0.6 8
    ShearX 0.6 5 | Equalize 1.0 9
    Color 0.4 0 | Equalize 0.6 3
    Equalize 0.4 7 | Solarize 0.2 4
    Solarize 0.6 5 | AutoContrast 0.6 5
    Invert 0.6 4 | Equalize 1.0 8
    Color 0.6 4 | Contrast 1.0 8
    Equalize 0.8 8 | Equalize 0.6 3
"""), "v0": _policy("""
    Equalize 0.8 1 | ShearY 0.8 4
    Color 0.4 9 | Equalize 0.6 3
    Color 0.4 1 | Rotate 0.6 8
    Solarize 0.8 3 | Equalize 0.4 7
    Solarize 0.4 2 | Solarize 0.6 2
    Color 0.2 0 | Equalize 0.8 8
    Equalize 0.4 8 | SolarizeAdd 0.8 3
    ShearX 0.2 9 | Rotate 0.6 8
    Color 0.6 1 | Equalize 1.0 2
    Invert 0.4 9 | Rotate 0.6 0
    Equalize 1.0 9 | ShearY 0.6 3
    Color 0.4 7 | Equalize 0.6 0
    Posterize 0.4 6 | AutoContrast 0.4 7
    Solarize 0.6 8 | Color 0.6 9
    Solarize 0.2 4 | Rotate 0.8 9
    Rotate 1.0 7 | TranslateYRel 0.8 9
    ShearX 0.0 0 | Solarize 0.8 4
    ShearY 0.8 0 | Color 0.6 4
    Color 1.0 0 | Rotate 0.6 2
    Equalize 0.8 4 | Equalize 0.0 8
    Equalize 1.0 4 | AutoContrast 0.6 2
    ShearY 0.4 7 | SolarizeAdd 0.6 7
    Posterize 0.8 2 | Solarize 0.6 10
    Solarize 0.6 8 | Equalize 0.6 1
    Color 0.8 6 | Rotate 0.4 5
""")}
for _name, _posterize in (("original", "PosterizeOriginal"), ("v0", "Posterize")):
    AUTO_AUGMENT[_name + "r"] = tuple(
        tuple(("PosterizeIncreasing" if op == _posterize else op, p, m) for op, p, m in sub)
        for sub in AUTO_AUGMENT[_name])


GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def argument(name, magnitude, sign):
    """The argument timm's level function gives operation `name` at
    `magnitude` (0-10) and `sign` (+-1), in doubles (0 for none)."""
    level = _OPS[name][1]
    return as_double(0.0 if level is None else level(magnitude, sign))


def plan(ops, index, magnitude, sign):
    """Operation `ops[index]` (a tensor index) at `magnitude` and `sign`, as
    `(kind, argument)`: its Pillow operation's number in `pillow_calls.KINDS`
    and its argument (`argument`), for `run`."""
    tf = lazy.tensorflow()
    if len(ops) == 1:
        return tf.constant(KINDS.index(_OPS[ops[0]][0]), tf.int32), argument(ops[0], magnitude, sign)
    kinds = tf.constant([KINDS.index(_OPS[n][0]) for n in ops], tf.int32)
    return tf.gather(kinds, index), tf.switch_case(
        index, [lambda n=n: argument(n, magnitude, sign) for n in ops])


def run(image, kinds, arguments, applied, interpolation="bilinear", first=None):
    """The planned operations (`plan`), each where `applied`, in order, in one
    Pillow call (`pillow_calls.chain`, with the crop's resize and flip `first`
    where given): Pillow's own operations, at Pillow's speed, one round trip
    per image."""
    if first is None and isinstance(kinds, (list, tuple)) and not kinds:  # no layers
        return image
    return pillow_chain(image, kinds, arguments, applied, interpolation, first)


def apply_op(name, image, magnitude, sign, interpolation="bilinear"):
    """timm's operation `name` at `magnitude` (0-10) with `sign` (+-1); the
    geometric ones sample with Pillow's `interpolation` (timm's
    `hparams["interpolation"]`: DeiT's bicubic)."""
    return _one_of((name,), 0, image, magnitude, sign, interpolation)


def _draw_magnitude(magnitude, mstd, mmax, key):
    """timm's `AugmentOp` magnitude: `N(m, mstd)` (uniform in [0, m] for an
    infinite `mstd`), clipped to [0, mmax]."""
    tf = lazy.tensorflow()
    m = tf.constant(float(magnitude))
    if mstd == float("inf"):
        m = tf.random.stateless_uniform([], key, 0.0, float(magnitude))
    elif mstd > 0:
        m = m + float(mstd) * tf.random.stateless_normal([], key)
    return tf.clip_by_value(m, 0.0, float(mmax or LEVEL_MAX))


def _one_of(ops, index, image, magnitude, sign, interpolation="bilinear"):
    kind, arg = plan(ops, index, magnitude, sign)
    return run(image, [kind], [arg], [True], interpolation)


def rand_augment(image, key, num_layers=2, magnitude=10, mstd=0.0, mmax=None,
                 increasing=False, prob=0.5, interpolation="bilinear", first=None):
    """timm's `RandAugment` of one float 0-255 image: `num_layers` operations
    drawn uniformly with replacement from timm's 15 (`RAND_OPS`, or with
    `increasing` `RAND_INCREASING_OPS`), each applied with probability `prob`
    at a magnitude drawn per operation (`_draw_magnitude`). Stateless, from `key`.
    `first=(size, flip)`: the crop's resize and flip, in the same Pillow call
    (`pillow_calls.chain`; `image` is then the uncropped window)."""
    tf = lazy.tensorflow()
    ops = RAND_INCREASING_OPS if increasing else RAND_OPS
    kinds, arguments, applied = [], [], []
    for layer in range(int(num_layers)):
        keys = tf.random.experimental.stateless_split(
            tf.random.experimental.stateless_fold_in(key, layer), 4)
        index = tf.random.stateless_uniform([], keys[0], 0, len(ops), dtype=tf.int32)
        m = _draw_magnitude(magnitude, mstd, mmax, keys[1])
        sign = tf.where(tf.random.stateless_uniform([], keys[2]) > 0.5, -1.0, 1.0)
        kind, arg = plan(ops, index, m, sign)
        kinds.append(kind)
        arguments.append(arg)
        applied.append(tf.random.stateless_uniform([], keys[3]) < prob)
    return run(image, kinds, arguments, applied, interpolation, first)


def auto_augment(image, key, policy="v0", mstd=0.0, interpolation="bilinear", first=None):
    """timm's `AutoAugment` of one float 0-255 image: one of the policy's
    sub-policies (`AUTO_AUGMENT[policy]`) drawn uniformly, its operations in
    order, each applied with its probability at its magnitude (with `mstd`,
    drawn per operation as `_draw_magnitude`). Stateless, from `key`;
    `first` as `rand_augment`'s."""
    tf = lazy.tensorflow()
    subs = AUTO_AUGMENT[policy]
    k_choice, k_ops = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    index = tf.random.stateless_uniform([], k_choice, 0, len(subs), dtype=tf.int32)

    def draws(sub):
        kinds, arguments, applied = [], [], []
        for j, (name, prob, magnitude) in enumerate(sub):
            keys = tf.random.experimental.stateless_split(
                tf.random.experimental.stateless_fold_in(k_ops, j), 3)
            m = _draw_magnitude(magnitude, mstd, None, keys[0])
            sign = tf.where(tf.random.stateless_uniform([], keys[1]) > 0.5, -1.0, 1.0)
            kind, arg = plan((name,), 0, m, sign)
            kinds.append(kind)
            arguments.append(arg)
            applied.append(tf.random.stateless_uniform([], keys[2]) < prob)
        return tf.stack(kinds), tf.stack(arguments), tf.stack(applied)

    kinds, arguments, applied = tf.switch_case(index, [lambda sub=sub: draws(sub) for sub in subs])
    return run(image, kinds, arguments, applied, interpolation, first)


def truncated_levels(image):
    """A float image as NumPy's `astype(uint8)` after `np.clip(0, 255)`
    writes it (timm's AugMix mix): truncated levels."""
    tf = lazy.tensorflow()
    return tf.floor(tf.clip_by_value(image, 0.0, 255.0))


def augmix(image, key, magnitude=3, width=3, depth=-1, alpha=1.0, mstd=float("inf"),
           interpolation="bilinear"):
    """timm's `AugMixAugment` (its basic mode) of one float 0-255 image:
    `width` chains of `depth` operations (-1: 1 to 3) of `AUGMIX_OPS`, each
    applied (probability 1) at a magnitude drawn per operation, mixed with
    Dirichlet(alpha) weights, clipped and truncated to levels, and blended with the image by
    `Beta(alpha, alpha)`. Stateless, from `key`."""
    from keras_reluvit.data.pillow_graph import blend

    tf = lazy.tensorflow()
    keys = tf.random.experimental.stateless_split(key, 3)
    gammas = tf.random.stateless_gamma([width], keys[0], alpha=alpha)
    weights = gammas / tf.reduce_sum(gammas)  # Dirichlet(alpha, ..., alpha)
    b1, b2 = tf.unstack(tf.random.experimental.stateless_split(keys[1], 2))
    m_blend = beta_draws([], alpha, b1, b2)
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
            aug = tf.where(step < n, _one_of(AUGMIX_OPS, index, aug, m, sign,
                                             interpolation=interpolation), aug)
        mixed = mixed + weights[chain] * aug
    # timm: np.clip, then astype(uint8) (truncated) before Image.blend
    return blend(image, truncated_levels(mixed), m_blend)


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
    """timm's `--aa` name -> `(function, keyword arguments)` of `rand_augment`,
    `augmix` or `auto_augment`; a name or section timm does not know is an error."""
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
    if head in AUTO_AUGMENT:
        s = _sections(name_, "AutoAugment", ("mstd",), name)
        # timm's AutoAugment takes mstd as it is (no 'above 100: uniform')
        return auto_augment, dict(policy=head, mstd=float(s.get("mstd", 0.0)))
    raise ValueError(f"Unknown auto_augment {name!r}: timm's RandAugment ('rand-m9-mstd0.5-"
                     "inc1'), AugMix ('augmix-m3-w3-d-1') or AutoAugment's policies "
                     f"({', '.join(repr(p) for p in AUTO_AUGMENT)}, e.g. 'original-mstd0.5')"
                     + ("; DeiT III's 3-Augment is --three-augment (Augment(three_augment=True))"
                        if head in ("3a", "3aw") else "") + ".")


def by_name(image, name, key, interpolation="bilinear", first=None):
    """The augmentation timm's `--aa name` names, of one float 0-255 image,
    its geometric operations sampled with Pillow's `interpolation`.
    `first=(size, flip)` (where `takes_first(name)`): the crop's resize and
    flip in the same Pillow call (`image` the uncropped window)."""
    fn, kwargs = parse(name)
    if first is not None:
        kwargs["first"] = first
    return fn(image, key, interpolation=interpolation, **kwargs)


def takes_first(name):
    """Whether `by_name(name)` runs in one Pillow call that can take the
    crop's resize and flip (`first`): RandAugment and AutoAugment (AugMix
    mixes its chains in floats)."""
    return parse(name)[0] in (rand_augment, auto_augment)


ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = (0.3, 1 / 0.3)
ERASE_ATTEMPTS = 10


def random_erasing(image, probability, seed):
    """timm's `RandomErasing(probability, mode="pixel")` of one normalised
    image (`[H, W, C]`, after the model's normalisation): with
    `probability`, a box of `ERASE_AREA` of the image (uniform) and aspect
    ratio in `ERASE_ASPECT` (log-uniform) is filled with per-pixel standard
    normal noise; of `ERASE_ATTEMPTS` draws the first box that fits is used
    (none fits: the image is kept). Stateless, drawn from `seed`."""
    tf = lazy.tensorflow()
    keys = tf.random.experimental.stateless_split(seed, 5)
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    hf, wf = tf.cast(h, tf.float32), tf.cast(w, tf.float32)
    area = tf.random.stateless_uniform([ERASE_ATTEMPTS], keys[0], *ERASE_AREA) * hf * wf
    log_aspect = tf.random.stateless_uniform(
        [ERASE_ATTEMPTS], keys[1], math.log(ERASE_ASPECT[0]), math.log(ERASE_ASPECT[1]))
    aspect = tf.exp(log_aspect)
    box_h = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    box_w = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (box_h < h) & (box_w < w)
    first = tf.argmax(tf.cast(fits, tf.int32))  # the first attempt that fits
    bh, bw = box_h[first], box_w[first]
    corner = tf.random.stateless_uniform([2], keys[2], 0.0, 1.0)
    top = tf.cast(corner[0] * tf.cast(h - bh + 1, tf.float32), tf.int32)
    left = tf.cast(corner[1] * tf.cast(w - bw + 1, tf.float32), tf.int32)
    erase = (tf.random.stateless_uniform([], keys[3]) < probability) & tf.reduce_any(fits)

    def erased():  # the noise drawn for the box's rows only
        noise = _normal_rows(tf.shape(image), keys[4], top, bh, image.dtype)
        cols = tf.range(w)[None, :, None]
        band = tf.where((cols >= left) & (cols < left + bw), noise, image[top:top + bh])
        return tf.concat([image[:top], band, image[top + bh:]], 0)

    return tf.cond(erase, erased, lambda: image)


def _normal_rows(shape, key, first, rows, dtype):
    """Rows `first:first + rows` of `tf.random.stateless_normal(shape, key)`,
    drawn alone: Philox's counter moved to their first group of four (the
    op's layout: element e of the draw is value e % 4 of group e // 4), so a
    box's noise costs its rows, not the image (2.4 ms per 224 px image on
    one thread); equal to the whole draw's rows value for value (tested)."""
    tf = lazy.tensorflow()
    from tensorflow.python.ops import gen_stateless_random_ops_v2
    from tensorflow.python.ops import random_ops_util

    key, counter, alg = random_ops_util.get_key_counter_alg(key, "auto_select")
    row = tf.cast(tf.reduce_prod(shape[1:]), tf.int64)
    start = tf.cast(first, tf.int64) * row
    skip = tf.cast(start // 4, tf.uint64)
    low = counter[0] + skip
    counter = tf.stack([low, counter[1] + tf.cast(low < skip, tf.uint64)])  # the carry
    offset = start % 4
    n = tf.cast(rows, tf.int64) * row + offset
    flat = gen_stateless_random_ops_v2.stateless_random_normal_v2(
        tf.reshape(n, [1]), key=key, counter=counter, dtype=dtype, alg=alg)
    return tf.reshape(flat[offset:], tf.concat([[rows], shape[1:]], 0))




def cutmix_box(lam, centre, h, w):
    """CutMix's boxes as timm 1.0.31's `rand_bbox` draws them: sides
    `int(size * sqrt(1 - lam))` about a centre `(int(u * h), int(u' * w))`
    (`centre` holds the uniforms u), rows `cy - cut_h // 2` to
    `cy + (cut_h + 1) // 2` (so an unclipped box is exactly `cut_h` high; timm
    0.3.2, DeiT's pin, ended at `cy + cut_h // 2`), clipped to the image.
    Returns `(y1, y2, x1, x2)`, the ends exclusive."""
    tf = lazy.tensorflow()
    cut = tf.sqrt(1.0 - lam)
    cut_h = tf.cast(tf.cast(h, tf.float32) * cut, tf.int32)
    cut_w = tf.cast(tf.cast(w, tf.float32) * cut, tf.int32)
    cy = tf.cast(centre[:, 0] * tf.cast(h, tf.float32), tf.int32)
    cx = tf.cast(centre[:, 1] * tf.cast(w, tf.float32), tf.int32)
    return (tf.clip_by_value(cy - cut_h // 2, 0, h), tf.clip_by_value(cy + (cut_h + 1) // 2, 0, h),
            tf.clip_by_value(cx - cut_w // 2, 0, w), tf.clip_by_value(cx + (cut_w + 1) // 2, 0, w))


def timm_mix(images, labels, seed, mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0,
             switch_prob=0.5, mode="batch", label_smoothing=0.1):
    """timm's `Mixup` of one batch (`[B, H, W, C]` images, one-hot labels).

    With probability `prob`, each batch (`mode="batch"`: one draw for the
    batch) or each image (`"elem"`) is mixed with the batch in reverse order
    (timm's `x.flip(0)`; `"pair"`: image i and image B-1-i share their draws,
    so each pair swaps the same box or mixes with the same weight): CutMix with probability `switch_prob` when both
    alphas are on, else the one that is, with `lam ~ Beta(alpha, alpha)`.
    MixUp: `lam * x + (1 - lam) * x_flipped`. CutMix: a box of side
    `sqrt(1 - lam)` of the image's (integer sizes, its centre uniform,
    clipped at the borders) is pasted from the flipped image and `lam`
    corrected to the share not pasted (timm's `correct_lam`). Labels are
    smoothed first (`1 - s + s / K` on the class, `s / K` elsewhere) and
    mixed with the same `lam`. Stateless, drawn from `seed`."""
    tf = lazy.tensorflow()
    if mode not in TIMM_MIX_MODES:
        raise ValueError(f"Unknown timm_mix mode {mode!r}; valid: {TIMM_MIX_MODES}.")
    if not (mixup_alpha > 0 or cutmix_alpha > 0):
        raise ValueError("timm_mix needs mixup_alpha > 0 or cutmix_alpha > 0.")
    keys = tf.random.experimental.stateless_split(seed, 7)
    shape = tf.shape(images)
    batch, h, w = shape[0], shape[1], shape[2]
    n = 1 if mode == "batch" else batch
    if mode == "pair":
        tf.debugging.assert_equal(batch % 2, 0, message="timm_mix mode 'pair' needs an even "
                                  "batch")

    def beta(alpha, k1, k2):
        return beta_draws([n], alpha, k1, k2) if alpha > 0 else tf.ones([n])

    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = tf.random.stateless_uniform([n], keys[0]) < switch_prob
    else:
        use_cutmix = tf.fill([n], cutmix_alpha > 0)
    lam = tf.where(use_cutmix, beta(cutmix_alpha, keys[1], keys[2]),
                   beta(mixup_alpha, keys[3], keys[4]))
    apply = tf.random.stateless_uniform([n], keys[5]) < prob
    centre = tf.random.stateless_uniform([n, 2], keys[6])
    if mode == "pair":  # the second half mirrors the first: pairs (i, B-1-i)
        first = tf.range(batch) < batch // 2

        def mirrored(t):
            return tf.where(tf.reshape(first, [-1] + [1] * (t.shape.rank - 1)), t,
                            tf.reverse(t, [0]))

        use_cutmix, lam, apply, centre = (mirrored(t) for t in (use_cutmix, lam, apply, centre))
    lam = tf.where(apply, lam, tf.ones_like(lam))
    use_cutmix = use_cutmix & apply
    y1, y2, x1, x2 = cutmix_box(lam, centre, h, w)
    pasted = tf.cast((y2 - y1) * (x2 - x1), tf.float32) / tf.cast(h * w, tf.float32)
    lam = tf.where(use_cutmix, 1.0 - pasted, lam)
    rows = tf.range(h)[None, :, None]
    cols = tf.range(w)[None, None, :]
    box = ((rows >= y1[:, None, None]) & (rows < y2[:, None, None])
           & (cols >= x1[:, None, None]) & (cols < x2[:, None, None])
           & use_cutmix[:, None, None])
    flipped = tf.reverse(images, [0])
    lam_x = tf.reshape(tf.where(use_cutmix, tf.ones_like(lam), lam), [n, 1, 1, 1])
    if mode == "batch":  # one draw: the one mix drawn computed (~3x less work on a batch)
        mixed = tf.cond(use_cutmix[0], lambda: tf.where(box[..., None], flipped, images),
                        lambda: lam_x * images + (1.0 - lam_x) * flipped)
    else:  # CutMix's images have lam_x 1: their box pasted, the rest as they were
        mixed = tf.where(box[..., None], flipped, lam_x * images + (1.0 - lam_x) * flipped)
    k = tf.cast(tf.shape(labels)[-1], labels.dtype)
    smooth = labels * (1.0 - label_smoothing) + label_smoothing / k
    lam_y = tf.reshape(lam, [n, 1])
    return mixed, lam_y * smooth + (1.0 - lam_y) * tf.reverse(smooth, [0])
