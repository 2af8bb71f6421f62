"""Image files to pixels: TensorFlow's decoders, JPEG with the accurate
integer DCT (the pixels PIL gives), a transparent image by an alpha rule."""

import numpy as np

from keras_reluvit.preprocessing.pillow import composite_on_white
from keras_reluvit.preprocessing.recipe import ALPHA_RULES
from keras_reluvit.preprocessing.tf_ops import TF


def decode_image(data, dct_method="INTEGER_ACCURATE", alpha="drop"):
    """Encoded image bytes (a TensorFlow string scalar) -> uint8 `[H, W, 3]`
    in TensorFlow ops: JPEG with the accurate integer DCT (as PIL, i.e. timm
    and transformers, decode; `dct_method=""` is TensorFlow's default, what
    tfds decodes with), PNG / GIF / BMP / WebP with `tf.io.decode_image`.

    `alpha`: a transparent image's alpha channel is dropped (`"drop"`, PIL's
    `convert("RGB")`), composited onto white (`"white"`, transformers'
    `convert_to_rgb`; see `composite_on_white`) or kept (`"keep"`: always
    `[H, W, 4]`, alpha 255 where the file has none, for a preprocessor to
    apply its recipe's rule). Grayscale images become RGB."""
    import tensorflow as tf

    if alpha not in ALPHA_RULES + ("keep",):
        raise ValueError(f"alpha must be 'drop', 'white' or 'keep', got {alpha!r}.")
    if alpha == "drop":
        return tf.cond(
            tf.io.is_jpeg(data),
            lambda: tf.io.decode_jpeg(data, channels=3, dct_method=dct_method),
            lambda: tf.io.decode_image(data, channels=3, expand_animations=False))

    def opaque(x):  # a channel of 255 beside x
        return tf.fill(tf.concat([tf.shape(x)[:-1], [1]], 0), tf.constant(255, x.dtype))

    def rgba():
        x = tf.io.decode_image(data, channels=0, expand_animations=False)
        c = tf.shape(x)[-1]  # 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA)
        rgb = tf.cond(c >= 3, lambda: x[..., :3], lambda: tf.repeat(x[..., :1], 3, axis=-1))
        a = tf.cond(tf.equal(c % 2, 0), lambda: x[..., -1:], lambda: opaque(x))
        return tf.concat([rgb, a], -1)

    def jpeg():  # no alpha channel in a JPEG
        x = tf.io.decode_jpeg(data, channels=3, dct_method=dct_method)
        return tf.concat([x, opaque(x)], -1) if alpha == "keep" else x

    def other():
        x = tf.ensure_shape(rgba(), [None, None, 4])
        if alpha == "keep":
            return x
        q = tf.cast(x, tf.int32)
        return tf.cast(composite_on_white(q[..., :3], q[..., 3:], TF), tf.uint8)

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other),
                           [None, None, 4 if alpha == "keep" else 3])


def load_image(path, alpha="auto"):
    """An image file (JPEG, PNG, GIF, BMP, WebP) as uint8 numpy pixels,
    decoded as the SavedModel's `serve_bytes` decodes it: TensorFlow, JPEG
    with the accurate integer DCT (the pixels PIL gives).

    `alpha`: `"auto"` (default) gives `[H, W, 3]` for an opaque image and
    `[H, W, 4]` for one with transparent pixels, which `model.preprocessor`
    turns into RGB by the checkpoint's own rule (transformers' CLIP / DINOv2
    composite onto white, timm drops the channel) -- so
    `model.preprocessor(kr.load_image(path))` is right for every image, as
    `keras-reluvit predict`. `"keep"` always `[H, W, 4]`; `"drop"` /
    `"white"` RGB by that rule (see `decode_image`). Needs TensorFlow (the
    `[train]` extra)."""
    if alpha not in ALPHA_RULES + ("keep", "auto"):
        raise ValueError(f"alpha must be 'auto', 'keep', 'drop' or 'white', got {alpha!r}.")
    with open(path, "rb") as f:
        data = f.read()
    import tensorflow as tf

    try:
        x = decode_image(tf.constant(data), alpha="keep" if alpha == "auto" else alpha).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise ValueError(f"{path}: not a readable JPEG, PNG, GIF, BMP or WebP image "
                         f"({e.message}).") from None
    if alpha == "auto" and bool(np.all(x[..., 3] == 255)):  # opaque: every rule agrees
        x = np.ascontiguousarray(x[..., :3])
    return x
