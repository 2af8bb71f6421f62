"""The pointwise functions `h` attention weights can use (the paper's
sweep), by name, and softmax's name beside them."""

from keras import ops


def _relu2(x):
    return ops.square(ops.relu(x))


def _gelu_tanh(x):
    return ops.gelu(x, approximate=True)


def _identity(x):
    return x


# name -> (function, one-line description). "softmax" is handled apart: it is
# not pointwise and ignores the sequence-length exponent.
ACTIVATIONS = {
    "relu": (ops.relu, "max(0, x): the paper's choice, the cheapest"),
    "relu2": (_relu2, "squared ReLU, max(0, x)^2 (Primer, Hua et al.)"),
    "gelu": (_gelu_tanh, "GELU, tanh approximation (jax.nn.gelu default)"),
    "softplus": (ops.softplus, "log(1 + exp(x))"),
    "identity": (_identity, "x: linear attention weights"),
    "relu6": (ops.relu6, "min(max(0, x), 6)"),
    "sigmoid": (ops.sigmoid, "1 / (1 + exp(-x))"),
}
SOFTMAX = "softmax"
ACTIVATION_NAMES = (SOFTMAX,) + tuple(ACTIVATIONS)


def get_activation(activation):
    """Returns `(name_or_None, fn)` for an activation name or callable.

    `fn` is None for softmax. Raises `ValueError` naming the valid choices.
    """
    if callable(activation):
        return None, activation
    if isinstance(activation, str):
        key = activation.lower()
        if key == SOFTMAX:
            return SOFTMAX, None
        if key in ACTIVATIONS:
            return key, ACTIVATIONS[key][0]
    raise ValueError(
        f"Unknown attention activation {activation!r}. Valid names: "
        f"{', '.join(ACTIVATION_NAMES)}; or pass any callable mapping a "
        "tensor to a tensor of the same shape."
    )
