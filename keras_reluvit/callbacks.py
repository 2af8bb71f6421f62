"""Keras callbacks for a training run directory."""

import os

import keras


def default(output, checkpoint_every_epoch=True):
    """`BackupAndRestore` (resume a killed run where it stopped),
    `TensorBoard` logs and a `ModelCheckpoint` of the last epoch, all under
    `output`.

    Example:

    ```python
    model.fit(train, validation_data=val, epochs=90,
              callbacks=kr.callbacks.default("runs/s16_relu"))
    ```
    """
    output = os.path.expanduser(os.fspath(output))
    os.makedirs(output, exist_ok=True)
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(output, "backup"), save_freq="epoch",
                                         delete_checkpoint=False),
        keras.callbacks.TensorBoard(os.path.join(output, "tensorboard")),
    ]
    if checkpoint_every_epoch:
        callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(output, "last.keras")))
    return callbacks
