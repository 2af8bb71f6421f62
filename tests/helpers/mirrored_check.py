"""TensorFlow backend, 2 logical CPUs: the README's MirroredStrategy recipe
(a `kr.distribution.DataParallelModel` around the compiled ViT) gives the
same 3 training losses and accuracies as one device -- also with an active
`global_clipnorm`, `clipnorm` or `clipvalue`, which it applies to the
all-reduced gradient (also under a `LossScaleOptimizer`; gradient
accumulation, which Keras 3.15 cannot run under a strategy, is refused
naming it); the same model trained by Keras' own `fit` clips each
replica's gradient (a different update: "per_replica"). Prints one JSON
line."""

import json
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_reluvit as kr  # noqa: E402

CONFIG = dict(variant="Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
              num_classes=4, attention="relu")
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (24, 32, 32, 3)).astype("float32")
Y = np.eye(4, dtype="float32")[rng.integers(0, 4, 24)]


def run(strategy=None, clip=None, keras_train=False, kind="global_clipnorm", loss_scale=False):
    scope = strategy.scope() if strategy else tf.device("/cpu:0")
    with scope:
        model = kr.ViT(**CONFIG)
        r = np.random.default_rng(1)
        model.set_weights([(r.normal(0, 0.2, v.shape) + ("gamma" in v.path)).astype("float32")
                           for v in model.weights])
        optimizer = keras.optimizers.SGD(0.1, **{kind: clip})
        if loss_scale:  # mixed precision's optimizer (float32 here: the same numbers)
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, metrics=["accuracy"],
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        trained = model  # Keras' own fit
        if strategy and not keras_train:
            trained = kr.distribution.DataParallelModel(model)
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).repeat()
    hist = trained.fit(ds, epochs=3, verbose=0, steps_per_epoch=1)  # a loss per step
    if clip is not None:  # the thresholds the step traced with were put back
        inner = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        assert inner.get_config()[kind] == clip, inner.get_config()[kind]
    return ([float(v) for v in trained.evaluate(X[:8], Y[:8], verbose=0)],
            hist.history["loss"] + hist.history["accuracy"])


def accumulation_error(strategy):
    with strategy.scope():
        model = kr.ViT(**CONFIG)
        model.build((None, 32, 32, 3))
        model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        try:
            kr.distribution.DataParallelModel(model)
        except ValueError as e:
            return str(e)
    return None


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
CLIP = 0.05  # below these gradients' norms: every step clips
print(json.dumps(dict(
    replicas=strategy.num_replicas_in_sync, mirrored=run(strategy), single=run(),
    mirrored_clipped=run(strategy, CLIP), single_clipped=run(clip=CLIP),
    mirrored_unbitten=run(strategy, 1e3), single_unbitten=run(),
    mirrored_clipnorm=run(strategy, CLIP, kind="clipnorm"),
    single_clipnorm=run(clip=CLIP, kind="clipnorm"),
    mirrored_clipvalue=run(strategy, 1e-3, kind="clipvalue"),
    single_clipvalue=run(clip=1e-3, kind="clipvalue"),
    accumulated_error=accumulation_error(strategy),
    mirrored_loss_scaled=run(strategy, CLIP, loss_scale=True),
    single_loss_scaled=run(clip=CLIP, loss_scale=True),
    per_replica=run(strategy, CLIP, keras_train=True))))
