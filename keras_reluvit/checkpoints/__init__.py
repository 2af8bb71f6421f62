"""Pretrained checkpoints in and out: timm, big_vision / AugReg, Hugging Face
transformers, keras-hub.

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
- Hugging Face transformers directories (`save_pretrained`): ViT, DeiT,
  DINOv2 (with registers), CLIP vision towers (`hf.py` lists them);
- keras-hub `ViTBackbone` / `ViTImageClassifier` preset directories
  (`config.json` + `model.weights.h5`, `task.json` + `task.weights.h5`);
- our own presets (`ViT.save_to_preset`), `.keras` and `.weights.h5` files.

Every reader produces the `ViT` arguments and a `{variable path: array}` map;
loading then checks both ways (a checkpoint key the ViT cannot hold, a weight
the checkpoint lacks, a shape that does not fit) before any weight is
assigned, so a bad file raises an error naming the file and the key and
nothing is half-loaded. A checkpoint at another resolution is resampled to
`image_size` (bilinear position embedding, prefix tokens kept).

The other way, `timm_state_dict(model, "x.safetensors")`,
`big_vision_npz(model, "x.npz")` and `hf_state_dict(model, "dir")` write a
ViT in those layouts.

One module per format, each with `detect(path)`, `read(path, overrides)`
and (where there is one) its writer, over one name map: `timm.py`,
`big_vision.py`, `hf.py`, `keras_hub.py`, `preset.py` (ours); what they
share (errors, the link machinery of the name maps, checks, `assign`) is in
`common.py`. This module holds the registry `FORMATS`, detects the format
and builds the model; a new format is a module and a line in `FORMATS`.
"""

import os
import re
import sys

import keras
import numpy as np

from keras_reluvit._logging import say
from keras_reluvit.checkpoints import big_vision
from keras_reluvit.checkpoints import hf
from keras_reluvit.checkpoints import keras_hub
from keras_reluvit.checkpoints import preset
from keras_reluvit.checkpoints import timm
from keras_reluvit.checkpoints.big_vision import big_vision_npz  # noqa: F401
from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import assign
from keras_reluvit.checkpoints.common import image_pair
from keras_reluvit.checkpoints.common import model_class
from keras_reluvit.checkpoints.common import square_grid
from keras_reluvit.checkpoints.hf import hf_state_dict  # noqa: F401
from keras_reluvit.checkpoints.preset import PRESET_CONFIG
from keras_reluvit.checkpoints.preset import PRESET_METADATA  # noqa: F401
from keras_reluvit.checkpoints.preset import PRESET_WEIGHTS
from keras_reluvit.checkpoints.preset import save_to_preset  # noqa: F401
from keras_reluvit.checkpoints.timm import timm_state_dict  # noqa: F401
from keras_reluvit.models import extensions
from keras_reluvit.models import variants
from keras_reluvit.models.attention_kinds import deserialize_attention
from keras_reluvit.models.attention_kinds import resolve_attention


def _variant_name(width, patch):
    for name, (w, *_rest) in variants.VARIANTS.items():
        if w == width:
            return f"{name}/{patch}"
    return f"B/{patch}"  # every dimension is passed explicitly anyway


# The formats, in the order they are tried: name -> (detect(path) -> bool,
# read(path, overrides) -> (ViT arguments, weights)). A new format is one
# module with those two functions and a line here.
FORMATS = {
    "hf": (hf.detect, hf.read),
    "keras_hub": (keras_hub.detect, keras_hub.read),
    "timm_hub": (timm.detect_hub, timm.read_hub),
    "preset": (preset.detect, preset.read),
    "big_vision": (big_vision.detect, big_vision.read),
    "keras": (preset.detect_keras, preset.read_keras),
    "weights_h5": (preset.detect_weights_h5, preset.read_weights_h5),
    "timm": (timm.detect, timm.read),
}
# Formats whose reader gives a full architecture + weights map (the ones
# `kr.load_weights` can check against an existing model).
CHECKPOINT_FORMATS = ("timm", "timm_hub", "big_vision", "keras_hub", "preset", "hf")


def detect_format(path):
    """The checkpoint format of `path`, one of `FORMATS`: `"hf"`,
    `"keras_hub"`, `"timm_hub"`, `"preset"`, `"big_vision"`, `"keras"`, `"weights_h5"` or
    `"timm"`."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, PRESET_CONFIG)):
        raise CheckpointError(f"{path}: a directory without {PRESET_CONFIG}; not a preset "
                              "or a transformers checkpoint.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    for name, (detect, _) in FORMATS.items():
        if detect(path):
            return name
    raise CheckpointError(
        f"{path}: unknown checkpoint format; expected .safetensors / .pth / .bin "
        "(timm), .npz (big_vision, AugReg), a preset or transformers directory, .keras or "
        ".weights.h5."
    )


HUB_PREFIX = "hf://"
# What a model directory on the Hub needs: configs, safetensors weights
# (single or sharded), Keras weights (keras-hub presets, ours).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.weights.h5"]


def hub_directory(handle):
    """`hf://org/name[@revision]` -> the local snapshot directory, through
    `huggingface_hub` (its cache, `HF_HOME`, and offline mode
    `HF_HUB_OFFLINE=1`, as timm and keras-hub use it). `pytorch_model.bin`
    is fetched only where a repository has no safetensors weights."""
    spec = handle[len(HUB_PREFIX):]
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise CheckpointError(f"{handle}: a Hugging Face handle is hf://ORG/NAME[@REVISION].")
    try:
        import huggingface_hub
        import huggingface_hub.constants
    except ImportError:
        raise ModuleNotFoundError(f"Loading {handle} needs huggingface_hub: pip install "
                                  "\"keras-reluvit[hub]\" (or pip install huggingface_hub).",
                                  name="huggingface_hub") from None

    def fetch(patterns):
        return huggingface_hub.snapshot_download(repo, revision=revision or None,
                                                 allow_patterns=patterns)

    try:
        directory = fetch(_HUB_PATTERNS)
        if not any(f.endswith((".safetensors", ".weights.h5")) for f in os.listdir(directory)):
            directory = fetch(_HUB_PATTERNS + ["pytorch_model.bin"])
    except Exception as e:  # not cached and no network, no such repo, ...
        cache = huggingface_hub.constants.HF_HUB_CACHE
        raise CheckpointError(
            f"{handle}: cannot get {repo} from the Hugging Face Hub ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}) and it is not in the cache at "
            f"{cache}. On a machine with network run `hf download {repo}` (or "
            f"huggingface_hub.snapshot_download({repo!r})) and copy its cache here "
            "(HF_HOME / HF_HUB_CACHE), or pass the downloaded directory instead of the "
            "handle.") from None
    return directory


def read_checkpoint(path, architecture=None, **overrides):
    """`(arch, weights, format)`: the ViT arguments read from `path` and a
    `{variable path: (array, source key)}` map. Mostly internal; see
    `load_checkpoint`."""
    path = os.fspath(path)
    fmt = detect_format(path)
    if architecture is not None and fmt != "timm":
        raise CheckpointError(
            f"{path}: architecture={architecture!r} names the timm model of a bare state "
            f"dict; a {fmt} checkpoint carries its own architecture.")
    arch, w = FORMATS[fmt][1](path, dict(overrides, architecture=architecture))
    return arch, w, fmt


def load_checkpoint(path, attention=None, num_classes=None, image_size=None,
                    posemb_resampling=None, architecture=None, **overrides):
    """Builds a `ViT` from a pretrained checkpoint, architecture and weights.

    Args:
        path: a timm `.safetensors` / `.pth` / `.bin` state dict, a big_vision
            or AugReg `.npz`, a Hugging Face transformers ViT / DeiT / DINOv2 /
            CLIP directory, a keras-hub ViT preset directory, a
            keras_reluvit preset directory or `.keras` file, or one of those
            directories on the Hugging Face Hub as `hf://org/name[@revision]`.
            The format is detected from the file.
        attention: the attention of the returned model. Default: the
            checkpoint's own, i.e. `"softmax"` for timm, big_vision,
            transformers and keras-hub (what every public checkpoint was trained with) and the
            stored one for our presets and `.keras` files. `"relu"` loads the
            same weights into ReLU/L attention, the start of a
            softmax -> ReLU/L fine-tune (see the `relu_from_softmax` recipe).
        num_classes: None keeps the checkpoint's head; another number gives a
            fresh zero-initialised head of that size; 0 returns pooled
            features (no head).
        image_size: None keeps the checkpoint's resolution; another size
            resamples the learned position embedding (prefix tokens kept),
            e.g. a 384 px AugReg checkpoint into a 224 px model: bilinearly,
            except for transformers' DINOv2, resampled as transformers does
            at run time (bicubic; antialiased with registers), so its
            features at 224 px are transformers' own.
        posemb_resampling: None (the format's, above), `"bilinear"`,
            `"bicubic"` or `"bicubic_antialias"` (timm's own resampling).
        architecture: for a bare timm state dict, its timm name (e.g.
            `"vit_base_patch16_clip_224.openai_ft_in1k"`): what the file
            cannot say — a CLIP tower's LayerNorm epsilon 1e-5, quick GELU,
            the family's preprocessing (see
            `checkpoints.timm.preprocessing_from_name`). Hub directories and
            other formats carry their own.
        **overrides: any other `ViT` argument, for values a checkpoint does not
            store or to change them: `num_heads` (timm state dicts store no
            head count; standard widths are inferred), `mlp_activation`
            (`"gelu"` exact for timm / keras-hub, `"gelu_tanh"` for big_vision,
            as each source trained), `layer_norm_epsilon`, `pool`, `dropout`,
            `dtype`, `name`.

    Returns:
        A `keras_reluvit.ViT` that takes what its source's model takes
        (NHWC): the weights are unchanged, and `model.preprocessing` holds
        the source's recipe (resize, crop, mean/std), so
        `model.preprocessor(photos)` gives the inputs the source's own
        pipeline gives, and `model.label_names` its class names.

    Example:

    ```python
    import keras_reluvit as kr
    model = kr.load_checkpoint("vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors")
    relu = kr.load_checkpoint("S_16-i21k-300ep.npz", attention="relu", num_classes=10,
                              image_size=224)
    ```
    """
    path = os.fspath(path)
    if path.startswith(HUB_PREFIX):
        repo = path[len(HUB_PREFIX):].partition("@")[0]
        overrides.setdefault("name", "vit_" + re.sub(r"\W+", "_", repo.split("/")[-1]).lower())
        directory = hub_directory(path)
        arch, weights, fmt = read_checkpoint(directory, architecture=architecture,
                                             _image_size_hint=_pair(image_size), **overrides)
        return _build(arch, weights, fmt, directory, attention, num_classes, image_size,
                      overrides, posemb_resampling, source=path)
    arch, weights, fmt = read_checkpoint(path, architecture=architecture,
                                         _image_size_hint=_pair(image_size), **overrides)
    return _build(arch, weights, fmt, path, attention, num_classes, image_size, overrides,
                  posemb_resampling)


def _pair(size):
    """An image size as `(h, w)` (None stays None)."""
    return None if size is None else image_pair(size)


def _build(arch, weights, fmt, path, attention, num_classes, image_size, overrides,
           posemb_resampling=None, source=None):
    arch = dict(arch)
    refused = arch.pop("_needs_num_classes", None)
    resampling = arch.pop("_posemb_resampling", "bilinear")
    resampling = posemb_resampling or resampling
    if refused and num_classes is None:
        raise CheckpointError(refused)
    grid_n = arch.pop("_grid", None)
    native = arch.pop("_native_grid", None)
    patch = arch["patch_size"]
    if native is None and grid_n is not None:
        side = square_grid(grid_n, "the position embedding", path)
        native = (side, side)
    if native is None:  # sincos2d posemb: the checkpoint has no resolution
        native = (224 // patch, 224 // patch)
    arch.setdefault("image_size", (native[0] * patch, native[1] * patch))
    own = dict(arch, attention=arch.get("attention", "softmax"))
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
    if fresh_head or not arch.get("include_top", True):  # the source's classes are gone
        arch.pop("label_names", None)
    arch.update(overrides)
    _say_changes(path if source is None else source, own, arch, image_size)
    if "variant" not in arch:
        arch["variant"] = _variant_name(arch["width"], patch)
    if "name" not in arch:
        base = os.path.basename(path.rstrip("/"))
        arch["name"] = "vit_" + re.sub(r"\W+", "_", base.split(".")[0]).strip("_").lower()
    if not arch.get("include_top", True):  # features: the checkpoint's head is dropped
        weights = {k: v for k, v in weights.items() if not k.startswith("head/")}
    try:
        model = model_class()(**arch)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    assign(model, weights, path, fresh_head=fresh_head, posemb_resampling=resampling,
           native_grid=native)
    model.checkpoint_source = {"path": source or path, "format": fmt}
    return model


# What a caller may change about a checkpoint's architecture (beside the
# head, which `assign` names): each change is said in one printed line.
_ANNOUNCED = ("attention", "pool", "mlp_activation", "qk_norm", "posemb", "fc_norm",
              "layer_norm_epsilon", "dropout", "dtype")


def _say_changes(path, own, arch, image_size):
    """One line naming what differs from the checkpoint's own architecture
    (from what to what), so that a fine-tune never swaps, say, softmax for
    ReLU attention unseen."""
    changes = [f"{k} {own.get(k)!r} -> {arch[k]!r}" for k in _ANNOUNCED
               if k in arch and arch[k] is not None and own.get(k) is not None
               and _plain(arch[k]) != _plain(own.get(k))]
    if image_size is not None and image_pair(image_size) != image_pair(own["image_size"]):
        changes.append(f"image_size {tuple(image_pair(own['image_size']))} -> "
                       f"{tuple(image_pair(image_size))} (position embedding resampled)")
    if changes:
        say(f"{os.path.basename(path.rstrip('/'))}: the checkpoint's "
            f"architecture changed: {'; '.join(changes)}.")


def _plain(value):
    """An attention given as a name or as a dict of arguments, comparable."""
    if isinstance(value, (str, dict)):
        try:
            value = resolve_attention(value)
        except ValueError:
            return value
        return {k: getattr(v, "__name__", v) for k, v in value.items()}
    return value


def load_model(source, **overrides):
    """Any model source as a `ViT`: a `.keras` file (Keras' own loader), a
    preset / timm / transformers / keras-hub directory, a checkpoint file or
    an `hf://org/name` handle (`load_checkpoint`, with `overrides`)."""
    source = os.fspath(source)
    if not overrides and os.path.isfile(source) and source.lower().endswith(".keras"):
        return keras.saving.load_model(source, compile=False)
    return load_checkpoint(source, **overrides)


def fold_input_normalization(model, mean=None, std=None):
    """Folds a per-channel input normalisation into the patch embedding, in
    place, so the model takes [-1, 1] images instead.

    A checkpoint trained on `(pixel - mean) / std` with pixels in [0, 1]
    (default: its own recipe's, `model.preprocessing`) then gives its logits
    on `x = 2 * pixel - 1`: the stem is linear, so
    `W * ((x + 1) / 2 - mean) / std + b` is again a convolution of `x`.
    Exact up to float rounding. The model's recipe then says [-1, 1], so
    `model.preprocessor` keeps giving what the model takes.
    """
    recipe = model.preprocessing
    mean = recipe["mean"] if mean is None else mean
    std = recipe["std"] if std is None else std
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
    model._config["preprocessing"] = dict(recipe, mean=(0.5,) * 3, std=(0.5,) * 3)
    return model


def from_preset(directory, **overrides):
    """Loads a model directory as a `ViT`: a preset (ours, or a keras-hub
    ViT), a Hugging Face transformers directory or a timm hub directory, or
    such a directory on the Hugging Face Hub by handle
    (`"hf://timm/vit_small_patch16_224.augreg_in21k_ft_in1k"`,
    `"hf://google/vit-base-patch16-224"`; see `hub_directory`);
    `attention`, `num_classes`, `image_size` and other overrides as
    `load_checkpoint` (the attention defaults to the checkpoint's own)."""
    directory = os.fspath(directory)
    if directory.startswith(HUB_PREFIX):
        return load_checkpoint(directory, **overrides)
    fmt = detect_format(directory)
    if fmt not in ("preset", "keras_hub", "hf", "timm_hub"):
        raise CheckpointError(f"{directory}: not a model directory (a preset's config.json + "
                              f"{PRESET_WEIGHTS}, a transformers or a timm hub directory).")
    return load_checkpoint(directory, **overrides)


# `ViT.from_preset` / `save_to_preset` and the builders' `weights=` ask here.
extensions.register("checkpoints", sys.modules[__name__])
