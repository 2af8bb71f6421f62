"""Attention kinds: the strings `attention=` takes ("relu", "softmax", ...),
each standing for a set of `PointwiseAttention` arguments.

(Called "attention presets" before 0.2; "preset" now means only a saved model
directory, as in keras-hub's `from_preset`.)"""

import copy

from keras_reluvit.models.attention import ACTIVATION_NAMES

_KINDS = {
    "softmax": (
        dict(activation="softmax"),
        "softmax attention, the baseline (alpha ignored)",
    ),
    "relu": (
        dict(activation="relu", seq_len_exponent=1.0),
        "ReLU/L: relu(q.k/sqrt(d)) / L, the paper's choice",
    ),
    "relu_noscale": (
        dict(activation="relu", seq_len_exponent=0.0),
        "ReLU without the 1/L factor (alpha = 0, prior work)",
    ),
    "relu2": (
        dict(activation="relu2", seq_len_exponent=1.0),
        "squared ReLU / L",
    ),
    "gelu": (dict(activation="gelu", seq_len_exponent=1.0), "GELU / L"),
    "softplus": (
        dict(activation="softplus", seq_len_exponent=1.0),
        "softplus / L",
    ),
    "relu6": (dict(activation="relu6", seq_len_exponent=1.0), "ReLU6 / L"),
    "sigmoid": (
        dict(activation="sigmoid", seq_len_exponent=1.0),
        "sigmoid / L",
    ),
    "identity": (
        dict(activation="identity", seq_len_exponent=1.0),
        "no activation, q.k/sqrt(d) / L (linear attention weights)",
    ),
    "relu_gated": (
        dict(activation="relu", seq_len_exponent=1.0, gated=True),
        "ReLU/L with the sigmoid output gate of the paper's Figure 4",
    ),
    "relu_learned": (
        dict(activation="relu", seq_len_exponent=1.0, learned_scale=True),
        "ReLU/L times a learned per-head scale exp(s_h), s_h init 0",
    ),
}

# Keys an `attention=` dict may hold (qk_norm is a model argument).
ATTENTION_KEYS = ("activation", "seq_len_exponent", "gated", "learned_scale")


def attention_kinds():
    """Returns `{name: one-line description}` of the attention kinds, the
    strings a model's `attention=` argument takes.

    Example:

    >>> import keras_reluvit
    >>> for name, doc in keras_reluvit.attention_kinds().items():
    ...     print(f"{name:13s} {doc}")  # doctest: +ELLIPSIS
    softmax       softmax attention, the baseline (alpha ignored)
    ...
    """
    return {name: doc for name, (_, doc) in _KINDS.items()}


def attention_presets():
    """Deprecated alias of `attention_kinds()` (renamed in 0.2: "preset" now
    means only a saved model directory); removed in 0.3."""
    import warnings

    warnings.warn("keras_reluvit.attention_presets() is renamed attention_kinds(); "
                  "the old name goes in 0.3.", DeprecationWarning, stacklevel=2)
    return attention_kinds()


def resolve_attention(attention):
    """Turns an attention kind or a dict of arguments into a dict of arguments.

    Raises `ValueError` naming the valid kinds or keys.
    """
    if isinstance(attention, str):
        if attention not in _KINDS:
            raise ValueError(
                f"Unknown attention kind {attention!r}. Valid kinds: "
                f"{', '.join(_KINDS)} (see keras_reluvit.attention_kinds())"
                ", or pass a dict of PointwiseAttention arguments such as "
                "{'activation': 'relu', 'seq_len_exponent': 0.5}."
            )
        return copy.deepcopy(_KINDS[attention][0])
    if isinstance(attention, dict):
        unknown = sorted(set(attention) - set(ATTENTION_KEYS))
        if unknown:
            hint = (
                " Pass qk_norm to the model, not in the attention dict."
                if "qk_norm" in unknown
                else ""
            )
            raise ValueError(
                f"Unknown attention argument(s) {unknown}; valid keys are "
                f"{list(ATTENTION_KEYS)}.{hint}"
            )
        if "activation" not in attention:
            raise ValueError(
                "An attention dict needs an 'activation' (one of "
                f"{', '.join(ACTIVATION_NAMES)}), got {attention!r}."
            )
        return dict(attention)
    raise ValueError(
        "`attention` must be an attention kind (one of "
        f"{', '.join(_KINDS)}) or a dict of PointwiseAttention arguments; "
        f"got {attention!r}."
    )


def deserialize_attention(attention):
    """An `attention` dict read back from a config: a registered custom
    activation function was serialized to a dict; turn it back into the
    function. Kind names pass through."""
    if isinstance(attention, dict) and isinstance(attention.get("activation"), dict):
        import keras

        return dict(attention,
                    activation=keras.saving.deserialize_keras_object(attention["activation"]))
    return attention
