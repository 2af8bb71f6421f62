"""big_vision / original ViT and AugReg `.npz` files, in and out
(big_vision's `encoderblock_N/MultiHeadDotProductAttention_0` naming, scanned
`encoderblock/...`, `MAPHead_0`; AugReg's `posembed_input` +
`MultiHeadDotProductAttention_1` + `MlpBlock_3`; `opt/target/`, `params/`,
`params/img/` prefixes)."""

import os
import re

import numpy as np

from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import _model_weights
from keras_reluvit.checkpoints.common import _posemb_layout
from keras_reluvit.checkpoints.common import _refuse
from keras_reluvit.checkpoints.common import _require
from keras_reluvit.checkpoints.common import _Weights


_NPZ_PREFIXES = ("opt/target/", "params/img/", "params/")


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as f:
            raw = {k: f[k] for k in f.files}
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable .npz file ({e}); truncated?") from e
    out = {}
    for k, v in raw.items():
        k = k.replace(".", "/")  # some exports join with dots
        for p in _NPZ_PREFIXES:
            if k.startswith(p):
                k = k[len(p):]
                break
        out[k] = v
    return out


def _big_vision(p, path, overrides):
    _require(p, "embedding/kernel", path, "big_vision / ViT .npz")
    used = set()

    def get(key, default=None):
        if key in p:
            used.add(key)
            return p[key]
        if default is not None:
            return default
        raise CheckpointError(f"{path}: missing key {key!r}.")

    scanned = any(k.startswith("Transformer/encoderblock/") for k in p)
    if scanned:
        blocks = None
    else:
        blocks = sorted({int(m.group(1)) for k in p
                         for m in [re.match(r"Transformer/encoderblock_(\d+)/", k)] if m})
    augreg = any("MultiHeadDotProductAttention_1" in k for k in p)
    ln1, ln2, mha, mlp = (
        ("LayerNorm_0", "LayerNorm_2", "MultiHeadDotProductAttention_1", "MlpBlock_3")
        if augreg else
        ("LayerNorm_0", "LayerNorm_1", "MultiHeadDotProductAttention_0", "MlpBlock_0")
    )
    if scanned:
        depth = p[f"Transformer/encoderblock/{ln1}/scale"].shape[0]
    else:
        depth = len(blocks)
        if blocks != list(range(depth)):
            raise CheckpointError(f"{path}: encoder blocks {blocks} are not numbered 0..N-1.")
    if depth == 0:
        raise CheckpointError(f"{path}: no Transformer/encoderblock_N found.")

    def block(i, key):
        if scanned:
            return get(f"Transformer/encoderblock/{key}")[i]
        return get(f"Transformer/encoderblock_{i}/{key}")

    def bkey(i, key):
        return f"Transformer/encoderblock{'' if scanned else '_' + str(i)}/{key}"

    stem = get("embedding/kernel")
    patch, width = stem.shape[0], stem.shape[-1]
    qk = block(0, f"{mha}/query/kernel")
    heads = qk.shape[1]
    class_token = "cls" in p
    map_head = "MAPHead_0/probe" in p
    pool = "map" if map_head else "tok" if class_token else "gap"
    qk_norm = f"{mha}/query_ln/scale" in (
        k.split("/", 2)[-1] for k in p if k.startswith("Transformer/encoderblock"))
    arch = dict(
        width=width, depth=depth, num_heads=heads, patch_size=patch,
        mlp_dim=block(0, f"{mlp}/Dense_0/kernel").shape[-1], pool=pool,
        qk_norm=qk_norm, class_token=class_token, mlp_activation="gelu_tanh",
        representation_size=(p["pre_logits/kernel"].shape[-1]
                              if "pre_logits/kernel" in p else None),
        include_top="head/kernel" in p,
        num_classes=p["head/kernel"].shape[-1] if "head/kernel" in p else 1000,
    )
    w = _Weights()
    w.put("embedding/kernel", stem, "embedding/kernel")
    w.put("embedding/bias", get("embedding/bias"), "embedding/bias")
    if class_token:
        w.put("cls/token", get("cls"), "cls")
    for key in ("pos_embedding", "Transformer/posembed_input/pos_embedding",
                "Transformer/pos_embedding"):
        if key in p:
            pe = get(key)
            covers, n = _posemb_layout(pe.shape[1], int(class_token), path, key)
            arch.update(posemb="learn", posemb_prefix=overrides.get("posemb_prefix", covers),
                        _grid=n)
            w.put("pos_embedding/embedding", pe, key)
            break
    else:
        arch["posemb"] = "sincos2d"

    def norm(ours, key, value=None):
        w.put(f"{ours}/gamma", get(key + "/scale") if value is None else value[0], key + "/scale")
        if value is None:
            w.put(f"{ours}/beta", get(key + "/bias"), key + "/bias")
        elif value[1] is not None:
            w.put(f"{ours}/beta", value[1], key + "/bias")

    def attention(ours, fetch, key):
        for name in ("query", "key", "value", "out"):
            target = "attention_output" if name == "out" else name
            w.put(f"{ours}/{target}/kernel", fetch(f"{name}/kernel"), f"{key}/{name}/kernel")
            w.put(f"{ours}/{target}/bias", fetch(f"{name}/bias"), f"{key}/{name}/bias")

    for i in range(depth):
        o = f"block_{i:02d}/"
        for ours, key in (("norm1", ln1), ("norm2", ln2)):
            norm(o + ours, bkey(i, key), (block(i, key + "/scale"), block(i, key + "/bias")))
        attention(o + "attention", lambda k, i=i: block(i, f"{mha}/{k}"), bkey(i, mha))
        if qk_norm:
            for ours, key in (("query_norm", "query_ln"), ("key_norm", "key_ln")):
                w.put(f"{o}attention/{ours}/gamma", block(i, f"{mha}/{key}/scale"),
                      bkey(i, f"{mha}/{key}/scale"))
        for fc, dense in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            for part in ("kernel", "bias"):
                w.put(f"{o}mlp/{fc}/{part}", block(i, f"{mlp}/{dense}/{part}"),
                      bkey(i, f"{mlp}/{dense}/{part}"))
    norm("encoder_norm", "Transformer/encoder_norm")
    if map_head:
        w.put("map_head/probe", get("MAPHead_0/probe"), "MAPHead_0/probe")
        attention("map_head/attention",
                  lambda k: get(f"MAPHead_0/MultiHeadDotProductAttention_0/{k}"),
                  "MAPHead_0/MultiHeadDotProductAttention_0")
        if qk_norm:
            for ours, key in (("query_norm", "query_ln"), ("key_norm", "key_ln")):
                k = f"MAPHead_0/MultiHeadDotProductAttention_0/{key}/scale"
                w.put(f"map_head/attention/{ours}/gamma", get(k), k)
        norm("map_head/norm", "MAPHead_0/LayerNorm_0")
        for fc, dense in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            for part in ("kernel", "bias"):
                k = f"MAPHead_0/MlpBlock_0/{dense}/{part}"
                w.put(f"map_head/mlp/{fc}/{part}", get(k), k)
    for name in ("pre_logits", "head"):
        if f"{name}/kernel" in p:
            for part in ("kernel", "bias"):
                w.put(f"{name}/{part}", get(f"{name}/{part}"), f"{name}/{part}")
    _refuse(path, set(p) - used)
    return arch, w


def big_vision_npz(model, path=None):
    """The ViT's weights in big_vision's `vit.py` naming (`.npz`).

    `pos_embedding` (patches only when `posemb_prefix=False`, else AugReg's
    `Transformer/posembed_input/pos_embedding`), `cls`,
    `Transformer/encoderblock_N/{LayerNorm_0, MultiHeadDotProductAttention_0,
    LayerNorm_1, MlpBlock_0}`, `Transformer/encoder_norm`, `MAPHead_0`,
    `pre_logits`, `head`; qk-norm as Flax's `query_ln` / `key_ln`. Returns the
    `{key: array}` dict and writes it to `path` (`np.savez`) when given.
    """
    cfg = model.get_config()
    unsupported = [k for k in ("num_register_tokens", "layer_scale", "fc_norm") if cfg[k]]
    if cfg["qk_norm"] == "affine":
        unsupported.append("qk_norm='affine'")
    if cfg["class_token"] and cfg["pool"] != "tok":
        unsupported.append("class_token with pool!='tok'")
    if unsupported:
        raise ValueError(f"big_vision's ViT has no {', '.join(unsupported)}.")
    w = _model_weights(model)
    out = {"embedding/kernel": w["embedding/kernel"], "embedding/bias": w["embedding/bias"]}
    if cfg["class_token"]:
        out["cls"] = w["cls/token"]
    if cfg["posemb"] == "learn":
        key = ("Transformer/posembed_input/pos_embedding" if model.posemb_prefix_tokens
               else "pos_embedding")
        out[key] = w["pos_embedding/embedding"]

    def attention(key, ours):
        for name, target in (("query", "query"), ("key", "key"), ("value", "value"),
                             ("out", "attention_output")):
            out[f"{key}/{name}/kernel"] = w[f"{ours}/{target}/kernel"]
            out[f"{key}/{name}/bias"] = w[f"{ours}/{target}/bias"]
        if cfg["qk_norm"]:
            out[f"{key}/query_ln/scale"] = w[f"{ours}/query_norm/gamma"]
            out[f"{key}/key_ln/scale"] = w[f"{ours}/key_norm/gamma"]

    def norm(key, ours):
        out[key + "/scale"], out[key + "/bias"] = w[ours + "/gamma"], w[ours + "/beta"]

    def mlp(key, ours):
        for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2")):
            out[f"{key}/{dense}/kernel"] = w[f"{ours}/{fc}/kernel"]
            out[f"{key}/{dense}/bias"] = w[f"{ours}/{fc}/bias"]

    for i in range(cfg["depth"]):
        b, o = f"Transformer/encoderblock_{i}/", f"block_{i:02d}/"
        norm(b + "LayerNorm_0", o + "norm1")
        attention(b + "MultiHeadDotProductAttention_0", o + "attention")
        norm(b + "LayerNorm_1", o + "norm2")
        mlp(b + "MlpBlock_0", o + "mlp")
    norm("Transformer/encoder_norm", "encoder_norm")
    if cfg["pool"] == "map":
        out["MAPHead_0/probe"] = w["map_head/probe"]
        attention("MAPHead_0/MultiHeadDotProductAttention_0", "map_head/attention")
        norm("MAPHead_0/LayerNorm_0", "map_head/norm")
        mlp("MAPHead_0/MlpBlock_0", "map_head/mlp")
    for name in ("pre_logits", "head"):
        if f"{name}/kernel" in w:
            out[f"{name}/kernel"], out[f"{name}/bias"] = w[f"{name}/kernel"], w[f"{name}/bias"]
    if path is not None:
        np.savez(os.fspath(path), **out)
    return out
