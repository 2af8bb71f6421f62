"""Keras callbacks for a training run directory."""

import math
import os

import keras

from keras_reluvit.data.pipeline import skip_passes
from keras_reluvit.distribution.parallel_model import unwrapped
from keras_reluvit.training.settings import KEEP_CHECKPOINTS


def default(output, checkpoint_every_epoch=True, dataset=None, process=(0, 1), every=None,
            keep=KEEP_CHECKPOINTS, info=None):
    """TensorBoard logs, a `ModelCheckpoint` of the last epoch and a
    `kr.backup.StepBackup` (last in the list: it records each epoch's full
    logs), all under `output`.

    The backup (`output/backup/`; in a TensorFlow or torch cluster
    `backup/process_<i>/`) is taken at each epoch's end and, with `every`,
    every `every` steps (the newest `keep` kept; `info`: see `StepBackup`).
    Rerunning the same `model.fit` after a kill resumes at the last epoch
    backed up, with that epoch's data stream when
    `dataset` (the one-epoch training set that `fit` repeats) is given;
    `kr.backup.fit` also resumes mid-epoch and saves on SIGTERM / SIGINT.

    Example:

    ```python
    model.fit(train.repeat(), steps_per_epoch=len(train), validation_data=val, epochs=90,
              callbacks=kr.callbacks.default("runs/s16_relu", dataset=train))
    ```
    """
    from keras_reluvit.training.backup import StepBackup
    from keras_reluvit.training.backup import backup_folder

    output = os.path.expanduser(os.fspath(output))
    os.makedirs(output, exist_ok=True)
    index, count = process
    callbacks = []
    if index == 0:  # in a cluster: process 0 writes the logs
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(output, "tensorboard")))
    if checkpoint_every_epoch:
        path = os.path.join(output, "last.keras")
        callbacks.append(keras.callbacks.ModelCheckpoint(path) if count == 1
                         else ChiefCheckpoint(path))
    backup = backup_folder(os.path.join(output, "backup"), process)
    return callbacks + [StepBackup(backup, every=every, keep=keep, process=process,
                                   dataset=dataset, info=info)]


class ChiefCheckpoint(keras.callbacks.Callback):
    """`ModelCheckpoint(path)` in a cluster: process 0 writes the model each
    epoch; every process takes part in gathering sharded weights."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch, logs=None):
        from keras_reluvit.distribution import chief_writes

        with chief_writes(self.model) as chief:
            if chief:
                self.model.save(self.path)


class EMAEvaluation(keras.callbacks.Callback):
    """Evaluates the weights' EMA (a recipe optimizer's, `ema=`) on
    `validation_data` at each epoch's end, beside the trained weights Keras
    validates: its numbers join the epoch's logs as `ema_val_<metric>`
    (history, and the `TensorBoard` callback when this one comes first).
    The weights are swapped back before training goes on."""

    def __init__(self, validation_data):
        super().__init__()
        self.validation_data = validation_data

    def on_epoch_end(self, epoch, logs=None):
        from keras_reluvit.training.recipes import swap_ema

        if self.model.stop_training:  # a stop after this epoch: not evaluated (NaN)
            if logs is not None:
                logs.update({f"ema_{k}": math.nan for k in list(logs) if k.startswith("val_")})
            return
        swap_ema(self.model)
        try:
            result = self.model.evaluate(self.validation_data, return_dict=True, verbose=0)
        finally:
            swap_ema(self.model)
        if logs is not None:
            logs.update({f"ema_val_{k}": float(v) for k, v in result.items()})


class ResumeDataStream(keras.callbacks.Callback):
    """Makes a resumed run read the data stream of the epoch it resumes.

    A `kr.data` training set draws a new shuffle order and new augmentation
    draws for each pass (each iterator created from it), seeded by the run's
    seed. A rerun after a kill starts a fresh process at pass 0, so without
    this callback epoch `k` would see epoch 0's crops, flips, RandAugment ops
    and MixUp coefficients again. Placed *after* `BackupAndRestore`, it reads
    the epoch the backup resumes at and creates that many iterators of
    `dataset` without reading them (cheap: tf.data starts work on the first
    read), so the next pass is the one the uninterrupted run had.

    (For our own `StepBackup`, `StepBackup(dataset=)` does the same, with the
    same `data.pipeline.skip_passes`.)

    This is exact when `model.fit` gets `dataset.repeat()` with
    `steps_per_epoch=len(dataset)`: then Keras keeps one iterator for the
    whole run and each epoch is one new pass. (`keras-reluvit train` does
    this; with `model.fit(dataset)` Keras creates a varying number of
    iterators per epoch.)

    Args:
        dataset: the one-epoch training `tf.data.Dataset` (as returned by
            `kr.data.load(...).train`) that `model.fit` repeats.

    Example:

    ```python
    train, val, info = kr.data.load("sklearn_digits", 64, image_size=32)
    callbacks = kr.callbacks.default("runs/x") + [kr.callbacks.ResumeDataStream(train)]
    model.fit(train.repeat(), steps_per_epoch=len(train), epochs=30,
              validation_data=val, callbacks=callbacks)
    ```
    """

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset
        self.skipped = 0

    def on_train_begin(self, logs=None):
        from keras_reluvit import _keras_compat as compat

        epoch = compat.initial_epoch(self.model)
        skip_passes(self.dataset, epoch)
        self.skipped = epoch


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

        model = unwrapped(self.model)  # a cluster's DataParallelModel holds the ViT
        out = model.intermediates(self.images)
        stats = {}
        previous = out["tokens"]
        for i, block in enumerate(model.blocks):
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
