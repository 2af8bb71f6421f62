"""Unknown keywords are refused, naming ours: a misspelled argument, or
another zoo's spelling of one (timm's `drop_rate`, keras-hub's
`hidden_dim`, transformers' `hidden_size`), must never build a model as
if nothing had been said."""

import difflib
import inspect


class UnknownArgumentError(TypeError, ValueError):
    """An argument the callee does not take (a `TypeError`, as Python's own,
    and a `ValueError`, as the library's other argument errors)."""


# Other zoos' spelling -> ours (or what to do instead, in words).
FOREIGN = {
    # timm (VisionTransformer)
    "drop_rate": "dropout", "proj_drop_rate": "dropout", "pos_drop_rate": "dropout",
    "img_size": "image_size", "embed_dim": "width", "mlp_ratio": "mlp_dim (= mlp_ratio * width)",
    "global_pool": "pool ('gap' for 'avg', 'tok' for 'token', 'map')",
    "reg_tokens": "num_register_tokens", "no_embed_class": "posemb_prefix (= not no_embed_class)",
    "init_values": "layer_scale", "act_layer": "mlp_activation",
    "drop_path_rate": "drop_path",
    "attn_drop_rate": "nothing: attention-weight dropout is not implemented",
    "in_chans": "nothing: the models take RGB images (3 channels)",
    "qkv_bias": "nothing: the q/k/v projections always have biases",
    # keras-hub (ViTBackbone)
    "image_shape": "image_size", "hidden_dim": "width", "num_layers": "depth",
    "dropout_rate": "dropout", "use_class_token": "class_token",
    "attention_dropout": "nothing: attention-weight dropout is not implemented",
    # transformers (ViTConfig)
    "hidden_size": "width", "num_hidden_layers": "depth", "num_attention_heads": "num_heads",
    "intermediate_size": "mlp_dim", "hidden_dropout_prob": "dropout", "num_labels": "num_classes",
    "layer_norm_eps": "layer_norm_epsilon", "hidden_act": "mlp_activation",
    "id2label": "label_names",
    # keras.applications
    "classes": "num_classes", "input_shape": "image_size", "pooling": "pool",
    "classifier_activation": "nothing: the models return logits "
                             "(keras_reluvit.preprocessing.probabilities)",
    # big_vision
    "rep_size": "representation_size", "pool_type": "pool",
    # the paper's words
    "qk_layernorm": "qk_norm", "qk_layer_norm": "qk_norm",
    "activation": "attention={'activation': ...} (or a kind: attention='relu')",
    "alpha": "attention={'activation': ..., 'seq_len_exponent': alpha}",
    "seq_len_exponent": "attention={'activation': ..., 'seq_len_exponent': ...}",
}


def check_keywords(callee, unknown, accepted):
    """Raises `UnknownArgumentError` when `unknown` (a dict of keywords
    `callee` did not take) is not empty, naming each with ours (another zoo's
    spelling, or the closest of `accepted`) and listing `accepted`."""
    if not unknown:
        return
    hints = []
    for key in sorted(unknown):
        if key in FOREIGN:
            hints.append(f"{key!r} (use {FOREIGN[key]})")
            continue
        close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
        hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownArgumentError(
        f"{callee} got unknown keyword argument(s) {', '.join(hints)}. It accepts: "
        f"{', '.join(accepted)}.")


def parameters(function, drop=("self", "kwargs")):
    """The names `function` takes (in order), for the message."""
    return [p for p in inspect.signature(function).parameters if p not in drop]
