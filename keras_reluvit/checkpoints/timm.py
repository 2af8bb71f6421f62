"""timm `VisionTransformer` state dicts: `.safetensors` (no torch needed) or
`.pth` / `.pt` / `.bin` (`torch.load(weights_only=True)`), in and out."""

import json
import os
import re

import numpy as np

from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import Link
from keras_reluvit.checkpoints.common import export_weights
from keras_reluvit.checkpoints.common import image_pair
from keras_reluvit.checkpoints.common import linear_links
from keras_reluvit.checkpoints.common import norm_links
from keras_reluvit.checkpoints.common import out_proj_links
from keras_reluvit.checkpoints.common import patch_links
from keras_reluvit.checkpoints.common import posemb_grid
from keras_reluvit.checkpoints.common import read_json
from keras_reluvit.checkpoints.common import read_links
from keras_reluvit.checkpoints.common import refuse
from keras_reluvit.checkpoints.common import require
from keras_reluvit.checkpoints.common import write_links
from keras_reluvit.models import variants
from keras_reluvit.preprocessing import IMAGENET_MEAN
from keras_reluvit.preprocessing import IMAGENET_STD
from keras_reluvit.preprocessing import OPENAI_CLIP_MEAN
from keras_reluvit.preprocessing import OPENAI_CLIP_STD
from keras_reluvit.preprocessing import check_preprocessing
from keras_reluvit.preprocessing import imagenet1k_labels

# Widths of the standard variants -> heads (timm state dicts store no head
# count; the tables of big_vision / timm name one per width).
_HEADS_BY_WIDTH = {}
for _w, _d, _m, _h in variants.VARIANTS.values():
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
    "cls_token", "reg_token", "pos_embed", "patch_embed.proj.weight", "norm_pre.weight",
    "norm_pre.bias",
    "patch_embed.proj.bias", "norm.weight", "norm.bias", "fc_norm.weight",
    "fc_norm.bias", "head.weight", "head.bias", "pre_logits.fc.weight",
    "pre_logits.fc.bias", "attn_pool.latent", "attn_pool.q.weight",
    "attn_pool.q.bias", "attn_pool.kv.weight", "attn_pool.kv.bias",
    "attn_pool.proj.weight", "attn_pool.proj.bias", "attn_pool.norm.weight",
    "attn_pool.norm.bias", "attn_pool.mlp.fc1.weight", "attn_pool.mlp.fc1.bias",
    "attn_pool.mlp.fc2.weight", "attn_pool.mlp.fc2.bias",
}


def detect(path):
    """A state dict file: `.safetensors`, `.pth` / `.pt` / `.bin`, or a
    torch zip archive under another name (checked after the other formats)."""
    import zipfile

    lower = path.lower()
    return os.path.isfile(path) and (lower.endswith((".safetensors", ".pth", ".pt", ".bin"))
                                     or zipfile.is_zipfile(path))


def read(path, overrides):
    """A bare state dict. `overrides["architecture"]` (the timm name, e.g.
    `"vit_base_patch16_clip_224.openai"`) supplies what the file cannot
    say; without it, timm's VisionTransformer defaults (a `norm_pre`
    marks a CLIP tower: LayerNorm epsilon 1e-5, OpenAI's mean/std)."""
    name = overrides.get("architecture")
    if name is not None:
        check_architecture(name, path)
    written = _writer_kwargs(path)
    arch, w = _timm(_read_timm_file(path), path, overrides, name, written)
    if name is None and arch["pre_norm"] and written is None:  # a CLIP-derived tower
        name = "vit_clip_"
        arch.update(architecture_args(name))
    recorded = (written or {}).get("keras_reluvit_preprocessing")
    arch["preprocessing"] = (check_preprocessing(recorded) if recorded
                             else preprocessing_from_name(name))
    if arch.get("include_top") and arch["num_classes"] == 1000:
        arch["label_names"] = imagenet1k_labels()
    return arch, w


_HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def detect_hub(path):
    """A timm Hugging Face Hub directory (`push_to_hf_hub` /
    `save_for_hf`): `config.json` naming an `architecture`, beside
    `model.safetensors` or `pytorch_model.bin`."""
    cfg = os.path.join(path, "config.json")
    if not (os.path.isdir(path) and os.path.exists(cfg)
            and any(os.path.exists(os.path.join(path, w)) for w in _HUB_WEIGHTS)):
        return False
    config = read_json(cfg)
    return "architecture" in config and "model_type" not in config


# The architectures timm builds as a plain `VisionTransformer`
# (timm/models/vision_transformer.py and deit.py): these name prefixes ...
_VIT_NAMES = re.compile(r"^(vit|deit|deit3|flexivit|aimv2|beit3|test_vit\d*)_|"
                        r"^eva_large_patch14_(196|336)\b")
# ... except the families timm builds with other classes or stems.
_OTHER_NAMES = (
    (re.compile(r"_rope|_dinov3|^vit_pe_|_lingbot|_sapiens"), "timm's Eva (rotary embeddings)"),
    (re.compile(r"^vit_s?relpos_"), "timm's VisionTransformerRelPos (relative positions)"),
    (re.compile(r"_r\d+_s\d+_|_r_s\d+_|_resnet\d|_mci_"), "a hybrid CNN stem"),
    (re.compile(r"_distilled_"), "timm's VisionTransformerDistilled (a second, distillation "
     "head)"),
)


def check_architecture(name, where):
    """A timm architecture name (`vit_small_patch16_224`, with or without a
    `.tag`) that timm builds as a `VisionTransformer`; otherwise a
    CheckpointError naming what timm builds instead."""
    base = str(name).split(".")[0]
    for pattern, what in _OTHER_NAMES:
        if pattern.search(base):
            raise CheckpointError(f"{where}: timm builds {base!r} as {what}, which "
                                  "keras_reluvit.ViT does not express.")
    if not _VIT_NAMES.search(base):
        raise CheckpointError(
            f"{where}: a timm {base!r}; keras_reluvit loads the architectures timm builds as "
            "a VisionTransformer (vit_*, deit_*, deit3_*, flexivit_*, ...).")
    return base


def architecture_args(name):
    """What a timm architecture name says that its state dict does not: the
    CLIP towers' LayerNorm epsilon (1e-5) and OpenAI's quick GELU."""
    base = str(name).split(".")[0]
    args = {}
    if "_clip_" in base or base.endswith("_clip"):
        args["layer_norm_epsilon"] = 1e-5
    if "quickgelu" in base:
        args["mlp_activation"] = "quick_gelu"
    return args


_INTERPOLATIONS = {n: n for n in ("bicubic", "bilinear", "nearest", "box", "hamming", "lanczos")}


def preprocessing_from_cfg(cfg, where):
    """Our recipe from timm's `pretrained_cfg` / data config (`input_size`,
    `interpolation`, `crop_pct`, `crop_mode`, `mean`, `std`): PIL resampling
    on uint8 images, torchvision's centre crop."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: pretrained_cfg is not an object.")
    interp = cfg.get("interpolation", "bicubic")
    if interp not in _INTERPOLATIONS:
        raise CheckpointError(f"{where}: pretrained_cfg.interpolation {interp!r} is not "
                              f"supported ({', '.join(_INTERPOLATIONS)}).")
    mode = cfg.get("crop_mode") or "center"
    modes = {"center": "shorter", "squash": "squash", "border": "border"}
    if mode not in modes:
        raise CheckpointError(f"{where}: pretrained_cfg.crop_mode {mode!r} is not supported "
                              f"({', '.join(modes)}).")
    recipe = dict(resize=modes[mode], crop_pct=cfg.get("crop_pct") or 0.875,
                  interpolation=_INTERPOLATIONS[interp], antialias=True, round_uint8=True,
                  crop_offset="round", resize_rounding="floor", mean=cfg.get("mean", (0.5,) * 3),
                  std=cfg.get("std", (0.5,) * 3))
    for key in ("mean", "std", "crop_pct"):
        try:
            check_preprocessing({key: recipe[key]})
        except ValueError as e:
            raise CheckpointError(f"{where}: pretrained_cfg.{key}: {e}") from None
    return check_preprocessing(recipe)


def preprocessing_from_name(name):
    """The recipe of a timm architecture name where no `pretrained_cfg` is
    at hand (a bare state dict): timm's VisionTransformer default
    (bicubic, crop_pct 0.9, mean = std = 0.5), with the ImageNet mean/std
    for `deit*` and OpenAI's for `*_clip_*` towers, as timm's tables give
    those families. A hub directory's `config.json` is exact; this is the
    rule of thumb for files that carry nothing."""
    base = str(name or "").split(".")[0]
    cfg = dict(interpolation="bicubic", crop_pct=0.9, mean=(0.5,) * 3, std=(0.5,) * 3)
    if base.startswith("deit"):
        cfg.update(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    if "_clip_" in base:
        cfg.update(mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
    return preprocessing_from_cfg(cfg, name)


def hub_labels(config, num_classes):
    """Class names from a timm hub `config.json`: `label_descriptions`
    (e.g. "tench, Tinca tinca") where given, else `label_names` (synsets);
    the ImageNet-1k names for a 1000-class head without any."""
    names = config.get("label_names") or config.get("pretrained_cfg", {}).get("label_names")
    descriptions = (config.get("label_descriptions")
                    or config.get("pretrained_cfg", {}).get("label_descriptions") or {})
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i, f"class_{i}")) for i in range(num_classes)]
    if names and len(names) == num_classes:
        return [str(descriptions.get(n, n)) if isinstance(descriptions, dict) else str(n)
                for n in names]
    return imagenet1k_labels() if num_classes == 1000 else None


def native_image_size(config, where):
    """`(height, width)` a timm hub model was built for: `model_args.img_size`,
    else `pretrained_cfg.input_size` (`[3, H, W]`); None where neither is
    given."""
    size = (config.get("model_args") or {}).get("img_size")
    if size is None:
        input_size = (config.get("pretrained_cfg") or {}).get("input_size")
        size = input_size[1:] if isinstance(input_size, (list, tuple)) else None
    try:
        return None if size is None else image_pair(size)
    except ValueError:
        raise CheckpointError(f"{where}: model_args.img_size / pretrained_cfg.input_size "
                              f"{size!r} is not an image size (H, W).") from None


def read_hub(path, overrides):
    """A timm hub directory: the state dict as `read`, plus what the config
    says and a state dict cannot: the preprocessing (`pretrained_cfg`), class
    names, and from the architecture name the CLIP towers' LayerNorm epsilon
    and OpenAI's quick GELU (`mlp_activation=` etc. override)."""
    cfg_path = os.path.join(path, "config.json")
    config = read_json(cfg_path)
    name = check_architecture(config["architecture"], path)
    weights = next(os.path.join(path, w) for w in _HUB_WEIGHTS
                   if os.path.exists(os.path.join(path, w)))
    size = native_image_size(config, cfg_path)
    if size is not None:
        overrides = dict(overrides, _native_image_size=size)
    arch, w = _timm(_read_timm_file(weights), weights, overrides, name,
                    _writer_kwargs(weights))
    arch["preprocessing"] = preprocessing_from_cfg(config.get("pretrained_cfg", {}),
                                                   cfg_path)
    if arch.get("include_top"):
        arch["label_names"] = hub_labels(config, arch["num_classes"])
    return arch, w


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


def name_map(arch):
    """The one name map of the timm layout for a ViT config `arch` (width,
    num_heads, depth, qk_norm, layer_scale, pool, class_token, ...): the
    reader and the writer both walk it, so ours -> timm -> ours is symmetric
    by construction."""
    D, H = arch["width"], arch["num_heads"]
    dh = D // H

    def fused(key, ours_names, ours_prefix):
        # timm's fused projections (qkv, kv; q alone): stacked (n * D, D) <-> n (D, H, dh).
        n = len(ours_names)
        yield Link([key + ".weight"], [f"{ours_prefix}/{o}/kernel" for o in ours_names],
                   lambda xs: [m.T.reshape(D, H, dh) for m in np.split(xs[0], n)],
                   lambda xs: [np.concatenate([x.reshape(D, D).T for x in xs])])
        yield Link([key + ".bias"], [f"{ours_prefix}/{o}/bias" for o in ours_names],
                   lambda xs: [b.reshape(H, dh) for b in np.split(xs[0], n)],
                   lambda xs: [np.concatenate([x.reshape(D) for x in xs])],
                   optional=True, zeros=[(H, dh)] * n)

    def norm(key, ours, dim=D):
        return norm_links(key, ours, dim)

    links = [*patch_links("patch_embed.proj", D), Link(["pos_embed"], ["pos_embedding/embedding"])]
    if arch.get("pre_norm"):
        links += norm("norm_pre", "pre_norm")
    if arch.get("class_token"):
        links.append(Link(["cls_token"], ["cls/token"]))
    if arch.get("num_register_tokens"):
        links.append(Link(["reg_token"], ["reg/token"]))
    mlp = arch["mlp_dim"]
    for i in range(arch["depth"]):
        b, o = f"blocks.{i}.", f"block_{i:02d}/"
        links += fused(b + "attn.qkv", ("query", "key", "value"), o + "attention")
        links += out_proj_links(b + "attn.proj", o + "attention/attention_output", D, H)
        if arch.get("qk_norm"):
            links += norm(b + "attn.q_norm", o + "attention/query_norm", dh)
            links += norm(b + "attn.k_norm", o + "attention/key_norm", dh)
        links += norm(b + "norm1", o + "norm1")
        links += norm(b + "norm2", o + "norm2")
        links += linear_links(b + "mlp.fc1", o + "mlp/fc1", mlp)
        links += linear_links(b + "mlp.fc2", o + "mlp/fc2", D)
        if arch.get("layer_scale") is not None:
            links += [Link([b + "ls1.gamma"], [o + "ls1"]), Link([b + "ls2.gamma"], [o + "ls2"])]
    links += norm("fc_norm" if arch.get("fc_norm") else "norm", "encoder_norm")
    if arch["pool"] == "map":
        links.append(Link(["attn_pool.latent"], ["map_head/probe"]))
        links += fused("attn_pool.q", ("query",), "map_head/attention")  # one of one
        links += fused("attn_pool.kv", ("key", "value"), "map_head/attention")
        links += out_proj_links("attn_pool.proj", "map_head/attention/attention_output", D, H)
        links += norm("attn_pool.norm", "map_head/norm")
        links += linear_links("attn_pool.mlp.fc1", "map_head/mlp/fc1", mlp)
        links += linear_links("attn_pool.mlp.fc2", "map_head/mlp/fc2", D)
    if arch.get("representation_size"):
        links += linear_links("pre_logits.fc", "pre_logits", arch["representation_size"])
    if arch.get("include_top"):
        links += linear_links("head", "head", arch["num_classes"])
    return links


def _writer_kwargs(path):
    """The `timm_kwargs` our writer records in a `.safetensors` file's
    metadata, or None (timm's own files carry none)."""
    if not path.lower().endswith(".safetensors"):
        return None
    try:
        from safetensors import safe_open

        with safe_open(path, "np") as f:
            kwargs = json.loads((f.metadata() or {}).get("timm_kwargs", "null"))
    except Exception:
        return None
    return kwargs if isinstance(kwargs, dict) else None


def _written_args(written):
    """What our writer's `timm_kwargs` (None: a file timm wrote) record that a
    state dict does not: the MLP activation (`act_layer`; timm's default is
    exact GELU, so pass `mlp_activation=` or `architecture=` for timm's
    files) and the LayerNorm epsilon (`norm_layer`; 1e-6 when absent)."""
    if written is None:
        return {"mlp_activation": "gelu"}
    m = re.fullmatch(r"LayerNorm\(eps=([0-9.eE+-]+)\)", str(written.get("norm_layer", "")))
    return {"mlp_activation": {"quick_gelu": "quick_gelu", "gelu_tanh": "gelu_tanh"}.get(
                written.get("act_layer"), "gelu"),
            "layer_norm_epsilon": float(m.group(1)) if m else 1e-6}


def _timm(sd, path, overrides, architecture=None, written=None):
    """`(arch, weights)` of a timm state dict `sd` read from `path`;
    `architecture`: its timm name where known, `written`: our writer's
    `timm_kwargs` (see `_writer_kwargs`)."""
    require(sd, "patch_embed.proj.weight", path, "timm VisionTransformer state dict")
    refuse(path, [
        k for k in sd
        if k not in _TIMM_TOP_KEYS
        and not (_TIMM_BLOCK.fullmatch(k) and _TIMM_BLOCK.fullmatch(k).group(2) in _TIMM_BLOCK_KEYS)
    ], " (e.g. patch_embed.norm, SwiGLU MLPs, distillation tokens, RoPE are not "
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
        fc_norm=has_fc_norm,
        pre_norm="norm_pre.weight" in sd,
        layer_scale=1e-5 if "blocks.0.ls1.gamma" in sd else None,
        representation_size=(sd["pre_logits.fc.weight"].shape[0]
                             if "pre_logits.fc.weight" in sd else None),
        include_top="head.weight" in sd,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 1000,
    )
    arch.update(_written_args(written), **architecture_args(architecture))
    if "pos_embed" not in sd:
        raise CheckpointError(f"{path}: no pos_embed (models without an absolute "
                              "position embedding are not supported).")
    native, hint = (None if size is None else (size[0] // patch, size[1] // patch)
                    for size in (overrides.get("_native_image_size")
                                 or native_image_size({"model_args": written or {}}, path),
                                 overrides.get("_image_size_hint")))
    covers, grid = posemb_grid(sd["pos_embed"].shape[1], prefix, path, "pos_embed",
                               native=native, hint=hint, covers=overrides.get("posemb_prefix"))
    arch["posemb_prefix"] = covers
    arch["_native_grid"] = grid
    for i in range(depth):
        qkv = sd.get(f"blocks.{i}.attn.qkv.weight")
        if qkv is not None and qkv.shape != (3 * width, width):
            raise CheckpointError(f"{path}: blocks.{i}.attn.qkv.weight has shape {qkv.shape}, "
                                  f"expected {(3 * width, width)}.")
    w = read_links(sd, name_map(arch), path, f"this ViT ({depth} blocks, pool={pool!r})")
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
    if cfg["pool"] == "tok_gap":
        raise ValueError("timm's VisionTransformer has no 'tok_gap' pooling (class token "
                         "concatenated with the patch mean).")
    if cfg["pool"] == "map" and cfg["qk_norm"]:
        raise ValueError("timm's attention pool has no qk-norm; this MAP ViT has one.")
    w = export_weights(model)  # sincos2d: written as timm's learned pos_embed
    D, H = cfg["width"], cfg["num_heads"]
    if cfg["pre_norm"]:  # timm's pre-norm PatchEmbed has no bias: fold ours into pos_embed
        pos = np.array(w["pos_embedding/embedding"])
        pos[:, model.posemb_prefix_tokens:] += w.pop("embedding/bias")
        w["pos_embedding/embedding"] = pos
    sd = write_links(w, name_map(cfg),
                     skip=["patch_embed.proj.bias"] if cfg["pre_norm"] else ())
    kwargs = dict(
        img_size=tuple(cfg["image_size"]), patch_size=cfg["patch_size"], embed_dim=D,
        depth=cfg["depth"], num_heads=H, mlp_ratio=cfg["mlp_dim"] / D, qkv_bias=True,
        qk_norm=bool(cfg["qk_norm"]), class_token=cfg["class_token"],
        reg_tokens=cfg["num_register_tokens"], no_embed_class=not cfg["posemb_prefix"],
        global_pool={"tok": "token", "gap": "avg", "map": "map"}[cfg["pool"]],
        fc_norm=cfg["fc_norm"], init_values=cfg["layer_scale"], pre_norm=cfg["pre_norm"],
        num_classes=cfg["num_classes"] if cfg["include_top"] else 0,
    )
    if cfg["mlp_activation"] != "gelu":
        kwargs["act_layer"] = cfg["mlp_activation"]  # timm's names: gelu_tanh, quick_gelu
    if cfg["layer_norm_epsilon"] != 1e-6:
        kwargs["norm_layer"] = f"LayerNorm(eps={cfg['layer_norm_epsilon']})"
    if path is not None:
        _write_state_dict(sd, os.fspath(path), dict(
            kwargs, keras_reluvit_preprocessing=model.preprocessing))
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
