"""The recipes' losses beside Keras' own (`CategoricalCrossentropy` for
`softmax_xent`): big_vision's `sigmoid_xent` and DeiT III's binarized
cross-entropy."""

import keras

LOSSES = ("softmax_xent", "sigmoid_xent", "bce")


def check_loss(loss):
    if loss not in LOSSES:
        raise ValueError(f"Unknown loss {loss!r}; valid: {', '.join(LOSSES)}.")



@keras.saving.register_keras_serializable(package="keras_reluvit")
class SigmoidCrossEntropy(keras.losses.Loss):
    """big_vision's `sigmoid_xent`: per example the *sum* over classes of the
    binary cross-entropy of the logits, averaged over the batch."""

    def __init__(self, name="sigmoid_xent", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        y_true = keras.ops.cast(y_true, y_pred.dtype)
        log_p = keras.ops.log_sigmoid(y_pred)
        log_not_p = keras.ops.log_sigmoid(-y_pred)
        return -keras.ops.sum(y_true * log_p + (1.0 - y_true) * log_not_p, axis=-1)


@keras.saving.register_keras_serializable(package="keras_reluvit")
class BinarizedCrossEntropy(keras.losses.BinaryCrossentropy):
    """DeiT III's `--bce-loss`: the targets binarised first (every class
    with a positive target is 1: both classes of a MixUp / CutMix image,
    timm's mixing done), then `keras.losses.BinaryCrossentropy` of the
    logits, the mean over classes and batch (torch's `BCEWithLogitsLoss`).
    `label_smoothing` (a run without mixing: timm's `--bce-loss
    --smoothing`) smooths the binarised targets as timm's
    `BinaryCrossEntropy(smoothing=)`: `s / classes` off, `1 - s + s /
    classes` on (Keras' own pulls them to 0.5). DeiT III's smoothing is 0."""

    def __init__(self, from_logits=True, label_smoothing=0.0, name="bce", **kwargs):
        super().__init__(from_logits=from_logits, label_smoothing=0.0, name=name, **kwargs)
        self.smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        y_true = keras.ops.cast(keras.ops.greater(y_true, 0), y_pred.dtype)
        if self.smoothing:
            off = self.smoothing / y_pred.shape[-1]
            y_true = y_true * (1.0 - self.smoothing) + off
        return super().call(y_true, y_pred)

    def get_config(self):
        return dict(super().get_config(), label_smoothing=self.smoothing)
