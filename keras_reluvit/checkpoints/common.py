"""What every checkpoint format shares: the error type, the `{our variable
path: (array, source key)}` map a reader fills, the checks a reader makes
(tell-tale key, keys the ViT cannot express, position-embedding layout), and
`assign`, which copies a map into a model after checking every key and shape."""

import math
import os
import re

import keras
import numpy as np

from keras_reluvit.layers import resample_posemb


def model_class():
    """The `ViT` class, from Keras' registry of serializable classes (where
    `keras_reluvit.vit` registers it as `keras_reluvit>ViT`), as keras-hub's
    presets find theirs: the checkpoint package builds ViTs without importing
    vit.py, whose `ViT.from_preset` / `save_to_preset` import the package."""
    cls = keras.saving.get_registered_object("keras_reluvit>ViT")
    if cls is None:
        raise RuntimeError("keras_reluvit.ViT is not registered yet: import keras_reluvit "
                           "before reading checkpoints.")
    return cls


class CheckpointError(ValueError):
    """A checkpoint that cannot be read into a ViT (names file and key)."""


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


# Weights a loaded model may lack in the checkpoint (new parts of an
# attention preset: the gate of "relu_gated", the scales of "relu_learned").
# attention preset: the gate of "relu_gated", the scales of "relu_learned").
_FRESH_OK = re.compile(r".*attention/(gate|log_scale).*")


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


def _np(v):
    return np.asarray(keras.ops.convert_to_numpy(v), dtype="float32")


def _model_weights(model):
    return {v.path: _np(v) for v in model.weights}
