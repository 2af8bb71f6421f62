"""Transfer learning: what to train of a pretrained ViT, and at which rate.

- `set_trainable(model, "all" | "head" | "lora", lora_rank=...)`: the three
  ways to fine-tune -- everything (timm / big_vision's default), a linear
  probe (only the classifier `head`: the features stay the checkpoint's), or
  LoRA (`enable_lora`: low-rank updates of the attention projections, plus
  the head);
- `enable_lora(model, rank)`: keras-hub's `Backbone.enable_lora` on a ViT
  (`model.enable_lora(rank)`): Keras' own `enable_lora` on the attention's
  `query` and `value` projections (`target_layer_names` picks others: `key`,
  `attention_output`, the MLP's `fc1` / `fc2`); every other weight is
  frozen, the classifier head stays trainable unless `train_head=False`.
  Saving (`model.save`, `save_weights`, presets, `export`) writes the merged
  kernels (Keras' own `save_own_variables`), so a saved model is a plain ViT
  that computes what the LoRA model computes;
- `layer_decay_scales(model, decay)`: layer-wise learning-rate decay as
  BEiT / MAE / timm's `--layer-decay` define it: with `N` blocks, the
  head, the final norm and the pooling get the full rate, block `i`
  (0-based) `decay ** (N - i)`, and the embedding (patch stem, position
  embedding, class / register tokens, `pre_norm`) `decay ** (N + 1)`.
  `keras_reluvit.recipes.compile(..., layer_decay=0.75)` applies it on
  every backend.
"""

import re

import keras

from keras_reluvit._keras_compat import flatten_layers
from keras_reluvit.settings import LORA_RANK
from keras_reluvit.settings import TRAINABLE_DEFAULT

TRAINABLE = ("all", "head", "lora")
DEFAULT_LORA_LAYER_NAMES = ("query", "value")
LORA_LAYER_NAMES = ("query", "key", "value", "attention_output", "fc1", "fc2")
_EMBEDDING = ("embedding/", "cls/", "reg/", "pos_embedding/", "pre_norm/")
_BLOCK = re.compile(r"block_(\d+)/")


def _head(model):
    try:
        return model.get_layer("head")
    except ValueError:
        raise ValueError(
            f"{model.name} has no classifier head (include_top=False): a linear probe or "
            "LoRA trains the head; load the checkpoint with num_classes=N.") from None


def linear_probe(model):
    """Freezes everything but the classifier `head` (in place; returns
    `model`). Compile after calling it: the optimizer sees only the head."""
    head = _head(model)
    model.trainable = True  # (before the layers: it sets every sub-layer)
    for layer in flatten_layers(model, include_self=False):
        layer.trainable = False
    head.trainable = True
    return model


def enable_lora(model, rank, target_layer_names=None, train_head=True, lora_alpha=None):
    """LoRA of rank `rank` on `model`'s projections named
    `target_layer_names` (default `("query", "value")`, keras-hub's choice),
    everything else frozen but the head (with `train_head`). In place;
    returns the list of layers given LoRA. Compile after calling it."""
    rank = int(rank)
    if rank < 1:
        raise ValueError(f"LoRA rank must be a positive int, got {rank!r}.")
    names = tuple(target_layer_names or DEFAULT_LORA_LAYER_NAMES)
    unknown = sorted(set(names) - set(LORA_LAYER_NAMES))
    if unknown:
        raise ValueError(f"No LoRA target named {unknown}; valid: {', '.join(LORA_LAYER_NAMES)}.")
    head = _head(model) if train_head else None
    model.trainable = True
    layers = list(flatten_layers(model, include_self=False))
    for layer in layers:
        layer.trainable = False
    targets = [layer for layer in layers if layer.name in names and hasattr(layer, "enable_lora")]
    for layer in targets:
        if getattr(layer, "lora_enabled", False):
            raise ValueError(f"LoRA is already enabled on {layer.path}.")
        layer.trainable = True
        layer.enable_lora(rank, lora_alpha=lora_alpha)  # freezes the kernel
        if getattr(layer, "bias", None) is not None:
            layer.bias.trainable = False  # only the low-rank factors train
        _restart_factors_on_load(layer)
    if head is not None:
        head.trainable = True
    return targets


def _restart_factors_on_load(layer):
    """Keras' LoRA layers load the merged kernel and set *both* factors to
    zero, where no gradient reaches either again (d/dA = g B^T, d/dB = A^T g):
    a LoRA run resumed by `BackupAndRestore` would stop learning. After a
    load, `lora_kernel_a` is drawn again from its initializer (B stays zero:
    the loaded model's function is unchanged) so training goes on."""
    load = layer.load_own_variables

    def load_own_variables(store):
        load(store)
        a = layer.lora_kernel_a
        init = keras.initializers.VarianceScaling(scale=5 ** 0.5, mode="fan_in",
                                                  distribution="uniform")
        a.assign(init(a.shape, a.dtype))

    layer.load_own_variables = load_own_variables


def set_trainable(model, trainable=TRAINABLE_DEFAULT, lora_rank=LORA_RANK, lora_targets=None):
    """`"all"` (every weight), `"head"` (`linear_probe`) or `"lora"`
    (`enable_lora(model, lora_rank, lora_targets)`), in place."""
    if trainable not in TRAINABLE:
        raise ValueError(f"trainable must be one of {TRAINABLE}, got {trainable!r}.")
    if trainable == "head":
        return linear_probe(model)
    if trainable == "lora":
        enable_lora(model, lora_rank, lora_targets)
        return model
    model.trainable = True
    for layer in flatten_layers(model, include_self=False):
        layer.trainable = True
    return model


def layer_of(path, depth):
    """The layer id of a variable path (BEiT's rule): 0 for the embedding,
    `i + 1` for block `i`, `depth + 1` for the rest (final norm, pooling,
    head)."""
    if path.startswith(_EMBEDDING):
        return 0
    m = _BLOCK.match(path)
    if m:
        return int(m.group(1)) + 1
    return depth + 1


def layer_decay_scales(model, decay):
    """`{variable path: learning-rate multiplier}` of layer-wise decay
    `decay` (in (0, 1]) for every trainable variable of `model`."""
    decay = float(decay)
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1], got {decay}.")
    if not hasattr(model, "blocks"):
        raise ValueError("layer_decay needs a keras_reluvit ViT (its blocks are the layers).")
    depth = len(model.blocks)
    return {v.path: decay ** (depth + 1 - layer_of(v.path, depth))
            for v in model.trainable_variables}


def describe_trainable(model):
    """One line: how many weights train, of how many."""
    train = sum(int(keras.ops.size(v)) for v in model.trainable_variables)
    total = sum(int(keras.ops.size(v)) for v in model.weights)
    return f"{train:,} of {total:,} weights train ({100.0 * train / max(total, 1):.2f} %)"
