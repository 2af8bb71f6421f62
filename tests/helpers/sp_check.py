"""Sequence-parallel attention on 8 virtual JAX CPU devices (run in a
subprocess by test_distribution.py; prints one JSON line).

1. The kernel: `pointwise_attention` under a sequence-parallel distribution
   (meshes (1, 8) and (2, 4) batch x seq) against the generic path with no
   distribution, forward and gradient, for several activations, alpha and a
   learned scale.
   Token counts the axis does not divide (60 keys; one query, as the MAP
   head's probe) are padded, with the same results. Under the "pallas"
   kernel switch each shard's partial sums come from the Pallas kernel.
2. ViTs with gap (64 tokens), a class token (65) and a MAP head under
   `kr.distribution.model_parallel(..., sequence_axis="seq")`: the path is
   used, logits and three training steps equal one device.
"""

import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_reluvit as kr  # noqa: E402
from keras_reluvit import kernels  # noqa: E402

calls = {"sequence_parallel": 0}
_original = kernels.sequence_parallel


def counting(*args, **kwargs):
    calls["sequence_parallel"] += 1
    return _original(*args, **kwargs)


kernels.sequence_parallel = counting
devices = keras.distribution.list_devices()


def attention_fn(activation, alpha, log_scale):
    def f(q, k, v):
        return kr.pointwise_attention(q, k, v, activation=activation, seq_len_exponent=alpha,
                                      log_scale=log_scale)

    def loss(q, k, v, w):
        return jax.numpy.sum(f(q, k, v) * w)

    return jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def rel(a, r):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(r))) / np.max(np.abs(np.asarray(r))))


def kernel_errors():
    rng = np.random.default_rng(0)
    b, t, h, d = 2, 64, 2, 8
    q, k, v, w = (rng.normal(size=(b, t, h, d)).astype("float32") for _ in range(4))
    log_scale = rng.normal(size=(h,)).astype("float32") * 0.3
    errors = {}
    for mesh_shape in ((1, 8), (2, 4)):
        mesh = keras.distribution.DeviceMesh(mesh_shape, ["batch", "seq"], devices)
        dist = kr.distribution.model_parallel(mesh, "data", sequence_axis="seq")
        for activation, alpha, scale in (("relu", 1.0, None), ("gelu", 0.5, None),
                                         ("sigmoid", 1.0, log_scale), ("relu2", 0.0, None)):
            f, g = attention_fn(activation, alpha, scale)
            ref_out, ref_grad = f(q, k, v), g(q, k, v, w)
            before = calls["sequence_parallel"]
            with dist.scope():
                f, g = attention_fn(activation, alpha, scale)
                out, grad = f(q, k, v), g(q, k, v, w)
            used = calls["sequence_parallel"] > before
            key = f"{'x'.join(map(str, mesh_shape))}/{activation}/{alpha}/{scale is not None}"
            errors[key] = dict(
                used=used,
                forward=rel(out, ref_out),
                grad=max(rel(a, r) for a, r in zip(grad, ref_grad)),
                out_sharding=str(out.sharding.spec),
            )
    # Token counts the axis does not divide (60 keys, 1 query: a MAP probe)
    # are padded; sigmoid(0) != 0, so padded keys must add nothing.
    mesh = keras.distribution.DeviceMesh((1, 8), ["batch", "seq"], devices)
    dist = kr.distribution.model_parallel(mesh, "data", sequence_axis="seq")
    for name, tq in (("uneven_60", 60), ("probe_1", 1)):
        ref_f, ref_g = attention_fn("sigmoid", 1.0, None)
        args = (q[:, :tq], k[:, :60], v[:, :60])
        ref_out, ref_grad = ref_f(*args), ref_g(*args, w[:, :tq])
        before = calls["sequence_parallel"]
        with dist.scope():
            f, g = attention_fn("sigmoid", 1.0, None)
            out, grad = f(*args), g(*args, w[:, :tq])
        errors[name] = dict(
            used=calls["sequence_parallel"] > before,
            forward=rel(out, ref_out),
            grad=max(rel(a, r) for a, r in zip(grad, ref_grad)),
            out_sharding="'seq' (padded)",
        )
    # Each shard's partial sums through the Pallas kernel (interpreted on
    # this CPU): the 60-key padded case, on a (2, 4) mesh.
    from keras_reluvit.kernels import pallas

    pallas_calls = []
    original = pallas.attention

    def counting_pallas(*a, **kw):
        pallas_calls.append(1)
        return original(*a, **kw)

    pallas.attention = counting_pallas
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "seq"], devices)
    dist = kr.distribution.model_parallel(mesh, "data", sequence_axis="seq")
    args = (q[:, :60], k[:, :60], v[:, :60])
    ref_f, ref_g = attention_fn("relu", 1.0, log_scale)
    ref_out, ref_grad = ref_f(*args), ref_g(*args, w[:, :60])
    before = calls["sequence_parallel"]
    with dist.scope(), kr.use_kernel("pallas"):
        f, g = attention_fn("relu", 1.0, log_scale)
        out, grad = f(*args), g(*args, w[:, :60])
    pallas.attention = original
    errors["2x4/pallas/relu/uneven_60"] = dict(
        used=calls["sequence_parallel"] > before and len(pallas_calls) > 0,
        forward=rel(out, ref_out),
        grad=max(rel(a, r) for a, r in zip(grad, ref_grad)),
        out_sharding=str(out.sharding.spec),
    )
    return errors


def vit_losses(distribution, pool="gap"):
    keras.utils.set_random_seed(0)
    if distribution is not None:
        keras.distribution.set_distribution(distribution)
    # gap: 64 tokens; tok: 65 (a class token); map: 64 keys, one probe query.
    model = kr.ViT("Ti/16", attention="relu", image_size=32, patch_size=4, width=32, depth=2,
                   num_heads=2, mlp_dim=64, num_classes=5, pool=pool)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 5, 8), 5)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    losses = [float(model.train_on_batch(x, y)) for _ in range(3)]
    logits = np.asarray(model.predict(x, batch_size=8, verbose=0))  # head trained: non-zero
    keras.distribution.set_distribution(None)
    return logits, losses


def main():
    errors = kernel_errors()
    vits = {}
    for pool, shape in (("gap", (2, 4)), ("tok", (1, 8)), ("map", (1, 8))):
        ref_logits, ref_losses = vit_losses(None, pool)
        mesh = keras.distribution.DeviceMesh(shape, ["batch", "seq"], devices)
        before = calls["sequence_parallel"]
        logits, losses = vit_losses(
            kr.distribution.model_parallel(mesh, "data", sequence_axis="seq"), pool)
        vits[pool] = dict(
            used=calls["sequence_parallel"] > before,
            logits_diff=float(np.max(np.abs(logits - ref_logits))),
            logits_scale=float(np.max(np.abs(ref_logits))),
            losses=losses,
            reference=ref_losses,
        )
    print(json.dumps(dict(jax_devices=len(jax.devices()), kernel=errors, vits=vits)))


if __name__ == "__main__":
    sys.exit(main())
