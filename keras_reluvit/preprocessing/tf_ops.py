"""The recipe in TensorFlow ops, for graphs with dynamic image sizes
(tf.data pipelines, SavedModel signatures) under any Keras backend; equal
to the `keras.ops` path (tested)."""

from keras_reluvit.preprocessing.color import normalise
from keras_reluvit.preprocessing.color import to_rgb
from keras_reluvit.preprocessing.geometry import crop_or_pad
from keras_reluvit.preprocessing.geometry import plan
from keras_reluvit.preprocessing.geometry import vertical_first
from keras_reluvit.preprocessing.pillow import pillow_weights
from keras_reluvit.preprocessing.pillow import two_passes
from keras_reluvit.preprocessing.pillow import weight_passes
from keras_reluvit.preprocessing.recipe import PILLOW_FILTERS
from keras_reluvit.preprocessing.recipe import check_preprocessing


class _TFNamespace:
    """The names the shared algorithms use (`geometry.Static`'s integer
    arithmetic and tensor ops, `pillow._NumPy`'s array functions), in
    TensorFlow: dynamic shapes in a graph. TensorFlow is imported at first
    use."""

    def __getattr__(self, name):
        import tensorflow as tf

        def f64(v):
            return tf.cast(v, tf.float64)

        def pad(x, pads):
            return tf.pad(x, tf.stack([tf.stack([tf.cast(a, tf.int32), tf.cast(b, tf.int32)])
                                       for a, b in pads]))

        names = dict(
            # integer arithmetic (geometry)
            minimum=tf.minimum, maximum=tf.maximum, logical_and=tf.logical_and, select=tf.where,
            round_div=lambda a, b: tf.cast(tf.round(f64(a) / f64(b)), tf.int32),
            ratio=lambda a, b, c, d, larger=False: (tf.maximum if larger else tf.minimum)(
                f64(a) / f64(b), f64(c) / f64(d)),
            # float64 arrays (Pillow's weights)
            float64=tf.float64, cast=tf.cast, abs=tf.abs, sin=tf.sin, cos=tf.cos, floor=tf.floor,
            where=lambda c, a, b: tf.where(c, f64(a), f64(b)), arange=tf.range,
            cumsum=tf.math.cumsum, trunc=lambda v: tf.where(v < 0, tf.math.ceil(v), tf.floor(v)),
            sum=lambda v, axis, keepdims: tf.reduce_sum(v, axis=axis, keepdims=keepdims),
            # tensors
            shape=tf.shape, pad=pad, stack=tf.stack, clip=tf.clip_by_value,
            floor_divide=tf.math.floordiv, einsum=tf.einsum,
            concatenate=lambda xs, axis=0: tf.concat(xs, axis))
        self.__dict__.update(names)  # looked up here once, then plain attributes
        if name not in names:
            raise AttributeError(name)
        return names[name]


TF = _TFNamespace()


def tf_to_rgb(image, p=None):
    """`to_rgb` in TensorFlow ops for a graph that may not know the channel
    count (decoded files, `data.for_model`'s inputs): float32 0-255 RGB."""
    import tensorflow as tf

    p = check_preprocessing(p)
    x = tf.cast(image, tf.float32)
    if x.shape[-1] is not None:
        return to_rgb(x, p, TF)
    lead = [None] * (x.shape.rank - 1)

    def branch(channels):  # to_rgb with the channel count made static
        return lambda: tf.ensure_shape(to_rgb(tf.ensure_shape(x, lead + [channels]), p, TF),
                                       lead + [3])

    return tf.switch_case(tf.shape(x)[-1] - 1, [branch(c) for c in (1, 2, 3, 4)])


def tf_preprocess(images, size, p=None, normalize=True):
    """The recipe `p` in TensorFlow ops, for graphs with dynamic image sizes
    (tf.data, SavedModel signatures): `images` `[H, W, 3]` or
    `[N, H, W, 3]` (one size per batch) of any dtype holding 0-255 pixel
    values -> float32 model inputs (0-255 pixels without `normalize`).
    Equal to the `keras.ops` path (tested)."""
    import tensorflow as tf

    p = check_preprocessing(p)
    x = tf_to_rgb(images, p)
    shape = tf.shape(x)
    h, w = shape[-3], shape[-2]
    before, (rh, rw), (top, left, th, tw) = plan(h, w, size, p, TF)
    if before is not None:
        t, l_, ch, cw = before
        x = x[..., t:t + ch, l_:l_ + cw, :]
    method = p["interpolation"]
    antialias = p["antialias"] and method != "area"
    if method in PILLOW_FILTERS:
        # Pillow's weights, only the crop's rows and columns of them.
        ih, iw = tf.shape(x)[-3], tf.shape(x)[-2]
        rows = tf.cast(pillow_weights(ih, rh, method, TF)[top:top + th], tf.float32)
        cols = tf.cast(pillow_weights(iw, rw, method, TF)[left:left + tw], tf.float32)
        x = weight_passes(x, rows, cols, vertical_first(ih, iw, rh, rw, p, TF), p, TF)
    elif antialias and before is None and p["resize"] != "border":
        # Only the crop's pixels: TensorFlow's scale-and-translate (what
        # `resize(antialias=True)` runs) samples the resized image at the
        # crop's positions directly, PIL's pass order kept -- the same
        # values as resizing everything and cropping.
        x = _crop_resample(x, (h, w), (rh, rw), (top, left, th, tw), method, p)
    else:
        def resize(y, hw):
            return tf.image.resize(y, tf.stack(hw), method=method, antialias=antialias)

        if p["round_uint8"] and method != "area":
            ih, iw = tf.shape(x)[-3], tf.shape(x)[-2]
            x = two_passes(x, vertical_first(ih, iw, rh, rw, p, TF),
                           lambda y: resize(y, [rh, tf.shape(y)[-2]]),
                           lambda y: resize(y, [tf.shape(y)[-3], rw]), p, TF)
        else:
            x = resize(x, [rh, rw])
        x = crop_or_pad(x, top, left, th, tw, p, TF)
    x = tf.ensure_shape(x, [*([None] * (len(images.shape) - 3)), th, tw, 3])
    if p["clip"]:
        x = tf.clip_by_value(x, 0.0, 255.0)
    return normalise(x, p) if normalize else x


def pillow_resize(image, size, method="bicubic"):
    """Pillow's `resize(size, method)` of a uint8-level image `[H, W, 3]` (or a
    batch) to `size` `(h, w)` (ints or int32 scalars: a size known only in
    the graph): antialiased, each pass rounded to uint8 in Pillow's pass
    order; float32 levels out. Pillow's bicubic (a = -0.5) as TensorFlow's
    Keys cubic in float32: all but ~1 in 10,000 pixels Pillow's, the
    others a level off (tests/test_preprocessing.py)."""
    import tensorflow as tf

    p = check_preprocessing(dict(interpolation=method, round_uint8=True))
    x = tf.cast(image, tf.float32)
    shape = tf.shape(x)
    h, w = shape[-3], shape[-2]
    rh, rw = (tf.cast(v, tf.int32) for v in size)
    return tf.clip_by_value(_crop_resample(x, (h, w), (rh, rw), (0, 0, rh, rw), method, p),
                            0.0, 255.0)


def _crop_resample(x, hw, resized, crop, method, p):
    """`resize(x, resized)[crop]` (antialiased) computing only the crop."""
    import tensorflow as tf

    batched = len(x.shape) == 4
    x = x if batched else x[None]
    (h, w), (rh, rw), (top, left, th, tw) = hw, resized, crop
    f = lambda v: tf.cast(v, tf.float32)  # noqa: E731

    def sample(images, size, scale, translation):
        return tf.raw_ops.ScaleAndTranslate(
            images=images, size=tf.stack(size), scale=tf.stack(scale),
            translation=tf.stack(translation), antialias=True,
            kernel_type={"bicubic": "keyscubic", "bilinear": "triangle"}[method])

    if p["round_uint8"]:  # Pillow: one pass per axis, each rounded to uint8
        x = two_passes(
            x, vertical_first(h, w, rh, rw, p, TF),
            lambda y: sample(y, [th, tf.shape(y)[2]], [f(rh) / f(h), 1.0], [-f(top), 0.0]),
            lambda y: sample(y, [tf.shape(y)[1], tw], [1.0, f(rw) / f(w)], [0.0, -f(left)]),
            p, TF)
    else:
        x = sample(x, [th, tw], [f(rh) / f(h), f(rw) / f(w)], [-f(top), -f(left)])
    return x if batched else x[0]


def in_tf_graph():
    """Whether this runs inside a TensorFlow graph (tf.data, tf.function)."""
    try:
        import tensorflow as tf
    except ImportError:
        return False
    return not tf.executing_eagerly()
