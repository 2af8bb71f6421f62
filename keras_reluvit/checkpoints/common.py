"""What every checkpoint format shares: the error type, the `{our variable
path: (array, source key)}` map a reader fills, the checks a reader makes
(tell-tale key, keys the ViT cannot express, position-embedding layout), and
`assign`, which copies a map into a model after checking every key and shape."""

import math
import os
import re

import keras
import numpy as np

from keras_reluvit._logging import say
from keras_reluvit.models.posemb import resample_posemb


def model_class():
    """The `ViT` class, from Keras' registry of serializable classes (where
    `keras_reluvit.models.vit` registers it as `keras_reluvit>ViT`), as keras-hub's
    presets find theirs: the checkpoint package builds ViTs without importing
    vit.py, whose `ViT.from_preset` / `save_to_preset` import the package."""
    cls = keras.saving.get_registered_object("keras_reluvit>ViT")
    if cls is None:
        raise RuntimeError("keras_reluvit.ViT is not registered yet: import keras_reluvit "
                           "before reading checkpoints.")
    return cls


class CheckpointError(ValueError):
    """A checkpoint that cannot be read into a ViT (names file and key)."""


class WeightReader(dict):
    """`{our variable path: (array, source key)}` built by a reader."""

    def put(self, path, value, key):
        self[path] = (np.asarray(value, dtype="float32"), key)


def square_grid(n, what, path):
    side = int(round(math.sqrt(n)))
    if side * side != n:
        raise CheckpointError(
            f"{path}: {what} holds {n} patch positions, not a square grid; "
            "pass image_size=(h, w) matching the checkpoint's grid."
        )
    return side


def posemb_layout(num_positions, num_prefix, path, key):
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


def image_pair(size):
    """An image size (an int or `(h, w)`) as `(h, w)` of positive ints; a
    ValueError otherwise. (As `vit._pair`, which checkpoints cannot import:
    the ViT module loads checkpoints.)"""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size, size)
    try:
        pair = tuple(int(v) for v in size)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"an image size must be a positive int or (height, width), got {size!r}.")
    return pair


def posemb_grid(num_positions, num_prefix, path, key, native=None, hint=None, covers=None):
    """`(covers_prefix, (rows, cols))` of a learned position embedding of
    `num_positions` rows: `native` is the checkpoint's own grid where its
    config says it (timm's `model_args.img_size`), `hint` a grid to try
    where the rows are not a square (the `image_size` asked for), `covers`
    the caller's `posemb_prefix` (else inferred)."""
    if native is not None:
        n = native[0] * native[1]
        if covers is None and num_prefix and num_positions == n + num_prefix:
            covers = True
        covers = bool(covers)
        if num_positions - num_prefix * covers != n:
            raise CheckpointError(
                f"{path}: {key} has {num_positions} rows; a {native[0]}x{native[1]} grid "
                f"takes {n} (+ {num_prefix} class/register rows where it covers them).")
        return covers, tuple(native)
    if covers is None:
        try:
            covers, n = posemb_layout(num_positions, num_prefix, path, key)
        except CheckpointError:
            if hint is None:
                raise CheckpointError(
                    f"{path}: {key} has {num_positions} rows, not a square grid with or "
                    f"without the {num_prefix} class/register row(s); pass image_size=(h, w) "
                    "(the checkpoint's own resolution) for a rectangular grid.") from None
            return posemb_grid(num_positions, num_prefix, path, key, native=hint)
    n = num_positions - num_prefix * bool(covers)
    side = int(round(math.sqrt(n)))
    if side * side == n:
        return bool(covers), (side, side)
    if hint is not None and hint[0] * hint[1] == n:
        return bool(covers), tuple(hint)
    raise CheckpointError(
        f"{path}: {key} holds {n} patch positions, not a square grid; pass "
        "image_size=(h, w) matching the checkpoint's grid.")


def require(keys, key, path, what):
    """The format's tell-tale key, or an error saying the file is not one."""
    if key not in keys:
        raise CheckpointError(f"{path}: not a {what} (no {key!r}); its keys start "
                              f"{sorted(keys)[:6]}.")


def refuse(path, keys, hint=""):
    """Checkpoint keys the ViT cannot express: an error, never a partial load."""
    if keys:
        raise CheckpointError(
            f"{path}: keys outside what keras_reluvit.ViT expresses: {sorted(keys)[:12]}"
            f"{' ...' if len(keys) > 12 else ''}{hint}.")


# Weights a loaded model may lack in the checkpoint (new parts of an
# attention kind: the gate of "relu_gated", the scales of "relu_learned").
_FRESH_OK = re.compile(r".*attention/(gate|log_scale).*")


def assign(model, weights, path, fresh_head=False, posemb_resampling="bilinear",
           native_grid=None):
    """Copies `{variable path: (array, source key)}` into `model` after
    checking every key and shape (nothing is assigned on an error); a
    position embedding of another grid is resampled (`posemb_resampling`,
    see `resample_posemb`)."""
    target = {v.path: v for v in model.weights}
    missing, plan, fresh = [], [], []
    unexpected = sorted(k for k in weights if k not in target)
    # a 4x3 grid and a 6x2 one have the same shape: the grids decide
    other_grid = native_grid is not None and tuple(native_grid) != tuple(model.grid_size)
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
        if p == "pos_embedding/embedding" and (value.shape != tuple(var.shape) or other_grid):
            prefix = model.posemb_prefix_tokens
            n = value.shape[1] - prefix
            if native_grid is None or native_grid[0] * native_grid[1] != n:
                side = square_grid(n, key, path)
                native_grid = (side, side)
            if value.shape[-1] == var.shape[-1]:
                value = resample_posemb(value, model.grid_size, tuple(native_grid), prefix,
                                        method=posemb_resampling)
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
        say(f"{os.path.basename(path)}: freshly initialised {fresh}")
    return fresh


def _np(v):
    return np.asarray(keras.ops.convert_to_numpy(v), dtype="float32")


def model_weights(model):
    return {v.path: _np(v) for v in model.weights}


def export_weights(model):
    """`model_weights`, with a fixed (sincos2d) position embedding as the
    array the learned-posemb layouts (timm, transformers) store."""
    w = model_weights(model)
    if model.get_config()["posemb"] != "learn":
        w["pos_embedding/embedding"] = model.get_layer("pos_embedding")._fixed.astype("float32")
    return w


# ---- name maps: one list of links drives a format's reader and its writer ----

class Link:
    """Checkpoint keys <-> our variable paths, with the conversion each way
    (`to_ours`, `to_theirs`: lists of arrays to lists of arrays). `zeros`:
    the shapes of our arrays; with `optional`, a checkpoint may lack the key
    (a bias of a bias-free projection) and zeros of those shapes stand in;
    a writer writes zeros for a part our layer lacks (a bias-free LayerNorm)."""

    def __init__(self, keys, ours, to_ours=None, to_theirs=None, optional=False, zeros=None):
        self.keys, self.ours = tuple(keys), tuple(ours)
        self.to_ours = to_ours or (lambda xs: xs)
        self.to_theirs = to_theirs or (lambda xs: xs)
        self.optional, self.zeros = optional, zeros


def norm_links(key, ours, dim, weight="weight", bias="bias"):
    """A PyTorch LayerNorm `key.weight` / `key.bias` <-> Keras gamma / beta."""
    yield Link([f"{key}.{weight}"], [ours + "/gamma"])
    yield Link([f"{key}.{bias}"], [ours + "/beta"], zeros=[(dim,)])


def linear_links(key, ours, out):
    """A PyTorch Linear `(out, in)` <-> a Keras Dense `(in, out)`."""
    yield Link([key + ".weight"], [ours + "/kernel"], lambda xs: [xs[0].T], lambda xs: [xs[0].T])
    yield Link([key + ".bias"], [ours + "/bias"], optional=True, zeros=[(out,)])


def head_links(key, ours, width, heads):
    """A PyTorch `(D, D)` q, k or v projection <-> our `(D, H, dh)` kernel."""
    dh = width // heads
    yield Link([key + ".weight"], [ours + "/kernel"], lambda xs: [xs[0].T.reshape(width, heads, dh)],
               lambda xs: [xs[0].reshape(width, width).T])
    yield Link([key + ".bias"], [ours + "/bias"], lambda xs: [xs[0].reshape(heads, dh)],
               lambda xs: [xs[0].reshape(width)], optional=True, zeros=[(heads, dh)])


def out_proj_links(key, ours, width, heads):
    """A PyTorch `(D, D)` attention output projection <-> our `(H, dh, D)`."""
    dh = width // heads
    yield Link([key + ".weight"], [ours + "/kernel"], lambda xs: [xs[0].T.reshape(heads, dh, width)],
               lambda xs: [xs[0].reshape(width, width).T])
    yield Link([key + ".bias"], [ours + "/bias"], optional=True, zeros=[(width,)])


def patch_links(key, width, ours="embedding"):
    """A PyTorch patch Conv2d `(D, 3, p, p)` <-> a Keras Conv2D `(p, p, 3, D)`
    (a bias-free one, as CLIP's, loads a zero bias)."""
    yield Link([key + ".weight"], [ours + "/kernel"], lambda xs: [xs[0].transpose(2, 3, 1, 0)],
               lambda xs: [xs[0].transpose(3, 2, 0, 1)])
    yield Link([key + ".bias"], [ours + "/bias"], optional=True, zeros=[(width,)])


def read_links(sd, links, path, context):
    """Reads a checkpoint `{key: array}` through a name map into `WeightReader`;
    a required key the file lacks raises, naming it and `context` (what the
    architecture read from the file needs it for)."""
    w = WeightReader()
    for link in links:
        missing = [k for k in link.keys if k not in sd]
        if missing and link.optional:
            values = [np.zeros(shape) for shape in link.zeros]
        elif missing:
            raise CheckpointError(f"{path}: missing {missing[0]!r}, which {context} needs.")
        else:
            values = link.to_ours([sd[k] for k in link.keys])
        for ours, value in zip(link.ours, values):
            w.put(ours, value, "+".join(link.keys))
    return w


def write_links(w, links, skip=()):
    """Our `{variable path: array}` through a name map into the checkpoint's
    `{key: float32 array}` (zeros where our model lacks a part the format
    always has); links whose keys are in `skip` are left out."""
    out = {}
    for link in links:
        if set(link.keys) & set(skip):
            continue
        if link.ours[0] not in w:
            values = [np.zeros(shape) for shape in link.zeros]
        else:
            values = link.to_theirs([w[o] for o in link.ours])
        out.update(zip(link.keys, values))
    return {k: np.ascontiguousarray(v, dtype="float32") for k, v in out.items()}


def read_json(path):
    """A JSON object from `path`, or a CheckpointError naming the file."""
    import json

    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e}).") from e
    if not text.strip():
        raise CheckpointError(f"{path}: the file is empty; expected a JSON object.")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}).") from e
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(obj).__name__}, not an object.")
    return obj
