"""ViT models on the current backend: a NumPy re-implementation of the
forward pass, initialisation, save/load, fit, mixed precision, resizing,
intermediates and input validation."""

import math

import keras
import numpy as np
import pytest
from test_attention import np_attention

import keras_reluvit as kr

TINY = dict(variant="Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64,
            image_size=32, num_classes=5)
BUILDER_ARGS = {k: v for k, v in TINY.items() if k != "variant"}


def tiny(**kw):
    return kr.ViT(**{**TINY, **kw})


def images(n=2, size=32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")


def randomize(model, seed=0):
    """Random values for every weight (zero-init head/cls/biases too)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.trainable:
            v.assign((rng.normal(0, 0.3, v.shape) + ("gamma" in v.path)).astype("float32"))


# ------------------------------------------------------ NumPy reference ViT
def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_sincos2d(h, w, width):
    out = np.zeros((h * w, width))
    q = width // 4
    for yy in range(h):
        for xx in range(w):
            for d in range(q):
                omega = 1.0 / 10000 ** (d / (q - 1))
                out[yy * w + xx, d] = math.sin(xx * omega)
                out[yy * w + xx, q + d] = math.cos(xx * omega)
                out[yy * w + xx, 2 * q + d] = math.sin(yy * omega)
                out[yy * w + xx, 3 * q + d] = math.cos(yy * omega)
    return out


def np_vit(model, x):
    """The ViT forward pass written from big_vision's description."""
    cfg = model.get_config()
    w = {v.path: to_np(v) for v in model.weights}
    p = cfg["patch_size"]
    n, hh, ww, c = x.shape
    gh, gw = hh // p, ww // p
    patches = x.reshape(n, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, gh * gw, p * p * c)
    kernel = w["embedding/kernel"].reshape(p * p * c, -1)
    t = patches @ kernel + w["embedding/bias"]
    if cfg["pool"] == "tok":
        t = np.concatenate([np.broadcast_to(w["cls/token"], (n, 1, t.shape[-1])), t], axis=1)
    if cfg["posemb"] == "learn":
        t = t + w["pos_embedding/embedding"]
    else:
        pe = np_sincos2d(gh, gw, t.shape[-1])
        if cfg["pool"] == "tok":
            pe = np.concatenate([np.zeros((1, pe.shape[1])), pe])
        t = t + pe
    act = model.attention_args["activation"]
    alpha = model.attention_args.get("seq_len_exponent", 1.0)

    def ln(x, prefix):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-6) * w[prefix + "/gamma"] + w[prefix + "/beta"]

    def attn(prefix, q_in, kv_in):
        pp = dict(wq=w[prefix + "/query/kernel"], bq=w[prefix + "/query/bias"],
                  wk=w[prefix + "/key/kernel"], bk=w[prefix + "/key/bias"],
                  wv=w[prefix + "/value/kernel"], bv=w[prefix + "/value/bias"],
                  wo=w[prefix + "/attention_output/kernel"], bo=w[prefix + "/attention_output/bias"])
        if cfg["qk_norm"]:
            pp.update(gq=w[prefix + "/query_norm/gamma"], gk=w[prefix + "/key_norm/gamma"])
        return np_attention(pp, q_in, kv_in, None, act, alpha, cfg["qk_norm"], False)[0]

    def mlp(x, prefix):
        hdn = np_gelu_tanh(x @ w[prefix + "/fc1/kernel"] + w[prefix + "/fc1/bias"])
        return hdn @ w[prefix + "/fc2/kernel"] + w[prefix + "/fc2/bias"]

    for i in range(cfg["depth"]):
        b = f"block_{i:02d}"
        y = ln(t, b + "/norm1")
        t = t + attn(b + "/attention", y, y)
        t = t + mlp(ln(t, b + "/norm2"), b + "/mlp")
    t = ln(t, "encoder_norm")
    if cfg["pool"] == "gap":
        pooled = t.mean(1)
    elif cfg["pool"] == "tok":
        pooled = t[:, 0]
    else:
        probe = np.broadcast_to(w["map_head/probe"], (n, 1, t.shape[-1]))
        y = attn("map_head/attention", probe, t)
        y = y + mlp(ln(y, "map_head/norm"), "map_head/mlp")
        pooled = y[:, 0]
    if cfg["representation_size"]:
        pooled = np.tanh(pooled @ w["pre_logits/kernel"] + w["pre_logits/bias"])
    if not cfg["include_top"]:
        return pooled
    return pooled @ w["head/kernel"] + w["head/bias"]


@pytest.mark.parametrize("pool,posemb,qk_norm,attention,rep", [
    ("gap", "learn", True, "relu", None),
    ("tok", "learn", False, "softmax", None),
    ("map", "sincos2d", True, "relu2", 16),
    ("tok", "sincos2d", True, {"activation": "sigmoid", "seq_len_exponent": 0.5}, None),
    ("gap", "sincos2d", False, "relu_noscale", 8),
])
def test_forward_matches_numpy_reference(pool, posemb, qk_norm, attention, rep):
    model = tiny(pool=pool, posemb=posemb, qk_norm=qk_norm, attention=attention,
                 representation_size=rep, patch_size=8)
    randomize(model)
    x = images()
    np.testing.assert_allclose(to_np(model(x)), np_vit(model, x.astype("float64")), rtol=2e-4, atol=2e-4)


def test_features_without_top_match_numpy_reference():
    model = tiny(include_top=False, pool="gap")
    randomize(model)
    x = images()
    out = model(x)
    assert tuple(out.shape) == (2, 32)
    np.testing.assert_allclose(to_np(out), np_vit(model, x.astype("float64")), rtol=2e-4, atol=2e-4)


def test_big_vision_initialisation():
    model = kr.ViT("S/16", depth=1, image_size=224, num_classes=10)
    w = {v.path: to_np(v) for v in model.weights}
    D, H, Dh = 384, 6, 64
    # zero-init head, posemb normal(1/sqrt(D)), lecun-normal stem (truncated)
    assert np.all(w["head/kernel"] == 0) and np.all(w["head/bias"] == 0)
    assert np.std(w["pos_embedding/embedding"]) == pytest.approx(1 / math.sqrt(D), rel=0.05)
    fan_in = 16 * 16 * 3
    assert np.std(w["embedding/kernel"]) == pytest.approx(math.sqrt(1 / fan_in), rel=0.05)
    assert np.all(w["embedding/bias"] == 0)
    # xavier-uniform with DenseGeneral fans: limit sqrt(6 / (D + H*Dh))
    limit = math.sqrt(6 / (D + H * Dh))
    for name in ("query", "key", "value", "attention_output"):
        k = w[f"block_00/attention/{name}/kernel"]
        assert np.abs(k).max() <= limit and np.abs(k).max() > 0.98 * limit, name
        assert np.std(k) == pytest.approx(limit / math.sqrt(3), rel=0.03), name
    mlp_limit = math.sqrt(6 / (D + 4 * D))
    assert np.abs(w["block_00/mlp/fc1/kernel"]).max() <= mlp_limit
    assert np.std(w["block_00/mlp/fc1/kernel"]) == pytest.approx(mlp_limit / math.sqrt(3), rel=0.03)
    assert 0 < np.std(w["block_00/mlp/fc1/bias"]) < 1e-5
    assert np.all(w["block_00/attention/query_norm/gamma"] == 1)
    assert "block_00/attention/query_norm/beta" not in w


def test_timm_head_initialisation_for_deit_and_deit3_recipes():
    """`head_init="trunc_normal"`: timm's `trunc_normal_(head.weight, std=.02)`
    (DeiT's VisionTransformer and DeiT III's vit_models; bounds +-2, i.e. a
    normal of std 0.02) by a KS test over ViT-S's 384 x 1000 head, which
    rejects a normal truncated at 2 std (Keras' TruncatedNormal); the bias 0;
    the DeiT and DeiT III recipes ask for it, kept by get_config."""
    from scipy import stats

    from keras_reluvit import recipes

    keras.utils.set_random_seed(0)
    model = kr.ViT("S/16", depth=1, image_size=32, num_classes=1000, head_init="trunc_normal")
    head = model.get_layer("head")
    k = to_np(head.kernel).ravel().astype(np.float64)
    assert np.all(to_np(head.bias) == 0) and model.get_config()["head_init"] == "trunc_normal"
    assert stats.kstest(k, stats.norm(0, 0.02).cdf).pvalue > 1e-3
    truncated = stats.truncnorm(-2, 2, scale=0.02).rvs(len(k), random_state=0)
    assert stats.kstest(truncated, stats.norm(0, 0.02).cdf).pvalue < 1e-6
    assert kr.ViT.from_config(model.get_config()).get_config()["head_init"] == "trunc_normal"
    from keras_reluvit.training import run as T

    for name in ("deit_s16_300ep", "deit3_s16_400ep", "deit3_b16_400ep"):
        assert recipes.get(name).model["head_init"] == "trunc_normal", name
        assert T.build_config(recipe=name, batch_size=8).model["head_init"] == "trunc_normal"
    with pytest.raises(ValueError, match="Unknown head_init 'normal'"):
        tiny(head_init="normal")


def test_sigmoid_xent_head_bias_init():
    model = tiny(head_bias_init=-6.9)
    np.testing.assert_allclose(to_np(model.get_layer("head").bias), -6.9, rtol=1e-6)


@pytest.mark.parametrize("preset", list(kr.attention_kinds()))
def test_every_attention_kind_builds_and_sets_the_attention(preset):
    model = tiny(attention=preset)
    out = to_np(model(images()))
    assert np.all(np.isfinite(out))
    layer = model.get_layer("block_01").attn
    expected = {"softmax": ("softmax", None), "relu_noscale": ("relu", 0.0)}.get(preset)
    act, alpha = expected or ({"relu_gated": "relu", "relu_learned": "relu"}.get(preset, preset), 1.0)
    assert layer.activation == act
    if alpha is not None:
        assert layer.seq_len_exponent == alpha
    assert layer.gated == (preset == "relu_gated")
    assert layer.learned_scale == (preset == "relu_learned")
    assert layer.qk_norm


def test_attention_kinds_are_listed_with_descriptions():
    presets = kr.attention_kinds()
    assert set(presets) == {"softmax", "relu", "relu_noscale", "relu2", "gelu", "softplus",
                            "relu6", "sigmoid", "identity", "relu_gated", "relu_learned"}
    assert all(isinstance(d, str) and d for d in presets.values())


def test_attention_presets_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="renamed attention_kinds"):
        assert kr.attention_presets() == kr.attention_kinds()


def test_keras_round_trip_and_config(tmp_path):
    model = tiny(attention={"activation": "relu", "seq_len_exponent": 0.5, "gated": True},
                 pool="map", posemb="sincos2d", representation_size=12, mlp_activation="gelu")
    randomize(model)
    x = images()
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, kr.ViT)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    clone = kr.ViT.from_config(model.get_config())
    assert clone.count_params() == model.count_params()


def test_exact_gelu_differs_from_tanh_gelu():
    a = tiny(mlp_activation="gelu")
    randomize(a)
    b = tiny(mlp_activation="gelu_tanh")
    b.set_weights(a.get_weights())
    x = images()
    diff = np.abs(to_np(a(x)) - to_np(b(x))).max()
    assert 1e-6 < diff < 0.5


def test_fit_lowers_the_loss():
    model = tiny(attention="relu")
    x = images(16, seed=1)
    y = np.arange(16) % 5
    model.compile(optimizer=keras.optimizers.AdamW(3e-3, weight_decay=0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(x, y, batch_size=8, epochs=15, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses


def test_mixed_bfloat16_runs_and_is_finite():
    model = tiny(dtype="mixed_bfloat16", attention="relu")
    x = images()
    out = model(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert np.all(np.isfinite(to_np(out)))
    assert keras.backend.standardize_dtype(model.get_layer("block_00").attn.query_dense.kernel.dtype) == "float32"
    assert model.get_layer("block_00").compute_dtype == "bfloat16"
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(x, np.array([0, 1]), epochs=2, verbose=0)
    assert all(np.isfinite(hist.history["loss"]))


def np_bilinear(grid, new_h, new_w):
    """Half-pixel-centre bilinear resize of (h, w, d), no antialiasing."""
    h, w, _ = grid.shape

    def coords(n_in, n_out):
        c = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
        c = np.clip(c, 0, n_in - 1)
        lo = np.floor(c).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, c - lo

    y0, y1, fy = coords(h, new_h)
    x0, x1, fx = coords(w, new_w)
    top = grid[y0][:, x0] * (1 - fx)[None, :, None] + grid[y0][:, x1] * fx[None, :, None]
    bot = grid[y1][:, x0] * (1 - fx)[None, :, None] + grid[y1][:, x1] * fx[None, :, None]
    return top * (1 - fy)[:, None, None] + bot * fy[:, None, None]


@pytest.mark.parametrize("fmt", ["keras", "weights.h5"])
def test_weights_at_another_resolution_resample_posemb(tmp_path, fmt):
    src = tiny(pool="tok")
    randomize(src)
    path = tmp_path / f"m.{fmt}"
    src.save(path) if fmt == "keras" else src.save_weights(path)
    big = kr.ViT_Ti8(**{**BUILDER_ARGS, "pool": "tok", "image_size": 48}, weights=path)
    pe_src = to_np(src.get_layer("pos_embedding").embedding)[0]
    pe_big = to_np(big.get_layer("pos_embedding").embedding)[0]
    assert pe_big.shape == (1 + 36, 32)
    np.testing.assert_allclose(pe_big[0], pe_src[0], rtol=1e-6)  # class token row kept
    ref = np_bilinear(pe_src[1:].reshape(4, 4, 32), 6, 6).reshape(36, 32)
    np.testing.assert_allclose(pe_big[1:], ref, rtol=1e-5, atol=1e-6)
    src_w = {v.path: to_np(v) for v in src.weights}
    for v in big.weights:
        if "pos_embedding" not in v.path:
            np.testing.assert_array_equal(to_np(v), src_w[v.path])
    assert np.all(np.isfinite(to_np(big(images(size=48)))))


def test_resize_model_to_same_size_is_identity():
    model = tiny()
    randomize(model)
    same = kr.resize_model(model, 32)
    x = images()
    np.testing.assert_allclose(to_np(same(x)), to_np(model(x)), rtol=1e-6, atol=1e-6)
    wide = kr.resize_model(model, (32, 48))
    assert wide.grid_size == (4, 6)


def test_builders_take_a_head_of_another_size(tmp_path):
    src = tiny()
    randomize(src)
    src.save(tmp_path / "m.keras")
    new = kr.ViT_Ti8(**{**BUILDER_ARGS, "num_classes": 7}, weights=tmp_path / "m.keras")
    assert np.all(to_np(new.get_layer("head").kernel) == 0)
    np.testing.assert_array_equal(to_np(new.get_layer("block_01").attn.query_dense.kernel),
                                  to_np(src.get_layer("block_01").attn.query_dense.kernel))


def test_intermediates():
    model = tiny(pool="tok", attention="relu")
    randomize(model)
    x = images()
    out = model.intermediates(x)
    assert set(out) == {"tokens", "block_00", "block_01", "attention_00", "attention_01",
                        "encoded", "pooled", "pre_logits", "logits"}
    np.testing.assert_allclose(to_np(out["logits"]), to_np(model(x)), rtol=1e-5, atol=1e-6)
    assert tuple(out["attention_01"].shape) == (2, 2, 17, 17)
    # The attention map of block 1 is the layer applied to LN(block_00 output).
    block = model.get_layer("block_01")
    y = block.norm1(out["block_00"])
    _, w = block.attn(y, y, return_attention_scores=True)
    np.testing.assert_allclose(to_np(out["attention_01"]), to_np(w), rtol=1e-5, atol=1e-7)
    assert np.all(to_np(out["attention_01"]) >= 0)  # relu weights
    no_attn = model.intermediates_model(attention_weights=False)
    assert not any(k.startswith("attention") for k in no_attn.output)


def test_builders_exist_with_their_variants():
    names = ["ViT_Ti8", "ViT_Ti16", "ViT_Ti32", "ViT_S8", "ViT_S16", "ViT_S32", "ViT_B8", "ViT_B16",
             "ViT_B32", "ViT_L8", "ViT_L16", "ViT_L32", "ViT_H14"]
    assert sorted(kr.BUILDERS) == sorted(names)
    m = kr.ViT_S32(depth=1, num_classes=3, image_size=64)
    cfg = m.get_config()
    assert (cfg["width"], cfg["mlp_dim"], cfg["num_heads"], cfg["patch_size"]) == (384, 1536, 6, 32)
    assert cfg["attention"] == "relu" and cfg["qk_norm"] is True and cfg["pool"] == "gap"


@pytest.mark.parametrize("kwargs,match", [
    (dict(image_size=30), "not divisible by the patch size"),
    (dict(image_size=(32, 20)), "not divisible by the patch size"),
    (dict(attention="relu_squared"), "Valid kinds: softmax, relu"),
    (dict(attention={"activation": "tanh"}), "Valid names"),
    (dict(attention={"activation": "relu", "seq_len_exponent": -1}), "seq_len_exponent"),
    (dict(attention={"activation": "relu", "qk_norm": False}), "Pass qk_norm to the model"),
    (dict(num_heads=3), "not divisible by num_heads"),
    (dict(pool="cls"), "Unknown pool"),
    (dict(posemb="rope"), "Unknown posemb"),
    (dict(variant="XL/16"), "Unknown ViT variant"),
    (dict(num_classes=0), "num_classes"),
    (dict(mlp_activation="relu"), "mlp_activation"),
    (dict(posemb="sincos2d", width=34, num_heads=2), "divisible by 4"),
    (dict(pool="tok_gap", class_token=False), 'pool="tok_gap" pools the class token'),
    (dict(pool="tok_gap", class_token=True, fc_norm=True), "it has no fc_norm"),
])
def test_bad_model_arguments_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


@pytest.mark.parametrize("shape,match", [
    ((2, 32, 32, 1), "3 \\(RGB\\) channels"),
    ((2, 32, 32, 4), "3 \\(RGB\\) channels"),
    ((2, 32, 32), "rank 4"),
    ((2, 48, 48, 3), "built for 32x32"),
])
def test_bad_images_raise_clear_errors(shape, match):
    model = tiny()
    with pytest.raises(ValueError, match=match):
        model(np.zeros(shape, "float32"))


@keras.saving.register_keras_serializable(package="tests")
def squareplus(x):
    return 0.5 * (x + keras.ops.sqrt(keras.ops.square(x) + 4.0))


def test_custom_registered_activation_in_a_vit_round_trips(tmp_path):
    """README 'How to add an activation': a registered function as the
    attention activation of a ViT is used and survives a `.keras` file."""
    model = kr.ViT("Ti/16", attention={"activation": squareplus, "seq_len_exponent": 1.0},
                   image_size=32, depth=1, width=32, num_heads=2, mlp_dim=64, num_classes=3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    maps = keras.ops.convert_to_numpy(model.intermediates(x)["attention_00"])
    assert maps.min() > 0  # squareplus > 0 everywhere: no relu zeros
    path = tmp_path / "custom.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.blocks[0].attn.activation is squareplus
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded.intermediates(x)["attention_00"]),
                               maps, rtol=1e-5, atol=1e-7)


def test_one_variant_parser_and_one_probability_choice():
    from keras_reluvit import recipes
    from keras_reluvit.models.variants import canonical_variant
    from keras_reluvit.models.variants import variant_with_patch

    for name in ("S/16", "vit_s16", "ViT_S16", "s16"):
        assert canonical_variant(name) == "S/16"
    assert canonical_variant("so400m/14") == "So400m/14" and canonical_variant("B") == "B"
    assert variant_with_patch("ViT_L32") == "L/32"
    with pytest.raises(ValueError, match="Unknown ViT variant"):
        canonical_variant("Q/16")
    with pytest.raises(ValueError, match="no patch size"):
        variant_with_patch("vit_s")
    assert recipes.probability("augreg_i1k") == "sigmoid"
    assert recipes.probability("s16_i1k_90ep") == recipes.probability({"loss": "softmax_xent"})
    with pytest.raises(ValueError, match="Unknown loss"):
        recipes.probability("hinge")


@pytest.mark.parametrize("attention", ["relu", "softmax"])
def test_fused_torch_layers_give_keras_own_outputs_and_gradients(attention, monkeypatch):
    """`keras_reluvit.kernels.torch_fast` (fused q/k/v projection, bias-fused GEMMs)
    against Keras' own layer code, a whole ViT: logits and the gradient of
    every weight. PyTorch's layers: collected only in the torch suite (not a
    skip elsewhere)."""
    from conftest import grads

    from keras_reluvit.kernels import torch_fast

    calls = {"project_qkv": 0, "linear": 0}
    for name in calls:  # spies: the fast paths must run (and only when on)
        def spy(*a, _name=name, _f=getattr(torch_fast, name), **k):
            calls[_name] += 1
            return _f(*a, **k)
        monkeypatch.setattr(torch_fast, name, spy)
    model = tiny(attention=attention, qk_norm=True)
    randomize(model)
    x = images()
    cot = keras.ops.convert_to_tensor(np.random.default_rng(1).normal(size=(2, 5)).astype("float32"))
    results = []
    for fast in ("1", "0"):
        monkeypatch.setenv("KERAS_RELUVIT_TORCH_FAST", fast)
        before = dict(calls)
        (gx,), gv = grads(lambda xs: keras.ops.sum(model(xs) * cot), model.trainable_weights, [x])
        results.append([to_np(model(x)), gx] + gv)
        ran = {n: calls[n] - before[n] for n in calls}
        if fast == "1":  # every block's q/k/v projection and both MLP GEMMs
            depth = model.get_config()["depth"]
            assert ran["project_qkv"] >= depth and ran["linear"] >= 2 * depth, ran
        else:
            assert ran == {"project_qkv": 0, "linear": 0}, ran
    assert len(results[0]) == len(model.trainable_weights) + 2
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


if keras.backend.backend() != "torch":
    del test_fused_torch_layers_give_keras_own_outputs_and_gradients


def test_cli_lists_attention_kinds_and_the_old_command_warns(capsys):
    from keras_reluvit import cli

    assert cli.main(["attention"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(kr.attention_kinds())
    assert out.err == ""
    assert cli.main(["presets"]) == 0
    old = capsys.readouterr()
    assert old.out.splitlines() == lines
    assert "renamed `attention`" in old.err


def test_clip_and_dinov2_parts_compute_their_definitions(tmp_path):
    """pre_norm is a LayerNorm between the position embedding and the first
    block; quick GELU is x * sigmoid(1.702 x) in the MLP; tok_gap pools
    [class token, mean of the patch tokens after the registers]."""
    model = tiny(pool="tok_gap", class_token=True, num_register_tokens=2, pre_norm=True,
                 mlp_activation="quick_gelu", attention="softmax")
    randomize(model, seed=5)
    x = images()
    out = model.intermediates(x, attention_weights=False)
    tokens, encoded = to_np(out["tokens"]), to_np(out["encoded"])
    norm = model.get_layer("pre_norm")
    mu, var = tokens.mean(-1, keepdims=True), tokens.var(-1, keepdims=True)
    pre = (tokens - mu) / np.sqrt(var + norm.epsilon) * to_np(norm.gamma) + to_np(norm.beta)
    block = model.get_layer("block_00")
    np.testing.assert_allclose(to_np(block(pre)), to_np(out["block_00"]), atol=1e-4, rtol=1e-4)
    h = np.random.default_rng(0).normal(0, 2, (3, 8, 32)).astype("float32")
    mlp = block.mlp
    hidden = h @ to_np(mlp.fc1.kernel) + to_np(mlp.fc1.bias)
    ref = (hidden / (1 + np.exp(-1.702 * hidden))) @ to_np(mlp.fc2.kernel) + to_np(mlp.fc2.bias)
    np.testing.assert_allclose(to_np(mlp(h)), ref, atol=1e-4, rtol=1e-4)
    pooled = np.concatenate([encoded[:, 0], encoded[:, 3:].mean(1)], axis=-1)
    np.testing.assert_allclose(to_np(out["pooled"]), pooled, atol=1e-5, rtol=1e-5)
    assert model.get_layer("head").kernel.shape == (2 * 32, 5)
    model.save(tmp_path / "m.keras")
    back = keras.saving.load_model(tmp_path / "m.keras")
    cfg = back.get_config()
    assert (cfg["pool"], cfg["pre_norm"], cfg["mlp_activation"]) == ("tok_gap", True, "quick_gelu")
    np.testing.assert_allclose(to_np(back(x)), to_np(model(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("old,new", [((4, 4), (6, 6)), ((7, 7), (3, 3)), ((5, 4), (3, 6)),
                                     ((37, 37), (16, 16))])
def test_bicubic_posemb_resampling_is_pytorchs(old, new, antialias):
    """`resample_posemb(method="bicubic" / "bicubic_antialias")` is
    `torch.nn.functional.interpolate(mode="bicubic", antialias=...)`, the
    resampling timm and transformers' DINOv2 use, prefix rows kept."""
    import torch

    method = "bicubic_antialias" if antialias else "bicubic"
    rng = np.random.default_rng(old[0] * 10 + new[1])
    posemb = rng.normal(size=(1, 2 + old[0] * old[1], 8)).astype("float32")
    got = kr.resample_posemb(posemb, new, old, num_prefix_tokens=2, method=method)
    grid = torch.from_numpy(posemb[:, 2:].reshape(1, *old, 8)).permute(0, 3, 1, 2).double()
    want = torch.nn.functional.interpolate(grid, size=new, mode="bicubic", antialias=antialias,
                                           align_corners=False)
    want = want.permute(0, 2, 3, 1).reshape(1, -1, 8).numpy()
    np.testing.assert_array_equal(got[:, :2], posemb[:, :2])
    np.testing.assert_allclose(got[:, 2:], want, atol=1e-6)
    with pytest.raises(ValueError, match="Unknown posemb resampling 'nearest'"):
        kr.resample_posemb(posemb, new, old, 2, method="nearest")


# ------------------------------------------------------- unknown keywords
@pytest.mark.parametrize("call, named, hint", [
    (lambda: kr.ViT_S16(num_classes=10, drop_rate=0.1), "'drop_rate'", "use dropout"),  # timm
    (lambda: kr.ViT("Ti/16", hidden_dim=32), "'hidden_dim'", "use width"),  # keras-hub
    (lambda: kr.ViT("Ti/16", num_hidden_layers=2), "'num_hidden_layers'", "use depth"),  # HF
    (lambda: kr.ViT("Ti/16", num_clases=3), "'num_clases'", "did you mean 'num_classes'"),
    (lambda: kr.ViT_B16(drop_path_rate=0.1), "'drop_path_rate'", "use drop_path"),  # timm
    (lambda: kr.ViT_B16(attn_drop_rate=0.1), "'attn_drop_rate'", "not implemented"),
])
def test_unknown_keywords_are_refused_naming_ours(call, named, hint):
    """A misspelled or foreign keyword never builds a model as if nothing had
    been said (Keras' functional Model drops what it does not know)."""
    with pytest.raises(TypeError, match="unknown keyword") as e:
        call()
    assert named in str(e.value) and hint in str(e.value)
    assert "It accepts: " in str(e.value) and "dropout" in str(e.value)
    assert isinstance(e.value, ValueError)  # the library's argument errors are ValueErrors


def test_keras_own_keywords_still_pass_through_a_saved_config():
    model = kr.ViT(**TINY, trainable=False)
    assert kr.ViT.from_config(model.get_config()).trainable is False
