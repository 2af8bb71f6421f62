"""A pipeline's named operations: the training pipeline of an `Augment` is
a list of `Op`s (`train_ops`), each one function of the image (the first: of
the encoded example) and of the example's random number, from which it
draws its own key (`key`), then the batch's (`batch_ops`: MixUp / CutMix).
`describe` writes them as one line, in big_vision's `|` notation with each
operation under its source's name (big_vision's `inception_crop`,
`flip_lr`, `randaug`; timm's `--aa` names, `random_erasing`, `timm_mix`;
DeiT III's `simple_random_crop`, `three_augment`, `color_jitter`), as
`keras-reluvit recipes NAME` prints it.
"""

import dataclasses
import inspect

from keras_reluvit.data import lazy
from keras_reluvit.data.augment import decode_inception_crop
from keras_reluvit.data.augment import decode_random_crop
from keras_reluvit.data.augment import inception_crop
from keras_reluvit.data.augment import random_crop
from keras_reluvit.data.augment import switch_randaugment
from keras_reluvit.data.pillow_graph import pillow_levels
from keras_reluvit.data.three_augment import color_jitter
from keras_reluvit.data.three_augment import simple_random_crop
from keras_reluvit.data.three_augment import three_augment
from keras_reluvit.data.timm_augment import by_name as timm_by_name
from keras_reluvit.data.timm_augment import random_erasing
from keras_reluvit.data.timm_augment import takes_first as timm_takes_first
from keras_reluvit.data.timm_augment import timm_mix
from keras_reluvit.preprocessing import decode_image
from keras_reluvit.preprocessing import normalise
from keras_reluvit.preprocessing import tf_preprocess
from keras_reluvit.preprocessing import tf_to_rgb

# Each operation's key: [the example's random number, its slot]; the crop and the flip
# draw from the two halves of slot 0's key (`key`).
SLOTS = dict(crop=0, flip=0, randaug=2, erase=3, three_augment=4, color_jitter=5,
             auto_augment=6)


def key(rnd, name):
    """The key of operation `name` (a `SLOTS` name) for the example whose
    random number is `rnd`: `[rnd, slot]`; the crop's and the flip's, the two
    halves of `[rnd, 0]` split."""
    tf = lazy.tensorflow()
    slot = tf.stack([rnd, SLOTS[name]])
    if name in ("crop", "flip"):
        return tf.unstack(tf.random.experimental.stateless_split(slot, 2))[name == "flip"]
    return slot


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a pipeline: `fn(x, rnd) -> x` (`x` the image, float
    0-255 `[H, W, 3]`; for the first, the `Example`), shown as
    `name(args)`."""

    name: str
    args: tuple = ()
    fn: object = dataclasses.field(default=None, repr=False, compare=False)

    def __str__(self):
        return f"{self.name}({', '.join(map(str, self.args))})" if self.args else self.name


@dataclasses.dataclass(frozen=True)
class Example:
    """An example's image as the pipeline's first operation takes it:
    `data` encoded bytes (`encoded`) or pixels, `dct` the JPEG decoder's
    method (`"INTEGER_ACCURATE"` for an image folder's files, as predict
    and the SavedModel decode them; tfds' default otherwise)."""

    data: object
    dct: str
    encoded: bool


def _size(size):
    if size is None:
        return "the checkpoint's size"
    return size[0] if size[0] == size[1] else f"({size[0]}, {size[1]})"


def _range(pair):
    return "(" + ", ".join(f"{v:.4g}" for v in pair) + ")"


def fuses(aug):
    """Whether DeiT's chain runs as one Pillow call: the crop window's
    bicubic resize, the flip and timm's operations (`--aa` names that take
    the crop first)."""
    return (aug.crop != "simple" and aug.interpolation == "bicubic"
            and aug.auto_augment is not None and timm_takes_first(aug.auto_augment))


def crop_op(aug, size, recipe):
    """The first operation: the encoded example to the crop at `size`."""
    shown = (_size(size), f"area={_range(aug.crop_area)}", f"aspect={_range(aug.crop_aspect)}",
             aug.interpolation)

    def pixels(x):
        return (decode_image(x.data, x.dct, recipe["alpha"]) if x.encoded
                else tf_to_rgb(x.data, recipe))

    if aug.crop == "simple":  # DeiT III's --src: the whole image decoded
        def simple(x, rnd):
            return simple_random_crop(pixels(x), size, key(rnd, "crop"), aug.interpolation)

        return Op("simple_random_crop", (_size(size), aug.interpolation), simple)
    if fuses(aug):
        def chain(x, rnd):
            tf, k = lazy.tensorflow(), key(rnd, "crop")
            window = (decode_random_crop(x.data, aug.crop_area, aug.crop_aspect, k, x.dct,
                                         recipe["alpha"]) if x.encoded else
                      random_crop(tf_to_rgb(x.data, recipe), aug.crop_area, aug.crop_aspect, k))
            # stateless_random_flip_left_right's draw
            flip = (tf.random.stateless_uniform([], key(rnd, "flip"), 0, 1.0) < 0.5
                    if aug.flip else False)
            return timm_by_name(window, aug.auto_augment, key(rnd, "auto_augment"),
                                aug.interpolation, first=(size, flip))

        inner = [str(Op("inception_crop", shown))] + (["flip_lr"] if aug.flip else []) + [
            str(Op("aa", (aug.auto_augment, aug.interpolation)))]
        return Op("pillow", ("|".join(inner),), chain)

    def crop(x, rnd):
        if x.encoded:  # the window alone decoded for a JPEG
            return decode_inception_crop(x.data, size, aug.crop_area, aug.crop_aspect,
                                         key(rnd, "crop"), x.dct, recipe["alpha"],
                                         aug.interpolation)
        return inception_crop(tf_to_rgb(x.data, recipe), size, aug.crop_area, aug.crop_aspect,
                              key(rnd, "crop"), aug.interpolation)

    return Op("inception_crop", shown, crop)


def train_ops(aug, size, recipe, randaug=None):
    """The training pipeline of `aug` (an `Augment`) per example, at `size`
    `(h, w)` (None: described only), normalised by `recipe` (the model's
    preprocessing): a list of `Op`s. `randaug`: the Keras `RandAugment`
    layer of `aug.randaug` (None: described only)."""
    fused = fuses(aug)
    first = crop_op(aug, size, recipe)
    ops = [Op(first.name, first.args,
              lambda x, rnd: lazy.tensorflow().ensure_shape(first.fn(x, rnd), (*size, 3)))]
    if aug.flip and not fused:
        ops.append(Op("flip_lr", (), lambda x, rnd: lazy.tensorflow().image
                      .stateless_random_flip_left_right(x, key(rnd, "flip"))))
    if aug.randaug and aug.randaug[1] > 0:  # big_vision's, Keras' layer
        ops.append(Op("randaug", tuple(aug.randaug), lambda x, rnd: switch_randaugment(
            randaug, x, key(rnd, "randaug"))))
    # Pillow's operations run on uint8 levels: a bilinear crop's floats made levels (a
    # bicubic crop is Pillow's own resize, levels already)
    if ((aug.auto_augment is not None or aug.three_augment or aug.color_jitter > 0)
            and aug.interpolation != "bicubic"):
        ops.append(Op("pillow_levels", (), lambda x, rnd: pillow_levels(x)))
    if aug.auto_augment is not None and not fused:  # timm's --aa
        ops.append(Op("aa", (aug.auto_augment, aug.interpolation), lambda x, rnd: timm_by_name(
            x, aug.auto_augment, key(rnd, "auto_augment"), aug.interpolation)))
    if aug.three_augment:  # DeiT III's, then its colour jitter
        ops.append(Op("three_augment", (), lambda x, rnd: three_augment(
            x, key(rnd, "three_augment"))))
    if aug.color_jitter > 0:
        strength = float(aug.color_jitter)
        ops.append(Op("color_jitter", (f"{strength:g}",), lambda x, rnd: color_jitter(
            x, strength, key(rnd, "color_jitter"))))
    ops.append(normalise_op(recipe))
    if aug.erase > 0:  # timm's: after the normalisation, noise of the normalised scale
        p = float(aug.erase)
        ops.append(Op("random_erasing", (f"{p:g}",), lambda x, rnd: random_erasing(
            x, p, key(rnd, "erase"))))
    return ops


def normalise_op(recipe, clip=True):
    """`(x / 255 - mean) / std`, after clipping to 0-255 (`clip`)."""
    mean, std = (tuple(float(v) for v in recipe[k]) for k in ("mean", "std"))
    shown = (("-1, 1",) if mean == std == (0.5,) * 3 else
             (f"mean={_range(mean)}", f"std={_range(std)}"))

    def run(x, rnd):
        return normalise(lazy.tensorflow().clip_by_value(x, 0.0, 255.0) if clip else x, recipe)

    return Op("value_range" if len(shown) == 1 else "normalize", shown, run)


def eval_ops(size, recipe):
    """The evaluation pipeline: the model's preprocessing `recipe` (its
    resize and central crop, clipped where it clips; then normalised)."""
    shown = [f"resize={recipe['resize']}", f"crop_pct={recipe['crop_pct']:g}",
             recipe["interpolation"]]

    def preprocess(x, rnd):
        return tf_preprocess(decode_image(x.data, x.dct, recipe["alpha"]) if x.encoded
                             else x.data, size, recipe, normalize=False)

    return [Op("preprocess", (_size(size), *shown), preprocess), normalise_op(recipe, clip=False)]


def batch_ops(aug):
    """The training batch's operations (after `onehot` and `batch`), shown
    only: `pipeline` maps them with the batch's own random number."""
    if aug.timm_mix is not None:  # every argument, timm_mix's defaults where left out
        defaults = {k: p.default for k, p in inspect.signature(timm_mix).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        return [Op("timm_mix", tuple(f"{k}={v}" for k, v in dict(defaults, **aug.timm_mix)
                                     .items()))]
    return [Op("mixup", (f"{float(aug.mixup):g}",))] if aug.mixup > 0 else []


def describe(aug, size=None, recipe=None, checkpoint=False):
    """The training pipeline of `aug` (an `Augment`) at `size` (None: a
    checkpoint's) as one line, and the evaluation's: `{"train": ...,
    "eval": ...}`. `recipe`: the model's preprocessing (None: ours, as a
    model trained from scratch has); `checkpoint`: a fine-tune's, whose
    preprocessing is its checkpoint's (said so)."""
    from keras_reluvit.preprocessing import check_preprocessing

    recipe = check_preprocessing(recipe)
    shown = (size, size) if isinstance(size, int) else size
    repeats = [Op("aug_repeats", (aug.aug_repeats,))] if aug.aug_repeats > 1 else []
    steps = train_ops(aug, shown, recipe)
    if checkpoint:  # its normalisation is the checkpoint's
        steps = [o if o.name not in ("value_range", "normalize")
                 else Op("normalize", ("the checkpoint's",)) for o in steps]
    train = (["shuffle"] + [str(o) for o in repeats + steps] + ["onehot", "batch"]
             + [str(o) for o in batch_ops(aug)])
    evaluation = ["decode"] + ([str(Op("preprocess", ("the checkpoint's",)))] if checkpoint
                               else [str(o) for o in eval_ops(shown, recipe)])
    return {"train": "|".join(train), "eval": "|".join(evaluation + ["onehot", "batch"])}
