"""Predictions to classes: probabilities from logits, ImageNet-1k's class
names, and the top classes of each prediction."""

import keras
import numpy as np


def probabilities(logits, activation="softmax"):
    """Logits `[N, C]` -> probabilities (softmax, or sigmoid for models
    trained with a sigmoid cross-entropy), as numpy."""
    z = np.asarray(keras.ops.convert_to_numpy(logits), "float64")
    if activation == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if activation != "softmax":
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}.")
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def imagenet1k_labels():
    """The 1000 ImageNet-1k class names in the standard class order
    (WordNet lemmas, e.g. "tench, Tinca tinca"; the same strings as
    transformers' ImageNet checkpoints)."""
    import importlib.resources

    text = importlib.resources.files("keras_reluvit").joinpath(
        "resources/imagenet1k_labels.txt").read_text(encoding="utf-8")
    return [line.split("\t", 1)[1] for line in text.splitlines() if line]


def decode_predictions(predictions, model=None, top=5, label_names=None, from_logits=False):
    """The `top` classes of each row of `predictions` (`[N, C]`
    probabilities; logits with `from_logits=True`, turned into softmax
    probabilities) as lists of `(class name, probability)`, best first.

    Class names come from `label_names`, else `model.label_names` (what the
    checkpoint stored), else `"class_<i>"`.

    Example:

    >>> import numpy as np, keras_reluvit
    >>> keras_reluvit.decode_predictions(np.array([[0.1, 0.7, 0.2]]),
    ...                                  label_names=["cat", "dog", "eel"], top=2)
    [[('dog', 0.7), ('eel', 0.2)]]
    """
    p = (probabilities(predictions) if from_logits
         else np.asarray(keras.ops.convert_to_numpy(predictions), "float64"))
    if p.ndim != 2:
        raise ValueError(f"decode_predictions takes [N, classes] scores, got shape {p.shape}.")
    names = label_names if label_names is not None else getattr(model, "label_names", None)
    if names is not None and len(names) != p.shape[1]:
        raise ValueError(f"{len(names)} label names for {p.shape[1]} classes.")
    k = min(int(top), p.shape[1])
    out = []
    for row in p:
        idx = np.argsort(-row, kind="stable")[:k]
        out.append([(names[i] if names is not None else f"class_{i}", float(row[i]))
                    for i in idx])
    return out

