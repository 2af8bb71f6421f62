"""big_vision / original ViT and AugReg `.npz` files, in and out
(big_vision's `encoderblock_N/MultiHeadDotProductAttention_0` naming, scanned
`encoderblock/...`, `MAPHead_0`; AugReg's `posembed_input` +
`MultiHeadDotProductAttention_1` + `MlpBlock_3`; `opt/target/`, `params/`,
`params/img/` prefixes)."""

import os
import re

import numpy as np

from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import WeightReader
from keras_reluvit.checkpoints.common import model_weights
from keras_reluvit.checkpoints.common import posemb_layout
from keras_reluvit.checkpoints.common import refuse
from keras_reluvit.checkpoints.common import require
from keras_reluvit.preprocessing import imagenet1k_labels

_NPZ_PREFIXES = ("opt/target/", "params/img/", "params/")


def detect(path):
    """An `.npz` file, or a zip archive of `.npy` arrays under another name."""
    import zipfile

    if not os.path.isfile(path):
        return False
    if path.lower().endswith(".npz"):
        return True
    return zipfile.is_zipfile(path) and any(
        n.endswith(".npy") for n in zipfile.ZipFile(path).namelist())


def read(path, overrides):
    return _big_vision(_read_npz(path), path, overrides)


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


def _block_names(augreg):
    """A block's parts: (LayerNorm before attention, LayerNorm before the MLP,
    attention, MLP), in big_vision's naming or AugReg's."""
    if augreg:
        return "LayerNorm_0", "LayerNorm_2", "MultiHeadDotProductAttention_1", "MlpBlock_3"
    return "LayerNorm_0", "LayerNorm_1", "MultiHeadDotProductAttention_0", "MlpBlock_0"


def name_map(arch, augreg=False):
    """The one name map of the big_vision layout for a ViT config `arch`:
    `(top, per_block)`, lists of `(npz key, our variable path)`; block keys
    are relative to `Transformer/encoderblock_N/` (or the scanned
    `Transformer/encoderblock/`, a leading layer axis) and our paths to
    `block_NN/`. AugReg's files name the block's parts differently
    (`augreg=True`). The reader and `big_vision_npz` both walk it (the
    position embedding, whose key depends on the file, apart)."""
    ln1, ln2, mha, mlp = _block_names(augreg)

    def attention(key, ours):
        pairs = [(f"{key}/{name}/{part}", f"{ours}/{target}/{part}")
                 for name, target in (("query", "query"), ("key", "key"), ("value", "value"),
                                      ("out", "attention_output"))
                 for part in ("kernel", "bias")]
        if arch.get("qk_norm"):
            pairs += [(f"{key}/query_ln/scale", f"{ours}/query_norm/gamma"),
                      (f"{key}/key_ln/scale", f"{ours}/key_norm/gamma")]
        return pairs

    def norm(key, ours):
        return [(key + "/scale", ours + "/gamma"), (key + "/bias", ours + "/beta")]

    def mlp_pairs(key, ours):
        return [(f"{key}/{dense}/{part}", f"{ours}/{fc}/{part}")
                for dense, fc in (("Dense_0", "fc1"), ("Dense_1", "fc2"))
                for part in ("kernel", "bias")]

    per_block = (norm(ln1, "norm1") + attention(mha, "attention") + norm(ln2, "norm2")
                 + mlp_pairs(mlp, "mlp"))
    top = [("embedding/kernel", "embedding/kernel"), ("embedding/bias", "embedding/bias")]
    if arch.get("class_token"):
        top.append(("cls", "cls/token"))
    top += norm("Transformer/encoder_norm", "encoder_norm")
    if arch.get("pool") == "map":
        top.append(("MAPHead_0/probe", "map_head/probe"))
        top += attention("MAPHead_0/MultiHeadDotProductAttention_0", "map_head/attention")
        top += norm("MAPHead_0/LayerNorm_0", "map_head/norm")
        top += mlp_pairs("MAPHead_0/MlpBlock_0", "map_head/mlp")
    if arch.get("representation_size"):
        top += [("pre_logits/kernel", "pre_logits/kernel"), ("pre_logits/bias", "pre_logits/bias")]
    if arch.get("include_top"):
        top += [("head/kernel", "head/kernel"), ("head/bias", "head/bias")]
    return top, per_block


def _big_vision(p, path, overrides):
    require(p, "embedding/kernel", path, "big_vision / ViT .npz")
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
    ln1, _, mha, mlp = _block_names(augreg)
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
    w = WeightReader()
    for key in ("pos_embedding", "Transformer/posembed_input/pos_embedding",
                "Transformer/pos_embedding"):
        if key in p:
            pe = get(key)
            covers, n = posemb_layout(pe.shape[1], int(class_token), path, key)
            arch.update(posemb="learn", posemb_prefix=overrides.get("posemb_prefix", covers),
                        _grid=n)
            w.put("pos_embedding/embedding", pe, key)
            break
    else:
        arch["posemb"] = "sincos2d"
    top, per_block = name_map(arch, augreg=augreg)
    for key, ours in top:
        w.put(ours, get(key), key)
    for i in range(depth):
        for key, ours in per_block:
            w.put(f"block_{i:02d}/{ours}", block(i, key), bkey(i, key))
    refuse(path, set(p) - used)
    # big_vision's evaluation: resize_small(256) | central_crop(224) (area),
    # value_range(-1, 1): our default recipe.
    arch["preprocessing"] = None
    if arch.get("include_top") and arch.get("num_classes") == 1000:
        arch["label_names"] = imagenet1k_labels()
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
    unsupported = [k for k in ("num_register_tokens", "layer_scale", "fc_norm", "pre_norm")
                   if cfg[k]]
    if cfg["pool"] == "tok_gap":
        unsupported.append("pool='tok_gap'")
    if cfg["qk_norm"] == "affine":
        unsupported.append("qk_norm='affine'")
    if cfg["class_token"] and cfg["pool"] != "tok":
        unsupported.append("class_token with pool!='tok'")
    if unsupported:
        raise ValueError(f"big_vision's ViT has no {', '.join(unsupported)}.")
    w = model_weights(model)
    out = {}
    if cfg["posemb"] == "learn":
        key = ("Transformer/posembed_input/pos_embedding" if model.posemb_prefix_tokens
               else "pos_embedding")
        out[key] = w["pos_embedding/embedding"]
    top, per_block = name_map(cfg)
    out.update((key, w[ours]) for key, ours in top)
    for i in range(cfg["depth"]):
        out.update((f"Transformer/encoderblock_{i}/{key}", w[f"block_{i:02d}/{ours}"])
                   for key, ours in per_block)
    if path is not None:
        np.savez(os.fspath(path), **out)
    return out
