"""Pillow itself, called from a tf.data map (`through_pillow`, a
`tf.numpy_function`): the operations timm, DeiT and torchvision run on PIL
images (`ImageOps`, `ImageEnhance`, affine transforms, the crop's resize),
each Pillow's own arithmetic and rounding, version for version as timm gets
them. `chain` runs a list of them (timm's RandAugment, AutoAugment, AugMix,
with the crop's resize and flip first) in one call per image. A pipeline
holding them runs in this Python process, not in a SavedModel or tf.data
service; Pillow's arithmetic as TensorFlow ops is `pillow_graph`. Checked
against Pillow called directly in tests/test_timm_augment.py."""

import atexit
import os
import threading
import time

import numpy as np

from keras_reluvit.data import lazy
from keras_reluvit.data.pillow_graph import pillow_levels

FILL = (124, 116, 104)  # timm's img_mean fill: round(255 * ImageNet mean), as DeiT runs it


INTERPOLATIONS = ("bilinear", "bicubic")  # the crop's resize and the geometric operations' filters


def through_pillow(image, call, *args, size=None):
    """`call(PIL image, *args as NumPy values)` -> PIL image, run by Pillow
    itself on the levels of `image` `[H, W, 3]` (uint8, or float levels) in
    a tf.data map (`tf.numpy_function`): Pillow's own arithmetic and
    rounding, version for version as timm gets them, at Pillow's speed (it
    lets go of the GIL while it resamples: ~8x faster than the same
    sampling written in TensorFlow ops). float32 levels out, `[*size, 3]`
    (default: the input's height and width). A pipeline holding it runs in
    this Python process (not in tf.data service or a SavedModel); at the
    process's exit, its calls still in flight are let finish first (`_drain`)."""
    tf = lazy.tensorflow()
    _install_hooks()
    shape = tf.shape(image)[:2] if size is None else tf.cast(tf.stack(size), tf.int32)

    def run(pixels, *values):
        with _CALLS["lock"]:
            _CALLS["in_flight"] += 1
        try:
            if _CALLS["closing"]:  # the process is exiting: an error at once, no work
                raise RuntimeError(CLOSED)
            from PIL import Image

            return np.asarray(call(Image.fromarray(pixels, "RGB"), *values), np.uint8)
        finally:
            with _CALLS["lock"]:
                _CALLS["in_flight"] -= 1
                _CALLS["last"] = time.monotonic()

    pixels = image if image.dtype == tf.uint8 else tf.saturate_cast(pillow_levels(image), tf.uint8)
    out = tf.numpy_function(run, [pixels, *args], tf.uint8, stateful=False)
    return tf.cast(tf.reshape(out, tf.concat([shape, [3]], 0)), tf.float32)


_CALLS = dict(lock=threading.Lock(), in_flight=0, last=0.0, closing=False, hooked=False)
CLOSED = ("keras-reluvit: this process is exiting, so its tf.data pipelines no longer call "
          "Pillow (pillow_calls._drain, an atexit hook): read the data before the exit begins.")


def _forked():  # a forked child holds none of its parent's calls, nor a lock a thread held
    _CALLS.update(lock=threading.Lock(), in_flight=0)


def _drain(quiet=0.5, limit=10.0):
    """At exit, before Python finalizes: a tf.data thread that asks for the
    GIL once finalization has begun never returns, so a pipeline iterator
    still alive then, with a call in flight, hung the exit for good (10 of
    12 runs of a script ending beside such an iterator). Here each call
    fails at once (`closing`: `CLOSED`, never silent pixels) and the exit
    waits, the GIL let go, until none has run for `quiet` seconds (the
    pipeline's buffers full: tf.data asks for no more), at most `limit`. A
    map call whose work before Pillow (a decode) outlasts `quiet` can still
    arrive late."""
    _CALLS["closing"] = True
    start = time.monotonic()
    while time.monotonic() - start < limit:
        with _CALLS["lock"]:
            if not _CALLS["in_flight"] and time.monotonic() - _CALLS["last"] > quiet:
                return
        time.sleep(0.02)


def _install_hooks():
    """The process hooks of Pillow's calls (`_drain` at exit, `_forked` in a
    forked child), installed once, by the first pipeline op that calls
    Pillow (`through_pillow`): importing the package installs nothing."""
    with _CALLS["lock"]:
        if not _CALLS["hooked"]:
            os.register_at_fork(after_in_child=_forked)
            atexit.register(_drain)
            _CALLS["hooked"] = True


def as_double(v):
    """`v` in doubles, as timm computes its arguments: a Python float exactly
    (not through float32: 0.3 stays 0.3), a tensor cast."""
    tf = lazy.tensorflow()
    return tf.cast(v, tf.float64) if tf.is_tensor(v) else tf.constant(v, tf.float64)


def _image():
    from PIL import Image

    return Image


def _image_ops():
    from PIL import ImageOps

    return ImageOps


def _image_enhance():
    from PIL import ImageEnhance

    return ImageEnhance


def _resample(interpolation):
    Image = _image()
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}.")
    return {"bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC}[interpolation]


def resize(image, size, interpolation="bicubic"):
    """Pillow's `resize((w, h), resample)` of `image` to `size` `(h, w)`
    (ints or int32 scalars): torchvision's resize of a PIL crop, timm's and
    DeiT's `RandomResizedCrop`. float32 levels out."""
    return chain(image, [], [], [], interpolation, first=(size, False))


def _affine(im, matrix, resample):
    return im.transform(im.size, _image().Transform.AFFINE, matrix, resample, fillcolor=FILL)


def _posterize(im, bits):
    bits = int(bits)
    if bits >= 8:
        return im
    if bits <= 0:  # what Pillow before 13 wrote for 0 bits (13 refuses them)
        return im.point([0] * 768)
    return _image_ops().posterize(im, bits)


def _enhance(kind):
    return lambda im, factor, resample: getattr(_image_enhance(), kind)(im).enhance(factor)


# timm's operations on a PIL image (`timm.data.auto_augment`'s Pillow calls):
# (image, argument as a Python float, resample) -> image
_PIL = {
    "auto_contrast": lambda im, a, r: _image_ops().autocontrast(im),
    "equalize": lambda im, a, r: _image_ops().equalize(im),
    "invert": lambda im, a, r: _image_ops().invert(im),
    "posterize": lambda im, bits, r: _posterize(im, bits),
    "solarize": lambda im, threshold, r: _image_ops().solarize(im, threshold),
    "solarize_add": lambda im, add, r: im.point(  # timm's own table, 128 its threshold
        [min(255, i + int(add)) if i < 128 else i for i in range(256)] * 3),
    "color": _enhance("Color"),
    "contrast": _enhance("Contrast"),
    "brightness": _enhance("Brightness"),
    "sharpness": _enhance("Sharpness"),
    "rotate": lambda im, degrees, r: im.rotate(degrees, r, fillcolor=FILL),
    "shear_x": lambda im, f, r: _affine(im, (1.0, f, 0.0, 0.0, 1.0, 0.0), r),
    "shear_y": lambda im, f, r: _affine(im, (1.0, 0.0, 0.0, f, 1.0, 0.0), r),
    "translate_x_rel": lambda im, pct, r: _affine(im, (1.0, 0.0, pct * im.size[0], 0.0, 1.0, 0.0), r),
    "translate_y_rel": lambda im, pct, r: _affine(im, (1.0, 0.0, 0.0, 0.0, 1.0, pct * im.size[1]), r),
}
KINDS = tuple(_PIL)  # a kind's number in `chain`


def chain(image, kinds, arguments, applied, interpolation="bilinear", first=None):
    """Pillow's operations `KINDS[kinds[i]]` at `arguments[i]` (doubles, as
    timm computes them), each where `applied[i]`, in order, on the levels of
    `image` `[H, W, 3]`: one Pillow call (`through_pillow`) for the whole
    chain, the geometric ones sampled with Pillow's `interpolation` and
    timm's `FILL`. The operations (`_PIL`) are timm's Pillow calls: ImageOps'
    autocontrast / equalize / invert / posterize / solarize, timm's
    solarize-add table, ImageEnhance's Color / Contrast / Brightness /
    Sharpness factor, `rotate` (degrees, counter-clockwise), the affine
    shears (factor) and translations (a fraction of the width / height).

    `first=(size, flip)`: before them, in the same call, the crop's resize
    to `size` `(h, w)` (Pillow's, `interpolation`: `resize`) and, where the
    bool `flip`, its mirror image (`FLIP_LEFT_RIGHT`). float32 levels out."""
    tf = lazy.tensorflow()
    resample = _resample(interpolation)

    def call(im, kinds, arguments, applied, *first):
        if first:
            h, w, flip = first
            im = im.resize((int(w), int(h)), resample)
            if flip:
                im = im.transpose(_image().Transpose.FLIP_LEFT_RIGHT)
        for kind, argument, on in zip(kinds, arguments, applied):
            if on:
                im = _PIL[KINDS[kind]](im, float(argument), resample)
        return im

    def vector(v, dtype, cast=tf.cast):
        if not isinstance(v, (list, tuple)):
            return cast(v, dtype)
        return tf.stack([cast(x, dtype) for x in v]) if v else tf.zeros([0], dtype)

    args = [vector(kinds, tf.int32), vector(arguments, tf.float64, lambda x, _: as_double(x)),
            vector(applied, tf.bool)]
    size = None
    if first is not None:
        size, flip = first
        hw = tf.cast(size, tf.int32)
        size = (hw[0], hw[1])
        args += [size[0], size[1], tf.cast(flip, tf.bool)]
    return through_pillow(image, call, *args, size=size)


def _one(kind):
    def op(image, argument=0.0, interpolation="bilinear"):
        return chain(image, [KINDS.index(kind)], [argument], [True], interpolation)

    op.__name__ = kind
    op.__doc__ = f"Pillow's `{kind}` of `chain`, alone."
    return op


auto_contrast, equalize, invert, posterize, solarize_add, sharpness = map(_one, (
    "auto_contrast", "equalize", "invert", "posterize", "solarize_add", "sharpness"))
rotate, shear_x, shear_y, translate_x_rel, translate_y_rel = map(_one, (
    "rotate", "shear_x", "shear_y", "translate_x_rel", "translate_y_rel"))
