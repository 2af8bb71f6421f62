"""TensorFlow backend, 2 logical CPUs: the README's MirroredStrategy recipe
gives the same 3 training losses as one device -- also with an active
`global_clipnorm`, which a `kr.ViT` makes clip the all-reduced gradient;
the same model trained by Keras' own train function clips each replica's
gradient (a different update: "per_replica"). Prints one JSON line."""

import json
import os
from functools import partial

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


def run(strategy=None, clip=None, keras_train=False):
    scope = strategy.scope() if strategy else tf.device("/cpu:0")
    with scope:
        model = kr.ViT(**CONFIG)
        r = np.random.default_rng(1)
        model.set_weights([(r.normal(0, 0.2, v.shape) + ("gamma" in v.path)).astype("float32")
                           for v in model.weights])
        model.compile(optimizer=keras.optimizers.SGD(0.1, global_clipnorm=clip),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        if keras_train:  # Keras' own train function, not kr.ViT's
            model.make_train_function = partial(keras.Model.make_train_function, model)
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    hist = model.fit(ds, epochs=1, verbose=0, steps_per_epoch=3)
    return [float(model.evaluate(X[:8], Y[:8], verbose=0))], hist.history["loss"]


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
CLIP = 0.05  # below these gradients' norms: every step clips
print(json.dumps(dict(
    replicas=strategy.num_replicas_in_sync, mirrored=run(strategy), single=run(),
    mirrored_clipped=run(strategy, CLIP), single_clipped=run(clip=CLIP),
    per_replica=run(strategy, CLIP, keras_train=True))))
