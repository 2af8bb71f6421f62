"""Hugging Face transformers checkpoints: the directories `save_pretrained`
writes (`config.json` + `model.safetensors`, or shards listed in
`model.safetensors.index.json`, or `pytorch_model.bin`), in; plain ViTs out.

`model_type` (architectures): loaded as
- `vit` (`ViTModel`, `ViTForImageClassification`): class token, `pool="tok"`;
  `ViTModel`'s pooler (Dense + tanh) as `representation_size`.
- `deit` (`DeiTModel`, `DeiTForImageClassification`): the distillation token
  as a second prefix token (its own position row).
- `dinov2` (`Dinov2Model`, `Dinov2ForImageClassification`): LayerScale; the
  classifier's `pool="tok_gap"` (class token + patch mean).
- `dinov2_with_registers` (`Dinov2WithRegisters{Model,ForImageClassification}`):
  registers without a position row (the class row folded into the class token).
- `clip_vision_model`, `clip` (`CLIPVisionModel`, `CLIPVisionModelWithProjection`,
  `CLIPModel`'s vision tower): `pre_norm`, quick GELU, the projection as a
  bias-free head.

`DeiTForImageClassificationWithTeacher` averages a class-token head and a
distillation-token head, which one `ViT` head cannot hold: it is refused
unless `num_classes=` asks for the backbone (0) or a fresh head.

One name map per family drives the reader and (for `vit`) the writer.
"""

import json
import os

import numpy as np

from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import Link
from keras_reluvit.checkpoints.common import export_weights
from keras_reluvit.checkpoints.common import head_links
from keras_reluvit.checkpoints.common import linear_links
from keras_reluvit.checkpoints.common import norm_links
from keras_reluvit.checkpoints.common import out_proj_links
from keras_reluvit.checkpoints.common import patch_links
from keras_reluvit.checkpoints.common import read_json
from keras_reluvit.checkpoints.common import read_links
from keras_reluvit.checkpoints.common import refuse
from keras_reluvit.checkpoints.common import write_links
from keras_reluvit.preprocessing import IMAGENET_MEAN
from keras_reluvit.preprocessing import IMAGENET_STD
from keras_reluvit.preprocessing import OPENAI_CLIP_MEAN
from keras_reluvit.preprocessing import OPENAI_CLIP_STD
from keras_reluvit.preprocessing import check_preprocessing
from keras_reluvit.preprocessing import resized_side

CONFIG = "config.json"

# model_type -> the architectures we load. The config defaults are
# transformers' own (a config.json may hold only what differs from them).
ARCHITECTURES = {
    "vit": ("ViTModel", "ViTForImageClassification"),
    "deit": ("DeiTModel", "DeiTForImageClassification",
             "DeiTForImageClassificationWithTeacher"),
    "dinov2": ("Dinov2Model", "Dinov2ForImageClassification"),
    "dinov2_with_registers": ("Dinov2WithRegistersModel",
                              "Dinov2WithRegistersForImageClassification"),
    "clip_vision_model": ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
    "clip": ("CLIPModel",),
}
_BERT_LIKE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12,
                  image_size=224, patch_size=16, num_channels=3, qkv_bias=True,
                  pooler_act="tanh")
_DINO = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4,
             hidden_act="gelu", layer_norm_eps=1e-6, image_size=224, patch_size=14,
             num_channels=3, qkv_bias=True, layerscale_value=1.0, use_swiglu_ffn=False)
_CLIP = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072, hidden_act="quick_gelu", layer_norm_eps=1e-5,
             image_size=224, patch_size=32, num_channels=3, projection_dim=512)
_DEFAULTS = {"vit": _BERT_LIKE, "deit": _BERT_LIKE, "dinov2": _DINO,
             "dinov2_with_registers": dict(_DINO, patch_size=16, num_register_tokens=4),
             "clip_vision_model": _CLIP, "clip": _CLIP}
# transformers' activation names -> ours.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "quick_gelu": "quick_gelu"}
# The patch embedding's key inside the backbone: finds the backbone's prefix.
_PATCH_KEY = {"clip": "embeddings.patch_embedding.weight"}


def detect(path):
    """A directory with a `config.json` that names a transformers
    `model_type` (the config is read, so a broken one raises naming it)."""
    cfg = os.path.join(path, CONFIG)
    return os.path.isdir(path) and os.path.exists(cfg) and "model_type" in read_json(cfg)


def _family(model_type):
    return "clip" if model_type in ("clip", "clip_vision_model") else model_type


def _read_weights(directory):
    """`{key: float32 array}` of the directory's weights, whichever of
    transformers' layouts it uses."""
    single = os.path.join(directory, "model.safetensors")
    index = single + ".index.json"
    if os.path.exists(single) or os.path.exists(index):
        from safetensors.numpy import load_file

        files = ([single] if os.path.exists(single) else sorted(
            {os.path.join(directory, f) for f in read_json(index).get("weight_map", {}).values()}))
        if not files:
            raise CheckpointError(f"{index}: its weight_map lists no files.")
        out = {}
        for f in files:
            try:
                out.update(load_file(f))
            except Exception as e:
                raise CheckpointError(f"{f}: not a readable safetensors file ({e}).") from e
        return {k: np.asarray(v, "float32") for k, v in out.items()}
    pt = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(pt):
        from keras_reluvit.checkpoints.timm import _read_timm_file

        return _read_timm_file(pt)
    raise CheckpointError(f"{directory}: no model.safetensors, model.safetensors.index.json "
                          "or pytorch_model.bin beside config.json.")


def name_map(arch, family, base="", head="classifier"):
    """The name map of a transformers ViT family for a ViT config `arch`;
    `base` is the backbone's key prefix (`"vit."` in a task model)."""
    D, H = arch["width"], arch["num_heads"]
    e = base + "embeddings."
    clip = family == "clip"
    links = list(patch_links(e + ("patch_embedding" if clip else "patch_embeddings.projection"), D))
    if clip:
        links += [Link([e + "class_embedding"], ["cls/token"], lambda xs: [xs[0].reshape(1, 1, D)],
                       lambda xs: [xs[0].reshape(D)]),
                  Link([e + "position_embedding.weight"], ["pos_embedding/embedding"],
                       lambda xs: [xs[0][None]], lambda xs: [xs[0][0]])]
        links += norm_links(base + "pre_layrnorm", "pre_norm", D)
    else:
        links += [Link([e + "cls_token"], ["cls/token"])]
        if family == "dinov2_with_registers":
            # HF adds the class row of the position embedding to the class token
            # and gives the registers none: the row is folded into our token.
            links = [lk for lk in links if lk.ours != ("cls/token",)]
            # (Written back, the class row is zero and the token carries it.)
            links += [Link([e + "cls_token", e + "position_embeddings"],
                           ["cls/token", "pos_embedding/embedding"],
                           lambda xs: [xs[0] + xs[1][:, :1], xs[1][:, 1:]],
                           lambda xs: [xs[0], np.concatenate([0 * xs[1][:, :1], xs[1]], 1)]),
                      Link([e + "register_tokens"], ["reg/token"])]
        else:
            links += [Link([e + "position_embeddings"], ["pos_embedding/embedding"])]
        if family == "deit":
            links += [Link([e + "distillation_token"], ["reg/token"])]
    mlp = arch["mlp_dim"]
    for i in range(arch["depth"]):
        o = f"block_{i:02d}/"
        if clip:
            b = f"{base}encoder.layers.{i}."
            attn, out, n1, n2 = b + "self_attn.", b + "self_attn.out_proj", "layer_norm1", "layer_norm2"
            qkv = ("q_proj", "k_proj", "v_proj")
        else:
            b = f"{base}encoder.layer.{i}."
            attn, out = b + "attention.attention.", b + "attention.output.dense"
            n1, n2 = (("norm1", "norm2") if family.startswith("dinov2")
                      else ("layernorm_before", "layernorm_after"))
            qkv = ("query", "key", "value")
        for ours, theirs in zip(("query", "key", "value"), qkv):
            links += head_links(attn + theirs, o + "attention/" + ours, D, H)
        links += out_proj_links(out, o + "attention/attention_output", D, H)
        links += norm_links(b + n1, o + "norm1", D)
        links += norm_links(b + n2, o + "norm2", D)
        if clip or family.startswith("dinov2"):
            fc1, fc2 = b + "mlp.fc1", b + "mlp.fc2"
        else:
            fc1, fc2 = b + "intermediate.dense", b + "output.dense"
        links += linear_links(fc1, o + "mlp/fc1", mlp)
        links += linear_links(fc2, o + "mlp/fc2", D)
        if family.startswith("dinov2"):
            links += [Link([b + "layer_scale1.lambda1"], [o + "ls1"]),
                      Link([b + "layer_scale2.lambda1"], [o + "ls2"])]
    links += norm_links(base + ("post_layernorm" if clip else "layernorm"), "encoder_norm", D)
    if arch.get("representation_size"):
        links += linear_links(base + "pooler.dense", "pre_logits", arch["representation_size"])
    if arch.get("include_top"):
        links += linear_links(head, "head", arch["num_classes"])
    return links


PREPROCESSOR = "preprocessor_config.json"
# transformers' image processor defaults per model_type (a
# preprocessor_config.json may hold only what differs; without one, these).
_PROCESSORS = {
    "vit": dict(size={"height": 224, "width": 224}, resample=2, do_center_crop=False,
                image_mean=[0.5] * 3, image_std=[0.5] * 3),
    "deit": dict(size={"height": 256, "width": 256}, resample=3, do_center_crop=True,
                 crop_size={"height": 224, "width": 224}, image_mean=list(IMAGENET_MEAN),
                 image_std=list(IMAGENET_STD)),
    "dinov2": dict(size={"shortest_edge": 256}, resample=3, do_center_crop=True, do_convert_rgb=True,
                   crop_size={"height": 224, "width": 224}, image_mean=list(IMAGENET_MEAN),
                   image_std=list(IMAGENET_STD)),
    "clip": dict(size={"shortest_edge": 224}, resample=3, do_center_crop=True, do_convert_rgb=True,
                 crop_size={"height": 224, "width": 224}, image_mean=list(OPENAI_CLIP_MEAN),
                 image_std=list(OPENAI_CLIP_STD)),
}
# PIL's resample enums (and names), as transformers' processors take them.
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_RESAMPLE.update({name: name for name in _RESAMPLE.values()})


def _hw(value, where, key, square_int):
    """A transformers size: `{"height", "width"}`, `{"shortest_edge"}` or an
    int -> `("hw", (h, w))` / `("short", n)`."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        return ("hw", (value, value)) if square_int else ("short", value)
    if isinstance(value, dict):
        if isinstance(value.get("height"), int) and isinstance(value.get("width"), int):
            return "hw", (value["height"], value["width"])
        if isinstance(value.get("shortest_edge"), int) and len(value) == 1:
            return "short", value["shortest_edge"]
    raise CheckpointError(f"{where}: {key} {value!r} is not a size keras_reluvit reads "
                          '({"height": H, "width": W}, {"shortest_edge": N} or an int).')


def _processor(directory, family):
    """`(path, settings)` of the directory's image processor, transformers'
    defaults for the family filled in."""
    path = os.path.join(directory, PREPROCESSOR)
    defaults = _PROCESSORS["dinov2" if family.startswith("dinov2") else family]
    return path, dict(defaults, **(read_json(path) if os.path.exists(path) else {}))


def processor_input_size(directory, family):
    """`(height, width)` of the images the directory's image processor
    (`preprocessor_config.json`) hands the model (its crop, else its
    resize), or None where that varies (a shortest edge without a crop, no
    resize) or the directory has no processor."""
    path, pc = _processor(directory, family)
    if not os.path.exists(path):
        return None
    if pc.get("do_center_crop"):
        return _hw(pc.get("crop_size", pc.get("size")), path, "crop_size", square_int=True)[1]
    if not pc.get("do_resize", True):
        return None
    kind, size = _hw(pc.get("size"), path, "size", square_int=family in ("vit", "deit"))
    return size if kind == "hw" else None


def preprocessing_from_processor(directory, family):
    """Our recipe from `preprocessor_config.json` (or transformers' defaults
    for the family): PIL resampling on uint8 images, transformers' centre
    crop (`(H - h) // 2`), `rescale_factor` and `image_mean` / `image_std`;
    `do_convert_rgb` composites transparent images onto white
    (`alpha="white"`); `do_rescale=False` makes the preprocessor take
    [0, 1] floats (`input_scale=1`), what that flag has the caller hand
    transformers, resized as floats (no uint8 rounding, no clipping) as
    transformers' default backend (torchvision's) resizes them."""
    path, pc = _processor(directory, family)
    resample = pc.get("resample", 2)
    if resample not in _RESAMPLE:
        raise CheckpointError(f"{path}: resample {resample!r} is not one of PIL's filters "
                              "(0-5: nearest, lanczos, bilinear, bicubic, box, hamming).")
    kind, size = _hw(pc.get("size"), path, "size", square_int=family in ("vit", "deit"))
    if not pc.get("do_resize", True):
        kind, size = "hw", None
    crop = None
    if pc.get("do_center_crop"):
        _, crop = _hw(pc.get("crop_size", size), path, "crop_size", square_int=True)
    if kind == "short" and crop is None:
        raise CheckpointError(f"{path}: size is a shortest_edge without do_center_crop, which "
                              "gives images of varying shape; a ViT takes one size.")
    if size is None:
        pct, resize = 1.0, "squash"
    elif kind == "short":
        pct, resize = min(crop) / size, "shorter"
    else:
        pct, resize = (1.0 if crop is None else crop[0] / size[0]), "squash"
        if crop is not None and abs(crop[1] / size[1] - pct) > 1e-6:
            raise CheckpointError(f"{path}: crop_size {crop} is not the same fraction of size "
                                  f"{size} in height and width.")
    # do_rescale=False: the processor is handed images already in its scale;
    # read as [0, 1] floats (input_scale=1), the scale its mean / std are in.
    rescale = pc.get("do_rescale", True) is not False
    factor = float(pc.get("rescale_factor", 1 / 255)) if rescale else 1 / 255
    mean, std = (pc.get("image_mean"), pc.get("image_std")) if pc.get(
        "do_normalize", True) else (0.0, 1.0)
    try:
        unit = 255.0 * factor  # their pixel unit in [0, 1] pixels
        mean = [float(m) / unit for m in (mean if isinstance(mean, list) else [mean] * 3)]
        std = [float(s) / unit for s in (std if isinstance(std, list) else [std] * 3)]
        return check_preprocessing(dict(
            resize=resize, crop_pct=min(pct, 1.0), interpolation=_RESAMPLE[resample],
            antialias=True, round_uint8=rescale, clip=rescale, crop_offset="floor",
            resize_rounding="floor",
            alpha="white" if pc.get("do_convert_rgb") else "drop",
            input_scale=255 if rescale else 1, mean=mean, std=std))
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: rescale_factor / image_mean / image_std: {e}") from None


def _labels(config, num_classes, cfg_path):
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or len(id2label) != num_classes:
        return None
    try:
        names = [str(id2label[str(i)]) for i in range(num_classes)]
    except KeyError as e:
        raise CheckpointError(f"{cfg_path}: id2label lacks class {e}.") from None
    if all(n == f"LABEL_{i}" for i, n in enumerate(names)):  # transformers' placeholders
        return None
    return names


def read(directory, overrides):
    """`(arch, weights)` of a transformers ViT directory."""
    cfg_path = os.path.join(directory, CONFIG)
    config = read_json(cfg_path)
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"{directory}: a transformers model_type {model_type!r}, which keras_reluvit does "
            f"not load; supported: {', '.join(ARCHITECTURES)} (ViT, DeiT, DINOv2, CLIP vision).")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or len(archs) > 1:
        raise CheckpointError(f"{cfg_path}: 'architectures' should name one class, got {archs!r}.")
    name = archs[0] if archs else None
    if name is not None and name not in ARCHITECTURES[model_type]:
        raise CheckpointError(
            f"{directory}: {name} is not supported; for model_type {model_type!r} "
            f"keras_reluvit loads {', '.join(ARCHITECTURES[model_type])}.")
    sd = _read_weights(directory)
    family = _family(model_type)
    top = config
    if model_type == "clip":  # a full CLIP model: its vision tower (and projection)
        top = config.get("vision_config") or {}
        if not isinstance(top, dict):
            raise CheckpointError(f"{cfg_path}: vision_config is not an object.")
        top = dict(top, projection_dim=config.get("projection_dim", 512))
    c = dict(_DEFAULTS[model_type], **top)
    patch_key = _PATCH_KEY.get(family, "embeddings.patch_embeddings.projection.weight")
    bases = sorted(k[:-len(patch_key)] for k in sd if k.endswith(patch_key))
    if len(bases) != 1:
        raise CheckpointError(f"{directory}: expected one '{patch_key}' among the weights, "
                              f"found {len(bases)}; its keys start {sorted(sd)[:6]}.")
    base = bases[0]
    act = c["hidden_act"]
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"{cfg_path}: hidden_act {act!r} is not supported "
                              f"(supported: {', '.join(_ACTIVATIONS)}).")
    if c.get("num_channels", 3) != 3:
        raise CheckpointError(f"{cfg_path}: num_channels={c['num_channels']}; the ViT takes RGB.")
    if c.get("use_swiglu_ffn"):
        raise CheckpointError(f"{cfg_path}: use_swiglu_ffn=True (DINOv2 giant's SwiGLU MLP) "
                              "is not supported.")
    image = c["image_size"]
    image = tuple(image) if isinstance(image, (list, tuple)) else (image, image)
    patch = c["patch_size"]
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    width = c["hidden_size"]
    regs = {"deit": 1, "dinov2_with_registers": c.get("num_register_tokens", 0)}.get(family, 0)
    arch = dict(
        width=width, depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
        patch_size=patch, mlp_dim=c.get("intermediate_size") or int(width * c["mlp_ratio"]),
        pool="tok", posemb="learn", qk_norm=False, class_token=True,
        num_register_tokens=regs, posemb_prefix=family != "dinov2_with_registers",
        mlp_activation=_ACTIVATIONS[act], layer_norm_epsilon=float(c["layer_norm_eps"]),
        layer_scale=c.get("layerscale_value") if family.startswith("dinov2") else None,
        pre_norm=family == "clip", image_size=image,
        # transformers' DINOv2 resamples its position embedding at run time
        # for other sizes (bicubic; antialiased with registers): we resample
        # it once, the same way.
        _posemb_resampling={"dinov2": "bicubic", "dinov2_with_registers": "bicubic_antialias"}
        .get(family, "bilinear"),
        _native_grid=(image[0] // patch, image[1] // patch),
        include_top=False, num_classes=1000,
    )
    head, ignored = "classifier", set()
    if family == "clip":
        head = "visual_projection"
        ignored = {k for k in sd if k.startswith(("text_model.", "text_projection"))
                   or k == "logit_scale"}
    elif family.startswith("dinov2"):
        ignored = {base + "embeddings.mask_token"}  # masked-image training only
    ignored |= {k for k in sd if k.endswith("embeddings.position_ids")}  # an old buffer
    teacher = {"cls_classifier.weight", "distillation_classifier.weight"} <= set(sd)
    if teacher:  # loadable only as a backbone or with a fresh head (load_checkpoint checks)
        arch["_needs_num_classes"] = (
            f"{directory}: DeiTForImageClassificationWithTeacher averages a class-token "
            "head and a distillation-token head; a keras_reluvit ViT has one head. Pass "
            "num_classes=0 for the backbone's features or num_classes=N for a fresh head.")
        ignored |= {k for k in sd if k.startswith(("cls_classifier.", "distillation_classifier."))}
    if head + ".weight" in sd:
        arch.update(include_top=True, num_classes=int(sd[head + ".weight"].shape[0]))
        if family.startswith("dinov2"):
            arch["pool"] = "tok_gap"
    if base + "pooler.dense.weight" in sd:
        if c.get("pooler_act", "tanh") != "tanh":
            raise CheckpointError(f"{cfg_path}: pooler_act {c['pooler_act']!r}; the ViT's "
                                  "representation layer is Dense + tanh.")
        arch["representation_size"] = int(sd[base + "pooler.dense.weight"].shape[0])
    arch["preprocessing"] = preprocessing_from_processor(directory, family)
    if family.startswith("dinov2"):
        # transformers' DINOv2 takes whatever its processor gives (224 px for
        # the public checkpoints, configured at 518) and resamples the
        # position embedding at run time: the model is built at the
        # processor's size (load_checkpoint's image_size= overrides it).
        size = processor_input_size(directory, family)
        if size is not None and tuple(size) != image:
            if size[0] % patch or size[1] % patch:
                raise CheckpointError(
                    f"{directory}: the image processor gives {size[0]}x{size[1]} images, not "
                    f"a multiple of the patch size {patch}; pass image_size=.")
            arch["image_size"] = tuple(size)
    if arch["include_top"] and family != "clip":  # CLIP's head is a projection, not classes
        arch["label_names"] = _labels(config, arch["num_classes"], cfg_path)
    links = name_map(arch, family, base, head)
    known = {k for link in links for k in link.keys} | ignored
    refuse(directory, [k for k in sd if k not in known])
    return arch, read_links(sd, links, directory,
                            f"this {model_type} ViT ({arch['depth']} blocks)")


def hf_state_dict(model, directory=None, strict=True):
    """The ViT's weights as a transformers `ViTForImageClassification` (or
    `ViTModel` without a head) directory: returns `(state_dict, config)` and,
    with `directory`, writes `config.json` + `model.safetensors` there, which
    `transformers.ViTForImageClassification.from_pretrained(directory)` loads
    (a headless ViT: `ViTModel.from_pretrained(directory,
    add_pooling_layer=False)`, or with the pooler when the ViT has a
    `representation_size` equal to its width).

    With the ViT's class names (`id2label`) and, where transformers' image
    processors can express its preprocessing, `preprocessor_config.json`
    (see `processor_config`).

    HF's ViT is the original layout: class token pooling (`pool="tok"`), a
    position row per token, no registers, qk-norm, LayerScale, pre-norm or
    fc-norm, and softmax attention (with `strict`, another attention raises:
    HF would silently compute another model).
    """
    cfg = model.get_config()
    D = cfg["width"]
    problems = []
    if strict and model.attention_args.get("activation") != "softmax":
        problems.append(f"attention {cfg['attention']!r} (HF computes softmax; strict=False "
                        "writes the weights anyway)")
    if cfg["pool"] != "tok" or not cfg["class_token"]:
        problems.append(f"pool={cfg['pool']!r} (HF's ViT pools the class token)")
    for key in ("num_register_tokens", "qk_norm", "layer_scale", "fc_norm", "pre_norm"):
        if cfg[key]:
            problems.append(f"{key}={cfg[key]!r}")
    if not cfg["posemb_prefix"]:
        problems.append("posemb_prefix=False")
    if cfg["representation_size"] not in (None, D) or (
            cfg["representation_size"] and cfg["include_top"]):
        problems.append(f"representation_size={cfg['representation_size']} (HF has a pooler "
                        "only in a headless ViTModel, of the model's width)")
    if model.attention_args.get("gated") or model.attention_args.get("learned_scale"):
        problems.append("an attention gate or learned scale")
    if problems:
        raise ValueError(f"{model.name} cannot be written as a transformers ViT: "
                         + "; ".join(problems) + ".")
    w = export_weights(model)
    top = cfg["include_top"]
    sd = write_links(w, name_map(cfg, "vit", "vit." if top else ""))
    act = {v: k for k, v in _ACTIVATIONS.items() if k != "gelu_new"}[cfg["mlp_activation"]]
    h, wd = cfg["image_size"]
    config = dict(
        model_type="vit", architectures=["ViTForImageClassification" if top else "ViTModel"],
        hidden_size=D, num_hidden_layers=cfg["depth"], num_attention_heads=cfg["num_heads"],
        intermediate_size=cfg["mlp_dim"], hidden_act=act,
        layer_norm_eps=cfg["layer_norm_epsilon"], patch_size=cfg["patch_size"],
        image_size=h if h == wd else [h, wd],  # transformers' ViT takes (h, w) too
        num_channels=3, qkv_bias=True, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pooler_act="tanh", pooler_output_size=D,
    )
    if top:
        n = cfg["num_classes"]
        names = model.label_names or [f"LABEL_{i}" for i in range(n)]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    processor = processor_config(model.preprocessing, (h, wd))
    if directory is not None:
        from safetensors.numpy import save_file

        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        save_file(sd, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(directory, CONFIG), "w") as f:
            json.dump(config, f, indent=2)
        if processor is not None:
            with open(os.path.join(directory, PREPROCESSOR), "w") as f:
                json.dump(processor, f, indent=2)
    return sd, config


def processor_config(recipe, size):
    """transformers' `preprocessor_config.json` for our recipe at `size`, or
    None where transformers' processors cannot express it (area resizing,
    keras-hub's crop-then-resize): ViTImageProcessor for a plain squash,
    DeiTImageProcessor for squash + crop, CLIPImageProcessor for the
    shorter side + crop."""
    if recipe["interpolation"] == "area" or recipe["resize"] == "crop_resize":
        return None
    h, w = (size, size) if isinstance(size, int) else size
    if recipe["resize"] == "shorter" and h != w:
        return None  # transformers' shortest edge + crop has no rectangular rule of timm's
    resized = [resized_side(s, recipe) for s in (h, w)]
    out = dict(do_resize=True, resample=next(k for k, v in _RESAMPLE.items()
                                             if isinstance(k, int) and v == recipe["interpolation"]),
               do_rescale=recipe["input_scale"] == 255, rescale_factor=1 / 255,
               do_normalize=True, do_convert_rgb=recipe["alpha"] == "white",
               image_mean=list(recipe["mean"]), image_std=list(recipe["std"]))
    if recipe["resize"] == "shorter":
        out.update(image_processor_type="CLIPImageProcessor",
                   size={"shortest_edge": resized[0]}, do_center_crop=True,
                   crop_size={"height": h, "width": w})
    elif recipe["crop_pct"] < 1:
        out.update(image_processor_type="DeiTImageProcessor",
                   size={"height": resized[0], "width": resized[1]}, do_center_crop=True,
                   crop_size={"height": h, "width": w})
    else:
        out.update(image_processor_type="ViTImageProcessor",
                   size={"height": h, "width": w})
    return out
