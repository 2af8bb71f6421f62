"""Pretrained checkpoints on the current backend.

The references are not our loader run backwards: for timm and big_vision a
NumPy forward pass written from each project's model source
(`timm/models/vision_transformer.py` + `timm/layers/attention_pool.py`;
`big_vision/models/vit.py`) runs on synthetic checkpoints with their exact
key names and shapes; for keras-hub the real `keras_hub.models.ViTBackbone`
and `ViTImageClassifier` compute the logits.
"""

import json
import math

import keras
import numpy as np
import pytest
from test_vit import np_sincos2d

import keras_reluvit as kr
from keras_reluvit import checkpoints as C

RNG = np.random.default_rng


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")


def images(n=2, size=32, seed=0):
    return RNG(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


# ------------------------------------------------------------- NumPy bits
def ln(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps) * w
    return out if b is None else out + b


def gelu_exact(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------ timm
def timm_state_dict(rng, width=32, depth=2, heads=2, mlp=64, patch=8, grid=4, classes=5,
                    cls=True, regs=0, no_embed_class=False, qk_norm=False, ls=False,
                    pool="token", fc_norm=False, qkv_bias=True, pre_norm=False):
    """A state dict with timm VisionTransformer's key names and shapes
    (`pre_norm`: a CLIP tower's, `norm_pre` and a bias-free patch stem)."""
    def r(*shape, scale=0.2):
        return rng.normal(0, scale, shape).astype("float32")

    def gamma(n):
        return (1 + r(n, scale=0.1)).astype("float32")

    D, sd = width, {}
    sd["patch_embed.proj.weight"] = r(D, 3, patch, patch)
    if pre_norm:
        sd["norm_pre.weight"], sd["norm_pre.bias"] = gamma(D), r(D)
    else:
        sd["patch_embed.proj.bias"] = r(D)
    prefix = int(cls) + regs
    if cls:
        sd["cls_token"] = r(1, 1, D)
    if regs:
        sd["reg_token"] = r(1, regs, D)
    sd["pos_embed"] = r(1, grid * grid + (0 if no_embed_class else prefix), D)
    for i in range(depth):
        b = f"blocks.{i}."
        sd[b + "norm1.weight"], sd[b + "norm1.bias"] = gamma(D), r(D)
        sd[b + "attn.qkv.weight"] = r(3 * D, D)
        if qkv_bias:
            sd[b + "attn.qkv.bias"] = r(3 * D)
        if qk_norm:
            for n in ("q_norm", "k_norm"):
                sd[b + f"attn.{n}.weight"], sd[b + f"attn.{n}.bias"] = gamma(D // heads), r(D // heads)
        sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"] = r(D, D), r(D)
        sd[b + "norm2.weight"], sd[b + "norm2.bias"] = gamma(D), r(D)
        sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"] = r(mlp, D), r(mlp)
        sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"] = r(D, mlp), r(D)
        if ls:
            sd[b + "ls1.gamma"], sd[b + "ls2.gamma"] = r(D), r(D)
    norm = "fc_norm" if fc_norm else "norm"
    sd[norm + ".weight"], sd[norm + ".bias"] = gamma(D), r(D)
    if pool == "map":
        p = "attn_pool."
        sd[p + "latent"] = r(1, 1, D)
        sd[p + "q.weight"], sd[p + "q.bias"] = r(D, D), r(D)
        sd[p + "kv.weight"], sd[p + "kv.bias"] = r(2 * D, D), r(2 * D)
        sd[p + "proj.weight"], sd[p + "proj.bias"] = r(D, D), r(D)
        sd[p + "norm.weight"], sd[p + "norm.bias"] = gamma(D), r(D)
        sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"] = r(mlp, D), r(mlp)
        sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"] = r(D, mlp), r(D)
    sd["head.weight"], sd["head.bias"] = r(classes, D), r(classes)
    return sd


def quick_gelu(x):
    return x / (1 + np.exp(-1.702 * x))


def np_timm(sd, x_nhwc, heads, global_pool, no_embed_class=False, act=None, eps=1e-6):
    """timm's VisionTransformer.forward in NumPy (eval mode, fused SDPA
    semantics): patch_embed, _pos_embed, norm_pre, blocks, norm, pool,
    fc_norm, head. `act`: the MLP activation (timm's default exact GELU;
    `quick_gelu` for the `vit_*_clip_quickgelu_*` towers); `eps`: every
    LayerNorm's (1e-5 in timm's CLIP towers)."""
    act = act or gelu_exact
    x = np.transpose(x_nhwc, (0, 3, 1, 2)).astype("float64")  # NCHW as timm
    W = sd["patch_embed.proj.weight"].astype("float64")
    D, _, p, _ = W.shape
    B, _, Hh, Ww = x.shape
    gh, gw = Hh // p, Ww // p
    patches = x.reshape(B, 3, gh, p, gw, p).transpose(0, 2, 4, 1, 3, 5)
    x = np.einsum("bhwcij,dcij->bhwd", patches, W) + sd.get("patch_embed.proj.bias", 0.0)
    x = x.reshape(B, gh * gw, D)
    to_cat = []
    if "cls_token" in sd:
        to_cat.append(np.broadcast_to(sd["cls_token"], (B, 1, D)))
    if "reg_token" in sd:
        to_cat.append(np.broadcast_to(sd["reg_token"], (B, sd["reg_token"].shape[1], D)))
    npre = sum(t.shape[1] for t in to_cat)
    if no_embed_class:
        x = np.concatenate(to_cat + [x + sd["pos_embed"]], axis=1)
    else:
        x = np.concatenate(to_cat + [x], axis=1) + sd["pos_embed"]
    if "norm_pre.weight" in sd:
        x = ln(x, sd["norm_pre.weight"], sd["norm_pre.bias"], eps)
    dh = D // heads

    def attend(q, k, v):  # (B, H, N, dh)
        a = softmax(np.einsum("bhqd,bhkd->bhqk", q, k) * dh**-0.5)
        return np.einsum("bhqk,bhkd->bhqd", a, v)

    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    for i in range(depth):
        b = f"blocks.{i}."
        y = ln(x, sd[b + "norm1.weight"], sd[b + "norm1.bias"], eps)
        qkv = y @ sd[b + "attn.qkv.weight"].T + sd.get(b + "attn.qkv.bias", 0)
        N = qkv.shape[1]
        q, k, v = qkv.reshape(B, N, 3, heads, dh).transpose(2, 0, 3, 1, 4)
        if b + "attn.q_norm.weight" in sd:
            q = ln(q, sd[b + "attn.q_norm.weight"], sd[b + "attn.q_norm.bias"], eps)
            k = ln(k, sd[b + "attn.k_norm.weight"], sd[b + "attn.k_norm.bias"], eps)
        o = attend(q, k, v).transpose(0, 2, 1, 3).reshape(B, N, D)
        o = o @ sd[b + "attn.proj.weight"].T + sd[b + "attn.proj.bias"]
        x = x + o * sd.get(b + "ls1.gamma", 1.0)
        y = ln(x, sd[b + "norm2.weight"], sd[b + "norm2.bias"], eps)
        y = act(y @ sd[b + "mlp.fc1.weight"].T + sd[b + "mlp.fc1.bias"])
        y = y @ sd[b + "mlp.fc2.weight"].T + sd[b + "mlp.fc2.bias"]
        x = x + y * sd.get(b + "ls2.gamma", 1.0)
    if "norm.weight" in sd:
        x = ln(x, sd["norm.weight"], sd["norm.bias"], eps)
    if global_pool == "map":
        p = "attn_pool."
        t = x[:, npre:]
        q = np.broadcast_to(sd[p + "latent"], (B, 1, D)) @ sd[p + "q.weight"].T + sd[p + "q.bias"]
        q = q.reshape(B, 1, heads, dh).transpose(0, 2, 1, 3)
        kv = t @ sd[p + "kv.weight"].T + sd[p + "kv.bias"]
        k, v = kv.reshape(B, t.shape[1], 2, heads, dh).transpose(2, 0, 3, 1, 4)
        o = attend(q, k, v).transpose(0, 2, 1, 3).reshape(B, 1, D)
        o = o @ sd[p + "proj.weight"].T + sd[p + "proj.bias"]
        y = ln(o, sd[p + "norm.weight"], sd[p + "norm.bias"], eps)
        y = gelu_exact(y @ sd[p + "mlp.fc1.weight"].T + sd[p + "mlp.fc1.bias"])
        o = o + y @ sd[p + "mlp.fc2.weight"].T + sd[p + "mlp.fc2.bias"]
        x = o[:, 0]
    elif global_pool == "token":
        x = x[:, 0]
    else:  # avg over the non-prefix tokens
        x = x[:, npre:].mean(1)
    if "fc_norm.weight" in sd:
        x = ln(x, sd["fc_norm.weight"], sd["fc_norm.bias"], eps)
    return x @ sd["head.weight"].T + sd["head.bias"]


TIMM_CASES = {
    # original ViT / AugReg in timm: class token, posemb over it, token pool
    "cls_token": dict(),
    # register tokens + no_embed_class + layer scale + qk-norm + avg + fc_norm
    "reg_ls_qknorm_fcnorm": dict(regs=2, no_embed_class=True, ls=True, qk_norm=True,
                                 pool="avg", fc_norm=True),
    # SigLIP-style: no class token, MAP head, no qkv bias
    "map_no_qkv_bias": dict(cls=False, pool="map", qkv_bias=False),
    # gap with a final norm before pooling (timm fc_norm=False)
    "avg_norm": dict(cls=False, pool="avg"),
}


def save_safetensors(sd, path):
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(path))
    return path


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_safetensors_logits_equal_numpy_timm(case, tmp_path):
    kw = TIMM_CASES[case]
    sd = timm_state_dict(RNG(1), **kw)
    path = save_safetensors(sd, tmp_path / "vit.safetensors")
    # width 32 is no standard variant: the head count is not in the file
    # unless qk-norm weights give the head size.
    extra = {} if kw.get("qk_norm") else {"num_heads": 2}
    model = kr.load_checkpoint(path, **extra)
    cfg = model.get_config()
    assert cfg["num_heads"] == 2 and cfg["mlp_activation"] == "gelu"
    assert cfg["num_register_tokens"] == kw.get("regs", 0)
    assert model.attention_args["activation"] == "softmax"
    x = images()
    ref = np_timm(sd, x, 2, {"token": "token"}.get(kw.get("pool", "token"), kw.get("pool")),
                  kw.get("no_embed_class", False))
    np.testing.assert_allclose(to_np(model(x)), ref, atol=1e-4, rtol=1e-4)


def test_timm_clip_towers_load_exactly(tmp_path):
    """timm's `vit_*_clip_*` layout (norm_pre, no patch-embedding bias, class
    token pooling): with timm's exact GELU (the `.openai` / `.laion2b` tags)
    and, by override or from our writer's metadata, OpenAI's quick GELU (the
    `_quickgelu` models). The bias-free stem loads as a zero bias; written
    back, our bias is folded into pos_embed and the logits survive."""
    sd = timm_state_dict(RNG(11), pre_norm=True)
    path = save_safetensors(sd, tmp_path / "clip.safetensors")
    x = images(seed=4)
    model = kr.load_checkpoint(path, num_heads=2)
    cfg = model.get_config()
    assert cfg["pre_norm"] and cfg["mlp_activation"] == "gelu" and cfg["pool"] == "tok"
    # timm builds its CLIP towers' LayerNorms with eps 1e-5: a bare state dict
    # with norm_pre is one of them, and gets OpenAI's mean/std.
    assert cfg["layer_norm_epsilon"] == 1e-5
    assert model.preprocessing["mean"] == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    np.testing.assert_allclose(to_np(model(x)), np_timm(sd, x, 2, "token", eps=1e-5),
                               atol=1e-5, rtol=1e-5)
    assert np.abs(np_timm(sd, x, 2, "token", eps=1e-5)  # the epsilons differ visibly here
                  - np_timm(sd, x, 2, "token")).max() > 4e-5
    quick = kr.load_checkpoint(path, num_heads=2, mlp_activation="quick_gelu")
    ref = np_timm(sd, x, 2, "token", act=quick_gelu, eps=1e-5)
    np.testing.assert_allclose(to_np(quick(x)), ref, atol=1e-5, rtol=1e-5)
    assert np.abs(ref - np_timm(sd, x, 2, "token", eps=1e-5)).max() > 1e-3  # activations differ
    # A trained stem bias: timm's pre-norm stem has none, so it goes into pos_embed.
    stem = quick.get_layer("embedding")
    stem.bias.assign(RNG(12).normal(0, 0.2, (32,)).astype("float32"))
    out, kwargs = C.timm_state_dict(quick, tmp_path / "back.safetensors", strict=False)
    assert "patch_embed.proj.bias" not in out and kwargs["pre_norm"]
    assert kwargs["act_layer"] == "quick_gelu"
    back = kr.load_checkpoint(tmp_path / "back.safetensors", num_heads=2)  # act from metadata
    assert back.get_config()["mlp_activation"] == "quick_gelu"
    np.testing.assert_allclose(to_np(back(x)), to_np(quick(x)), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(to_np(back(x)), np_timm(out, x, 2, "token", act=quick_gelu,
                                                       eps=1e-5), atol=1e-4, rtol=1e-4)
    # A timm hub directory (config.json + model.safetensors): its architecture
    # name says quick GELU, which a bare state dict cannot.
    hub = tmp_path / "vit_base_patch16_clip_quickgelu_224.openai"
    hub.mkdir()
    save_safetensors(sd, hub / "model.safetensors")
    (hub / "config.json").write_text(json.dumps({
        "architecture": "vit_base_patch16_clip_quickgelu_224", "num_classes": 5,
        "pretrained_cfg": {"mean": [0.48, 0.46, 0.41], "std": [0.27, 0.26, 0.28]}}))
    assert C.detect_format(hub) == "timm_hub"
    from_hub = kr.load_checkpoint(hub, num_heads=2)
    assert from_hub.get_config()["mlp_activation"] == "quick_gelu"
    assert from_hub.get_config()["layer_norm_epsilon"] == 1e-5
    assert from_hub.preprocessing["mean"] == (0.48, 0.46, 0.41)
    np.testing.assert_allclose(to_np(from_hub(x)), ref, atol=1e-5, rtol=1e-5)
    # The bare state dict named by its timm architecture: the same model.
    named = kr.load_checkpoint(path, num_heads=2,
                               architecture="vit_base_patch16_clip_quickgelu_224.openai")
    np.testing.assert_allclose(to_np(named(x)), ref, atol=1e-5, rtol=1e-5)
    (hub / "config.json").write_text(json.dumps({"architecture": "resnet50"}))
    with pytest.raises(C.CheckpointError, match="a timm 'resnet50'; keras_reluvit loads the "
                                                "architectures timm builds as a "
                                                "VisionTransformer"):
        kr.load_checkpoint(hub)


def test_timm_pth_reads_with_torch(tmp_path):
    import torch

    sd = timm_state_dict(RNG(2))
    path = tmp_path / "vit.pth"
    # timm training checkpoints wrap the weights; DDP adds "module.".
    torch.save({"state_dict": {"module." + k: torch.from_numpy(v) for k, v in sd.items()},
                "epoch": 3}, path)
    model = kr.load_checkpoint(path, num_heads=2)
    x = images(seed=1)
    np.testing.assert_allclose(to_np(model(x)), np_timm(sd, x, 2, "token"), atol=1e-4, rtol=1e-4)


def test_timm_head_count_is_inferred_for_standard_widths_and_asked_otherwise(tmp_path):
    sd = timm_state_dict(RNG(3), width=192, heads=3, mlp=64, depth=1)
    model = kr.load_checkpoint(save_safetensors(sd, tmp_path / "ti.safetensors"))
    assert model.get_config()["num_heads"] == 3  # ViT-Ti's
    sd = timm_state_dict(RNG(3), depth=1)
    path = save_safetensors(sd, tmp_path / "odd.safetensors")
    with pytest.raises(C.CheckpointError, match=r"odd.safetensors.*num_heads"):
        kr.load_checkpoint(path)


# ------------------------------------------------------------ big_vision
def bv_params(rng, width=32, depth=2, heads=2, mlp=64, patch=8, grid=4, classes=5,
              pool="gap", posemb="learn", augreg=False, scan=False, qk_norm=False,
              rep=None, prefix=""):
    """Flattened params with big_vision's (or AugReg's) names and shapes."""
    def r(*shape, scale=0.2):
        return rng.normal(0, scale, shape).astype("float32")

    D, dh, p = width, width // heads, {}
    ln1, ln2, mha, mlpn = (("LayerNorm_0", "LayerNorm_2", "MultiHeadDotProductAttention_1",
                            "MlpBlock_3") if augreg else
                           ("LayerNorm_0", "LayerNorm_1", "MultiHeadDotProductAttention_0",
                            "MlpBlock_0"))
    p["embedding/kernel"], p["embedding/bias"] = r(patch, patch, 3, D), r(D)
    if pool == "tok":
        p["cls"] = r(1, 1, D)
    if posemb == "learn":
        if augreg:
            p["Transformer/posembed_input/pos_embedding"] = r(1, grid * grid + (pool == "tok"), D)
        else:
            p["pos_embedding"] = r(1, grid * grid, D)

    def attn(base):
        out = {}
        for n in ("query", "key", "value"):
            out[f"{base}/{n}/kernel"], out[f"{base}/{n}/bias"] = r(D, heads, dh), r(heads, dh)
        out[f"{base}/out/kernel"], out[f"{base}/out/bias"] = r(heads, dh, D), r(D)
        if qk_norm:
            out[f"{base}/query_ln/scale"] = 1 + r(dh, scale=0.1)
            out[f"{base}/key_ln/scale"] = 1 + r(dh, scale=0.1)
        return out

    def block():
        out = {}
        for n in (ln1, ln2):
            out[f"{n}/scale"], out[f"{n}/bias"] = 1 + r(D, scale=0.1), r(D)
        out.update(attn(mha))
        out[f"{mlpn}/Dense_0/kernel"], out[f"{mlpn}/Dense_0/bias"] = r(D, mlp), r(mlp)
        out[f"{mlpn}/Dense_1/kernel"], out[f"{mlpn}/Dense_1/bias"] = r(mlp, D), r(D)
        return out

    blocks = [block() for _ in range(depth)]
    if scan:
        for k in blocks[0]:
            p[f"Transformer/encoderblock/{k}"] = np.stack([b[k] for b in blocks])
    else:
        for i, b in enumerate(blocks):
            p.update({f"Transformer/encoderblock_{i}/{k}": v for k, v in b.items()})
    p["Transformer/encoder_norm/scale"] = 1 + r(D, scale=0.1)
    p["Transformer/encoder_norm/bias"] = r(D)
    if pool == "map":
        p["MAPHead_0/probe"] = r(1, 1, D)
        p.update({f"MAPHead_0/{k}": v for k, v in attn("MultiHeadDotProductAttention_0").items()})
        p["MAPHead_0/LayerNorm_0/scale"], p["MAPHead_0/LayerNorm_0/bias"] = 1 + r(D), r(D)
        p["MAPHead_0/MlpBlock_0/Dense_0/kernel"] = r(D, mlp)
        p["MAPHead_0/MlpBlock_0/Dense_0/bias"] = r(mlp)
        p["MAPHead_0/MlpBlock_0/Dense_1/kernel"] = r(mlp, D)
        p["MAPHead_0/MlpBlock_0/Dense_1/bias"] = r(D)
    if rep:
        p["pre_logits/kernel"], p["pre_logits/bias"] = r(D, rep), r(rep)
    p["head/kernel"], p["head/bias"] = r(rep or D, classes), r(classes)
    return {prefix + k: v for k, v in p.items()}


def np_big_vision(p, x, pool, augreg=False):
    """big_vision `vit.py` `_Model.__call__` in NumPy (Flax semantics: HWIO
    conv, posemb added before the class token (AugReg: after), pre-LN blocks
    with Flax MHA (q scaled by 1/sqrt(dh); optional query_ln/key_ln without
    bias), tanh GELU, encoder_norm, gap / tok / MAPHead, tanh pre_logits)."""
    W = p["embedding/kernel"].astype("float64")
    patch, D = W.shape[0], W.shape[-1]
    B, H, Wd, _ = x.shape
    gh, gw = H // patch, Wd // patch
    pt = x.reshape(B, gh, patch, gw, patch, 3).transpose(0, 1, 3, 2, 4, 5)
    t = (np.einsum("bhwijc,ijcd->bhwd", pt, W) + p["embedding/bias"]).reshape(B, gh * gw, D)
    if "pos_embedding" in p:
        t = t + p["pos_embedding"]
    elif "Transformer/posembed_input/pos_embedding" not in p:
        t = t + np_sincos2d(gh, gw, D)[None]
    if pool == "tok":
        t = np.concatenate([np.broadcast_to(p["cls"], (B, 1, D)), t], axis=1)
    if "Transformer/posembed_input/pos_embedding" in p:
        t = t + p["Transformer/posembed_input/pos_embedding"]
    ln1, ln2, mha, mlpn = (("LayerNorm_0", "LayerNorm_2", "MultiHeadDotProductAttention_1",
                            "MlpBlock_3") if augreg else
                           ("LayerNorm_0", "LayerNorm_1", "MultiHeadDotProductAttention_0",
                            "MlpBlock_0"))

    def flax_mha(get, q_in, kv_in):
        q = np.einsum("bld,dhk->blhk", q_in, get("query/kernel")) + get("query/bias")
        k = np.einsum("bld,dhk->blhk", kv_in, get("key/kernel")) + get("key/bias")
        v = np.einsum("bld,dhk->blhk", kv_in, get("value/kernel")) + get("value/bias")
        if get("query_ln/scale") is not None:
            q = ln(q, get("query_ln/scale"), None)
            k = ln(k, get("key_ln/scale"), None)
        q = q / math.sqrt(q.shape[-1])
        a = softmax(np.einsum("bqhd,bkhd->bhqk", q, k))
        o = np.einsum("bhqk,bkhd->bqhd", a, v)
        return np.einsum("bqhd,hdo->bqo", o, get("out/kernel")) + get("out/bias")

    def mlp(get, y):
        y = gelu_tanh(y @ get("Dense_0/kernel") + get("Dense_0/bias"))
        return y @ get("Dense_1/kernel") + get("Dense_1/bias")

    scanned = "Transformer/encoderblock/" + ln1 + "/scale" in p
    depth = (p["Transformer/encoderblock/" + ln1 + "/scale"].shape[0] if scanned else
             len({k.split("/")[1] for k in p if k.startswith("Transformer/encoderblock_")}))
    for i in range(depth):
        def get(k, i=i):
            if scanned:
                v = p.get("Transformer/encoderblock/" + k)
                return None if v is None else v[i]
            return p.get(f"Transformer/encoderblock_{i}/" + k)

        y = ln(t, get(ln1 + "/scale"), get(ln1 + "/bias"))
        t = t + flax_mha(lambda k: get(f"{mha}/{k}"), y, y)
        y = ln(t, get(ln2 + "/scale"), get(ln2 + "/bias"))
        t = t + mlp(lambda k: get(f"{mlpn}/{k}"), y)
    t = ln(t, p["Transformer/encoder_norm/scale"], p["Transformer/encoder_norm/bias"])
    if pool == "gap":
        h = t.mean(1)
    elif pool == "tok":
        h = t[:, 0]
    else:
        probe = np.broadcast_to(p["MAPHead_0/probe"], (B, 1, D))
        h = flax_mha(lambda k: p.get(f"MAPHead_0/MultiHeadDotProductAttention_0/{k}"), probe, t)
        y = ln(h, p["MAPHead_0/LayerNorm_0/scale"], p["MAPHead_0/LayerNorm_0/bias"])
        h = (h + mlp(lambda k: p[f"MAPHead_0/MlpBlock_0/{k}"], y))[:, 0]
    if "pre_logits/kernel" in p:
        h = np.tanh(h @ p["pre_logits/kernel"] + p["pre_logits/bias"])
    return h @ p["head/kernel"] + p["head/bias"]


BV_CASES = {
    "big_vision_gap": dict(pool="gap"),
    "big_vision_tok_pre_logits": dict(pool="tok", rep=16),
    "augreg_opt_target": dict(pool="tok", augreg=True, prefix="opt/target/"),
    "scanned_map_qk_norm_params": dict(pool="map", scan=True, qk_norm=True, prefix="params/"),
    "sincos2d_gap": dict(pool="gap", posemb="sincos2d"),
}


@pytest.mark.parametrize("case", list(BV_CASES))
def test_big_vision_npz_logits_equal_numpy_big_vision(case, tmp_path):
    kw = BV_CASES[case]
    params = bv_params(RNG(4), **kw)
    path = tmp_path / "vit.npz"
    np.savez(path, **params)
    image_size = {"image_size": 32} if kw.get("posemb") == "sincos2d" else {}
    model = kr.load_checkpoint(path, **image_size)
    cfg = model.get_config()
    assert cfg["mlp_activation"] == "gelu_tanh" and cfg["pool"] == kw["pool"]
    assert cfg["qk_norm"] is bool(kw.get("qk_norm"))
    stripped = {k[len(kw.get("prefix", "")):]: v for k, v in params.items()}
    x = images(seed=2)
    ref = np_big_vision(stripped, x.astype("float64"), kw["pool"], kw.get("augreg", False))
    np.testing.assert_allclose(to_np(model(x)), ref, atol=1e-4, rtol=1e-4)


def test_checkpoint_at_another_resolution_resamples_the_posemb(tmp_path):
    params = bv_params(RNG(5), pool="tok", augreg=True)
    pe = params["Transformer/posembed_input/pos_embedding"]  # random: nothing hides
    path = tmp_path / "augreg_32px.npz"
    np.savez(path, **params)
    model = kr.load_checkpoint(path, image_size=48)
    assert model.image_size == (48, 48)
    got = to_np(model.get_layer("pos_embedding").embedding)
    assert got.shape == (1, 1 + 36, 32)
    np.testing.assert_allclose(got[:, 0], pe[:, 0], atol=1e-6)  # class token row kept
    want = np_bilinear(pe[0, 1:].astype("float64").reshape(4, 4, 32), (6, 6)).reshape(36, 32)
    np.testing.assert_allclose(got[0, 1:], want, atol=1e-5)  # big_vision's bilinear
    assert np.isfinite(to_np(model(images(size=48)))).all()


def test_attention_num_classes_and_features_overrides(tmp_path):
    sd = timm_state_dict(RNG(6))
    path = save_safetensors(sd, tmp_path / "vit.safetensors")
    relu = kr.load_checkpoint(path, num_heads=2, attention="relu")
    soft = kr.load_checkpoint(path, num_heads=2)
    assert relu.attention_args == {"activation": "relu", "seq_len_exponent": 1.0}
    for a, b in zip(relu.weights, soft.weights):
        np.testing.assert_array_equal(to_np(a), to_np(b))
    new_head = kr.load_checkpoint(path, num_heads=2, num_classes=7)
    assert new_head.output.shape[-1] == 7
    np.testing.assert_array_equal(to_np(new_head.get_layer("head").kernel), 0.0)
    feats = kr.load_checkpoint(path, num_heads=2, num_classes=0)
    assert tuple(feats(images()).shape) == (2, 32)


# ------------------------------------------------------------- keras-hub
@pytest.mark.parametrize("intermediate_dim", [None, 12])
def test_keras_hub_preset_logits_equal_keras_hub(intermediate_dim, tmp_path):
    import keras_hub  # installed by scripts/env.sh (requirements/keras-hub.txt)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
        mlp_dim=64, use_mha_bias=intermediate_dim is None)
    task = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=5,
                                               intermediate_dim=intermediate_dim)
    rng = RNG(7)
    for v in task.weights:
        v.assign(rng.normal(0, 0.3, v.shape).astype("float32") + (v.path.endswith("gamma")))
    task.save_to_preset(str(tmp_path / "hub"))
    x = images(seed=3)
    ref = to_np(task(x))
    for model in (kr.load_checkpoint(tmp_path / "hub"), kr.ViT.from_preset(tmp_path / "hub")):
        np.testing.assert_allclose(to_np(model(x)), ref, atol=1e-4, rtol=1e-4)
    # The backbone alone: pooled class-token features.
    backbone.save_to_preset(str(tmp_path / "bb"))
    feats = kr.load_checkpoint(tmp_path / "bb")
    np.testing.assert_allclose(to_np(feats(x)), to_np(backbone(x))[:, 0], atol=1e-4, rtol=1e-4)


# ----------------------------------------------- writing and round trips
def rich_model(**kw):
    model = kr.ViT("Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=5, attention="softmax", **kw)
    rng = RNG(8)
    for v in model.weights:
        v.assign(rng.normal(0, 0.2, v.shape).astype("float32") + ("gamma" in v.path))
    return model


TIMM_EXPORTS = {
    "tok": dict(pool="tok", qk_norm=False, mlp_activation="gelu"),
    "regs_fc_norm_ls_qk": dict(pool="gap", class_token=True, num_register_tokens=2,
                               fc_norm=True, layer_scale=0.1, qk_norm="affine",
                               posemb_prefix=False, mlp_activation="gelu"),
    "map": dict(pool="map", qk_norm=False, mlp_activation="gelu"),
}


@pytest.mark.parametrize("case", list(TIMM_EXPORTS))
def test_timm_export_runs_in_numpy_timm_and_round_trips(case, tmp_path):
    kw = TIMM_EXPORTS[case]
    model = rich_model(**kw)
    path = tmp_path / "out.safetensors"
    sd, timm_kwargs = kr.export.timm_state_dict(model, path)
    assert timm_kwargs["global_pool"] == {"tok": "token", "gap": "avg", "map": "map"}[kw["pool"]]
    x = images(seed=4)
    ours = to_np(model(x))
    ref = np_timm(sd, x, 2, timm_kwargs["global_pool"], timm_kwargs["no_embed_class"])
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
    back = kr.load_checkpoint(path, num_heads=2)
    np.testing.assert_array_equal(to_np(back(x)), ours)
    for a, b in zip(sorted(model.weights, key=lambda v: v.path),
                    sorted(back.weights, key=lambda v: v.path)):
        np.testing.assert_array_equal(to_np(a), to_np(b))


def test_timm_export_refuses_relu_attention():
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32)
    with pytest.raises(ValueError, match="softmax"):
        kr.export.timm_state_dict(model)


@pytest.mark.parametrize("kw", [dict(pool="gap", posemb="sincos2d"),
                                dict(pool="tok", posemb_prefix=False, representation_size=8),
                                dict(pool="map", qk_norm=True)])
def test_big_vision_export_runs_in_numpy_big_vision_and_round_trips(kw, tmp_path):
    model = rich_model(**kw)
    path = tmp_path / "out.npz"
    params = kr.export.big_vision_npz(model, path)
    x = images(seed=5)
    ours = to_np(model(x))
    np.testing.assert_allclose(ours, np_big_vision(params, x.astype("float64"), kw["pool"]),
                               atol=1e-4, rtol=1e-4)
    back = kr.load_checkpoint(path, image_size=32)
    np.testing.assert_array_equal(to_np(back(x)), ours)


def test_preset_round_trip_with_metadata(tmp_path):
    model = rich_model(pool="map")
    model.save_to_preset(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["parameter_count"] == model.count_params()
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["class_name"] == "ViT" and config["config"]["pool"] == "map"
    back = kr.ViT.from_preset(tmp_path / "p")
    x = images(seed=6)
    np.testing.assert_array_equal(to_np(back(x)), to_np(model(x)))
    relu = kr.ViT.from_preset(tmp_path / "p", attention="relu")
    assert relu.attention_args["activation"] == "relu"


def test_builder_takes_a_checkpoint_and_checks_the_variant(tmp_path):
    sd = timm_state_dict(RNG(9), width=192, heads=3, mlp=768, patch=16, grid=2, depth=12)
    path = save_safetensors(sd, tmp_path / "ti16.safetensors")
    model = kr.ViT_Ti16(weights=path, attention="softmax")
    x = images(size=32, seed=7)
    np.testing.assert_allclose(to_np(model(x)), np_timm(sd, x, 3, "token"), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="not ViT-S/16"):
        kr.ViT_S16(weights=path)


# ------------------------------------------------------------- bad inputs
def test_bad_checkpoints_name_the_file_and_the_key(tmp_path):
    good = timm_state_dict(RNG(10))
    # not a ViT at all
    path = save_safetensors({"conv1.weight": np.zeros((8, 3, 7, 7), "float32")},
                            tmp_path / "resnet.safetensors")
    with pytest.raises(C.CheckpointError, match=r"resnet.safetensors.*not a timm VisionTransformer"):
        kr.load_checkpoint(path)
    # a key the ViT cannot express
    bad = dict(good, **{"patch_embed.norm.weight": np.ones(32, "float32")})
    path = save_safetensors(bad, tmp_path / "eva.safetensors")
    with pytest.raises(C.CheckpointError, match=r"eva.safetensors.*patch_embed.norm.weight"):
        kr.load_checkpoint(path, num_heads=2)
    # half of a part the ViT can express (CLIP's norm_pre without its bias)
    bad = dict(good, **{"norm_pre.weight": np.ones(32, "float32")})
    path = save_safetensors(bad, tmp_path / "clip.safetensors")
    with pytest.raises(C.CheckpointError, match=r"clip.safetensors: missing 'norm_pre.bias'"):
        kr.load_checkpoint(path, num_heads=2)
    # a missing key
    bad = {k: v for k, v in good.items() if k != "blocks.1.norm2.bias"}
    path = save_safetensors(bad, tmp_path / "missing.safetensors")
    with pytest.raises((C.CheckpointError, KeyError), match=r"blocks.1.norm2.bias"):
        kr.load_checkpoint(path, num_heads=2)
    # a shape that does not fit
    bad = dict(good, **{"blocks.1.mlp.fc2.bias": np.zeros(31, "float32")})
    path = save_safetensors(bad, tmp_path / "shape.safetensors")
    with pytest.raises(C.CheckpointError, match=r"shape.safetensors.*blocks.1.mlp.fc2.bias"):
        kr.load_checkpoint(path, num_heads=2)
    # a truncated file
    full = save_safetensors(good, tmp_path / "full.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(full[: len(full) // 2])
    with pytest.raises(C.CheckpointError, match=r"cut.safetensors"):
        kr.load_checkpoint(tmp_path / "cut.safetensors", num_heads=2)
    np.savez(tmp_path / "full.npz", **bv_params(RNG(11)))
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(C.CheckpointError, match=r"cut.npz"):
        kr.load_checkpoint(tmp_path / "cut.npz")
    # an override that adds weights the checkpoint lacks
    with pytest.raises(C.CheckpointError, match=r"full.safetensors.*query_norm"):
        kr.load_checkpoint(tmp_path / "full.safetensors", num_heads=2, qk_norm=True)
    # an unknown big_vision key
    params = dict(bv_params(RNG(12)), **{"Transformer/encoderblock_0/LayerScale_0/scale":
                                         np.ones(32, "float32")})
    np.savez(tmp_path / "extra.npz", **params)
    with pytest.raises(C.CheckpointError, match=r"extra.npz.*LayerScale_0"):
        kr.load_checkpoint(tmp_path / "extra.npz")
    with pytest.raises(FileNotFoundError):
        kr.load_checkpoint(tmp_path / "nope.safetensors")


def test_fold_input_normalization_matches_normalised_inputs():
    model = rich_model(pool="tok")
    x = images(seed=8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pixels = (x + 1) / 2
    normalised = ((pixels - np.array(mean)) / np.array(std)).astype("float32")
    want = to_np(model(normalised))
    C.fold_input_normalization(model, mean, std)
    np.testing.assert_allclose(to_np(model(x)), want, atol=1e-4, rtol=1e-4)
    # The recipe now says [-1, 1]: the preprocessor feeds the folded model.
    assert model.preprocessing["mean"] == model.preprocessing["std"] == (0.5, 0.5, 0.5)
    photo = np.random.default_rng(9).integers(0, 256, (40, 52, 3), dtype="uint8")
    pre = to_np(model.preprocessor(photo))
    assert -1.0 <= pre.min() and pre.max() <= 1.0 and pre.max() - pre.min() > 1.0
    # By default the mean/std are the model's own recipe's.
    timm_like = rich_model(pool="tok", preprocessing={"mean": mean, "std": std})
    want = to_np(timm_like(normalised))
    C.fold_input_normalization(timm_like)
    np.testing.assert_allclose(to_np(timm_like(x)), want, atol=1e-4, rtol=1e-4)


def test_cli_convert_writes_keras_preset_and_timm(tmp_path):
    from keras_reluvit import cli

    sd = timm_state_dict(RNG(13))
    src = save_safetensors(sd, tmp_path / "vit.safetensors")
    out = tmp_path / "relu48.keras"
    assert cli.main(["convert", str(src), str(out), "--attention", "relu",
                     "--image-size", "48", "--num-heads", "2"]) == 0
    model = keras.saving.load_model(out, compile=False)
    assert model.image_size == (48, 48) and model.attention_args["activation"] == "relu"
    assert cli.main(["convert", str(src), str(tmp_path / "preset"), "--num-heads", "2"]) == 0
    x = images(seed=9)
    np.testing.assert_allclose(to_np(kr.ViT.from_preset(tmp_path / "preset")(x)),
                               np_timm(sd, x, 2, "token"), atol=1e-4, rtol=1e-4)
    assert cli.main(["convert", str(tmp_path / "preset"), str(tmp_path / "back.safetensors")]) == 0
    back = C.timm._read_timm_file(str(tmp_path / "back.safetensors"))
    assert sorted(back) == sorted(sd)
    # a bad source: a clear error, exit status 2
    assert cli.main(["convert", str(tmp_path / "nope.npz"), str(out)]) == 2


def test_relu_from_softmax_recipe_needs_a_checkpoint():
    import keras_reluvit as kr

    with pytest.raises(ValueError, match="--init"):
        kr.build_config(recipe="relu_from_softmax")
    cfg = kr.build_config(recipe="relu_from_softmax", init="x.safetensors")
    assert cfg["init"] == "x.safetensors" and cfg["model"] == {"attention": "relu"}


# ------------------------------------------------------ rectangular grids
def np_bilinear(grid, new):
    """Half-pixel bilinear resampling of `(h, w, D)` to `new` (edges
    clamped, no antialiasing): big_vision's `resample_posemb`, written out."""
    def weights(n_in, n_out):
        m = np.zeros((n_out, n_in))
        for i in range(n_out):
            x = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1)
            lo = int(np.floor(x))
            hi = min(lo + 1, n_in - 1)
            m[i, lo] += 1 - (x - lo)
            m[i, hi] += x - lo
        return m

    return np.einsum("ih,hwd,jw->ijd", weights(grid.shape[0], new[0]), grid,
                     weights(grid.shape[1], new[1]))


def rectangular_timm(rng, grid=(4, 3), patch=8):
    sd = timm_state_dict(rng, patch=patch)
    sd["pos_embed"] = rng.normal(0, 0.2, (1, 1 + grid[0] * grid[1], 32)).astype("float32")
    return sd


def test_rectangular_timm_hub_directory_loads_and_predicts_like_timm(tmp_path):
    """A timm VisionTransformer built with img_size=(32, 24) and saved with
    `save_for_hf` (config.json `model_args.img_size`, `pretrained_cfg.
    input_size`): its 13-row position embedding is no square with or without
    the class row; the reader takes the grid from the config, the logits
    equal timm's (NumPy), and the preprocessor gives (32, 24) inputs."""
    sd = rectangular_timm(RNG(11))
    hub = tmp_path / "hub"
    hub.mkdir()
    save_safetensors(sd, hub / "model.safetensors")
    (hub / "config.json").write_text(json.dumps({
        "architecture": "vit_small_patch16_224", "num_classes": 5,
        "model_args": {"img_size": [32, 24], "patch_size": 8},
        "pretrained_cfg": {"input_size": [3, 32, 24], "interpolation": "bicubic",
                           "crop_pct": 0.9, "mean": [0.5] * 3, "std": [0.5] * 3}}))
    model = kr.load_checkpoint(hub, num_heads=2)
    assert model.image_size == (32, 24)
    x = RNG(2).uniform(-1, 1, (2, 32, 24, 3)).astype("float32")
    np.testing.assert_allclose(to_np(model(x)), np_timm(sd, x, 2, "token"), atol=1e-4, rtol=1e-4)
    photo = RNG(3).integers(0, 256, (50, 70, 3), dtype="uint8")
    assert tuple(model.preprocessor(photo).shape) == (1, 32, 24, 3)
    # A bare state dict says nothing of its grid: refused by name, loaded with
    # image_size= (the message's advice), with or without posemb_prefix=.
    bare = save_safetensors(sd, tmp_path / "bare.safetensors")
    with pytest.raises(C.CheckpointError, match=r"not a square grid .*pass image_size=\(h, w\)"):
        kr.load_checkpoint(bare, num_heads=2)
    for extra in ({}, {"posemb_prefix": True}):
        m = kr.load_checkpoint(bare, num_heads=2, image_size=(32, 24), **extra)
        np.testing.assert_allclose(to_np(m(x)), np_timm(sd, x, 2, "token"), atol=1e-4, rtol=1e-4)


def test_rectangular_posemb_resampled_from_a_random_grid(tmp_path):
    """A random 4x3 grid loaded at (48, 16) px (6x2 patches): the class row
    is kept and the grid equals big_vision's bilinear resampling written out
    in NumPy (nearest, swapped height / width or another interpolation would
    not); bicubic as PyTorch's `interpolate` where torch is installed."""
    sd = rectangular_timm(RNG(12))
    path = save_safetensors(sd, tmp_path / "bare.safetensors")
    pe = sd["pos_embed"].astype("float64")
    # The checkpoint's own grid (4x3), said by a load at its size, travels
    # in our writer's metadata.
    native = kr.load_checkpoint(path, num_heads=2, image_size=(32, 24))
    kr.export.timm_state_dict(native, tmp_path / "ours.safetensors")  # records img_size
    model = kr.load_checkpoint(tmp_path / "ours.safetensors", num_heads=2, image_size=(48, 16),
                               posemb_resampling="bilinear")
    got = to_np(model.get_layer("pos_embedding").embedding)
    assert got.shape == (1, 1 + 12, 32)
    np.testing.assert_allclose(got[0, 0], pe[0, 0], atol=1e-6)
    want = np_bilinear(pe[0, 1:].reshape(4, 3, 32), (6, 2)).reshape(12, 32)
    np.testing.assert_allclose(got[0, 1:], want, atol=1e-5)
    swapped = np_bilinear(pe[0, 1:].reshape(3, 4, 32), (2, 6)).reshape(12, 32)
    assert np.abs(swapped - want).max() > 0.05
    torch = pytest.importorskip("torch")
    bicubic = kr.load_checkpoint(tmp_path / "ours.safetensors", num_heads=2, image_size=(48, 16),
                                 posemb_resampling="bicubic")
    grid = torch.from_numpy(pe[0, 1:].reshape(1, 4, 3, 32).transpose(0, 3, 1, 2).copy())
    ref = torch.nn.functional.interpolate(grid, size=(6, 2), mode="bicubic", align_corners=False)
    ref = ref.numpy()[0].transpose(1, 2, 0).reshape(12, 32)
    np.testing.assert_allclose(to_np(bicubic.get_layer("pos_embedding").embedding)[0, 1:], ref,
                               atol=1e-5)


def test_a_changed_architecture_is_said_in_one_line_and_init_keeps_the_attention(tmp_path,
                                                                                 capsys):
    """`load_checkpoint(..., attention="relu")` on a softmax checkpoint says
    what changed, from what to what; `kr.build_config(init=...)` (what
    `keras-reluvit train --init` runs) keeps the checkpoint's attention unless
    one is given (the README's fine-tune once swapped in ReLU/L unseen)."""
    from keras_reluvit.training import run as T

    kr.ViT("Ti/16", image_size=32, depth=1, num_classes=4,
           attention="softmax").save(tmp_path / "soft.keras")
    path = str(tmp_path / "soft.keras")
    config = T.build_config(recipe="bv_transfer", dataset="x", init=path)
    assert "attention" not in config["model"]
    kept = C.load_checkpoint(path, **config["model"])
    assert kept.get_config()["attention"] == "softmax"
    assert "changed" not in capsys.readouterr().err
    swapped = T.build_config(recipe="bv_transfer", dataset="x", init=path, attention="relu")
    assert C.load_checkpoint(path, **swapped["model"]).get_config()["attention"] == "relu"
    line = [x for x in capsys.readouterr().err.splitlines() if "changed" in x]
    assert line == ["keras_reluvit: soft.keras: the checkpoint's architecture changed: "
                    "attention 'softmax' -> 'relu'."], line
    # The recipe made for the swap swaps; from scratch the default is ReLU/L.
    assert T.build_config(recipe="relu_from_softmax", init=path)["model"]["attention"] == "relu"
    assert T.build_config()["model"]["attention"] == "relu"
