"""keras-hub `ViTBackbone` (+ `ViTImageClassifier`) preset directories
(`config.json` + `model.weights.h5`, `task.json` + `task.weights.h5`), in."""

import json
import os

import numpy as np

from keras_reluvit.checkpoints.common import CheckpointError
from keras_reluvit.checkpoints.common import WeightReader
from keras_reluvit.checkpoints.common import read_json
from keras_reluvit.preprocessing import check_preprocessing
from keras_reluvit.preprocessing import imagenet1k_labels


def detect(path):
    """A preset directory whose `config.json` names keras-hub."""
    cfg = os.path.join(path, "config.json")
    if not (os.path.isdir(path) and os.path.exists(cfg)):
        return False
    with open(cfg) as f:
        return "keras_hub" in f.read()


def read(path, overrides):
    config = read_json(os.path.join(path, "config.json"))
    if config.get("class_name") not in ("ViTBackbone",):
        raise CheckpointError(
            f"{path}: a keras-hub {config.get('class_name')} preset, not a ViTBackbone.")
    return _keras_hub(path, config, path)


def _converter_config(directory):
    """The `ImageConverter` config of a preset: `image_converter.json`, else
    the one nested in `preprocessor.json`; None when there is neither."""
    path = os.path.join(directory, "image_converter.json")
    if os.path.exists(path):
        return path, read_json(path).get("config", {})
    path = os.path.join(directory, "preprocessor.json")
    if os.path.exists(path):
        conv = read_json(path).get("config", {}).get("image_converter")
        if isinstance(conv, dict):
            return path, conv.get("config", {})
    return None, None


def preprocessing_from_converter(directory):
    """Our recipe from keras-hub's `ImageConverter` (a Keras `Resizing` with
    `crop_to_aspect_ratio`, then `x * scale + offset` on 0-255 pixels; the
    resized values are not clipped, so bicubic overshoot is kept).
    Without a converter, keras-hub's ViT presets' own: [-1, 1], bilinear."""
    path, conv = _converter_config(directory)
    if conv is None:
        conv = dict(scale=1 / 127.5, offset=-1.0, interpolation="bilinear", antialias=False,
                    crop_to_aspect_ratio=True)
    if not isinstance(conv, dict):
        raise CheckpointError(f"{path}: the image converter's config is not an object.")
    if conv.get("pad_to_aspect_ratio"):
        raise CheckpointError(f"{path}: pad_to_aspect_ratio=True is not supported.")
    interp = conv.get("interpolation", "bilinear")
    if interp not in ("bilinear", "bicubic"):
        raise CheckpointError(f"{path}: interpolation {interp!r} is not supported "
                              "('bilinear', 'bicubic').")
    try:
        scale = np.broadcast_to(np.asarray(conv.get("scale") or 1.0, "float64"), (3,))
        offset = np.broadcast_to(np.asarray(conv.get("offset") or 0.0, "float64"), (3,))
        std = 1.0 / (255.0 * scale)  # x = p * scale + offset = (p / 255 - mean) / std
        return check_preprocessing(dict(
            resize="crop_resize" if conv.get("crop_to_aspect_ratio", True) else "squash",
            crop_pct=1.0, interpolation=interp, antialias=bool(conv.get("antialias", False)),
            round_uint8=False, clip=False, crop_offset="floor", mean=tuple(-offset * std),
            std=tuple(std)))
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: scale / offset: {e}") from None


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
    w = WeightReader()

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
        if task["num_classes"] == 1000:
            arch["label_names"] = imagenet1k_labels()
        w.put("head/kernel", raw[dense[0] + "0"], dense[0] + "0")
        w.put("head/bias", raw[dense[0] + "1"], dense[0] + "1")
    arch["preprocessing"] = preprocessing_from_converter(directory)
    return arch, w
