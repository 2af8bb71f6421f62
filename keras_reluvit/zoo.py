"""Named builders (`ViT_S16`, ...) and weight loading across resolutions."""

import math
import os

import keras
import numpy as np

from keras_reluvit.vit import ViT


def resample_posemb(posemb, new_grid, old_grid=None, num_prefix_tokens=0):
    """Bilinearly resamples a `(1, prefix + h*w, D)` position embedding.

    As big_vision's high-resolution fine-tuning: prefix (class token) rows are
    kept, the patch grid is resized. `old_grid` defaults to a square grid.
    """
    posemb = np.asarray(posemb, dtype="float32")
    prefix, grid = (
        posemb[:, :num_prefix_tokens],
        posemb[:, num_prefix_tokens:],
    )
    n = grid.shape[1]
    if old_grid is None:
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(
                f"Cannot infer the grid of a position embedding with {n} "
                "patch positions; pass old_grid=(h, w)."
            )
        old_grid = (side, side)
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if old_grid[0] * old_grid[1] != n:
        raise ValueError(f"old_grid {old_grid} does not hold {n} positions.")
    if old_grid != new_grid:
        grid = grid.reshape(1, *old_grid, -1)
        grid = keras.ops.convert_to_numpy(
            keras.ops.image.resize(
                grid, new_grid, interpolation="bilinear", antialias=False
            )
        )
        grid = grid.reshape(1, new_grid[0] * new_grid[1], -1)
    return np.concatenate([prefix, grid], axis=1)


def transfer_weights(source, target):
    """Copies a ViT's weights into another ViT of the same architecture.

    The image size may differ (the learned position embedding is resampled
    bilinearly); a head of another shape (other `num_classes`) is left at
    its initialisation, as when fine-tuning on a new label set. Returns the
    list of variable paths that were not copied.
    """
    src, dst = _by_path(source), _by_path(target)
    missing = sorted(set(dst) - set(src))
    unexpected = sorted(set(src) - set(dst))
    if missing or unexpected:
        raise ValueError(
            "The two models have different architectures. Missing in the "
            f"source: {missing[:8]}; only in the source: {unexpected[:8]}."
        )
    prefix = 1 if target.get_config()["pool"] == "tok" else 0
    skipped = []
    for path, var in dst.items():
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


def load_weights(model, path):
    """Loads `path` (`.keras` or `.weights.h5`) into `model`, resampling the
    position embedding when the file was saved at another image size."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No weights file at {path!r}.")
    if path.endswith(".keras"):
        source = keras.saving.load_model(path, compile=False)
        if not isinstance(source, ViT):
            raise ValueError(f"{path} does not hold a keras_reluvit ViT.")
        skipped = transfer_weights(source, model)
        if skipped:
            print(f"keras_reluvit: kept a fresh head ({skipped}).")
        return model
    if path.endswith(".weights.h5"):
        old = _h5_posemb_tokens(path)
        config = model.get_config()
        prefix = 1 if config["pool"] == "tok" else 0
        if old is not None and old - prefix != math.prod(model.grid_size):
            side = int(round(math.sqrt(old - prefix)))
            if side * side != old - prefix:
                raise ValueError(
                    f"{path} holds a non-square position embedding "
                    f"({old - prefix} patches); load it into a model of its "
                    "own size and use keras_reluvit.resize_model."
                )
            config.pop("name", None)
            config["image_size"] = side * model.patch_size
            source = ViT.from_config(config)
            source.load_weights(path)
            transfer_weights(source, model)
            return model
        model.load_weights(path)
        return model
    raise ValueError(
        f"Unknown weights file {path!r}: expected a .keras or .weights.h5 "
        "file."
    )


def _h5_posemb_tokens(path):
    import h5py

    found = []
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if "position_embedding" in name and hasattr(obj, "shape"):
                if len(obj.shape) == 3:
                    found.append(obj.shape[1])

        f.visititems(visit)
    return found[0] if found else None


def _builder(variant):
    size, patch = variant.split("/")

    def build(weights=None, **kwargs):
        model = ViT(variant=variant, **kwargs)
        if weights is not None:
            load_weights(model, weights)
        return model

    build.__name__ = f"ViT_{size}{patch}"
    build.__qualname__ = build.__name__
    build.__doc__ = f"""ViT-{variant} (big_vision dims), `attention="relu"` by default.

    Args:
        weights: optional path of a `.keras` / `.weights.h5` file of the same
            architecture; saved at another image size, its position embedding
            is resampled bilinearly to this model's `image_size`.
        **kwargs: any `keras_reluvit.ViT` argument (`attention`,
            `num_classes`, `image_size`, `pool`, `posemb`, `qk_norm`, ...).

    Example:

    >>> import keras_reluvit
    >>> model = keras_reluvit.{build.__name__}(attention="relu", num_classes=10)
    """
    return build


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
