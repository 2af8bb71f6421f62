"""Run under JAX with 8 virtual CPU devices (see test_distribution.py).

For each strategy named (comma-separated) on a (2, 4) mesh: the variables'
shardings, 3 fit steps against a single-device run, and a sharded checkpoint
loaded unsharded. Prints one JSON line: {strategy: results}. The strategies
run one after the other in this process (one start-up for all three).
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_reluvit as kr  # noqa: E402

strategies, out_dir = sys.argv[1].split(","), sys.argv[2]
CONFIG = dict(variant="Ti/8", width=64, depth=2, num_heads=4, mlp_dim=128, image_size=32,
              num_classes=8, pool="map", attention="relu")
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (24, 32, 32, 3)).astype("float32")
Y = np.eye(8, dtype="float32")[rng.integers(0, 8, 24)]


def init_values(model):
    r = np.random.default_rng(1)
    return [(r.normal(0, 0.2, v.shape) + ("gamma" in v.path)).astype("float32") for v in model.weights]


def run(model):
    model.set_weights(init_values(model))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    losses = [float(model.train_on_batch(X[i * 8:(i + 1) * 8], Y[i * 8:(i + 1) * 8])) for i in range(3)]
    return losses


# single device reference
reference = run(kr.ViT(**CONFIG))


def check(strategy):
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], keras.distribution.list_devices())
    keras.distribution.set_distribution(kr.distribution.model_parallel(mesh, strategy))
    model = kr.ViT(**CONFIG)
    specs = {v.path: [None if a is None else str(a) for a in v.value.sharding.spec]
             + [None] * (len(v.shape) - len(v.value.sharding.spec))
             for v in model.weights}
    num_devices = {v.path: len(v.value.sharding.device_set) for v in model.weights}
    losses = run(model)
    x = X[:8]
    sharded_logits = np.asarray(model.predict(x, verbose=0))
    model.save_weights(os.path.join(out_dir, f"{strategy}.weights.h5"))
    bad_error = None
    if strategy == "tensor":  # 6 heads cannot be split over a model axis of 4
        try:
            kr.ViT(**{**CONFIG, "width": 96, "num_heads": 6})
        except ValueError as e:
            bad_error = str(e)
    keras.distribution.set_distribution(None)
    plain = kr.ViT(**CONFIG)
    plain.load_weights(os.path.join(out_dir, f"{strategy}.weights.h5"))
    plain_logits = np.asarray(plain(x))
    return dict(specs=specs, devices=num_devices, losses=losses, reference=reference,
                logits_diff=float(np.abs(plain_logits - sharded_logits).max()),
                jax_devices=len(jax.devices()), bad_error=bad_error)


print(json.dumps({strategy: check(strategy) for strategy in strategies}))
