"""`data.switch_randaugment` against Keras' own `RandAugment` layer:
exactly one op runs per draw, and the ops are drawn as the layer draws them
(uniform over its `_AUGMENT_LAYERS`). Backend-independent (tf.data code),
so it runs once."""

import keras
import numpy as np
import tensorflow as tf

from keras_reluvit import data as D


def chi_square_uniform_ok(counts, draws):
    """Pearson's chi-square statistic against the uniform distribution,
    below the 0.999 quantile (df = k - 1, Wilson-Hilferty)."""
    k = len(counts)
    expected = draws / k
    stat = sum((c - expected) ** 2 / expected for c in counts)
    df = k - 1
    z = 3.09  # 0.999 quantile of the standard normal
    quantile = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    return stat < quantile, stat, quantile


def test_one_keras_op_per_draw_with_the_layers_distribution():
    layer = keras.layers.RandAugment(value_range=(0, 255), num_ops=2, factor=0.5, seed=3)
    names = list(layer._AUGMENT_LAYERS)
    calls = {n: 0 for n in names}
    for n in names:  # count executions of each of the layer's own ops
        sub = getattr(layer, n)
        original = sub.transform_images

        def counted(images, transformation, *a, _n=n, _f=original, **k):
            calls[_n] += 1
            return _f(images, transformation, *a, **k)

        sub.transform_images = counted
    image = tf.constant(np.random.default_rng(0).uniform(0, 255, (16, 16, 3)).astype("float32"))
    n_images = 330
    outs = []
    for i in range(n_images):  # eager: tf.switch_case runs the chosen branch only
        key = tf.constant([7, i], tf.int64)  # the pipeline's per-example stateless key
        outs.append(D.switch_randaugment(layer, image, key).numpy())
    assert sum(calls.values()) == 2 * n_images  # num_ops = 2: exactly two ops per image
    ok, stat, q = chi_square_uniform_ok(list(calls.values()), 2 * n_images)
    assert ok, (calls, stat, q)
    # Keras' layer draws its op indices the same way (uniform).
    ref = keras.layers.RandAugment(value_range=(0, 255), num_ops=2, factor=0.5, seed=4)
    idx = np.concatenate([np.asarray(keras.ops.convert_to_numpy(
        ref.get_random_transformation(image[None])["layer_idxes"])) for _ in range(n_images)])
    ok, stat, q = chi_square_uniform_ok(np.bincount(idx, minlength=len(names)), len(idx))
    assert ok, (stat, q)
    assert all(o.shape == (16, 16, 3) and np.isfinite(o).all() for o in outs)
    assert all(-1e-3 <= o.min() and o.max() <= 255 + 1e-3 for o in outs)
    changed = [float(np.abs(o - image.numpy()).mean()) for o in outs]
    assert np.mean(changed) > 1.0  # it augments
    # Keyed draws are a function of the key only (what makes a resumed epoch
    # replay its augmentation), and differ between keys.
    again = D.switch_randaugment(layer, image, tf.constant([7, 5], tf.int64)).numpy()
    np.testing.assert_array_equal(again, outs[5])
    assert len({o.tobytes() for o in outs[:40]}) > 30
    # Without a key the layer's own seed generator draws (Keras' way).
    assert D.switch_randaugment(layer, image).shape == (16, 16, 3)


def test_equalization_histogram_is_a_bincount_under_every_global_backend():
    # Keras 3.15 picks Equalization's histogram by the *global* backend (a
    # 256-step loop under JAX, also inside tf.data); switch_randaugment binds
    # the layer's bincount branch. Counts against NumPy's, and the layer's
    # output against Keras' own on the same image and transformation.
    layer = keras.layers.RandAugment(value_range=(0, 255), num_ops=1, factor=0.5, seed=0)
    eq = layer.equalization
    reference = keras.layers.Equalization(value_range=(0, 255))
    reference.backend.set_backend("tensorflow")
    img = np.random.default_rng(1).uniform(0, 255, (12, 9, 3)).astype("float32")
    img[..., 0] = np.round(img[..., 0] / 32) * 32  # few levels: ties in the lookup table
    D.switch_randaugment(layer, tf.constant(img), tf.constant([1, 2], tf.int64))
    assert "_custom_histogram_fixed_width" in vars(eq)
    got = eq._custom_histogram_fixed_width(tf.constant(img[..., 1]), (0, 255), 256).numpy()
    want = np.bincount(np.clip((img[..., 1] * 255 / 255).astype("int32"), 0, 255).ravel(),
                       minlength=256)
    np.testing.assert_array_equal(got, want)
    out = eq.transform_images(tf.constant(img[None]), None)[0].numpy()
    np.testing.assert_array_equal(out, reference.transform_images(tf.constant(img[None]), None)[0].numpy())
    assert not np.array_equal(out, img)
