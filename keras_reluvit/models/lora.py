"""LoRA on a ViT (keras-hub's `Backbone.enable_lora`): Keras' own
`enable_lora` on the attention's `query` and `value` projections
(`target_layer_names` picks others: `key`, `attention_output`, the MLP's
`fc1` / `fc2`); every other weight is frozen, the classifier head stays
trainable unless `train_head=False`. Saving (`model.save`, `save_weights`,
presets, `export`) writes the merged kernels (Keras' own
`save_own_variables`), so a saved model is a plain ViT that computes what
the LoRA model computes. `model.enable_lora(rank)` calls it;
`keras_reluvit.training.finetune` uses it for `--trainable lora`.
"""

import keras

from keras_reluvit._keras_compat import flatten_layers

DEFAULT_LORA_LAYER_NAMES = ("query", "value")
LORA_LAYER_NAMES = ("query", "key", "value", "attention_output", "fc1", "fc2")


def classifier_head(model, required=True):
    """`model`'s classifier head (the layer named "head"); without one
    (include_top=False) an error, or None when not `required`."""
    try:
        return model.get_layer("head")
    except ValueError:
        if not required:
            return None
        raise ValueError(
            f"{model.name} has no classifier head (include_top=False): a linear probe or "
            "LoRA trains the head; load the checkpoint with num_classes=N.") from None


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
    head = classifier_head(model) if train_head else None
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
