"""The recipe in `keras.ops` on static shapes: the preprocessor's path on
the JAX and PyTorch backends (the TensorFlow path, `tf_ops`, computes the
same thing)."""

import keras
import numpy as np

from keras_reluvit.preprocessing.color import normalise
from keras_reluvit.preprocessing.color import to_rgb
from keras_reluvit.preprocessing.geometry import Static
from keras_reluvit.preprocessing.geometry import crop_or_pad
from keras_reluvit.preprocessing.geometry import plan
from keras_reluvit.preprocessing.geometry import vertical_first
from keras_reluvit.preprocessing.pillow import pillow_weights
from keras_reluvit.preprocessing.pillow import two_passes
from keras_reluvit.preprocessing.pillow import weight_passes
from keras_reluvit.preprocessing.recipe import PILLOW_FILTERS


def _area_matrix(n_in, n_out):
    """`(n_out, n_in)` box-averaging weights: output pixel i averages input
    [i * s, (i + 1) * s), s = n_in / n_out, by overlap (TensorFlow's
    `resize(method="area")`)."""
    s = n_in / n_out
    lo = np.arange(n_out)[:, None] * s
    j = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(j + 1, lo + s) - np.maximum(j, lo), 0, None)
    return (overlap / s).astype("float32")


def _resize(x, to, p):
    """`keras.ops` resampling of a float batch `[N, H, W, 3]` (static shape)."""
    ops = keras.ops
    rh, rw = to
    if p["interpolation"] == "area":
        my = ops.convert_to_tensor(_area_matrix(int(x.shape[1]), rh))
        mx = ops.convert_to_tensor(_area_matrix(int(x.shape[2]), rw))
        return ops.einsum("ih,nhwc,jw->nijc", my, x, mx)
    h, w = int(x.shape[1]), int(x.shape[2])
    if p["interpolation"] in PILLOW_FILTERS:
        my, mx = (ops.convert_to_tensor(pillow_weights(n, m, p["interpolation"]).astype("float32"))
                  for n, m in ((h, rh), (w, rw)))
        return weight_passes(x, my, mx, vertical_first(h, w, rh, rw, p), p, ops)

    def resize(y, hw):
        return ops.image.resize(y, hw, interpolation=p["interpolation"],
                                antialias=p["antialias"])

    if not p["round_uint8"]:
        return resize(x, (rh, rw))
    return two_passes(x, vertical_first(h, w, rh, rw, p),
                      lambda y: resize(y, (rh, int(y.shape[2]))),
                      lambda y: resize(y, (int(y.shape[1]), rw)), p, ops)


def generic(images, size, p):
    """`images` `[N, H, W, C]` (0-255 pixels, static shape) -> the model's
    float32 inputs `[N, *size, 3]` by the checked recipe `p`."""
    ops = keras.ops
    x = to_rgb(ops.cast(images, "float32"), p, ops)
    h, w = int(x.shape[1]), int(x.shape[2])
    before, to, (top, left, th, tw) = plan(h, w, size, p)
    if before is not None:
        t, l_, ch, cw = before
        x = x[:, t:t + ch, l_:l_ + cw]
    x = _resize(x, to, p)
    x = crop_or_pad(x, top, left, th, tw, p, Static)
    if p["clip"]:
        x = ops.clip(x, 0.0, 255.0)
    return normalise(x, p, ops.convert_to_tensor)
