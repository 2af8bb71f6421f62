"""The few-shot linear probe (big_vision's `fewshot_lsr`): its predictions
equal scikit-learn's ridge regression on the same whitened features (both
of big_vision's closed forms: more images than features and fewer), the k
images per class are drawn per seed from that class, and the callback logs
what the probe computes on the model's pre-logits after training."""

import keras
import numpy as np
import pytest
from conftest import END_TO_END_ON_TORCH
from sklearn.linear_model import Ridge

import keras_reluvit as kr
from keras_reluvit import fewshot as F


def sklearn_predictions(x_train, y_train, x_test, num_classes, l2):
    mean, std = x_train.mean(0), x_train.std(0) + 1e-5

    def design(x):
        return np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])

    ridge = Ridge(alpha=l2, fit_intercept=False, solver="svd")
    ridge.fit(design(x_train), 2.0 * np.eye(num_classes)[y_train] - 1.0)
    return ridge.predict(design(x_test)).argmax(1), ridge


@pytest.mark.backend_independent  # NumPy: the same under every backend
@pytest.mark.parametrize("n, d", [(60, 8), (12, 40)])  # X^T X and X X^T
@pytest.mark.parametrize("l2", [1e-2, 2.0 ** 10])
def test_the_probe_predicts_as_sklearns_ridge(n, d, l2):
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (4, d))
    y_train = np.arange(n) % 4
    x_train = centres[y_train] + rng.normal(0, 1.5, (n, d))
    y_test = rng.integers(0, 4, 500)
    x_test = centres[y_test] + rng.normal(0, 1.5, (500, d))
    want, ridge = sklearn_predictions(x_train, y_train, x_test, 4, l2)
    got = F.ridge_predictions(x_train, y_train, x_test, 4, l2)
    np.testing.assert_array_equal(got, want)
    assert 0.3 < np.mean(got == y_test) < 1.0  # informative, not trivial


@pytest.mark.backend_independent
def test_k_images_per_class_are_drawn_per_seed_from_that_class():
    labels = np.repeat(np.arange(5), 7)[np.random.default_rng(1).permutation(35)]
    a, b = F.shots_indices(labels, 5, 3, seed=0), F.shots_indices(labels, 5, 3, seed=1)
    for idx in (a, b):
        assert len(set(idx)) == 15
        np.testing.assert_array_equal(np.bincount(labels[idx], minlength=5), [3] * 5)
    assert set(a) != set(b)
    np.testing.assert_array_equal(a, F.shots_indices(labels, 5, 3, seed=0))
    with pytest.raises(ValueError, match="Class 0 has 7 images .* fewer than 8 shots"):
        F.shots_indices(labels, 5, 8, seed=0)
    with pytest.raises(ValueError, match="shots must be positive"):
        F.FewShot(None, None, shots=(0,))


@END_TO_END_ON_TORCH
def test_the_callback_logs_the_probe_of_the_trained_models_pre_logits(tmp_path):
    """A tiny ViT trained 2 epochs with the probe at each epoch's end: the
    history holds the mean accuracy per k, equal to the probe recomputed
    here from the trained model's pre-logits (`model.intermediates`), and a
    TensorBoard event file is written."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    y = np.arange(80) % 4
    x = (rng.uniform(-1, 1, (80, 16, 16, 3)) * 0.3 + (y[:, None, None, None] - 1.5) / 2)
    x = x.astype("float32")
    onehot = np.eye(4, dtype="float32")[y]
    model = kr.ViT("Ti/8", image_size=16, num_classes=4, width=16, depth=1, num_heads=2,
                   mlp_dim=32)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.CategoricalCrossentropy(from_logits=True))
    train = [(x[:40], onehot[:40])]  # batches of (images, one-hot labels)
    test = [(x[40:60], y[40:60]), (x[60:], y[60:])]  # or class indices
    probe = F.FewShot(train, test, shots=(1, 5), seeds=2, log_dir=str(tmp_path / "tb"))
    history = model.fit(x, onehot, epochs=2, batch_size=20, verbose=0, callbacks=[probe])
    assert [r["step"] for r in probe.results] == [4, 8]
    feats = np.asarray(keras.ops.convert_to_numpy(
        model.intermediates(x, attention_weights=False)["pre_logits"]))
    want = F.evaluate(feats[:40], y[:40], feats[40:], y[40:], 4, (1, 5), seeds=2)
    for k in (1, 5):
        np.testing.assert_allclose(probe.results[-1][f"fewshot_{k}shot_seed_1"], want[k][1])
        np.testing.assert_allclose(history.history[f"fewshot_{k}shot"][-1], np.mean(want[k]))
    assert history.history["fewshot_5shot"][-1] > 0.5  # separable classes, 5 shots
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_the_probe_every_n_steps_counts_optimizer_steps():
    """`every=3` probes once 3, 6 ... steps are passed, counted in optimizer
    steps: with the model compiled for 2 steps per call (Keras calls back
    once a call, with the index of its last batch) at steps 4 and 6; one
    step per call (PyTorch: Keras allows 1 only) at 3 and 6."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).uniform(-1, 1, (80, 16, 16, 3)).astype("float32")
    onehot = np.eye(4, dtype="float32")[np.arange(80) % 4]
    model = kr.ViT("Ti/8", image_size=16, num_classes=4, width=16, depth=1, num_heads=2,
                   mlp_dim=32)
    k = 1 if keras.backend.backend() == "torch" else 2
    model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True),
                  steps_per_execution=k)
    probe = F.FewShot([(x[:40], onehot[:40])], [(x[40:], onehot[40:])], shots=(1,), seeds=1,
                      every=3)
    model.fit(x, onehot, epochs=2, batch_size=20, verbose=0, callbacks=[probe])  # 8 steps
    assert [r["step"] for r in probe.results] == ([4, 6] if k == 2 else [3, 6])
