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

from keras_reluvit._defaults import LORA_RANK
from keras_reluvit._defaults import TRAINABLE  # noqa: F401 - kr.finetune.TRAINABLE
from keras_reluvit._defaults import TRAINABLE_DEFAULT
from keras_reluvit._keras_compat import flatten_layers
from keras_reluvit.models import lora
from keras_reluvit.models.lora import DEFAULT_LORA_LAYER_NAMES  # noqa: F401 - kr.finetune
from keras_reluvit.models.lora import LORA_LAYER_NAMES  # noqa: F401
from keras_reluvit.models.lora import enable_lora

_EMBEDDING = ("embedding/", "cls/", "reg/", "pos_embedding/", "pre_norm/")
_BLOCK = re.compile(r"block_(\d+)/")


def linear_probe(model):
    """Freezes everything but the classifier `head` (in place; returns
    `model`). Compile after calling it: the optimizer sees only the head."""
    head = lora.classifier_head(model)
    model.trainable = True  # (before the layers: it sets every sub-layer)
    for layer in flatten_layers(model, include_self=False):
        layer.trainable = False
    head.trainable = True
    return model


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
