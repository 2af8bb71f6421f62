"""PointwiseAttention on inputs of rank > 3 with `attention_axes`, as
`keras.layers.MultiHeadAttention` takes them: against a NumPy formula written
from the paper's definition with `L` counted over the attended axes (every
activation, with and without masks, forward and gradient), against
MultiHeadAttention itself for softmax, and MultiHeadAttention's shapes,
serialization and errors."""

import math
import traceback
import zlib

import keras
import numpy as np
import pytest
from conftest import grads
from test_attention import np_act

from keras_reluvit import PointwiseAttention

B, X, Y, D, H, DH = 2, 3, 4, 8, 2, 3
ACTS = ["relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid"]


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), "float64")


def np_nd(p, xq, xkv, axes, mask, act, alpha, log_scale=None):
    """Rank-4 inputs `(B, X, Y, D)`. `axes=(1, 2)`: every grid position
    attends to every grid position (2-D attention); `axes=(2,)`: each row x
    attends along its own Y axis (factorised attention). Weights
    `a = e^s * L^-alpha * h(q.k / sqrt(d))`, `L` = the unmasked keys of the
    query over the attended axes. Returns `(y, weights)` in
    MultiHeadAttention's score layout."""
    q = np.einsum("bxyd,dhk->bxyhk", xq, p["wq"]) + p["bq"]
    k = np.einsum("bxyd,dhk->bxyhk", xkv, p["wk"]) + p["bk"]
    v = np.einsum("bxyd,dhk->bxyhk", xkv, p["wv"]) + p["bv"]
    scale = 1 / math.sqrt(q.shape[-1])
    if axes == (1, 2):
        s = np.einsum("bxyhk,buvhk->bhxyuv", q, k) * scale
        m = np.ones((B, X, Y, X, Y), bool) if mask is None else mask
        m = m[:, None]  # (B, 1, X, Y, U, V)
        n = m.sum((-2, -1), keepdims=True)
    else:
        s = np.einsum("bxyhk,bxvhk->bxhyv", q, k) * scale
        m = np.ones((B, X, Y, Y), bool) if mask is None else mask
        m = m[:, :, None]  # (B, X, 1, Y, V)
        n = m.sum(-1, keepdims=True)
    w = np.where(m, np_act(act, s), 0.0) * np.maximum(n, 1.0) ** -alpha
    if log_scale is not None:
        shape = [1] * w.ndim
        shape[1 if axes == (1, 2) else 2] = H
        w = w * np.exp(log_scale).reshape(shape)
    if axes == (1, 2):
        o = np.einsum("bhxyuv,buvhk->bxyhk", w, v)
    else:
        o = np.einsum("bxhyv,bxvhk->bxyhk", w, v)
    return np.einsum("bxyhk,hkd->bxyd", o, p["wo"]) + p["bo"], w


def params(layer):
    p = dict(wq=layer.query_dense.kernel, bq=layer.query_dense.bias,
             wk=layer.key_dense.kernel, bk=layer.key_dense.bias,
             wv=layer.value_dense.kernel, bv=layer.value_dense.bias,
             wo=layer.output_dense.kernel, bo=layer.output_dense.bias)
    if layer.learned_scale:
        p["log_scale"] = layer.log_scale
    return p


def make(act, axes, alpha=1.0, seed=0, **kw):
    layer = PointwiseAttention(num_heads=H, key_dim=DH, activation=act, seq_len_exponent=alpha,
                               attention_axes=axes, **kw)
    layer.build((B, X, Y, D), (B, X, Y, D))
    rng = np.random.default_rng(seed)
    for v in layer.weights:
        v.assign(rng.normal(0, 0.5, v.shape).astype("float32"))
    return layer


def make_mask(axes, kind, rng):
    """`random`: each query keeps at least one key; `empty_rows`: some queries
    have none (their attention output is zero)."""
    if kind == "none":
        return None
    shape = (B, X, Y, X, Y) if axes == (1, 2) else (B, X, Y, Y)
    m = rng.random(shape) < 0.6
    m[..., 0] = True
    if kind == "empty_rows":
        m[0, 1] = False  # (1, 2): query row x=1 of batch 0; (2,): all queries of that row
    return m


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("axes", [(1, 2), (2,)])
@pytest.mark.parametrize("mask_kind", ["none", "random", "empty_rows"])
def test_nd_attention_equals_the_papers_formula_forward_and_gradient(act, axes, mask_kind):
    seed = zlib.crc32(repr((act, axes, mask_kind)).encode())
    rng = np.random.default_rng(seed)
    layer = make(act, axes, alpha=0.5 if act == "sigmoid" else 1.0, seed=seed)
    alpha = layer.seq_len_exponent
    xq = rng.normal(size=(B, X, Y, D)).astype("float32")
    xkv = rng.normal(size=(B, X, Y, D)).astype("float32")
    mask = make_mask(axes, mask_kind, rng)
    p64 = {k: to_np(v) for k, v in params(layer).items()}
    y, w = layer(xq, xkv, attention_mask=mask, return_attention_scores=True)
    ref_y, ref_w = np_nd(p64, xq.astype("float64"), xkv.astype("float64"), axes, mask, act, alpha)
    assert tuple(w.shape) == ref_w.shape
    np.testing.assert_allclose(to_np(w), ref_w, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(to_np(y), ref_y, rtol=1e-3, atol=5e-4)

    cot = rng.normal(size=ref_y.shape)
    names = list(p64)
    variables = [params(layer)[n] for n in names]

    def loss(q_in, kv_in):
        out = layer(q_in, kv_in, attention_mask=mask)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(cot.astype("float32")))

    (gq, gkv), gv = grads(loss, variables, [xq, xkv])
    dq, dkv = rng.normal(size=xq.shape), rng.normal(size=xkv.shape)
    dp = {n: rng.normal(size=p64[n].shape) for n in names}
    analytic = (gq * dq).sum() + (gkv * dkv).sum() + sum((g * dp[n]).sum()
                                                          for g, n in zip(gv, names))

    def f(eps):
        p = {n: p64[n] + eps * dp[n] for n in names}
        return (np_nd(p, xq + eps * dq, xkv + eps * dkv, axes, mask, act, alpha)[0] * cot).sum()

    numeric = (f(1e-5) - f(-1e-5)) / 2e-5
    assert analytic == pytest.approx(numeric, rel=2e-3, abs=2e-3), (analytic, numeric)


def test_nd_learned_scale_and_a_mask_without_the_free_axes():
    """A `(B, Y, Y)` mask on `attention_axes=(2,)` broadcasts over X (as
    MultiHeadAttention broadcasts it); the learned per-head scale multiplies
    the weights by exp(s_h)."""
    rng = np.random.default_rng(5)
    layer = make("relu", (2,), learned_scale=True, seed=5)
    xq = rng.normal(size=(B, X, Y, D)).astype("float32")
    mask = rng.random((B, Y, Y)) < 0.7
    y, w = layer(xq, xq, attention_mask=mask, return_attention_scores=True)
    p64 = {k: to_np(v) for k, v in params(layer).items()}
    full = np.broadcast_to(mask[:, None], (B, X, Y, Y))
    ref_y, ref_w = np_nd(p64, xq.astype("float64"), xq.astype("float64"), (2,), full, "relu", 1.0,
                         log_scale=p64["log_scale"])
    np.testing.assert_allclose(to_np(w), ref_w, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(to_np(y), ref_y, rtol=1e-3, atol=5e-4)


def test_nd_takes_the_chunked_path_with_the_same_numbers():
    """The attended axes are flattened into one sequence before the dispatch,
    so chunking (and the other 3-D paths) apply to N-D attention too."""
    rng = np.random.default_rng(6)
    dense = make("relu", (1, 2), seed=6)
    chunked = make("relu", (1, 2), seed=6, chunk_size=5)
    xq = rng.normal(size=(B, X, Y, D)).astype("float32")
    np.testing.assert_allclose(to_np(chunked(xq, xq)), to_np(dense(xq, xq)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes", [(1, 2), (2,), (-2,), (2, 1), None])
def test_softmax_nd_is_multi_head_attention(axes):
    rng = np.random.default_rng(7)
    shape = (B, X, Y, D)
    ref = keras.layers.MultiHeadAttention(num_heads=H, key_dim=DH, attention_axes=axes)
    ours = PointwiseAttention(num_heads=H, key_dim=DH, activation="softmax", attention_axes=axes)
    x = rng.normal(size=shape).astype("float32")
    ref(x, x)
    ours(x, x)
    ours.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in ref.get_weights()])
    ref.set_weights(ours.get_weights())
    want, want_w = ref(x, x, return_attention_scores=True)
    got, got_w = ours(x, x, return_attention_scores=True)
    np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-5)
    np.testing.assert_allclose(to_np(got_w), to_np(want_w), atol=1e-6)


def test_nd_shapes_and_serialization(tmp_path):
    layer = PointwiseAttention(num_heads=H, key_dim=DH, activation="relu", attention_axes=(2, 3),
                               output_shape=5)
    q = np.ones((B, 2, X, Y, D), "float32")
    v = np.ones((B, 2, 6, 7, 4), "float32")
    out, w = layer(q, v, return_attention_scores=True)
    assert tuple(out.shape) == layer.compute_output_shape(q.shape, v.shape) == (B, 2, X, Y, 5)
    assert tuple(w.shape) == (B, 2, H, X, Y, 6, 7)
    cfg = layer.get_config()
    assert cfg["attention_axes"] == (2, 3)
    again = PointwiseAttention.from_config(cfg)
    again(q, v)
    again.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_np(again(q, v)), to_np(out), atol=1e-6)
    inp_q, inp_v = keras.Input((2, X, Y, D)), keras.Input((2, 6, 7, 4))
    model = keras.Model([inp_q, inp_v], layer(inp_q, inp_v))
    model.save(tmp_path / "m.keras")
    back = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(to_np(back([q, v])), to_np(out), atol=1e-6)


@pytest.mark.parametrize("q_shape,v_shape,k_shape", [
    ((B, X, Y, D), (B, X, 5, D), (B, X, 6, D)),   # key and value disagree
    ((B, X, Y, D), (B, 2, Y, D), (B, 3, Y, D)),
])
def test_high_dim_shape_mismatches_raise_multi_head_attentions_errors(q_shape, v_shape, k_shape):
    layer = PointwiseAttention(num_heads=H, key_dim=DH, activation="relu", attention_axes=(2,))
    with pytest.raises(ValueError, match="must be equal"):
        layer.compute_output_shape(q_shape, v_shape, k_shape)
    with pytest.raises(ValueError, match="must be equal"):
        layer(np.ones(q_shape, "float32"), np.ones(v_shape, "float32"), np.ones(k_shape, "float32"))


@pytest.mark.parametrize("kwargs,match", [
    (dict(activation="tanh"), "Valid names"),
    (dict(activation="relu", flash_attention=True), "does not apply to pointwise attention"),
    (dict(activation="softmax", flash_attention=True, dropout=0.1),
     "Dropout is not supported when flash attention is enabled"),
    (dict(attention_axes="rows"), "must be an int, list, or tuple"),
])
def test_argument_errors_leave_a_layer_whose_repr_works(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        PointwiseAttention(num_heads=2, key_dim=4, **kwargs)
    # The traceback with its locals (the half-built layer among them) renders.
    text = "".join(traceback.TracebackException.from_exception(
        info.value, capture_locals=True).format())
    assert match.split()[0] in text


def test_flash_attention_false_is_accepted_and_softmax_keeps_it():
    relu = PointwiseAttention(num_heads=2, key_dim=4, activation="relu", flash_attention=False)
    assert relu._flash_attention is False
    for flash in (None, False, True):
        soft = PointwiseAttention(num_heads=2, key_dim=4, activation="softmax",
                                  flash_attention=flash)
        mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=flash)
        assert soft._flash_attention == mha._flash_attention


def test_symbolic_scores_have_the_shape_the_call_returns():
    """In a functional model the scores' symbolic shape is the real one, for
    N-D attention and for T != S (MultiHeadAttention's spec assumes rank 3
    and T == S)."""
    for q_shape, v_shape, axes, want in [
            ((5, D), (7, D), None, (None, H, 5, 7)),
            ((X, Y, D), (X, 6, D), (2,), (None, X, H, Y, 6)),
            ((X, Y, D), (2, 5, D), (1, 2), (None, H, X, Y, 2, 5))]:
        layer = PointwiseAttention(num_heads=H, key_dim=DH, activation="relu",
                                   attention_axes=axes)
        q, v = keras.Input(q_shape), keras.Input(v_shape)
        out, w = layer(q, v, return_attention_scores=True)
        assert tuple(w.shape) == want
        model = keras.Model([q, v], [out, w])
        real = model([np.ones((2, *q_shape), "float32"), np.ones((2, *v_shape), "float32")])
        assert tuple(real[1].shape) == (2, *want[1:])


def _project(p, xkv, weights, spec_w, spec_v, spec_o):
    """The output of attention weights `weights` on `xkv`'s values, projected."""
    v = np.einsum(spec_v, xkv, p["wv"]) + p["bv"]
    o = np.einsum(spec_w, weights, v)
    return np.einsum(spec_o, o, p["wo"]) + p["bo"]


@pytest.mark.parametrize("act", ["softmax"] + ACTS)
def test_per_head_masks_as_multi_head_attention_takes_them(act):
    """A `(B, H, T, S)` mask (MultiHeadAttention broadcasts it per head):
    each head's weights are the formula under its own mask, `L` counted per
    head; softmax equals MultiHeadAttention with the same mask."""
    from test_attention import np_attention

    rng = np.random.default_rng(zlib.crc32(act.encode()))
    T, S = 5, 6
    layer = PointwiseAttention(num_heads=H, key_dim=DH, activation=act)
    layer.build((B, T, D), (B, S, D))
    for v in layer.weights:
        v.assign(rng.normal(0, 0.5, v.shape).astype("float32"))
    xq = rng.normal(size=(B, T, D)).astype("float32")
    xkv = rng.normal(size=(B, S, D)).astype("float32")
    mask = rng.random((B, H, T, S)) < 0.6
    mask[..., 0] = True
    mask[0, 1, 2] = False  # an empty row in one head only
    y, w = layer(xq, xkv, attention_mask=mask, return_attention_scores=True)
    if act == "softmax":  # MultiHeadAttention is the reference (also for the empty row)
        mha = keras.layers.MultiHeadAttention(num_heads=H, key_dim=DH)
        mha(xq, xkv)
        mha.set_weights(layer.get_weights())
        want, want_w = mha(xq, xkv, attention_mask=mask, return_attention_scores=True)
        np.testing.assert_allclose(to_np(w), to_np(want_w), atol=1e-6)
        np.testing.assert_allclose(to_np(y), to_np(want), atol=1e-5)
        return
    p64 = {k: to_np(v) for k, v in params(layer).items()}
    per_head = [np_attention(p64, xq.astype("float64"), xkv.astype("float64"), mask[:, h], act,
                             1.0, False, False)[1][:, h] for h in range(H)]
    ref_w = np.stack(per_head, axis=1)
    ref_y = _project(p64, xkv.astype("float64"), ref_w, "bhts,bshk->bthk", "bsd,dhk->bshk",
                     "bthk,hkd->btd")
    np.testing.assert_allclose(to_np(w), ref_w, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(to_np(y), ref_y, rtol=1e-3, atol=5e-4)


def test_per_head_mask_in_nd_attention():
    rng = np.random.default_rng(9)
    layer = make("relu", (2,), seed=9)
    xq = rng.normal(size=(B, X, Y, D)).astype("float32")
    mask = rng.random((B, X, H, Y, Y)) < 0.6  # (<batch dims>, heads, <q axes>, <k axes>)
    mask[..., 0] = True
    y, w = layer(xq, xq, attention_mask=mask, return_attention_scores=True)
    p64 = {k: to_np(v) for k, v in params(layer).items()}
    x64 = xq.astype("float64")
    ref_w = np.stack([np_nd(p64, x64, x64, (2,), mask[:, :, h], "relu", 1.0)[1][:, :, h]
                      for h in range(H)], axis=2)
    ref_y = _project(p64, x64, ref_w, "bxhyv,bxvhk->bxyhk", "bxyd,dhk->bxyhk",
                     "bxyhk,hkd->bxyd")
    np.testing.assert_allclose(to_np(w), ref_w, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(to_np(y), ref_y, rtol=1e-3, atol=5e-4)
    with pytest.raises(ValueError, match="has more axes than"):
        layer(xq, xq, attention_mask=np.ones((1, B, X, H, Y, Y), bool))
