"""PointwiseAttention against a naive NumPy implementation of the paper's
formula, forward and gradient, on the current backend."""

import itertools
import math
import zlib

import keras
import numpy as np
import pytest
from conftest import grads

from keras_reluvit import PointwiseAttention

B, T, S, D, H, DH = 2, 5, 6, 8, 2, 3


# ---------------------------------------------------------------- reference
def np_act(name, x):
    if name == "relu":
        return np.maximum(x, 0)
    if name == "relu2":
        return np.maximum(x, 0) ** 2
    if name == "gelu":  # tanh approximation
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "softplus":
        return np.log1p(np.exp(x))
    if name == "identity":
        return x
    if name == "relu6":
        return np.clip(x, 0, 6)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    raise KeyError(name)


def np_layernorm(x, gamma, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma


def np_attention(p, xq, xkv, mask, act, alpha, qk_norm, gated, log_scale=None):
    """o = W_o [ (sum_j a_ij v_j) * gate ],  a_ij = e^s L_i^-alpha h(q_i.k_j/sqrt(d))."""
    q = np.einsum("btd,dhk->bthk", xq, p["wq"]) + p["bq"]
    k = np.einsum("bsd,dhk->bshk", xkv, p["wk"]) + p["bk"]
    v = np.einsum("bsd,dhk->bshk", xkv, p["wv"]) + p["bv"]
    if qk_norm:
        q = np_layernorm(q, p["gq"])
        k = np_layernorm(k, p["gk"])
    s = np.einsum("bthk,bshk->bhts", q, k) / math.sqrt(q.shape[-1])
    m = np.ones((xq.shape[0], xq.shape[1], xkv.shape[1]), bool) if mask is None else mask
    out = np.zeros_like(q[..., :1].repeat(v.shape[-1], -1))
    weights = np.zeros_like(s)
    for b in range(s.shape[0]):
        for h in range(s.shape[1]):
            for i in range(s.shape[2]):
                valid = m[b, i]
                if act == "softmax":
                    e = np.exp(s[b, h, i][valid] - s[b, h, i][valid].max())
                    w = np.zeros(s.shape[3])
                    w[valid] = e / e.sum()
                else:
                    n = valid.sum()
                    w = np.where(valid, np_act(act, s[b, h, i]), 0.0)
                    w = w * float(max(n, 1)) ** -alpha
                    if log_scale is not None:
                        w = w * np.exp(log_scale[h])
                weights[b, h, i] = w
                out[b, i, h] = w @ v[b, :, h]
    if gated:
        g = np.einsum("btd,dhk->bthk", xq, p["wg"]) + p["bg"]
        out = out * (1 / (1 + np.exp(-g)))
    y = np.einsum("bthk,hkd->btd", out, p["wo"]) + p["bo"]
    return y, weights


def layer_params(layer):
    p = dict(
        wq=layer.query_dense.kernel, bq=layer.query_dense.bias,
        wk=layer.key_dense.kernel, bk=layer.key_dense.bias,
        wv=layer.value_dense.kernel, bv=layer.value_dense.bias,
        wo=layer.output_dense.kernel, bo=layer.output_dense.bias,
    )
    if layer.gated:
        p.update(wg=layer._gate_dense.kernel, bg=layer._gate_dense.bias)
    if layer.qk_norm:
        p.update(gq=layer._query_norm.gamma, gk=layer._key_norm.gamma)
    return p


def randomize(layer, rng):
    """Non-trivial values everywhere (biases and LN scales too)."""
    for v in layer.weights:
        v.assign(rng.normal(0, 0.5, v.shape).astype("float32") + (1.0 if "gamma" in v.path else 0.0))


def make_mask(kind, rng):
    if kind == "none":
        return None
    if kind == "padding":
        lengths = np.array([S, 3])
        key_valid = np.arange(S)[None] < lengths[:, None]
        return np.broadcast_to(key_valid[:, None, :], (B, T, S)).copy()
    if kind == "causal":
        return np.broadcast_to(np.tril(np.ones((T, S), bool)), (B, T, S)).copy()
    raise KeyError(kind)


ACTS = ["softmax", "relu", "relu2", "gelu", "softplus", "identity", "relu6", "sigmoid"]
CASES = list(itertools.product(ACTS, [0.0, 0.5, 1.0], ["none", "padding", "causal"],
                               [False, True], [False, True]))


def build(act, alpha, qk_norm, gated, **kw):
    layer = PointwiseAttention(num_heads=H, key_dim=DH, activation=act,
                               seq_len_exponent=alpha, qk_norm=qk_norm,
                               gated=gated, **kw)
    layer.build((B, T, D), (B, S, D))
    return layer


def call(layer, xq, xkv, mask_kind, mask, **kw):
    if mask_kind == "causal":
        return layer(xq, xkv, use_causal_mask=True, **kw)
    return layer(xq, xkv, attention_mask=mask, **kw)


@pytest.mark.parametrize("act,alpha,mask_kind,qk_norm,gated", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_forward_and_gradient_match_numpy(act, alpha, mask_kind, qk_norm, gated):
    rng = np.random.default_rng(zlib.crc32(repr((act, alpha, mask_kind, qk_norm, gated)).encode()))
    layer = build(act, alpha, qk_norm, gated)
    randomize(layer, rng)
    xq = rng.normal(size=(B, T, D)).astype("float32")
    xkv = rng.normal(size=(B, S, D)).astype("float32")
    mask = make_mask(mask_kind, rng)
    if mask_kind == "causal":
        xkv = xkv[:, :T]  # causal needs T == S
        mask = mask[:, :, :T]
    p64 = {k: np.asarray(keras.ops.convert_to_numpy(v), "float64") for k, v in layer_params(layer).items()}

    y, w = call(layer, xq, xkv, mask_kind, mask, return_attention_scores=True)
    ref_y, ref_w = np_attention(p64, xq.astype("float64"), xkv.astype("float64"),
                                mask, act, alpha, qk_norm, gated)
    # float32 vs float64: squared activations and qk-LayerNorm double the
    # relative rounding error of the scores, hence 1e-3.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(w), ref_w, rtol=1e-3, atol=2e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), ref_y, rtol=1e-3, atol=5e-4)

    # Gradient: backend autodiff vs a central finite difference of the float64
    # NumPy reference along one random direction in (inputs, weights) space.
    cot = rng.normal(size=ref_y.shape)
    names = list(layer_params(layer))
    variables = [layer_params(layer)[n] for n in names]

    def loss(q_in, kv_in):
        out = call(layer, q_in, kv_in, mask_kind, mask)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(cot.astype("float32")))

    (gq, gkv), gv = grads(loss, variables, [xq, xkv])
    dq, dkv = rng.normal(size=xq.shape), rng.normal(size=xkv.shape)
    dp = {n: rng.normal(size=p64[n].shape) for n in names}
    analytic = (gq * dq).sum() + (gkv * dkv).sum() + sum((g * dp[n]).sum() for g, n in zip(gv, names))

    def f(eps):
        p = {n: p64[n] + eps * dp[n] for n in names}
        out, _ = np_attention(p, xq + eps * dq, xkv + eps * dkv, mask, act, alpha, qk_norm, gated)
        return (out * cot).sum()

    eps = 1e-5
    numeric = (f(eps) - f(-eps)) / (2 * eps)
    assert analytic == pytest.approx(numeric, rel=2e-3, abs=2e-3), (analytic, numeric)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_learned_scale_multiplies_weights_by_exp_s(mask_kind):
    rng = np.random.default_rng(3)
    layer = build("relu", 1.0, True, False, learned_scale=True)
    randomize(layer, rng)
    s = np.array([0.7, -1.3], "float32")
    layer.log_scale.assign(s)
    xq = rng.normal(size=(B, T, D)).astype("float32")
    xkv = rng.normal(size=(B, T, D)).astype("float32")
    mask = make_mask(mask_kind, rng)
    mask = None if mask is None else mask[:, :, :T]
    p64 = {k: np.asarray(keras.ops.convert_to_numpy(v), "float64") for k, v in layer_params(layer).items()}
    y, w = call(layer, xq, xkv, mask_kind, mask, return_attention_scores=True)
    ref_y, ref_w = np_attention(p64, xq, xkv, mask, "relu", 1.0, True, False, log_scale=s)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(w), ref_w, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), ref_y, rtol=2e-4, atol=2e-4)
    # The log-scale is trainable and gets a gradient.
    assert any(v is layer.log_scale for v in layer.trainable_variables)


def test_relu_over_L_weights_have_mean_order_one_over_L():
    """The paper's argument: E_j[a_ij] = O(1/L) with alpha = 1, O(1) with 0."""
    rng = np.random.default_rng(0)
    for L in (16, 256):
        x = rng.normal(size=(1, L, 64)).astype("float32")
        means, weights = {}, None
        for alpha in (0.0, 1.0):
            layer = PointwiseAttention(4, 16, activation="relu", seq_len_exponent=alpha, qk_norm=True)
            layer.build(x.shape, x.shape)
            if weights is None:
                weights = layer.get_weights()
            layer.set_weights(weights)
            _, w = layer(x, x, return_attention_scores=True)
            means[alpha] = float(np.mean(keras.ops.convert_to_numpy(w)))
        assert means[1.0] == pytest.approx(means[0.0] / L, rel=1e-4)
        assert 0.05 < means[0.0] < 2.0  # O(1) without scaling


def test_padding_does_not_change_outputs_of_valid_queries():
    """L counts unmasked keys: padding a sequence leaves the outputs equal."""
    rng = np.random.default_rng(1)
    layer = PointwiseAttention(2, 4, activation="relu")
    x = rng.normal(size=(1, 5, 8)).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x, x))
    padded = np.concatenate([x, rng.normal(size=(1, 3, 8)).astype("float32")], axis=1)
    mask = np.zeros((1, 8, 8), bool)
    mask[:, :, :5] = True
    yp = keras.ops.convert_to_numpy(layer(padded, padded, attention_mask=mask))
    np.testing.assert_allclose(yp[:, :5], y, rtol=1e-5, atol=1e-5)


def test_keras_masks_from_embedding_are_used():
    """Implicit Keras masks (mask_zero=True) count as padding, as in MHA."""
    tokens = np.array([[3, 5, 7, 0, 0], [2, 9, 4, 6, 1]])
    emb = keras.layers.Embedding(10, 8, mask_zero=True)
    layer = PointwiseAttention(2, 4, activation="relu")
    x = emb(tokens)
    y = keras.ops.convert_to_numpy(layer(x, x))
    short = keras.ops.convert_to_numpy(layer(emb(tokens[:1, :3]), emb(tokens[:1, :3])))
    np.testing.assert_allclose(y[:1, :3], short, rtol=1e-5, atol=1e-5)


def test_fully_masked_query_gives_zero_attention():
    layer = PointwiseAttention(2, 4, activation="relu", use_bias=False)
    x = np.random.default_rng(2).normal(size=(1, 3, 8)).astype("float32")
    mask = np.ones((1, 3, 3), bool)
    mask[0, 1] = False
    y = keras.ops.convert_to_numpy(layer(x, x, attention_mask=mask))
    assert np.all(y[0, 1] == 0) and np.all(np.isfinite(y))


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_softmax_matches_keras_multi_head_attention(mask_kind, dropout):
    rng = np.random.default_rng(4)
    ref = keras.layers.MultiHeadAttention(num_heads=H, key_dim=DH, dropout=dropout, seed=7)
    ours = PointwiseAttention(num_heads=H, key_dim=DH, activation="softmax", dropout=dropout, seed=7)
    xq = rng.normal(size=(B, T, D)).astype("float32")
    xkv = rng.normal(size=(B, T, D)).astype("float32")
    ref(xq, xkv)
    ours(xq, xkv)
    assert [tuple(w.shape) for w in ours.weights] == [tuple(w.shape) for w in ref.weights]
    assert [w.path.split("/", 1)[1] for w in ours.weights] == [w.path.split("/", 1)[1] for w in ref.weights]
    ours.set_weights(ref.get_weights())
    mask = make_mask(mask_kind, rng)
    mask = None if mask is None else mask[:, :, :T]
    kw = dict(use_causal_mask=True) if mask_kind == "causal" else dict(attention_mask=mask)
    a = ref(xq, xkv, **kw)
    b = ours(xq, xkv, **kw)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a), rtol=1e-5, atol=1e-5)
    a, sa = ref(xq, xkv, return_attention_scores=True, **kw)
    b, sb = ours(xq, xkv, return_attention_scores=True, **kw)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sb), keras.ops.convert_to_numpy(sa), rtol=1e-5, atol=1e-6)


def test_weight_layout_is_multi_head_attention_layout():
    layer = PointwiseAttention(num_heads=6, key_dim=64, activation="relu", qk_norm=True, gated=True, learned_scale=True)
    layer(np.zeros((1, 4, 384), "float32"), np.zeros((1, 4, 384), "float32"))
    shapes = {w.path.split("/", 1)[1]: tuple(w.shape) for w in layer.weights}
    assert shapes["query/kernel"] == (384, 6, 64)
    assert shapes["key/kernel"] == (384, 6, 64)
    assert shapes["value/kernel"] == (384, 6, 64)
    assert shapes["attention_output/kernel"] == (6, 64, 384)
    assert shapes["gate/kernel"] == (384, 6, 64)
    assert shapes["query_norm/gamma"] == (64,) and "query_norm/beta" not in shapes
    assert shapes["log_scale"] == (6,)
    assert isinstance(layer, keras.layers.MultiHeadAttention)


def test_config_round_trip_and_serialization(tmp_path):
    layer = PointwiseAttention(num_heads=2, key_dim=4, activation="relu2", seq_len_exponent=0.5,
                               qk_norm=True, gated=True, learned_scale=True, dropout=0.1,
                               use_bias=False, output_shape=6)
    x = np.random.default_rng(5).normal(size=(2, 3, 8)).astype("float32")
    y = layer(x, x)
    clone = PointwiseAttention.from_config(layer.get_config())
    clone(x, x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(x, x)), keras.ops.convert_to_numpy(y), rtol=1e-6)
    assert tuple(y.shape) == (2, 3, 6)
    inp = keras.Input((3, 8))
    model = keras.Model(inp, layer(inp, inp))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    cfg = loaded.layers[-1].get_config()
    assert (cfg["activation"], cfg["seq_len_exponent"], cfg["gated"],
            cfg["learned_scale"]) == ("relu2", 0.5, True, True)


@keras.saving.register_keras_serializable(package="tests")
def cube(x):
    return x * x * x


def test_callable_activation_is_used_and_serializes():
    layer = PointwiseAttention(num_heads=2, key_dim=4, activation=cube, use_bias=False)
    x = np.random.default_rng(6).normal(size=(1, 3, 8)).astype("float32")
    _, w = layer(x, x, return_attention_scores=True)
    q = np.einsum("btd,dhk->bthk", x, keras.ops.convert_to_numpy(layer.query_dense.kernel))
    k = np.einsum("btd,dhk->bthk", x, keras.ops.convert_to_numpy(layer.key_dense.kernel))
    s = np.einsum("bthk,bshk->bhts", q, k) / 2.0
    np.testing.assert_allclose(keras.ops.convert_to_numpy(w), s**3 / 3, rtol=1e-4, atol=1e-6)
    clone = PointwiseAttention.from_config(layer.get_config())
    assert clone.activation is cube


@pytest.mark.parametrize("kwargs,match", [
    (dict(activation="tanh"), "Valid names: softmax, relu, relu2"),
    (dict(activation=3), "Unknown attention activation"),
    (dict(seq_len_exponent=-0.5), "must be a finite number >= 0"),
    (dict(seq_len_exponent="1"), "must be a real number"),
    (dict(activation="softmax", learned_scale=True), "learned scale is not defined"),
    (dict(dropout=1.5), "dropout"),
    (dict(attention_axes="rows"), "attention_axes"),
    (dict(num_heads=0), "num_heads"),
])
def test_bad_arguments_raise_clear_errors(kwargs, match):
    args = dict(num_heads=2, key_dim=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PointwiseAttention(**args)


@pytest.mark.parametrize("gated", [False, True])
def test_softmax_is_a_drop_in_for_mha_under_every_mask_combination(gated):
    """Random explicit query/value/key/attention masks and causal masking,
    and Keras masks from Embedding(mask_zero=True): the softmax preset gives
    MultiHeadAttention's outputs and scores with copied weights."""
    rng = np.random.default_rng(11 + gated)
    S = T + 2
    ref = keras.layers.MultiHeadAttention(num_heads=H, key_dim=DH, use_gate=gated)
    ours = PointwiseAttention(num_heads=H, key_dim=DH, activation="softmax", gated=gated)
    xq = rng.normal(size=(B, T, D)).astype("float32")
    xv = rng.normal(size=(B, S, D)).astype("float32")
    xk = rng.normal(size=(B, S, D)).astype("float32")
    ref(xq, xv, xk)
    ours(xq, xv, xk)
    ours.set_weights(ref.get_weights())
    names = ("query_mask", "value_mask", "key_mask", "attention_mask", "use_causal_mask")
    for trial in range(12):
        pick = rng.random(5) < 0.5
        kw = {}
        if pick[0]:
            kw["query_mask"] = rng.random((B, T)) < 0.8
        if pick[1]:
            kw["value_mask"] = rng.random((B, S)) < 0.8
        if pick[2]:
            kw["key_mask"] = rng.random((B, S)) < 0.8
        if pick[3]:
            kw["attention_mask"] = rng.random((B, T, S)) < 0.7
        if pick[4]:
            kw["use_causal_mask"] = True
        want, want_w = ref(xq, xv, xk, return_attention_scores=True, **kw)
        got, got_w = ours(xq, xv, xk, return_attention_scores=True, **kw)
        label = [n for n, p in zip(names, pick) if p]
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got),
                                   keras.ops.convert_to_numpy(want), atol=1e-5, err_msg=str(label))
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got_w),
                                   keras.ops.convert_to_numpy(want_w), atol=1e-6, err_msg=str(label))
    # Keras masks of the inputs, as a functional model passes them.
    tokens_q = np.array([[3, 5, 7, 0, 0, 0], [2, 9, 4, 6, 1, 8]])[:, :T]
    tokens_v = np.array([[1, 2, 0, 0, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 0, 0]])[:, :S]
    emb = keras.layers.Embedding(10, D, mask_zero=True)
    q_in = keras.Input((T,), dtype="int32")
    v_in = keras.Input((S,), dtype="int32")
    outs = [layer(emb(q_in), emb(v_in)) for layer in (ref, ours)]
    model = keras.Model([q_in, v_in], outs)
    want, got = model.predict([tokens_q, tokens_v], verbose=0)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("act,alpha,qk_norm,learned", [
    ("softmax", 1.0, False, False), ("softmax", 1.0, True, False), ("relu", 1.0, True, False),
    ("relu", 0.5, False, True), ("gelu", 1.0, True, False), ("sigmoid", 0.0, False, False)])
def test_self_attention_fast_path_matches_numpy_and_keras_own_path(act, alpha, qk_norm, learned,
                                                                  monkeypatch):
    """`layer(x, x)` without masks: on PyTorch the fused q/k/v projection of
    `keras_reluvit.kernels.torch_fast` (asserted taken), elsewhere Keras' own call.
    Checked against the NumPy reference, and — outputs, input and weight
    gradients — against Keras' own call (`KERAS_RELUVIT_TORCH_FAST=0`)."""
    from keras_reluvit.kernels import torch_fast

    rng = np.random.default_rng(zlib.crc32(repr((act, alpha, qk_norm, learned)).encode()))
    layer = build(act, alpha, qk_norm, False, learned_scale=learned)
    randomize(layer, rng)
    x = rng.normal(size=(B, S, D)).astype("float32")
    taken = []
    original = torch_fast.project_qkv
    monkeypatch.setattr(torch_fast, "project_qkv",
                        lambda *a, **k: taken.append(1) or original(*a, **k))
    p64 = {k: np.asarray(keras.ops.convert_to_numpy(v), "float64")
           for k, v in layer_params(layer).items()}
    log_scale = keras.ops.convert_to_numpy(layer.log_scale) if learned else None
    ref, _ = np_attention(p64, x.astype("float64"), x.astype("float64"), None, act, alpha,
                          qk_norm, False, log_scale=log_scale)
    names = list(layer_params(layer))
    variables = [layer_params(layer)[n] for n in names] + ([layer.log_scale] if learned else [])
    cot = keras.ops.convert_to_tensor(rng.normal(size=ref.shape).astype("float32"))
    results = {}
    for fast in ("1", "0"):
        monkeypatch.setenv("KERAS_RELUVIT_TORCH_FAST", fast)
        xt = keras.ops.convert_to_tensor(x)  # one tensor as query and value
        y = keras.ops.convert_to_numpy(layer(xt, xt))
        (gx,), gv = grads(lambda xs: keras.ops.sum(layer(xs, xs) * cot), variables, [x])
        results[fast] = (y, gx, gv)
    expected_calls = 2 if keras.backend.backend() == "torch" else 0  # forward + gradient
    assert len(taken) == expected_calls
    np.testing.assert_allclose(results["1"][0], ref, rtol=1e-3, atol=5e-4)
    for a, b in zip(results["1"], results["0"]):
        for u, v in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5)
