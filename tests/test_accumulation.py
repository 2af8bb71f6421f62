"""Gradient accumulation against the definition, with an optimizer that shows
what AdamW and clipping hide: plain SGD (no momentum, no clipping, no weight
decay) moves the weights by `lr * gradient`, so one update of K micro-batches
is one step of the whole batch only if it averages the K micro-gradients (their
sum moves the weights K times as far)."""

import keras
import numpy as np
import tensorflow as tf

from keras_reluvit import recipes
from keras_reluvit.data.pipeline import split_batches

LR = 0.5


def softmax_regression(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, name="head")])


def plain_sgd(model, accum):
    recipe = dict(recipes.get("bv_transfer"), momentum=0.0, grad_clip=None, wd=0.0,
                  warmup_steps=0, warmup_epochs=None, label_smoothing=0.0, ema=None,
                  layer_decay=None, batch_size=32)
    recipes.compile(model, recipe, steps_per_epoch=1, batch_size=32, epochs=10, lr=LR,
                    accum_steps=accum, layer_decay=1.0)
    assert isinstance(model.optimizer, keras.optimizers.SGD)  # torch's subclass on torch
    assert float(model.optimizer.momentum) == 0.0 and model.optimizer.global_clipnorm is None
    return model


def numpy_step(w, b, x, y, scale=1.0):
    """One SGD step of softmax cross-entropy averaged over the batch, the
    gradient multiplied by `scale` (K: the sum of K micro-batch means)."""
    logits = x @ w + b
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d = (p - y) / len(x)
    return w - LR * scale * x.T @ d, b - LR * scale * d.sum(0)


def test_one_accumulated_sgd_update_is_one_step_of_the_whole_batch_not_the_sum():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = np.eye(5, dtype="float32")[rng.integers(0, 5, 32)]
    batch = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    k = 4
    one = plain_sgd(softmax_regression(), 1)
    w0, b0 = (keras.ops.convert_to_numpy(v).astype("float64") for v in one.weights)
    one.fit(batch, epochs=1, steps_per_epoch=1, verbose=0)
    acc = plain_sgd(softmax_regression(), k)
    for v, start in zip(acc.weights, (w0, b0)):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), start)  # the same init
    acc.fit(split_batches(batch, k), epochs=1, steps_per_epoch=k, verbose=0)  # 4 micro-steps of 8 images
    assert int(keras.ops.convert_to_numpy(acc.optimizer.iterations)) == 1  # one update
    mean = numpy_step(w0, b0, x.astype("float64"), y.astype("float64"))
    summed = numpy_step(w0, b0, x.astype("float64"), y.astype("float64"), scale=k)
    for a, o, m, s in zip(acc.weights, one.weights, mean, summed):
        a, o = keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(o)
        np.testing.assert_allclose(o, m, atol=1e-6)  # the un-accumulated step: the formula
        np.testing.assert_allclose(a, o, atol=1e-6, err_msg=f"accumulated vs one step ({a.shape})")
        # the sum of the micro-gradients moves K times as far: far off
        assert np.abs(a - s).max() > 100 * 1e-6 and np.abs(s - m).max() > 0.05
