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


class AttentionStats(keras.callbacks.Callback):
    """Attention statistics of every block on a fixed probe batch, per epoch.

    For block `XX` it adds to the epoch logs (so a `keras.callbacks.TensorBoard`
    placed *after* it in the callback list writes them as scalars, and
    `History` keeps them):

    - `attn_XX_zero_frac`: fraction of exact zeros in the attention weights
      (ReLU's sparsity; ~0 for softmax);
    - `attn_XX_row_sum`: mean over queries and heads of `sum_j a_ij` (exactly
      1 for softmax; ReLU/L makes no such promise);
    - `attn_XX_out_norm`: mean L2 norm of the attention layer's output tokens.

    These are the statistics the paper's authors note they lacked.

    Args:
        images: a probe batch `(N, H, W, 3)` in [-1, 1] (kept small: 8-32).
        every: compute every `every` epochs.

    Example:

    ```python
    stats = kr.callbacks.AttentionStats(x_val[:16])
    model.fit(train, epochs=10, callbacks=[stats, keras.callbacks.TensorBoard("logs")])
    ```
    """

    def __init__(self, images, every=1):
        super().__init__()
        self.images = images
        self.every = int(every)

    def compute(self):
        import numpy as np

        out = self.model.intermediates(self.images)
        stats = {}
        previous = out["tokens"]
        for i, block in enumerate(self.model.blocks):
            w = keras.ops.convert_to_numpy(out[f"attention_{i:02d}"])
            y = block.norm1(previous)
            a = keras.ops.convert_to_numpy(block.attn(y, y))
            stats[f"attn_{i:02d}_zero_frac"] = float(np.mean(w == 0))
            stats[f"attn_{i:02d}_row_sum"] = float(np.mean(w.sum(-1)))
            stats[f"attn_{i:02d}_out_norm"] = float(np.mean(np.linalg.norm(a, axis=-1)))
            previous = out[f"block_{i:02d}"]
        return stats

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and epoch % self.every == 0:
            logs.update(self.compute())
