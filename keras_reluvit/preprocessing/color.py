"""Pixels to model inputs: any channel count to RGB by the recipe's alpha
rule, and the normalisation, on every backend and in TensorFlow graphs."""

import numpy as np

from keras_reluvit.preprocessing.pillow import composite_on_white


def normalise(x, p, convert=None):
    """0-255 pixels -> `(x / 255 - mean) / std` (TensorFlow / tf.data; with
    `convert=keras.ops.convert_to_tensor`, any backend), computed as
    `x / (255 std) - mean / std`: for [-1, 1], `x / 127.5 - 1`."""
    std = np.asarray(p["std"], "float64")
    scale, shift = (255.0 * std).astype("float32"), (np.asarray(p["mean"]) / std).astype("float32")
    # TensorFlow: the same float32 operations per value in the cheapest form
    # it runs -- scalars when the channels agree ([-1, 1]), else constants of
    # the image's own shape (a per-channel broadcast costs ~10x on CPU). Not
    # for other backends: PyTorch divides by a scalar as a multiplication by
    # its reciprocal (other values).
    if convert is None and (scale == scale[0]).all() and (shift == shift[0]).all():
        scale, shift = scale[0], shift[0]
    elif convert is None and x.shape[-3:].is_fully_defined():
        scale, shift = (np.broadcast_to(v, tuple(x.shape[-3:])) for v in (scale, shift))
    if convert is not None:
        scale, shift = convert(scale), convert(shift)
    return x / scale - shift


def to_rgb(x, p, ops):
    """0-255 pixels with 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA)
    channels -> RGB `[..., 3]`, a transparent image by the recipe's `alpha`
    rule: the one conversion every path uses (preprocessor, tf.data
    pipelines, `data.for_model`, SavedModels). The channel count must be
    known (`tf_to_rgb` takes any in a TensorFlow graph)."""
    channels = x.shape[-1]
    if channels == 3:
        return x
    if channels == 1:  # grey: its value in R, G and B
        return ops.concatenate([x] * 3, axis=-1)
    if channels == 2:  # grey + alpha: RGBA, then the alpha rule
        x = ops.concatenate([x[..., :1]] * 3 + [x[..., 1:]], axis=-1)
    elif channels != 4:
        raise ValueError(f"Images have 1 (grey), 2, 3 (RGB) or 4 (RGBA) channels, got "
                         f"{channels}.")
    if p["alpha"] == "drop":
        return x[..., :3]
    q = ops.cast(x, "int32")
    return ops.cast(composite_on_white(q[..., :3], q[..., 3:], ops), "float32")
