"""`ViT(remat=...)`: each block recomputed in the backward pass gives the
gradients and the training step of the model without remat (on perturbed
weights), round-trips through `.keras`, and names a bad value."""

import keras
import numpy as np
import pytest
from conftest import grads

import keras_reluvit as kr


def tiny(remat, dropout=0.0, drop_path=0.0):
    keras.utils.set_random_seed(3)
    model = kr.ViT("Ti/8", image_size=16, num_classes=5, width=32, depth=2, num_heads=2,
                   mlp_dim=64, remat=remat, dropout=dropout, drop_path=drop_path)
    rng = np.random.default_rng(0)  # perturbed: the head starts at zero
    model.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def images():
    return np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")


# A JAX policy; on TensorFlow and PyTorch it is "full" (said in one line).
@pytest.mark.parametrize("remat", ["full"] + (["dots_saveable"] if keras.backend.backend() == "jax"
                                             else []))
def test_remat_gradients_equal_the_plain_models(remat):
    plain, rematted = tiny(None), tiny(remat)
    x = images()
    assert [b.remat for b in rematted.blocks] == ["full" if remat == "full" else remat] * 2

    def loss(model):
        return lambda t: keras.ops.sum(keras.ops.square(model(t, training=True)))

    gx0, gv0 = grads(loss(plain), plain.trainable_variables, [x])
    gx1, gv1 = grads(loss(rematted), rematted.trainable_variables, [x])
    assert len(gv0) == len(gv1) > 10
    for a, b, v in zip(gv1 + gx1, gv0 + gx0, rematted.trainable_variables + [None]):
        assert np.abs(b).max() > 0, v
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max(),
                                   err_msg=getattr(v, "path", "input"))


def test_a_training_step_with_remat_equals_the_plain_one(tmp_path):
    x, y = images(), np.eye(5, dtype="float32")[[0, 1, 2, 3]]
    models = [tiny(None), tiny("full")]
    for m in models:
        m.compile(keras.optimizers.SGD(0.1), keras.losses.CategoricalCrossentropy(
            from_logits=True))
        m.train_on_batch(x, y)
    for a, b in zip(models[1].get_weights(), models[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    path = str(tmp_path / "remat.keras")
    models[1].save(path)
    back = keras.saving.load_model(path)
    assert back.get_config()["remat"] == "full" and back.blocks[0].remat == "full"
    np.testing.assert_allclose(back.predict(x, verbose=0), models[1].predict(x, verbose=0),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("regulariser", [dict(dropout=0.2), dict(drop_path=0.5)])
def test_remat_with_dropout_replays_the_forward_masks(regulariser):
    """Dropout (or stochastic depth) inside a recomputed block: the
    recomputation must draw the forward pass's masks (a second draw would
    give the gradient of other masks, silently). Same seeds, same masks: the
    gradients of the plain model's. Then a training step runs and moves the
    weights."""
    plain, rematted = tiny(None, **regulariser), tiny("full", **regulariser)
    x = images()

    def loss(model):
        return lambda t: keras.ops.sum(keras.ops.square(model(t, training=True)))

    # Equal seed states draw equal masks (PyTorch's default Dropout draws from
    # torch's global generator, which torch.utils.checkpoint replays itself).
    keras.utils.set_random_seed(5)
    _, g0 = grads(loss(plain), plain.trainable_variables, [x])
    keras.utils.set_random_seed(5)
    _, g1 = grads(loss(rematted), rematted.trainable_variables, [x])
    _, g_inference = grads(lambda t: keras.ops.sum(keras.ops.square(plain(t))),
                           plain.trainable_variables, [x])
    assert max(np.abs(a - b).max() for a, b in zip(g0, g_inference)) > 1e-3  # masks matter
    for a, b, v in zip(g1, g0, rematted.trainable_variables):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max(), err_msg=v.path)
    rematted.compile(keras.optimizers.SGD(0.1), keras.losses.CategoricalCrossentropy(
        from_logits=True))
    before = rematted.get_weights()
    loss_value = rematted.train_on_batch(x, np.eye(5, dtype="float32")[[0, 1, 2, 3]])
    assert np.isfinite(loss_value)
    assert any(not np.array_equal(a, b) for a, b in zip(rematted.get_weights(), before))


def test_bad_remat_is_named():
    with pytest.raises(ValueError, match=r"Unknown remat 'blocks': None \(off\), 'full'"):
        kr.ViT("Ti/16", image_size=32, remat="blocks")


def _remat_equations(jaxpr):
    """The `jax.checkpoint` equations of `jaxpr` and of the jaxprs inside it
    (its primitive is `remat2` in jax 0.10, `checkpoint` in later ones)."""
    found = []
    for eqn in jaxpr.eqns:
        if "remat" in eqn.primitive.name or "checkpoint" in eqn.primitive.name:
            found.append(eqn)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's own
                if hasattr(sub, "eqns"):
                    found += _remat_equations(sub)
    return found


def _forward_and_backward(model, x):
    """(block forwards in the forward pass, block forwards in the backward
    pass, bytes PyTorch saved for the backward or None) of one gradient."""
    calls = []
    for block in model.blocks:
        def counted(*args, forward=block._forward, **kwargs):
            calls.append(1)
            return forward(*args, **kwargs)

        block._forward = counted  # what the remat wrapper calls, looked up per call
    saved = []
    if keras.backend.backend() == "torch":
        import torch

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = keras.ops.sum(keras.ops.square(model(torch.tensor(x), training=True)))
        forwards = len(calls)
        loss.backward()
        return forwards, len(calls) - forwards, sum(saved)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = keras.ops.sum(keras.ops.square(model(tf.constant(x), training=True)))
    forwards = len(calls)
    assert all(g is not None for g in tape.gradient(loss, model.trainable_variables))
    return forwards, len(calls) - forwards, None


def test_remat_recomputes_the_blocks_in_the_backward_pass():
    """Remat observed, not only its gradients (which are the plain model's
    by design): on JAX the gradient's jaxpr holds one `jax.checkpoint` per
    block, with the policy asked; on PyTorch and TensorFlow each block runs
    again in the backward pass (torch.utils.checkpoint, tf.recompute_grad)
    and PyTorch's forward keeps less for the backward. The plain model: none."""
    x = images()[:2]
    if keras.backend.backend() == "jax":
        import jax

        def remats(model):
            variables = model.trainable_variables

            def loss(values):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return keras.ops.sum(keras.ops.square(model(x, training=True)))

            jaxpr = jax.make_jaxpr(jax.grad(loss))([v.value for v in variables])
            return [e.params["policy"] for e in _remat_equations(jaxpr.jaxpr)]

        assert remats(tiny(None)) == []
        assert remats(tiny("full")) == [None, None]  # nothing_saveable: jax's default
        assert remats(tiny("dots_saveable")) == [jax.checkpoint_policies.dots_saveable] * 2
        return
    plain, rematted = _forward_and_backward(tiny(None), x), _forward_and_backward(tiny("full"), x)
    assert plain[:2] == (2, 0) and rematted[:2] == (2, 2), (plain, rematted)
    if keras.backend.backend() == "torch":  # 129 kB -> 35 kB here
        assert rematted[2] < 0.5 * plain[2], (plain, rematted)
