"""Few-shot linear probes while training (big_vision's `fewshot_lsr`).

The signal people watch in long pre-training runs: every N steps (or each
epoch), the model's pre-logits of `k` images per class of a small labelled
set are fitted with a closed-form ridge regression, and its accuracy on that
set's test images is logged -- no gradient step, a few seconds.

The probe is big_vision's: the `k`-shot features whitened (their mean and
standard deviation), a constant feature of 100 appended for the bias (large,
so almost unregularised), targets `2 * one_hot - 1`, the weights
`(X^T X + l2 I)^-1 X^T Y` (or `X^T (X X^T + l2 I)^-1 Y` when there are more
features than images) through one eigendecomposition, `l2 = 2^10`; the
`k` images of each class drawn by seed, several seeds.

Example:

```python
probe = kr.fewshot.FewShot.from_data("sklearn_digits", image_size=32, shots=(1, 5))
model.fit(train, epochs=10, callbacks=[probe, *kr.callbacks.default("runs/x")])
probe.results[-1]    # {"step": ..., "fewshot_5shot": 0.83, ...}
```
"""

import keras
import numpy as np

from keras_reluvit.distribution.parallel_model import unwrapped

BIAS_CONSTANT = 100.0
L2_REG = 2.0 ** 10  # big_vision's configs


def _design(x, mean, std):
    x = (np.asarray(x, np.float64) - mean) / std
    return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)


def ridge_predictions(train_features, train_labels, test_features, num_classes, l2_reg=L2_REG):
    """The classes a ridge regression on `(train_features, train_labels)`
    (whitened, with a bias feature; targets in {-1, 1}) predicts for
    `test_features`."""
    x = np.asarray(train_features, np.float64)
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True) + 1e-5
    x = _design(x, mean, std)
    y = 2.0 * np.eye(num_classes)[np.asarray(train_labels, int)] - 1.0
    n, d = x.shape
    if n >= d:  # (X^T X + l2 I)^-1 X^T Y
        eigs, q = np.linalg.eigh(x.T @ x)
        lhs, rhs = q, q.T @ (x.T @ y)
    else:  # X^T (X X^T + l2 I)^-1 Y
        eigs, q = np.linalg.eigh(x @ x.T)
        lhs, rhs = x.T @ q, q.T @ y
    w = (lhs / (eigs + l2_reg)[None, :]) @ rhs
    return np.argmax(_design(test_features, mean, std) @ w, axis=1)


def shots_indices(labels, num_classes, shots, seed):
    """`shots` indices of each class in `labels`, drawn by `seed` (the first
    `shots` of each class' permutation, as big_vision draws them)."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    chosen = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        if len(members) < shots:
            raise ValueError(f"Class {c} has {len(members)} images in the few-shot training "
                             f"set, fewer than {shots} shots.")
        chosen.append(rng.permutation(members)[:shots])
    return np.concatenate(chosen)


def evaluate(train_features, train_labels, test_features, test_labels, num_classes,
             shots=(1, 5, 10), seeds=3, l2_reg=L2_REG):
    """`{k: [accuracy per seed]}` of the `k`-shot probes."""
    results = {k: [] for k in shots}
    train_features, train_labels = np.asarray(train_features), np.asarray(train_labels)
    for seed in range(seeds):
        for k in shots:
            idx = shots_indices(train_labels, num_classes, k, seed)
            pred = ridge_predictions(train_features[idx], train_labels[idx], test_features,
                                     num_classes, l2_reg)
            results[k].append(float(np.mean(pred == np.asarray(test_labels))))
    return results


def features(model, dataset):
    """The model's pre-logits (`model.intermediates`' `"pre_logits"`) and the
    labels (class indices) of a dataset of `(images, labels)` batches (labels
    one-hot or indices)."""
    inner = model.intermediates_model(attention_weights=False)
    probe = keras.Model(inner.inputs, inner.output["pre_logits"])
    xs, ys = [], []
    batches = dataset.as_numpy_iterator() if hasattr(dataset, "as_numpy_iterator") else dataset
    for images, labels in batches:
        xs.append(keras.ops.convert_to_numpy(probe.predict_on_batch(images)))
        labels = np.asarray(labels)
        ys.append(labels.argmax(-1) if labels.ndim > 1 else labels)
    return np.concatenate(xs), np.concatenate(ys).astype(int)


class FewShot(keras.callbacks.Callback):
    """Logs `k`-shot linear-probe accuracies while training (big_vision's
    `fewshot_lsr`; see the module docstring).

    Args:
        train: the few-shot training images, a dataset of `(images, labels)`
            batches in the model's preprocessing, without augmentation (the
            `k` images per class are drawn from it).
        test: the images the probes are scored on, the same way.
        shots: the `k`s.
        every: optimizer steps between probes; None: at each epoch's end,
            where the mean accuracies join the epoch's logs (`history`,
            the `TensorBoard` callback after this one) as
            `fewshot_<k>shot`.
        seeds: draws of the `k` images per class; the logged accuracy is
            their mean.
        l2_reg: the ridge's regularisation (big_vision's 2^10).
        log_dir: TensorBoard scalars (`fewshot_<k>shot` at each probe's
            step) written here too.

    Attributes:
        results: one dict per probe: `step`, `epoch`, the mean accuracy of
            each `k` and each seed's (`fewshot_<k>shot_seed_<s>`).
    """

    def __init__(self, train, test, shots=(1, 5, 10), every=None, seeds=3, l2_reg=L2_REG,
                 log_dir=None):
        super().__init__()
        from keras_reluvit.training.settings import check_every

        check_every(every)
        shots = tuple(int(k) for k in shots)
        if not shots or min(shots) < 1:
            raise ValueError(f"shots must be positive numbers of images per class, got {shots}.")
        self.train, self.test, self.shots = train, test, shots
        self.every, self.seeds, self.l2_reg = every, int(seeds), float(l2_reg)
        self.log_dir = log_dir
        self.results = []
        self._step, self._base, self._epoch, self._writer = 0, 0, 0, None

    @classmethod
    def from_data(cls, name, image_size, train_split="train", test_split=None, data_dir=None,
                  preprocessing=None, batch_size=256, **kwargs):
        """A probe on a tfds data set or a folder of images (`kr.data.load`'s
        names): both splits read as evaluation images (no augmentation);
        `test_split` defaults to the source's validation split."""
        from keras_reluvit import data as kr_data

        def split(which):
            return kr_data.load(name, batch_size, image_size=image_size, data_dir=data_dir,
                                train_split=False, val_split=which,
                                preprocessing=preprocessing).val

        return cls(split(train_split), split(test_split or None), **kwargs)

    def probe(self):
        """Runs the probes now; returns (and appends to `results`) their dict."""
        model = unwrapped(self.model)  # a cluster's DataParallelModel holds the ViT
        x_train, y_train = features(model, self.train)
        x_test, y_test = features(model, self.test)
        num_classes = int(max(y_train.max(), y_test.max())) + 1
        accuracies = evaluate(x_train, y_train, x_test, y_test, num_classes, self.shots,
                              self.seeds, self.l2_reg)
        result = {"step": self._step, "epoch": self._epoch}
        for k, values in accuracies.items():
            result[f"fewshot_{k}shot"] = float(np.mean(values))
            for seed, v in enumerate(values):
                result[f"fewshot_{k}shot_seed_{seed}"] = v
        self.results.append(result)
        if self.log_dir:
            self._write(result)
        return result

    def _write(self, result):
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            for k in self.shots:
                tf.summary.scalar(f"fewshot_{k}shot", result[f"fewshot_{k}shot"],
                                  step=self._step)
        self._writer.flush()

    def on_train_begin(self, logs=None):
        self._step = None  # read as the first epoch begins: a backup restores it before

    def on_epoch_begin(self, epoch, logs=None):
        if self._step is None:  # a resumed run counts on from its backup
            iterations = getattr(self.model.optimizer, "iterations", None)
            self._step = int(keras.ops.convert_to_numpy(iterations)) if iterations is not None \
                else 0
        self._epoch = epoch
        self._base = self._step  # Keras numbers each epoch's batches from 0

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: the last step of the call (one call: `steps_per_execution` steps)
        before, self._step = self._step, self._base + batch + 1
        if self.every and self._step // self.every > before // self.every:
            self.probe()

    def on_epoch_end(self, epoch, logs=None):
        if self.every is None:
            result = self.probe()
            if logs is not None:
                logs.update({f"fewshot_{k}shot": result[f"fewshot_{k}shot"]
                             for k in self.shots})
