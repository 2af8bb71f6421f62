"""Training augmentation in tf.data: big_vision's inception crop (only the
window of a JPEG decoded), Keras' RandAugment one op at a time with keyed
draws, timm's random erasing and big_vision's MixUp."""

import dataclasses
import math

from keras_reluvit import _keras_compat as compat
from keras_reluvit.data.tfds import _tf
from keras_reluvit.preprocessing import decode_image
from keras_reluvit.preprocessing import tf_preprocess


@dataclasses.dataclass
class Augment:
    """Training augmentation. `randaug=(num_ops, magnitude)` as big_vision;
    `mixup` is the Beta parameter p (0 = off); `erase` the probability of
    timm's random erasing (`--reprob`; DeiT's 0.25; see `random_erasing`);
    `timm_mix` the arguments of timm's MixUp / CutMix (`timm_mix`, e.g.
    DeiT's `{"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing":
    0.1}`), instead of `mixup`; `repeats` DeiT's repeated augmentation
    (`RASampler`, timm's `--aug-repeats`; DeiT's 3): each epoch takes a new
    random `1 / repeats` of the images and shows each `repeats` times, each
    copy with its own draws, in the same number of steps; `crop`
    `"inception"` (the random-area crop of `crop_area` / `crop_aspect`: big_vision's
    inception crop, timm's `RandomResizedCrop`) or `"simple"` (DeiT III's
    `--src`: the shorter side resized to the size, 4 pixels of reflection
    padding, a random crop); `three_augment` DeiT III's 3-Augment and
    `color_jitter` torchvision's `ColorJitter(j, j, j)` after it (DeiT III:
    0.3; see `keras_reluvit.data.three_augment`); `auto_augment` timm's
    `--aa` name, instead of `randaug` (DeiT's `"rand-m9-mstd0.5-inc1"`,
    `"augmix-m3-w3-d-1"`; see `keras_reluvit.data.timm_augment`)."""

    crop_area: tuple = (0.05, 1.0)
    crop_aspect: tuple = (3 / 4, 4 / 3)
    flip: bool = True
    randaug: tuple = None
    mixup: float = 0.0
    erase: float = 0.0
    timm_mix: dict = None
    repeats: int = 1
    crop: str = "inception"
    three_augment: bool = False
    color_jitter: float = 0.0
    auto_augment: str = None

    def to_dict(self):
        return dataclasses.asdict(self)


def crop_window(shape, area, aspect, seed):
    """big_vision's inception crop window of an image of `shape` ([H, W, C]):
    (offset, size), each `[y, x]`, drawn statelessly from `seed`."""
    tf = _tf()
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
    tf = _tf()
    begin, crop = crop_window(tf.shape(image), area, aspect, seed)
    return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([crop, [-1]], 0))


def decode_random_crop(data, area, aspect, seed, dct_method="", alpha="drop"):
    """Encoded image bytes -> the inception crop window, uint8 `[h, w, 3]`: a
    JPEG's window is decoded alone (`decode_and_crop_jpeg`, as big_vision's
    `decode_jpeg_and_inception_crop`), other formats are decoded whole and
    cropped. The window equals `random_crop`'s on the decoded image for the
    same `seed`."""
    tf = _tf()

    def jpeg():
        begin, crop = crop_window(tf.image.extract_jpeg_shape(data), area, aspect, seed)
        return tf.image.decode_and_crop_jpeg(data, tf.concat([begin, crop], 0), channels=3,
                                             dct_method=dct_method)

    def other():
        return random_crop(decode_image(data, alpha=alpha), area, aspect, seed)

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other), (None, None, 3))


CROPS = ("inception", "simple")
SIMPLE_CROP_PADDING = 4  # DeiT III's RandomCrop(size, padding=4, padding_mode="reflect")


def simple_random_crop(image, size, seed):
    """DeiT III's simple random crop (`--src`) of decoded pixels `image`
    (`[H, W, C]`): resized (bilinear; DeiT's bicubic) so that it covers
    `size` with its shorter side, `SIMPLE_CROP_PADDING` pixels of reflection
    padding, a uniformly placed crop of `size`; float32 out."""
    tf = _tf()
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    target = tf.constant(size, tf.float32)
    scale = tf.reduce_max(target / shape)
    resized = tf.image.resize(image, tf.cast(tf.math.ceil(shape * scale - 1e-3), tf.int32),
                              method="bilinear")
    p = SIMPLE_CROP_PADDING
    padded = tf.pad(resized, [[p, p], [p, p], [0, 0]], mode="REFLECT")
    return tf.image.stateless_random_crop(padded, (*size, tf.shape(image)[-1]), seed)


def inception_crop(image, size, area, aspect, seed):
    """The random crop of decoded pixels `image` (`[H, W, C]`), resized to
    `size` (bilinear, float32 out)."""
    return _tf().image.resize(random_crop(image, area, aspect, seed), size, method="bilinear")


def decode_inception_crop(data, size, area, aspect, seed, dct_method="", alpha="drop"):
    """Encoded image bytes -> the random crop (`decode_random_crop`), resized
    to `size` (float32) from the uint8 crop (no float copy of the image)."""
    return _tf().image.resize(decode_random_crop(data, area, aspect, seed, dct_method, alpha), size,
                              method="bilinear")


def resize_small_central_crop(image, size):
    """Our evaluation geometry: the shorter side to `round(size * 256 / 224)`
    (area; the longer side in proportion, rounded), central crop `size`;
    0-255 pixels out. `image` is `[H, W, C]` or a batch `[N, H, W, C]`."""

    return tf_preprocess(image, size, normalize=False)


class _KeyedSeed:
    """Stands in for a `keras.random.SeedGenerator` inside tf.data: each
    `next()` is a stateless seed derived from a key tensor, so the draws of
    Keras' augmentation layers depend on (seed, epoch, example) only, never
    on the order in which parallel map calls advance a shared state."""

    def __init__(self, key):
        self.key, self.count = key, 0

    def next(self, ordered=True):
        tf = _tf()
        self.count += 1
        return tf.random.experimental.stateless_fold_in(self.key, self.count)


def _keyed(key):
    from keras.random import SeedGenerator

    seed = object.__new__(type("KeyedSeedGenerator", (_KeyedSeed, SeedGenerator), {}))
    _KeyedSeed.__init__(seed, key)
    return seed


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
    tf = _tf()
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
                    current[None], training=True, seed=_keyed(op_key))
            return tf.cast(sub.transform_images(current[None], transformation)[0], tf.float32)

        image = tf.switch_case(tf.cast(index, tf.int32),
                               [lambda n=n, im=image: branch(n, im) for n in names])
        image = tf.ensure_shape(image, shape)
    return image


# timm's RandomErasing (DeiT's settings): the erased share of the image, its
# aspect ratio drawn log-uniformly, and the attempts at a box that fits.
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
    tf = _tf()
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
    rows, cols = tf.range(h)[:, None, None], tf.range(w)[None, :, None]
    inside = (rows >= top) & (rows < top + bh) & (cols >= left) & (cols < left + bw)
    erase = tf.random.stateless_uniform([], keys[3]) < probability
    inside = inside & tf.reduce_any(fits)

    def erased():  # the noise drawn only for an image that is erased
        noise = tf.random.stateless_normal(tf.shape(image), keys[4], dtype=image.dtype)
        return tf.where(inside, noise, image)

    return tf.cond(erase, erased, lambda: image)


TIMM_MIX_MODES = ("batch", "elem", "pair")


def _beta(shape, alpha, key1, key2):
    """Beta(alpha, alpha) draws as the ratio of two Gamma(alpha) draws."""
    tf = _tf()
    g1 = tf.random.stateless_gamma(shape, key1, alpha=alpha)
    g2 = tf.random.stateless_gamma(shape, key2, alpha=alpha)
    return g1 / (g1 + g2)


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
    tf = _tf()
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
        return _beta([n], alpha, k1, k2) if alpha > 0 else tf.ones([n])

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
    # CutMix's box (timm's rand_bbox): sides int(size * sqrt(1 - lam)), centre uniform.
    cut = tf.sqrt(1.0 - lam)
    cut_h = tf.cast(tf.cast(h, tf.float32) * cut, tf.int32)
    cut_w = tf.cast(tf.cast(w, tf.float32) * cut, tf.int32)
    cy = tf.cast(centre[:, 0] * tf.cast(h, tf.float32), tf.int32)
    cx = tf.cast(centre[:, 1] * tf.cast(w, tf.float32), tf.int32)
    y1, y2 = tf.clip_by_value(cy - cut_h // 2, 0, h), tf.clip_by_value(cy + cut_h // 2, 0, h)
    x1, x2 = tf.clip_by_value(cx - cut_w // 2, 0, w), tf.clip_by_value(cx + cut_w // 2, 0, w)
    pasted = tf.cast((y2 - y1) * (x2 - x1), tf.float32) / tf.cast(h * w, tf.float32)
    lam = tf.where(use_cutmix, 1.0 - pasted, lam)
    rows = tf.range(h)[None, :, None]
    cols = tf.range(w)[None, None, :]
    box = ((rows >= y1[:, None, None]) & (rows < y2[:, None, None])
           & (cols >= x1[:, None, None]) & (cols < x2[:, None, None])
           & use_cutmix[:, None, None])
    flipped = tf.reverse(images, [0])
    lam_x = tf.reshape(tf.where(use_cutmix, tf.ones_like(lam), lam), [n, 1, 1, 1])
    mixed = lam_x * images + (1.0 - lam_x) * flipped
    mixed = tf.where(box[..., None], flipped, mixed)
    k = tf.cast(tf.shape(labels)[-1], labels.dtype)
    smooth = labels * (1.0 - label_smoothing) + label_smoothing / k
    lam_y = tf.reshape(lam, [n, 1])
    return mixed, lam_y * smooth + (1.0 - lam_y) * tf.reverse(smooth, [0])


def mixup(images, labels, p, seed):
    """big_vision MixUp: a ~ Beta(p, p), a = max(a, 1 - a), one a per batch,
    every example mixed with the batch rolled by one (images and labels)."""
    tf = _tf()
    s1, s2 = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    a = _beta([], p, s1, s2)
    a = tf.maximum(a, 1.0 - a)
    def mix(x):
        return a * x + (1.0 - a) * tf.roll(x, shift=1, axis=0)

    return mix(images), mix(labels)
