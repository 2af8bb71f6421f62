"""Pretrained checkpoints in and out: timm, big_vision / AugReg, keras-hub.

`load_checkpoint(path)` reads the architecture from the checkpoint itself and
returns a `ViT` holding its weights. The format is detected from the file:

- timm `VisionTransformer` state dicts: `.safetensors` (read with the
  `safetensors` package, no torch needed) or `.pth` / `.pt` / `.bin`
  (`torch.load(weights_only=True)`);
- big_vision / original ViT and AugReg `.npz` files (big_vision's
  `pos_embedding` + `encoderblock_N/MultiHeadDotProductAttention_0` naming,
  scanned `encoderblock/...` with a leading layer axis, `MAPHead_0`; the
  AugReg `posembed_input` + `MultiHeadDotProductAttention_1` + `MlpBlock_3`
  naming; `opt/target/`, `params/`, `params/img/` prefixes);
- keras-hub `ViTBackbone` / `ViTImageClassifier` preset directories
  (`config.json` + `model.weights.h5`, `task.json` + `task.weights.h5`);
- our own presets (`ViT.save_to_preset`), `.keras` and `.weights.h5` files.

Every reader produces the `ViT` arguments and a `{variable path: array}` map;
loading then checks both ways (a checkpoint key the ViT cannot hold, a weight
the checkpoint lacks, a shape that does not fit) before any weight is
assigned, so a bad file raises an error naming the file and the key and
nothing is half-loaded. A checkpoint at another resolution is resampled to
`image_size` (bilinear position embedding, prefix tokens kept).

The other way, `timm_state_dict(model, "x.safetensors")` and
`big_vision_npz(model, "x.npz")` write a ViT in those layouts.
"""

import datetime
import json
import math
import os
import re
import zipfile

import keras
import numpy as np

from keras_reluvit import vit as V
from keras_reluvit._version import __version__
from keras_reluvit.presets import deserialize_attention
from keras_reluvit.layers import resample_posemb

# Widths of the standard variants -> heads (timm state dicts store no head
# count; the tables of big_vision / timm name one per width).
_HEADS_BY_WIDTH = {}
for _w, _d, _m, _h in V.VARIANTS.values():
    _HEADS_BY_WIDTH.setdefault(_w, _h)

PRESET_CONFIG = "config.json"
PRESET_WEIGHTS = "model.weights.h5"
PRESET_METADATA = "metadata.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read into a ViT (names file and key)."""


# ----------------------------------------------------------------- helpers
class _Weights(dict):
    """`{our variable path: (array, source key)}` built by a reader."""

    def put(self, path, value, key):
        self[path] = (np.asarray(value, dtype="float32"), key)


def _square_grid(n, what, path):
    side = int(round(math.sqrt(n)))
    if side * side != n:
        raise CheckpointError(
            f"{path}: {what} holds {n} patch positions, not a square grid; "
            "pass image_size=(h, w) matching the checkpoint's grid."
        )
    return side


def _variant_name(width, patch):
    for name, (w, *_rest) in V.VARIANTS.items():
        if w == width:
            return f"{name}/{patch}"
    return f"B/{patch}"  # every dimension is passed explicitly anyway


def _posemb_layout(num_positions, num_prefix, path, key):
    """Whether the position embedding has rows for the prefix tokens:
    `(covers_prefix, num_patches)`."""
    def square(n):
        return n > 0 and int(round(math.sqrt(n))) ** 2 == n

    with_prefix = square(num_positions - num_prefix) if num_prefix else False
    without = square(num_positions)
    if num_prefix and with_prefix and not without:
        return True, num_positions - num_prefix
    if without and not with_prefix:
        return False, num_positions
    if not num_prefix:
        return False, num_positions
    raise CheckpointError(
        f"{path}: cannot tell whether {key} {num_positions} rows include the "
        f"{num_prefix} class/register token(s); pass posemb_prefix=True or False."
    )


# ------------------------------------------------------------------- timm
_TIMM_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")
_TIMM_BLOCK_KEYS = {
    "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
    "attn.q_norm.weight", "attn.q_norm.bias", "attn.k_norm.weight",
    "attn.k_norm.bias", "attn.proj.weight", "attn.proj.bias", "ls1.gamma",
    "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
    "mlp.fc2.weight", "mlp.fc2.bias", "ls2.gamma",
}
_TIMM_TOP_KEYS = {
    "cls_token", "reg_token", "pos_embed", "patch_embed.proj.weight",
    "patch_embed.proj.bias", "norm.weight", "norm.bias", "fc_norm.weight",
    "fc_norm.bias", "head.weight", "head.bias", "pre_logits.fc.weight",
    "pre_logits.fc.bias", "attn_pool.latent", "attn_pool.q.weight",
    "attn_pool.q.bias", "attn_pool.kv.weight", "attn_pool.kv.bias",
    "attn_pool.proj.weight", "attn_pool.proj.bias", "attn_pool.norm.weight",
    "attn_pool.norm.bias", "attn_pool.mlp.fc1.weight", "attn_pool.mlp.fc1.bias",
    "attn_pool.mlp.fc2.weight", "attn_pool.mlp.fc2.bias",
}


def _read_timm_file(path):
    ext = os.path.splitext(path)[1].lower()
    if ext == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError as e:  # pragma: no cover - a dependency of ours
            raise ImportError(
                f"Reading {path} needs the `safetensors` package: "
                "pip install safetensors") from e
        try:
            return dict(load_file(path))
        except Exception as e:
            raise CheckpointError(
                f"{path}: not a readable safetensors file ({e}); truncated?") from e
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"{path} is a PyTorch checkpoint; reading it needs torch (pip install "
            "torch, or convert it to .safetensors). .safetensors files need no torch."
        ) from e
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"{path}: not a readable PyTorch checkpoint ({e}); truncated?") from e
    for wrapper in ("state_dict", "model", "model_ema", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict.")
    out = {}
    for k, v in obj.items():
        if hasattr(v, "detach"):
            out[k[7:] if k.startswith("module.") else k] = v.detach().float().numpy()
    return out


def _require(keys, key, path, what):
    """The format's tell-tale key, or an error saying the file is not one."""
    if key not in keys:
        raise CheckpointError(f"{path}: not a {what} (no {key!r}); its keys start "
                              f"{sorted(keys)[:6]}.")


def _refuse(path, keys, hint=""):
    """Checkpoint keys the ViT cannot express: an error, never a partial load."""
    if keys:
        raise CheckpointError(
            f"{path}: keys outside what keras_reluvit.ViT expresses: {sorted(keys)[:12]}"
            f"{' ...' if len(keys) > 12 else ''}{hint}.")


def _timm(sd, path, overrides):
    _require(sd, "patch_embed.proj.weight", path, "timm VisionTransformer state dict")
    _refuse(path, [
        k for k in sd
        if k not in _TIMM_TOP_KEYS
        and not (_TIMM_BLOCK.fullmatch(k) and _TIMM_BLOCK.fullmatch(k).group(2) in _TIMM_BLOCK_KEYS)
    ], " (e.g. norm_pre, patch_embed.norm, SwiGLU MLPs, distillation tokens, RoPE are not "
       "supported)")
    proj = sd["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[1] != 3 or proj.shape[2] != proj.shape[3]:
        raise CheckpointError(
            f"{path}: patch_embed.proj.weight has shape {proj.shape}; expected "
            "(width, 3, patch, patch).")
    width, patch = proj.shape[0], proj.shape[2]
    depth = 1 + max([int(_TIMM_BLOCK.fullmatch(k).group(1)) for k in sd
                     if _TIMM_BLOCK.fullmatch(k)] or [-1])
    if depth == 0:
        raise CheckpointError(f"{path}: no transformer blocks (blocks.N.*) found.")
    qn = sd.get("blocks.0.attn.q_norm.weight")
    if "num_heads" in overrides:
        heads = int(overrides["num_heads"])
    elif qn is not None:
        heads = width // qn.shape[0]
    elif width in _HEADS_BY_WIDTH:
        heads = _HEADS_BY_WIDTH[width]
    else:
        raise CheckpointError(
            f"{path}: a timm state dict does not store the number of heads and width "
            f"{width} is not a standard variant width ({sorted(_HEADS_BY_WIDTH)}); "
            "pass num_heads=."
        )
    if width % heads:
        raise CheckpointError(f"{path}: width {width} is not divisible by num_heads {heads}.")
    dh = width // heads
    class_token = "cls_token" in sd
    regs = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    prefix = int(class_token) + regs
    has_fc_norm = "fc_norm.weight" in sd
    if has_fc_norm and "norm.weight" in sd:
        raise CheckpointError(f"{path}: holds both 'norm' and 'fc_norm'; the ViT has one final norm.")
    if "attn_pool.latent" in sd:
        pool = "map"
        if sd["attn_pool.latent"].shape[1] != 1:
            raise CheckpointError(f"{path}: attn_pool.latent with more than one latent "
                                  "query is not supported.")
    elif has_fc_norm:
        pool = "gap"
    elif class_token:
        pool = "tok"
    else:
        pool = "gap"
    qk_norm = False
    if qn is not None:
        if "blocks.0.attn.q_norm.bias" not in sd:
            raise CheckpointError(f"{path}: attn.q_norm without a bias (RMSNorm?) is not supported.")
        qk_norm = "affine"
        if pool == "map":
            raise CheckpointError(f"{path}: qk-norm blocks with a MAP head without qk-norm "
                                  "are not supported.")
    arch = dict(
        width=width, depth=depth, num_heads=heads, patch_size=patch,
        mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0], pool=pool, posemb="learn",
        qk_norm=qk_norm, class_token=class_token, num_register_tokens=regs,
        fc_norm=has_fc_norm, mlp_activation="gelu",
        layer_scale=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        representation_size=(sd["pre_logits.fc.weight"].shape[0]
                             if "pre_logits.fc.weight" in sd else None),
        include_top="head.weight" in sd,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 1000,
    )
    w = _Weights()
    w.put("embedding/kernel", proj.transpose(2, 3, 1, 0), "patch_embed.proj.weight")
    w.put("embedding/bias", sd.get("patch_embed.proj.bias", np.zeros(width)),
          "patch_embed.proj.bias")
    if class_token:
        w.put("cls/token", sd["cls_token"], "cls_token")
    if regs:
        w.put("reg/token", sd["reg_token"], "reg_token")
    if "pos_embed" not in sd:
        raise CheckpointError(f"{path}: no pos_embed (models without an absolute "
                              "position embedding are not supported).")
    covers, n = _posemb_layout(sd["pos_embed"].shape[1], prefix, path, "pos_embed")
    arch["posemb_prefix"] = overrides.get("posemb_prefix", covers)
    arch["_grid"] = n
    w.put("pos_embedding/embedding", sd["pos_embed"], "pos_embed")

    def dense(ours, key, weight, bias, shape=None, bias_shape=None):
        kernel = weight.T if shape is None else weight.T.reshape(shape)
        w.put(f"{ours}/kernel", kernel, key + ".weight")
        if bias is None:
            bias = np.zeros(weight.shape[0])
        w.put(f"{ours}/bias", bias if bias_shape is None else bias.reshape(bias_shape),
              key + ".bias")

    def norm(ours, key):
        w.put(f"{ours}/gamma", sd[key + ".weight"], key + ".weight")
        w.put(f"{ours}/beta", sd[key + ".bias"], key + ".bias")

    def attention(ours, q, qb, k, kb, v, vb, key_q, key_k, key_v, proj_key):
        for name, m, b, key in (("query", q, qb, key_q), ("key", k, kb, key_k),
                                ("value", v, vb, key_v)):
            w.put(f"{ours}/{name}/kernel", m.T.reshape(width, heads, dh), key + ".weight")
            b = np.zeros(width) if b is None else b
            w.put(f"{ours}/{name}/bias", b.reshape(heads, dh), key + ".bias")
        dense(f"{ours}/attention_output", proj_key, sd[proj_key + ".weight"],
              sd.get(proj_key + ".bias"), shape=(heads, dh, width))

    for i in range(depth):
        b, o = f"blocks.{i}.", f"block_{i:02d}/"
        qkv = sd[b + "attn.qkv.weight"]
        if qkv.shape != (3 * width, width):
            raise CheckpointError(f"{path}: {b}attn.qkv.weight has shape {qkv.shape}, "
                                  f"expected {(3 * width, width)}.")
        qkvb = sd.get(b + "attn.qkv.bias")
        qb, kb, vb = (None,) * 3 if qkvb is None else np.split(qkvb, 3)
        q, k, v = np.split(qkv, 3)
        key = b + "attn.qkv"
        attention(o + "attention", q, qb, k, kb, v, vb, key, key, key, b + "attn.proj")
        if qk_norm:
            norm(o + "attention/query_norm", b + "attn.q_norm")
            norm(o + "attention/key_norm", b + "attn.k_norm")
        norm(o + "norm1", b + "norm1")
        norm(o + "norm2", b + "norm2")
        for fc in ("fc1", "fc2"):
            dense(o + f"mlp/{fc}", b + f"mlp.{fc}", sd[b + f"mlp.{fc}.weight"],
                  sd.get(b + f"mlp.{fc}.bias"))
        if arch["layer_scale"] is not None:
            w.put(o + "ls1", sd[b + "ls1.gamma"], b + "ls1.gamma")
            w.put(o + "ls2", sd[b + "ls2.gamma"], b + "ls2.gamma")
    norm("encoder_norm", "fc_norm" if has_fc_norm else "norm")
    if pool == "map":
        kv = sd["attn_pool.kv.weight"]
        kvb = sd.get("attn_pool.kv.bias")
        kb, vb = (None, None) if kvb is None else np.split(kvb, 2)
        k, v = np.split(kv, 2)
        w.put("map_head/probe", sd["attn_pool.latent"], "attn_pool.latent")
        attention("map_head/attention", sd["attn_pool.q.weight"], sd.get("attn_pool.q.bias"),
                  k, kb, v, vb, "attn_pool.q", "attn_pool.kv", "attn_pool.kv",
                  "attn_pool.proj")
        norm("map_head/norm", "attn_pool.norm")
        for fc in ("fc1", "fc2"):
            key = f"attn_pool.mlp.{fc}"
            dense(f"map_head/mlp/{fc}", key, sd[key + ".weight"], sd.get(key + ".bias"))
    if arch["representation_size"]:
        dense("pre_logits", "pre_logits.fc", sd["pre_logits.fc.weight"],
              sd.get("pre_logits.fc.bias"))
    if arch["include_top"]:
        dense("head", "head", sd["head.weight"], sd.get("head.bias"))
    return arch, w


# ------------------------------------------------------ big_vision / AugReg
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


# -------------------------------------------------------------- keras-hub
def _read_h5_vars(path):
    """`{h5 dataset path: array}` of a Keras `.weights.h5` file."""
    import h5py

    out = {}
    try:
        with h5py.File(path, "r") as f:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[name] = obj[()]
            f.visititems(visit)
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable Keras weights file ({e}); truncated?") from e
    return out


def _keras_hub(directory, config, path):
    """A keras-hub ViTBackbone (+ ViTImageClassifier) preset directory.

    Variables are read from the `.weights.h5` files by the attribute paths of
    keras-hub's ViT layers (`vi_t_encoder_block{_i}/mha/query_dense`, ...);
    missing biases (`use_mha_bias=False` etc.) load as zeros, which is exact.
    """
    cfg = config["config"]
    for key in ("image_shape", "patch_size", "num_layers", "num_heads", "hidden_dim",
                "mlp_dim"):
        if key not in cfg:
            raise CheckpointError(f"{path}: keras-hub ViTBackbone config lacks {key!r}.")
    if cfg.get("use_class_token", True) is False:
        raise CheckpointError(f"{path}: keras-hub ViTs without a class token are not supported.")
    if cfg.get("data_format", "channels_last") == "channels_first":
        raise CheckpointError(f"{path}: channels_first keras-hub ViTs are not supported.")
    patch = cfg["patch_size"]
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    image = cfg["image_shape"]
    width, heads, depth = cfg["hidden_dim"], cfg["num_heads"], cfg["num_layers"]
    arch = dict(
        width=width, depth=depth, num_heads=heads, patch_size=patch,
        mlp_dim=cfg["mlp_dim"], pool="tok", posemb="learn", qk_norm=False,
        class_token=True, posemb_prefix=True, mlp_activation="gelu",
        layer_norm_epsilon=cfg.get("layer_norm_epsilon", 1e-6),
        image_size=tuple(image[:2]), include_top=False, num_classes=1000,
        _native_grid=(image[0] // patch, image[1] // patch),
    )
    weights_file = os.path.join(directory, "model.weights.h5")
    raw = _read_h5_vars(weights_file)
    w = _Weights()

    def take(ours, key, shape=None, optional=False):
        if key not in raw:
            if optional:
                w.put(ours, np.zeros(shape), key + " (absent: zeros)")
                return
            raise CheckpointError(
                f"{weights_file}: missing {key!r}; not a keras-hub ViTBackbone "
                f"(its variables start {sorted(raw)[:3]}).")
        w.put(ours, raw[key], key)

    emb = "layers/vi_t_patching_and_embedding/"
    take("embedding/kernel", emb + "patch_embedding/vars/0")
    take("embedding/bias", emb + "patch_embedding/vars/1", (width,), optional=True)
    take("cls/token", emb + "vars/0")
    take("pos_embedding/embedding", emb + "position_embedding/vars/0")
    w["pos_embedding/embedding"] = (w["pos_embedding/embedding"][0][None],
                                    w["pos_embedding/embedding"][1])
    for i in range(depth):
        blk = f"layers/vi_t_encoder/encoder_layers/vi_t_encoder_block{'_' + str(i) if i else ''}/"
        o = f"block_{i:02d}/"
        for ours, name in (("norm1", "layer_norm_1"), ("norm2", "layer_norm_2")):
            take(o + ours + "/gamma", blk + name + "/vars/0")
            take(o + ours + "/beta", blk + name + "/vars/1")
        for ours, name in (("query", "query_dense"), ("key", "key_dense"),
                           ("value", "value_dense"), ("attention_output", "output_dense")):
            take(o + f"attention/{ours}/kernel", blk + f"mha/{name}/vars/0")
            shape = (width,) if ours == "attention_output" else (heads, width // heads)
            take(o + f"attention/{ours}/bias", blk + f"mha/{name}/vars/1", shape, optional=True)
        for ours, name, n in (("fc1", "dense_1", cfg["mlp_dim"]), ("fc2", "dense_2", width)):
            take(o + f"mlp/{ours}/kernel", blk + f"mlp/{name}/vars/0")
            take(o + f"mlp/{ours}/bias", blk + f"mlp/{name}/vars/1", (n,), optional=True)
    take("encoder_norm/gamma", "layers/vi_t_encoder/layer_norm/vars/0")
    take("encoder_norm/beta", "layers/vi_t_encoder/layer_norm/vars/1")
    extra = sorted(set(raw) - {key for _, key in w.values()})
    if extra:
        raise CheckpointError(f"{weights_file}: variables outside keras-hub's ViTBackbone "
                              f"layout: {extra[:8]}.")
    task_file = os.path.join(directory, "task.json")
    if os.path.exists(task_file):
        with open(task_file) as f:
            task = json.load(f).get("config", {})
        if task.get("pooling", "token") != "token":
            raise CheckpointError(
                f"{path}: keras-hub pooling={task.get('pooling')!r} averages the class token "
                "with the patches; the ViT's 'gap' skips it. Only pooling='token' loads "
                "exactly (or pass num_classes=0 for the backbone's features).")
        if task.get("activation") not in (None, "linear"):
            raise CheckpointError(f"{path}: a classifier head with activation "
                                  f"{task.get('activation')!r}; logits heads only.")
        raw = _read_h5_vars(os.path.join(directory, "task.weights.h5"))
        dense = ["layers/dense/vars/", "layers/dense_1/vars/"]
        if task.get("intermediate_dim"):
            arch["representation_size"] = task["intermediate_dim"]
            w.put("pre_logits/kernel", raw[dense[0] + "0"], dense[0] + "0")
            w.put("pre_logits/bias", raw[dense[0] + "1"], dense[0] + "1")
            dense = dense[1:]
        arch.update(include_top=True, num_classes=task["num_classes"])
        w.put("head/kernel", raw[dense[0] + "0"], dense[0] + "0")
        w.put("head/bias", raw[dense[0] + "1"], dense[0] + "1")
    return arch, w


# ----------------------------------------------------------- our formats
def _ours(model):
    arch = model.get_config()
    arch.pop("name", None)
    arch.pop("trainable", None)
    w = _Weights()
    for key, value in _model_weights(model).items():
        w.put(key, value, key)
    arch["_native_grid"] = model.grid_size
    return arch, w


def _read_preset(directory, path):
    with open(os.path.join(directory, PRESET_CONFIG)) as f:
        config = json.load(f)
    registered = str(config.get("registered_name", ""))
    if registered.startswith("keras_hub>") or str(config.get("module", "")).startswith("keras_hub"):
        if config.get("class_name") not in ("ViTBackbone",):
            raise CheckpointError(
                f"{path}: a keras-hub {config.get('class_name')} preset, not a ViTBackbone.")
        return _keras_hub(directory, config, path)
    if config.get("class_name") != "ViT":
        raise CheckpointError(f"{path}: {PRESET_CONFIG} describes a "
                              f"{config.get('class_name')!r}, not a ViT.")
    model = V.ViT.from_config(config["config"])
    weights = os.path.join(directory, PRESET_WEIGHTS)
    try:
        model.load_weights(weights)
    except Exception as e:
        raise CheckpointError(f"{weights}: cannot load into the preset's ViT ({e}).") from e
    return _ours(model)


def detect_format(path):
    """The checkpoint format of `path`: `"timm"`, `"big_vision"`,
    `"keras_hub"`, `"preset"`, `"keras"` or `"weights_h5"`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        cfg = os.path.join(path, PRESET_CONFIG)
        if not os.path.exists(cfg):
            raise CheckpointError(f"{path}: a directory without {PRESET_CONFIG}; not a preset.")
        with open(cfg) as f:
            text = f.read()
        return "keras_hub" if "keras_hub" in text else "preset"
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    lower = path.lower()
    if lower.endswith(".safetensors"):
        return "timm"
    if lower.endswith((".pth", ".pt", ".bin")):
        return "timm"
    if lower.endswith(".npz"):
        return "big_vision"
    if lower.endswith(".keras"):
        return "keras"
    if lower.endswith(".h5"):
        return "weights_h5"
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89HDF"):
        return "weights_h5"
    if zipfile.is_zipfile(path):
        names = zipfile.ZipFile(path).namelist()
        if any(n.endswith(".npy") for n in names):
            return "big_vision"
        if "config.json" in names:
            return "keras"
        return "timm"  # torch's zip format
    raise CheckpointError(
        f"{path}: unknown checkpoint format; expected .safetensors / .pth / .bin "
        "(timm), .npz (big_vision, AugReg), a preset directory, .keras or .weights.h5."
    )


def read_checkpoint(path, **overrides):
    """`(arch, weights, format)`: the ViT arguments read from `path` and a
    `{variable path: (array, source key)}` map. Mostly internal; see
    `load_checkpoint`."""
    path = os.fspath(path)
    fmt = detect_format(path)
    if fmt == "timm":
        arch, w = _timm(_read_timm_file(path), path, overrides)
    elif fmt == "big_vision":
        arch, w = _big_vision(_read_npz(path), path, overrides)
    elif fmt in ("keras_hub", "preset"):
        arch, w = _read_preset(path, path)
    elif fmt == "keras":
        try:
            model = keras.saving.load_model(path, compile=False)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot load the .keras file ({e}).") from e
        if not isinstance(model, V.ViT):
            raise CheckpointError(f"{path} does not hold a keras_reluvit ViT.")
        arch, w = _ours(model)
    else:
        raise CheckpointError(
            f"{path}: a .weights.h5 file stores no architecture; build the model and "
            "call model.load_weights / kr.load_weights(model, path), or save a preset.")
    return arch, w, fmt


# Weights a loaded model may lack in the checkpoint (new parts of an
# attention preset: the gate of "relu_gated", the scales of "relu_learned").
_FRESH_OK = re.compile(r".*attention/(gate|log_scale).*")


def load_checkpoint(path, attention=None, num_classes=None, image_size=None,
                    **overrides):
    """Builds a `ViT` from a pretrained checkpoint, architecture and weights.

    Args:
        path: a timm `.safetensors` / `.pth` / `.bin` state dict, a big_vision
            or AugReg `.npz`, a keras-hub ViT preset directory, a
            keras_reluvit preset directory or `.keras` file. The format is
            detected from the file.
        attention: the attention of the returned model. Default: the
            checkpoint's own, i.e. `"softmax"` for timm, big_vision and
            keras-hub (what every public checkpoint was trained with) and the
            stored one for our presets and `.keras` files. `"relu"` loads the
            same weights into ReLU/L attention, the start of a
            softmax -> ReLU/L fine-tune (see the `relu_from_softmax` recipe).
        num_classes: None keeps the checkpoint's head; another number gives a
            fresh zero-initialised head of that size; 0 returns pooled
            features (no head).
        image_size: None keeps the checkpoint's resolution; another size
            resamples the learned position embedding (bilinear, prefix tokens
            kept), e.g. a 384 px AugReg checkpoint into a 224 px model.
        **overrides: any other `ViT` argument, for values a checkpoint does not
            store or to change them: `num_heads` (timm state dicts store no
            head count; standard widths are inferred), `mlp_activation`
            (`"gelu"` exact for timm / keras-hub, `"gelu_tanh"` for big_vision,
            as each source trained), `layer_norm_epsilon`, `pool`, `dropout`,
            `dtype`, `name`.

    Returns:
        A `keras_reluvit.ViT` (float images in [-1, 1], NHWC, as every ViT
        here). Inputs are not normalised by the model: AugReg / big_vision
        checkpoints expect [-1, 1]; timm checkpoints trained with ImageNet
        mean/std need `keras_reluvit.checkpoints.fold_input_normalization`.

    Example:

    ```python
    import keras_reluvit as kr
    model = kr.load_checkpoint("vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors")
    relu = kr.load_checkpoint("S_16-i21k-300ep.npz", attention="relu", num_classes=10,
                              image_size=224)
    ```
    """
    path = os.fspath(path)
    arch, weights, fmt = read_checkpoint(path, **overrides)
    return _build(arch, weights, fmt, path, attention, num_classes, image_size, overrides)


def _build(arch, weights, fmt, path, attention, num_classes, image_size, overrides):
    arch = dict(arch)
    grid_n = arch.pop("_grid", None)
    native = arch.pop("_native_grid", None)
    patch = arch["patch_size"]
    if native is None and grid_n is not None:
        side = _square_grid(grid_n, "the position embedding", path)
        native = (side, side)
    if native is None:  # sincos2d posemb: the checkpoint has no resolution
        native = (224 // patch, 224 // patch)
    arch.setdefault("image_size", (native[0] * patch, native[1] * patch))
    if attention is not None:
        arch["attention"] = attention
    arch["attention"] = deserialize_attention(arch.get("attention", "softmax"))
    fresh_head = False
    if num_classes is not None:
        if num_classes == 0:
            arch["include_top"] = False
        else:
            fresh_head = not arch.get("include_top") or arch.get("num_classes") != num_classes
            arch.update(include_top=True, num_classes=num_classes)
    if image_size is not None:
        arch["image_size"] = image_size
    arch.update(overrides)
    if "variant" not in arch:
        arch["variant"] = _variant_name(arch["width"], patch)
    if "name" not in arch:
        base = os.path.basename(path.rstrip("/"))
        arch["name"] = "vit_" + re.sub(r"\W+", "_", base.split(".")[0]).strip("_").lower()
    if not arch.get("include_top", True):  # features: the checkpoint's head is dropped
        weights = {k: v for k, v in weights.items() if not k.startswith("head/")}
    try:
        model = V.ViT(**arch)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    assign(model, weights, path, fresh_head=fresh_head)
    model.checkpoint_source = {"path": path, "format": fmt}
    return model


def assign(model, weights, path, fresh_head=False):
    """Copies `{variable path: (array, source key)}` into `model` after
    checking every key and shape (nothing is assigned on an error)."""
    target = {v.path: v for v in model.weights}
    missing, plan, fresh = [], [], []
    unexpected = sorted(k for k in weights if k not in target)
    for p, var in target.items():
        if p not in weights:
            if _FRESH_OK.fullmatch(p) or (fresh_head and p.startswith("head/")):
                fresh.append(p)
            else:
                missing.append(p)
            continue
        value, key = weights[p]
        if p.startswith("head/") and fresh_head:
            fresh.append(p)
            continue
        if p == "pos_embedding/embedding" and value.shape != tuple(var.shape):
            prefix = model.posemb_prefix_tokens
            n = value.shape[1] - prefix
            side = _square_grid(n, key, path)
            if value.shape[-1] == var.shape[-1]:
                value = resample_posemb(value, model.grid_size, (side, side), prefix)
        if value.shape != tuple(var.shape):
            raise CheckpointError(
                f"{path}: {key} has shape {value.shape}; the ViT's {p} needs "
                f"{tuple(var.shape)}.")
        plan.append((var, value))
    if unexpected:
        keys = [weights[k][1] for k in unexpected]
        raise CheckpointError(
            f"{path}: checkpoint weights the ViT has no place for: {keys[:10]} "
            "(an override that removes a part, e.g. pool= or qk_norm=?).")
    if missing:
        raise CheckpointError(
            f"{path}: the ViT needs weights the checkpoint lacks: {missing[:10]} "
            "(an override that adds a part, e.g. qk_norm=True on a checkpoint without?).")
    for var, value in plan:
        var.assign(value)
    if fresh:
        print(f"keras_reluvit: {os.path.basename(path)}: freshly initialised {fresh}")
    return fresh


def fold_input_normalization(model, mean, std):
    """Folds a per-channel input normalisation into the patch embedding, in
    place, so the model keeps taking [-1, 1] images.

    A checkpoint trained on `(pixel - mean) / std` with pixels in [0, 1]
    (timm's ImageNet-normalised models: mean (0.485, 0.456, 0.406), std
    (0.229, 0.224, 0.225)) then gives its logits on `x = 2 * pixel - 1`:
    the stem is linear, so `W * ((x + 1) / 2 - mean) / std + b` is again a
    convolution of `x`. Exact up to float rounding.
    """
    mean = np.broadcast_to(np.asarray(mean, "float64"), (3,))
    std = np.broadcast_to(np.asarray(std, "float64"), (3,))
    stem = model.get_layer("embedding")
    kernel = keras.ops.convert_to_numpy(stem.kernel).astype("float64")  # (p, p, 3, D)
    bias = keras.ops.convert_to_numpy(stem.bias).astype("float64")
    scale = 1.0 / (2.0 * std)
    shift = (0.5 - mean) / std
    new_bias = bias + np.einsum("hwcd,c->d", kernel, shift)
    stem.kernel.assign((kernel * scale[None, None, :, None]).astype("float32"))
    stem.bias.assign(new_bias.astype("float32"))
    return model


# ------------------------------------------------------------- writing
def _np(v):
    return np.asarray(keras.ops.convert_to_numpy(v), dtype="float32")


def _model_weights(model):
    return {v.path: _np(v) for v in model.weights}


def timm_state_dict(model, path=None, strict=True):
    """The ViT's weights in timm's `VisionTransformer` layout.

    Returns `(state_dict, timm_kwargs)`: numpy arrays by timm key and the
    `timm.create_model` / `VisionTransformer` arguments that reproduce the
    architecture (pass them with `pretrained=False`, then
    `load_state_dict`). With `path`, writes `.safetensors` (numpy, no torch
    needed) or `.pth` / `.bin` (torch.save). Position embeddings (learned or
    sincos2d) are written as timm's learned `pos_embed`.

    timm computes softmax attention only: with `strict` (default) a ViT with
    another attention raises, since timm would silently compute a different
    model.
    """
    cfg = model.get_config()
    if strict and model.attention_args.get("activation") != "softmax":
        raise ValueError(
            f"timm's VisionTransformer computes softmax attention; {model.name} uses "
            f"{cfg['attention']!r}. Its weights in timm's layout would give another "
            "model's outputs. Pass strict=False to write them anyway.")
    if cfg["representation_size"]:
        raise ValueError("timm's VisionTransformer has no representation (pre_logits) "
                         "layer; this ViT has representation_size="
                         f"{cfg['representation_size']}.")
    if model.attention_args.get("gated") or model.attention_args.get("learned_scale"):
        raise ValueError("timm has no attention gate or learned attention scale.")
    w = _model_weights(model)
    D, H = cfg["width"], cfg["num_heads"]
    sd = {}
    sd["patch_embed.proj.weight"] = w["embedding/kernel"].transpose(3, 2, 0, 1)
    sd["patch_embed.proj.bias"] = w["embedding/bias"]
    if cfg["class_token"]:
        sd["cls_token"] = w["cls/token"]
    if cfg["num_register_tokens"]:
        sd["reg_token"] = w["reg/token"]
    if cfg["posemb"] == "learn":
        sd["pos_embed"] = w["pos_embedding/embedding"]
    else:
        sd["pos_embed"] = model.get_layer("pos_embedding")._fixed.astype("float32")

    def attn(ours, qkv_key=None):
        qkv = [w[f"{ours}/{n}/kernel"].reshape(D, D).T for n in ("query", "key", "value")]
        qkvb = [w[f"{ours}/{n}/bias"].reshape(D) for n in ("query", "key", "value")]
        out = {}
        if qkv_key:
            out[qkv_key + ".weight"] = np.concatenate(qkv)
            out[qkv_key + ".bias"] = np.concatenate(qkvb)
        return out, qkv, qkvb

    def dense(key, ours):
        return {key + ".weight": w[ours + "/kernel"].T, key + ".bias": w[ours + "/bias"]}

    def norm(key, ours, bias=True):
        out = {key + ".weight": w[ours + "/gamma"]}
        out[key + ".bias"] = w[ours + "/beta"] if bias else np.zeros_like(out[key + ".weight"])
        return out

    affine = cfg["qk_norm"] == "affine"
    for i in range(cfg["depth"]):
        b, o = f"blocks.{i}.", f"block_{i:02d}/"
        part, _, _ = attn(o + "attention", b + "attn.qkv")
        sd.update(part)
        sd[b + "attn.proj.weight"] = w[o + "attention/attention_output/kernel"].reshape(D, D).T
        sd[b + "attn.proj.bias"] = w[o + "attention/attention_output/bias"]
        if cfg["qk_norm"]:
            sd.update(norm(b + "attn.q_norm", o + "attention/query_norm", affine))
            sd.update(norm(b + "attn.k_norm", o + "attention/key_norm", affine))
        sd.update(norm(b + "norm1", o + "norm1"))
        sd.update(norm(b + "norm2", o + "norm2"))
        sd.update(dense(b + "mlp.fc1", o + "mlp/fc1"))
        sd.update(dense(b + "mlp.fc2", o + "mlp/fc2"))
        if cfg["layer_scale"] is not None:
            sd[b + "ls1.gamma"] = w[o + "ls1"]
            sd[b + "ls2.gamma"] = w[o + "ls2"]
    sd.update(norm("fc_norm" if cfg["fc_norm"] else "norm", "encoder_norm"))
    if cfg["pool"] == "map":
        if cfg["qk_norm"]:
            raise ValueError("timm's attention pool has no qk-norm; this MAP ViT has one.")
        _, qkv, qkvb = attn("map_head/attention")
        sd["attn_pool.latent"] = w["map_head/probe"]
        sd["attn_pool.q.weight"], sd["attn_pool.q.bias"] = qkv[0], qkvb[0]
        sd["attn_pool.kv.weight"] = np.concatenate(qkv[1:])
        sd["attn_pool.kv.bias"] = np.concatenate(qkvb[1:])
        sd["attn_pool.proj.weight"] = (
            w["map_head/attention/attention_output/kernel"].reshape(D, D).T)
        sd["attn_pool.proj.bias"] = w["map_head/attention/attention_output/bias"]
        sd.update(norm("attn_pool.norm", "map_head/norm"))
        sd.update(dense("attn_pool.mlp.fc1", "map_head/mlp/fc1"))
        sd.update(dense("attn_pool.mlp.fc2", "map_head/mlp/fc2"))
    if cfg["include_top"]:
        sd.update(dense("head", "head"))
    sd = {k: np.ascontiguousarray(v, dtype="float32") for k, v in sd.items()}
    kwargs = dict(
        img_size=tuple(cfg["image_size"]), patch_size=cfg["patch_size"], embed_dim=D,
        depth=cfg["depth"], num_heads=H, mlp_ratio=cfg["mlp_dim"] / D, qkv_bias=True,
        qk_norm=bool(cfg["qk_norm"]), class_token=cfg["class_token"],
        reg_tokens=cfg["num_register_tokens"], no_embed_class=not cfg["posemb_prefix"],
        global_pool={"tok": "token", "gap": "avg", "map": "map"}[cfg["pool"]],
        fc_norm=cfg["fc_norm"], init_values=cfg["layer_scale"],
        num_classes=cfg["num_classes"] if cfg["include_top"] else 0,
    )
    if cfg["mlp_activation"] == "gelu_tanh":
        kwargs["act_layer"] = "gelu_tanh"
    if cfg["layer_norm_epsilon"] != 1e-6:
        kwargs["norm_layer"] = f"LayerNorm(eps={cfg['layer_norm_epsilon']})"
    if path is not None:
        _write_state_dict(sd, os.fspath(path), kwargs)
    return sd, kwargs


def _write_state_dict(sd, path, kwargs):
    if path.lower().endswith(".safetensors"):
        from safetensors.numpy import save_file

        save_file(sd, path, metadata={"format": "pt", "timm_kwargs": json.dumps(kwargs)})
    elif path.lower().endswith((".pth", ".pt", ".bin")):
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in sd.items()}, path)
    else:
        raise ValueError(f"{path}: write a .safetensors, .pth or .bin file.")


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


# ------------------------------------------------------------- presets
def save_to_preset(model, directory, source=None):
    """Writes `model` as a preset directory in keras-hub's convention:
    `config.json` (the full ViT config), `model.weights.h5` and
    `metadata.json` (versions, parameter count, source, date)."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    config = keras.saving.serialize_keras_object(model)
    config.pop("build_config", None)
    config.pop("compile_config", None)
    with open(os.path.join(directory, PRESET_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    model.save_weights(os.path.join(directory, PRESET_WEIGHTS))
    source = source or getattr(model, "checkpoint_source", None)
    meta = dict(
        keras_reluvit_version=__version__, keras_version=keras.__version__,
        parameter_count=int(model.count_params()), source=source,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    with open(os.path.join(directory, PRESET_METADATA), "w") as f:
        json.dump(meta, f, indent=2)
    return directory


def from_preset(directory, **overrides):
    """Loads a preset directory (ours, or a keras-hub ViT) as a `ViT`;
    `attention`, `num_classes`, `image_size` and other overrides as
    `load_checkpoint` (the attention defaults to the preset's own)."""
    directory = os.fspath(directory)
    fmt = detect_format(directory)
    if fmt not in ("preset", "keras_hub"):
        raise CheckpointError(f"{directory}: not a preset directory (config.json + "
                              f"{PRESET_WEIGHTS}).")
    return load_checkpoint(directory, **overrides)
