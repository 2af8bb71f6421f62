"""timm `VisionTransformer` state dicts: `.safetensors` (no torch needed) or
`.pth` / `.pt` / `.bin` (`torch.load(weights_only=True)`), in and out."""

import json
import os
import re

import numpy as np

from keras_reluvit import vit as V
from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import _model_weights
from keras_reluvit.checkpoints.common import _posemb_layout
from keras_reluvit.checkpoints.common import _refuse
from keras_reluvit.checkpoints.common import _require
from keras_reluvit.checkpoints.common import _Weights

# Widths of the standard variants -> heads (timm state dicts store no head
# count; the tables of big_vision / timm name one per width).
_HEADS_BY_WIDTH = {}
for _w, _d, _m, _h in V.VARIANTS.values():
    _HEADS_BY_WIDTH.setdefault(_w, _h)


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
