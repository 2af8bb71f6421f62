"""Training augmentation in tf.data: the `Augment` vocabulary (one field
per augmentation, whatever its source: docs/training.md's table), the
crops, and big_vision's: the inception crop (only the window of a JPEG
decoded; timm's `RandomResizedCrop`), `randaug` through Keras' RandAugment
one op at a time with keyed draws, and MixUp. timm's augmentations live in
`timm_augment`, DeiT III's in `three_augment`."""

import dataclasses
import math

import keras

from keras_reluvit import _keras_compat as compat
from keras_reluvit.data import lazy
from keras_reluvit.data import pillow_calls
from keras_reluvit.data.pillow_calls import INTERPOLATIONS
from keras_reluvit.preprocessing import decode_image
from keras_reluvit.preprocessing import tf_preprocess

CROPS = ("inception", "simple")
# timm_mix's arguments (data.timm_augment.timm_mix; tests/test_pipeline_ops.py keeps them equal)
TIMM_MIX_KEYS = ("mixup_alpha", "cutmix_alpha", "prob", "switch_prob", "mode", "label_smoothing")
TIMM_MIX_MODES = ("batch", "pair", "elem")


def _number(name, value, low, high, whole=False):
    """`value` a (whole) number in `[low, high]` (None: unbounded): else a
    ValueError naming `Augment`'s field."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (not whole or float(value).is_integer()) and value >= low and (
        high is None or value <= high)
    if not ok:
        span = f"[{low}, {'inf)' if high is None else f'{high}]'}"
        raise ValueError(f"Augment: {name} must be a {'whole ' if whole else ''}number in "
                         f"{span}, got {value!r}.")


def _pair(name, value, low, high):
    """`value` a (low, high) range of numbers above `low` (exclusive), at
    most `high`, low <= high."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > low
        and (high is None or v <= high) for v in value) and value[0] <= value[1]
    if not ok:
        bound = f"in ({low}, {high}]" if high is not None else f"above {low}"
        raise ValueError(f"Augment({name}=) must be a (low, high) pair of numbers {bound}, "
                         f"low <= high, got {value!r}.")


def check_repeats(repeats, name="Augment(aug_repeats=)"):
    """`repeats` is DeiT's repeated augmentation count: a whole number >= 1;
    `name` is how the caller's user spells it (a flag, a setting)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"{name} must be a whole number >= 1 (DeiT's 3; 1: off), "
                         f"got {repeats!r}.")


# Which sources run each option (its recipes: DeiT III's run timm's MixUp / CutMix and
# repeated augmentation; timm's --color-jitter is torchvision's ColorJitter, as DeiT III's).
SOURCES = dict(randaug=("big_vision",), mixup=("big_vision",), auto_augment=("timm",),
               erase=("timm",), timm_mix=("timm", "DeiT III"), aug_repeats=("timm", "DeiT III"),
               color_jitter=("timm", "DeiT III"), three_augment=("DeiT III",),
               crop=("DeiT III",))
# Options that do one job, of which one at most is on: the automatic augmentation, the
# batch's mixing.
ONE_JOB = (("randaug", "auto_augment", "three_augment"), ("mixup", "timm_mix"))


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training augmentation. `randaug=(num_ops, magnitude)` as big_vision;
    `mixup` is the Beta parameter p (0 = off); `erase` the probability of
    timm's random erasing (`--reprob`; DeiT's 0.25; see `random_erasing`);
    `timm_mix` the arguments of timm's MixUp / CutMix (`timm_mix`, e.g.
    DeiT's `{"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing":
    0.1}`), instead of `mixup`; `aug_repeats` DeiT's repeated augmentation
    (`RASampler`, timm's `--aug-repeats`; DeiT's 3; `repeats=`, its name
    before 0.2, still accepted): each epoch takes a new random
    `1 / aug_repeats` of the images and shows each `aug_repeats` times, each
    copy with its own draws, in the same number of steps; `crop`
    `"inception"` (the random-area crop of `crop_area` / `crop_aspect`: big_vision's
    inception crop, timm's `RandomResizedCrop`) or `"simple"` (DeiT III's
    `--src`: the shorter side resized to the size, 4 pixels of reflection
    padding, a random crop); `three_augment` DeiT III's 3-Augment and
    `color_jitter` torchvision's `ColorJitter(j, j, j)` after it (DeiT III:
    0.3; see `keras_reluvit.data.three_augment`); `auto_augment` timm's
    `--aa` name, instead of `randaug` (DeiT's `"rand-m9-mstd0.5-inc1"`,
    `"augmix-m3-w3-d-1"`, AutoAugment's `"original-mstd0.5"`; see
    `keras_reluvit.data.timm_augment`); `interpolation` the crop's resize and
    the geometric operations' sampling: `"bilinear"` (big_vision's resize,
    Pillow's bilinear transforms) or `"bicubic"` (Pillow's, as timm's
    `--train-interpolation bicubic`: DeiT's). Frozen and checked where made
    (two options of one job, `ONE_JOB`, are an error):
    `dataclasses.replace(aug, erase=0.25)` makes another, checked again."""

    crop_area: tuple = (0.05, 1.0)
    crop_aspect: tuple = (3 / 4, 4 / 3)
    flip: bool = True
    randaug: tuple = None
    mixup: float = 0.0
    erase: float = 0.0
    timm_mix: dict = None
    aug_repeats: int = None  # None: 1 (off), or `repeats`
    crop: str = "inception"
    three_augment: bool = False
    color_jitter: float = 0.0
    auto_augment: str = None
    interpolation: str = "bilinear"
    repeats: dataclasses.InitVar[int] = None  # aug_repeats' name before 0.2

    def __post_init__(self, repeats):
        if repeats is not None and self.aug_repeats not in (None, repeats):
            raise ValueError(f"Augment: repeats={repeats!r} is aug_repeats' old name; "
                             f"aug_repeats={self.aug_repeats!r} is given too.")
        if self.aug_repeats is None:  # frozen: set once, here
            object.__setattr__(self, "aug_repeats", 1 if repeats is None else repeats)
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"Augment(interpolation=) must be one of {INTERPOLATIONS}, "
                             f"got {self.interpolation!r}.")
        self._check_values()
        on = self.options()
        for job in ONE_JOB:
            both = [f"{f} ({' / '.join(SOURCES[f])}'s)" for f in job if f in on]
            if len(both) > 1:
                what = "automatic augmentation" if job is ONE_JOB[0] else "MixUp"
                raise ValueError(f"Augment: {' and '.join(both)} both on: each is the "
                                 f"pipeline's {what}; choose one.")

    def _check_values(self):
        """Each field's type and range: a ValueError naming the field."""
        _pair("crop_area", self.crop_area, 0, 1)
        _pair("crop_aspect", self.crop_aspect, 0, None)
        for name in ("flip", "three_augment"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Augment({name}=) must be True or False, "
                                 f"got {getattr(self, name)!r}.")
        if self.randaug is not None:
            if not (isinstance(self.randaug, (tuple, list)) and len(self.randaug) == 2):
                raise ValueError("Augment(randaug=) must be None or (num_ops, magnitude) as "
                                 f"big_vision's randaug(2, 15), got {self.randaug!r}.")
            _number("randaug's num_ops", self.randaug[0], 0, None, whole=True)
            _number("randaug's magnitude", self.randaug[1], 0, None)
        _number("mixup", self.mixup, 0, None)
        _number("erase", self.erase, 0, 1)
        _number("color_jitter", self.color_jitter, 0, None)
        check_repeats(self.aug_repeats)
        if self.crop not in CROPS:
            raise ValueError(f"Augment(crop=) must be one of {CROPS}, got {self.crop!r}.")
        if self.auto_augment is not None and not isinstance(self.auto_augment, str):
            raise ValueError(f"Augment(auto_augment=) must be None or timm's --aa name, "
                             f"got {self.auto_augment!r}.")
        if self.timm_mix is not None:
            if not isinstance(self.timm_mix, dict):
                raise ValueError(f"Augment(timm_mix=) must be None or a dict of timm_mix's "
                                 f"arguments {TIMM_MIX_KEYS}, got {self.timm_mix!r}.")
            unknown = sorted(set(self.timm_mix) - set(TIMM_MIX_KEYS))
            if unknown:
                raise ValueError(f"Augment(timm_mix=) has {', '.join(map(repr, unknown))}, not "
                                 f"arguments of timm_mix: {', '.join(TIMM_MIX_KEYS)}.")
            for key, low, high in (("mixup_alpha", 0, None), ("cutmix_alpha", 0, None),
                                   ("prob", 0, 1), ("switch_prob", 0, 1),
                                   ("label_smoothing", 0, 1)):
                if key in self.timm_mix:
                    _number(f"timm_mix's {key}", self.timm_mix[key], low, high)
            if self.timm_mix.get("mode", "batch") not in TIMM_MIX_MODES:
                raise ValueError(f"Augment(timm_mix=)'s mode must be one of {TIMM_MIX_MODES}, "
                                 f"got {self.timm_mix['mode']!r}.")

    def options(self):
        """The source-specific options on (`SOURCES`' fields), in field
        order."""
        on = dict(randaug=bool(self.randaug) and self.randaug[1] > 0, mixup=self.mixup > 0,
                  auto_augment=self.auto_augment is not None, erase=self.erase > 0,
                  timm_mix=self.timm_mix is not None, aug_repeats=self.aug_repeats > 1,
                  color_jitter=self.color_jitter > 0, three_augment=bool(self.three_augment),
                  crop=self.crop == "simple")
        return [f for f in SOURCES if on[f]]

    def mixed_sources(self):
        """Where the options on come from sources that no one recipe of theirs
        combines (big_vision's RandAugment with timm's erasing): one line
        saying so; else None."""
        on = self.options()
        common = set.intersection(*(set(SOURCES[f]) for f in on)) if on else {None}
        if common:
            return None
        named = ", ".join(f"{'crop=simple' if f == 'crop' else f} ({' / '.join(SOURCES[f])})"
                          for f in on)
        return (f"Augment combines options of more than one source ({named}): each runs as "
                "its source runs it, in the pipeline's order (`keras-reluvit recipes` / "
                "kr.data.ops.describe).")

    def to_dict(self):
        return dataclasses.asdict(self)


# `repeats` (aug_repeats' name before 0.2) read back: code that reads it keeps working.
Augment.repeats = property(lambda self: self.aug_repeats,
                           doc="aug_repeats' name before 0.2 (read only).")


def crop_window(shape, area, aspect, seed):
    """big_vision's inception crop window of an image of `shape` ([H, W, C]):
    (offset, size), each `[y, x]`, drawn statelessly from `seed`."""
    tf = lazy.tensorflow()
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([1, 0, 4]),
        seed=seed,
        area_range=area,
        aspect_ratio_range=aspect,
        min_object_covered=0.0,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[:2], crop_size[:2]


def random_crop(image, area, aspect, seed):
    """The inception crop window of decoded pixels `image` (`[H, W, C]`)."""
    tf = lazy.tensorflow()
    begin, crop = crop_window(tf.shape(image), area, aspect, seed)
    return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([crop, [-1]], 0))


def decode_random_crop(data, area, aspect, seed, dct_method="", alpha="drop"):
    """Encoded image bytes -> the inception crop window, uint8 `[h, w, 3]`: a
    JPEG's window is decoded alone (`decode_and_crop_jpeg`, as big_vision's
    `decode_jpeg_and_inception_crop`), other formats are decoded whole and
    cropped. The window equals `random_crop`'s on the decoded image for the
    same `seed`."""
    tf = lazy.tensorflow()

    def jpeg():
        begin, crop = crop_window(tf.image.extract_jpeg_shape(data), area, aspect, seed)
        return tf.image.decode_and_crop_jpeg(data, tf.concat([begin, crop], 0), channels=3,
                                             dct_method=dct_method)

    def other():
        return random_crop(decode_image(data, alpha=alpha), area, aspect, seed)

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other), (None, None, 3))


def resize_crop(image, size, interpolation="bilinear"):
    """A crop to `size`, float32 out: `"bilinear"` TensorFlow's (big_vision's),
    `"bicubic"` Pillow's own resize, levels (timm's and torchvision's on PIL
    images: DeiT's `--train-interpolation bicubic`)."""
    if interpolation == "bicubic":
        return pillow_calls.resize(image, size, "bicubic")
    return lazy.tensorflow().image.resize(image, size, method="bilinear")


def inception_crop(image, size, area, aspect, seed, interpolation="bilinear"):
    """The random crop of decoded pixels `image` (`[H, W, C]`), resized to
    `size` (`resize_crop`, float32 out)."""
    return resize_crop(random_crop(image, area, aspect, seed), size, interpolation)


def decode_inception_crop(data, size, area, aspect, seed, dct_method="", alpha="drop",
                          interpolation="bilinear"):
    """Encoded image bytes -> the random crop (`decode_random_crop`), resized
    to `size` (`resize_crop`, float32) from the uint8 crop (no float copy of the image)."""
    return resize_crop(decode_random_crop(data, area, aspect, seed, dct_method, alpha), size,
                       interpolation)


def resize_small_central_crop(image, size):
    """Our evaluation geometry: the shorter side to `round(size * 256 / 224)`
    (area; the longer side in proportion, rounded), central crop `size`;
    0-255 pixels out. `image` is `[H, W, C]` or a batch `[N, H, W, C]`."""

    return tf_preprocess(image, size, normalize=False)


class KeyedSeedGenerator(keras.random.SeedGenerator):
    """A `keras.random.SeedGenerator` for Keras' augmentation layers inside
    tf.data: each `next()` (what Keras' random ops ask a generator for) is a
    stateless seed derived from a key tensor, so the layers' draws depend on
    (seed, epoch, example) only, never on the order in which parallel map
    calls advance a shared state. It holds no state variable (SeedGenerator's
    own `__init__` makes one, a backend variable a tf.data graph cannot
    hold): its `next` is all Keras' random ops call; `state` and
    `get_config` are not available."""

    def __init__(self, key):  # (SeedGenerator.__init__ left out: see above)
        self.key, self.count = key, 0

    def __repr__(self):  # (SeedGenerator's reads its state variable, which this lacks)
        return f"KeyedSeedGenerator(key={self.key!r}, count={self.count})"

    def next(self, ordered=True):
        tf = lazy.tensorflow()
        self.count += 1
        return tf.random.experimental.stateless_fold_in(self.key, self.count)


def _histogram_by_bincount(sub):
    """Keras 3.15's `Equalization` chooses its histogram by the global
    backend: under JAX a 256-step loop of comparisons, which it also runs
    where the layer computes with TensorFlow ops (tf.data), ~50 ms per
    224 px image. This binds the layer's own other branch (`bincount`, what
    it runs under TensorFlow and PyTorch; the same counts, ~1 ms) to the
    instance."""
    if not compat.histogram_hook(sub) or compat.histogram_is_set(sub):
        return
    ops = sub.backend

    def histogram(values, value_range, nbins):
        lo, hi = (ops.cast(v, "float32") for v in value_range)
        scaled = (ops.cast(values, "float32") - lo) * (nbins - 1) / (hi - lo)
        indices = ops.numpy.clip(ops.cast(scaled, "int32"), 0, nbins - 1)
        return ops.numpy.bincount(ops.numpy.reshape(indices, [-1]), minlength=nbins)

    compat.set_histogram(sub, histogram)


def switch_randaugment(layer, image, key=None):
    """Applies a `keras.layers.RandAugment` to one image, running only the
    chosen ops.

    Keras 3.15's `RandAugment.transform_images` computes every one of its
    ops on the whole batch `num_ops` times and keeps one with `where()`
    (~14 images/s at 224 px on 2 CPU cores). Here each of the `num_ops` ops
    is drawn uniformly from the layer's `_AUGMENT_LAYERS` (as the layer
    draws them), its strength with that op's own `get_random_transformation`,
    and it is dispatched with `tf.switch_case`, so one op runs per draw: the
    same augmentation distribution, ~10x the throughput. `key` (a stateless
    seed, shape (2,)) makes every draw a function of it; without it the
    layer's seed generator is used.
    """
    tf = lazy.tensorflow()
    shape = tuple(image.shape[:2]) + (3,)
    image = tf.ensure_shape(image, shape)
    names = compat.randaugment_layers(layer)
    for name in names:  # in a tf.data graph, the layers compute with TF ops
        compat.compute_with(getattr(layer, name), "tensorflow")
        _histogram_by_bincount(getattr(layer, name))
    for op in range(layer.num_ops):
        if key is None:
            t = layer.get_random_transformation(image[None], training=True)
            index = t["layer_idxes"][0]
        else:
            op_key = tf.random.experimental.stateless_fold_in(key, op)
            index = tf.random.stateless_uniform([], op_key, 0, len(names), dtype=tf.int32)

        def branch(name, current=image, op_key=None if key is None else op_key):
            sub = getattr(layer, name)
            if key is None:
                transformation = t["transforms"][name]
            else:
                transformation = sub.get_random_transformation(
                    current[None], training=True, seed=KeyedSeedGenerator(op_key))
            return tf.cast(sub.transform_images(current[None], transformation)[0], tf.float32)

        image = tf.switch_case(tf.cast(index, tf.int32),
                               [lambda n=n, im=image: branch(n, im) for n in names])
        image = tf.ensure_shape(image, shape)
    return image


# timm's RandomErasing (DeiT's settings): the erased share of the image, its
# aspect ratio drawn log-uniformly, and the attempts at a box that fits.
def beta_draws(shape, alpha, key1, key2):
    """Beta(alpha, alpha) draws as the ratio of two Gamma(alpha) draws."""
    tf = lazy.tensorflow()
    g1 = tf.random.stateless_gamma(shape, key1, alpha=alpha)
    g2 = tf.random.stateless_gamma(shape, key2, alpha=alpha)
    return g1 / (g1 + g2)


def mixup(images, labels, p, seed):
    """big_vision MixUp: a ~ Beta(p, p), a = max(a, 1 - a), one a per batch,
    every example mixed with the batch rolled by one (images and labels)."""
    tf = lazy.tensorflow()
    s1, s2 = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    a = beta_draws([], p, s1, s2)
    a = tf.maximum(a, 1.0 - a)
    def mix(x):
        return a * x + (1.0 - a) * tf.roll(x, shift=1, axis=0)

    return mix(images), mix(labels)
