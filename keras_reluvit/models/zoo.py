"""Named builders (`ViT_S16`, ...) and weight loading across resolutions."""

import math
import os

import keras

from keras_reluvit._logging import say
from keras_reluvit.models import extensions
from keras_reluvit.models.keywords import check_keywords
from keras_reluvit.models.posemb import resample_posemb
from keras_reluvit.models.vit import ViT
from keras_reluvit.models.vit import accepted_keywords


def transfer_weights(source, target):
    """Copies a ViT's weights into another ViT of the same architecture.

    The image size may differ (the learned position embedding is resampled
    bilinearly); a head of another shape (other `num_classes`) is left at
    its initialisation, as when fine-tuning on a new label set. Returns the
    list of variable paths that were not copied.
    """
    src, dst = _by_path(source), _by_path(target)
    # A head the source lacks (features only) is a fresh head, as another size.
    missing = sorted(p for p in set(dst) - set(src) if not p.startswith("head/"))
    unexpected = sorted(p for p in set(src) - set(dst) if not p.startswith("head/"))
    if missing or unexpected:
        raise ValueError(
            "The two models have different architectures. Missing in the "
            f"source: {missing[:8]}; only in the source: {unexpected[:8]}."
        )
    prefix = target.posemb_prefix_tokens
    skipped = []
    for path, var in dst.items():
        if path not in src:
            skipped.append(path)
            continue
        value = keras.ops.convert_to_numpy(src[path])
        if path.endswith("pos_embedding/embedding"):
            value = resample_posemb(
                value, target.grid_size, source.grid_size, prefix
            )
        if value.shape != tuple(var.shape):
            if path.startswith("head/"):
                skipped.append(path)
                continue
            raise ValueError(
                f"Weight {path} has shape {value.shape} in the source and "
                f"{tuple(var.shape)} in the target."
            )
        var.assign(value)
    return skipped


def _by_path(model):
    # Variable paths start with the layer names inside the model
    # ("block_00/attention/query/kernel"), not with the model's own name.
    return {v.path: v for v in model.weights}


def resize_model(model, image_size):
    """A copy of `model` for another `image_size`, posemb resampled.

    Example:

    >>> import keras_reluvit
    >>> m = keras_reluvit.ViT("Ti/16", image_size=32, depth=1, num_classes=3)
    >>> m48 = keras_reluvit.resize_model(m, 48)
    >>> m48.image_size
    (48, 48)
    """
    config = model.get_config()
    config["image_size"] = image_size
    config.pop("name", None)
    new = ViT.from_config(config)
    transfer_weights(model, new)
    return new


# Architecture choices that change what the weights compute without changing
# their shapes: a checkpoint loaded into an existing model must agree on them.
_SEMANTIC_KEYS = ("pool", "mlp_activation", "class_token", "num_register_tokens",
                  "posemb_prefix", "fc_norm", "qk_norm", "layer_norm_epsilon",
                  "representation_size", "posemb", "pre_norm")


def load_weights(model, path):
    """Loads `path` into `model`: a `.keras` / `.weights.h5` file (the
    position embedding resampled when saved at another image size) or any
    checkpoint `keras_reluvit.load_checkpoint` reads (timm, big_vision /
    AugReg, keras-hub, presets), which must then match the model's
    architecture; use `load_checkpoint` to build the model from the
    checkpoint instead."""
    checkpoints = extensions.provider("checkpoints")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No weights file at {path!r}.")
    fmt = checkpoints.detect_format(path)
    if fmt in checkpoints.CHECKPOINT_FORMATS:
        config = model.get_config()
        arch, weights, _ = checkpoints.read_checkpoint(path, num_heads=config["num_heads"])
        differ = {k: (arch[k], config[k]) for k in _SEMANTIC_KEYS
                  if k in arch and arch[k] != config[k]}
        if differ:
            raise ValueError(
                f"{path} was trained with other architecture choices than {model.name}: "
                + ", ".join(f"{k}={a!r} (model: {b!r})" for k, (a, b) in differ.items())
                + ". Use keras_reluvit.load_checkpoint(path) to build the model the "
                "checkpoint describes.")
        checkpoints.assign(model, weights, path)
        return model
    if path.endswith(".keras"):
        source = keras.saving.load_model(path, compile=False)
        if not isinstance(source, ViT):
            raise ValueError(f"{path} does not hold a keras_reluvit ViT.")
        skipped = transfer_weights(source, model)
        if skipped:
            say(f"kept a fresh head ({skipped}).")
        return model
    if path.endswith(".weights.h5"):
        old, head = _h5_shapes(path, model)
        config = model.get_config()
        config.pop("name", None)
        prefix = model.posemb_prefix_tokens
        source_cfg = dict(config)
        if old is not None and old - prefix != math.prod(model.grid_size):
            side = int(round(math.sqrt(old - prefix)))
            if side * side != old - prefix:
                raise ValueError(
                    f"{path} holds a non-square position embedding "
                    f"({old - prefix} patches); load it into a model of its "
                    "own size and use keras_reluvit.resize_model."
                )
            source_cfg["image_size"] = side * model.patch_size
        own_head = config["num_classes"] if config["include_top"] else None
        if head != own_head:  # another class count (or none): a fresh head
            source_cfg.update(include_top=head is not None, label_names=None,
                              num_classes=head or config["num_classes"])
        if source_cfg == config:
            model.load_weights(path)
            return model
        source = ViT.from_config(source_cfg)
        source.load_weights(path)
        skipped = transfer_weights(source, model)
        if skipped:
            say(f"{os.path.basename(path)} has a head of {head} classes; "
                f"{model.name} keeps a fresh zero-initialised head of {own_head} "
                f"({', '.join(skipped)}).")
        return model
    raise ValueError(
        f"Unknown weights file {path!r}: expected a .keras or .weights.h5 "
        "file."
    )


def _h5_shapes(path, model):
    """(position-embedding rows, head classes or None) of a ViT's
    `.weights.h5` file, which names layers by class (`dense`, `dense_1`,
    ... in the model's order: the head is the last Dense, after
    `pre_logits` where the model has one)."""
    import re

    import h5py

    posemb, denses = [], {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if not hasattr(obj, "shape"):
                return
            if "position_embedding" in name and len(obj.shape) == 3:
                posemb.append(obj.shape[1])
            m = re.fullmatch(r"layers/dense(?:_(\d+))?/vars/0", name)
            if m and len(obj.shape) == 2:
                denses[int(m.group(1) or 0)] = obj.shape[1]

        f.visititems(visit)
    pre_logits = 1 if model.get_config()["representation_size"] else 0
    head = denses[max(denses)] if len(denses) > pre_logits else None
    return (posemb[0] if posemb else None), head


def _builder(variant):
    size, patch = variant.split("/")
    accepted = ["weights"] + [k for k in accepted_keywords() if k != "variant"]

    def build(weights=None, **kwargs):
        check_keywords(f"ViT_{size}{patch}", {k: v for k, v in kwargs.items()
                                             if k not in accepted}, accepted)
        if weights is not None and _foreign(weights):
            return _from_checkpoint(variant, weights, kwargs)
        model = ViT(variant=variant, **kwargs)
        if weights is not None:
            load_weights(model, weights)
        return model

    build.__name__ = f"ViT_{size}{patch}"
    build.__qualname__ = build.__name__
    build.__doc__ = f"""ViT-{variant} (big_vision dims), `attention="relu"` by default.

    Args:
        weights: optional path of a `.keras` / `.weights.h5` file of the same
            architecture (saved at another image size, its position embedding
            is resampled bilinearly to this model's `image_size`), or a
            pretrained ViT-{variant} checkpoint (timm `.safetensors`/`.pth`,
            big_vision / AugReg `.npz`, keras-hub or keras_reluvit preset
            directory): pooling, qk-norm, GELU etc. are then read from it, as
            `keras_reluvit.load_checkpoint` does, while the attention stays
            this builder's (`"relu"` unless given; pass `attention="softmax"`
            to run the checkpoint as it was trained).
        **kwargs: any `keras_reluvit.ViT` argument (`attention`,
            `num_classes`, `image_size`, `pool`, `posemb`, `qk_norm`, ...).

    Example:

    >>> import keras_reluvit
    >>> model = keras_reluvit.{build.__name__}(attention="relu", num_classes=10)
    >>> model.output_shape
    (None, 10)
    """
    return build


def _foreign(path):
    checkpoints = extensions.provider("checkpoints")
    try:
        return checkpoints.detect_format(path) in checkpoints.CHECKPOINT_FORMATS
    except (FileNotFoundError, ValueError):
        return False


def _from_checkpoint(variant, path, kwargs):
    from keras_reluvit.models.variants import parse_variant

    checkpoints = extensions.provider("checkpoints")
    want = parse_variant(variant)
    kwargs = dict(kwargs)
    kwargs.setdefault("attention", "relu")
    heads = kwargs.pop("num_heads", want["num_heads"])
    model = checkpoints.load_checkpoint(path, num_heads=heads, **kwargs)
    cfg = model.get_config()
    differ = {k: (cfg[k], v) for k, v in want.items() if cfg[k] != v}
    if differ:
        raise ValueError(
            f"{path} holds a ViT with " + ", ".join(f"{k}={a}" for k, (a, _) in differ.items())
            + f", not ViT-{variant} (" + ", ".join(f"{k}={b}" for k, (_, b) in differ.items())
            + "); use keras_reluvit.load_checkpoint(path).")
    return model


ViT_Ti8 = _builder("Ti/8")
ViT_Ti16 = _builder("Ti/16")
ViT_Ti32 = _builder("Ti/32")
ViT_S8 = _builder("S/8")
ViT_S16 = _builder("S/16")
ViT_S32 = _builder("S/32")
ViT_B8 = _builder("B/8")
ViT_B16 = _builder("B/16")
ViT_B32 = _builder("B/32")
ViT_L8 = _builder("L/8")
ViT_L16 = _builder("L/16")
ViT_L32 = _builder("L/32")
ViT_H14 = _builder("H/14")

BUILDERS = {
    "ViT_Ti8": ViT_Ti8,
    "ViT_Ti16": ViT_Ti16,
    "ViT_Ti32": ViT_Ti32,
    "ViT_S8": ViT_S8,
    "ViT_S16": ViT_S16,
    "ViT_S32": ViT_S32,
    "ViT_B8": ViT_B8,
    "ViT_B16": ViT_B16,
    "ViT_B32": ViT_B32,
    "ViT_L8": ViT_L8,
    "ViT_L16": ViT_L16,
    "ViT_L32": ViT_L32,
    "ViT_H14": ViT_H14,
}
