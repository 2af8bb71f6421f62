"""The Pallas kernel under a keras.distribution on 8 virtual JAX CPU devices
(run in a subprocess by test_distribution.py; prints one JSON line).

XLA cannot split a kernel's custom call: without help, a multi-device mesh
would gather the whole batch onto every device and compute all of it there.
`kernels.pallas_sharded` runs the kernel per shard instead. Checked here,
with the kernel interpreted: under DataParallel (8 devices) and a tensor-
parallel `kr.distribution.model_parallel` on a (2, 4) mesh, the kernel sees
the local batch (and local heads), the output keeps the input's sharding,
and outputs and gradients (with a key mask and a learned per-head scale)
equal the generic path with no distribution; a ViT's logits too.
"""

import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

import keras_reluvit as kr  # noqa: E402
from keras_reluvit.kernels import pallas  # noqa: E402

seen = []
_attention = pallas.attention


def recording(query, key, value, *args, **kwargs):
    if all(isinstance(n, int) for n in query.shape):  # not Keras' symbolic pass
        seen.append(tuple(query.shape))
    return _attention(query, key, value, *args, **kwargs)


pallas.attention = recording
devices = keras.distribution.list_devices()


def rel(a, r):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(r))) / np.max(np.abs(np.asarray(r))))


rng = np.random.default_rng(0)
b, t, h, d = 8, 37, 4, 16
q, k, v, w = (rng.normal(size=(b, t, h, d)).astype("float32") for _ in range(4))
mask = np.ones((b, 1, t), bool)
mask[1::2, :, t // 2:] = False
log_scale = rng.normal(scale=0.3, size=(h,)).astype("float32")


def functions():  # new jit functions: jit caches the kernel choice per trace
    def f(q, k, v, ls):
        return kr.pointwise_attention(q, k, v, activation="gelu", mask=mask, log_scale=ls)

    def loss(q, k, v, ls):
        return jax.numpy.sum(f(q, k, v, ls) * w)

    return jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


with kr.use_kernel("generic"):
    f, g = functions()
    ref_out, ref_grads = f(q, k, v, log_scale), g(q, k, v, log_scale)

result = {"devices": len(devices), "cases": {}}
dp = keras.distribution.DataParallel(devices=devices)
tp_mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices)
tp = kr.distribution.model_parallel(tp_mesh, "tensor")
for name, dist, spec in (("data_parallel", dp, PartitionSpec("batch")),
                         ("tensor_parallel", tp, PartitionSpec("batch", None, "model"))):
    keras.distribution.set_distribution(dist)
    sharding = NamedSharding(dist.device_mesh.backend_mesh, spec)
    xs = [jax.device_put(x, sharding) for x in (q, k, v)]
    del seen[:]
    with kr.use_kernel("pallas"):
        f, g = functions()
        out, grads = f(*xs, log_scale), g(*xs, log_scale)
    result["cases"][name] = dict(
        kernel_shapes=sorted(set(seen)), forward=rel(out, ref_out),
        grad=max(rel(a, r) for a, r in zip(grads, ref_grads)),
        out_sharding=str(out.sharding.spec))
    keras.distribution.set_distribution(None)

# A ViT's forward under DataParallel with the kernel equals one device.
model = kr.ViT(image_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64,
               num_classes=5, attention="relu")
model.set_weights([rng.normal(scale=0.2, size=w.shape).astype("float32")
                   for w in model.get_weights()])  # a zero-initialised head says nothing
x = rng.uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
with kr.use_kernel("generic"):
    single = np.asarray(model.predict(x, verbose=0))
keras.distribution.set_distribution(dp)
del seen[:]
with kr.use_kernel("pallas"):
    model_dp = kr.ViT.from_config(model.get_config())
    model_dp.set_weights(model.get_weights())
    sharded = np.asarray(model_dp.predict(x, batch_size=8, verbose=0))
result["vit"] = dict(kernel_shapes=sorted(set(seen)), logits=rel(sharded, single))
print(json.dumps(result))
