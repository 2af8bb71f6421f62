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

One module per format, each with its reader and (where there is one) its
writer: `timm.py`, `big_vision.py`, `keras_hub.py`, `preset.py` (ours); what
they share is in `common.py`. This module detects the format and builds the
model.
"""

import os
import re
import zipfile

import keras
import numpy as np

from keras_reluvit import variants
from keras_reluvit.checkpoints.big_vision import _big_vision
from keras_reluvit.checkpoints.big_vision import _read_npz
from keras_reluvit.checkpoints.big_vision import big_vision_npz  # noqa: F401
from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import model_class
from keras_reluvit.checkpoints.common import _square_grid
from keras_reluvit.checkpoints.common import assign
from keras_reluvit.checkpoints.preset import PRESET_CONFIG
from keras_reluvit.checkpoints.preset import PRESET_METADATA  # noqa: F401
from keras_reluvit.checkpoints.preset import PRESET_WEIGHTS
from keras_reluvit.checkpoints.preset import _ours
from keras_reluvit.checkpoints.preset import _read_preset
from keras_reluvit.checkpoints.preset import save_to_preset  # noqa: F401
from keras_reluvit.checkpoints.timm import _read_timm_file
from keras_reluvit.checkpoints.timm import _timm
from keras_reluvit.checkpoints.timm import timm_state_dict  # noqa: F401
from keras_reluvit.attention_kinds import deserialize_attention


def _variant_name(width, patch):
    for name, (w, *_rest) in variants.VARIANTS.items():
        if w == width:
            return f"{name}/{patch}"
    return f"B/{patch}"  # every dimension is passed explicitly anyway


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
        if not isinstance(model, model_class()):
            raise CheckpointError(f"{path} does not hold a keras_reluvit ViT.")
        arch, w = _ours(model)
    else:
        raise CheckpointError(
            f"{path}: a .weights.h5 file stores no architecture; build the model and "
            "call model.load_weights / kr.load_weights(model, path), or save a preset.")
    return arch, w, fmt


# Weights a loaded model may lack in the checkpoint (new parts of an
# attention preset: the gate of "relu_gated", the scales of "relu_learned").


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
        model = model_class()(**arch)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    assign(model, weights, path, fresh_head=fresh_head)
    model.checkpoint_source = {"path": path, "format": fmt}
    return model


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
