"""The distributions the batch augmentations draw from, over enough draws
that a near miss fails: MixUp's weights (timm's `timm_mix` and big_vision's
`mixup`) are Beta(0.8, 0.8) by a Kolmogorov-Smirnov test, random erasing's
boxes are timm's (area uniform, aspect log-uniform, 10 attempts). Each test
also shows its KS test rejects the nearest wrong law at the same size."""

import numpy as np
import pytest
from scipy import stats

from keras_reluvit import data as D
from keras_reluvit.data import timm_augment as AUG

pytestmark = pytest.mark.backend_independent

ALPHA = 0.8  # DeiT's mixup_alpha; big_vision's mixup p


def test_timm_mixup_weights_are_beta_and_cutmix_takes_half():
    """DeiT's timm_mix (MixUp alpha 0.8, CutMix alpha 1, switch 0.5) per
    image of one batch of 40,000 one-pixel images (half of value 1 and class
    0, half of value 0 and class 1, each mixed with its partner of the other
    half): a CutMix box of a one-pixel image is empty (lam corrected to 1),
    so the ~20,000 weights below 1 are MixUp's, read off the labels and the
    pixels alike."""
    import tensorflow as tf

    n, half = 40_000, 20_000
    images = tf.constant(np.repeat([1.0, 0.0], half).reshape(n, 1, 1, 1), tf.float32)
    labels = tf.constant(np.repeat(np.eye(2), half, axis=0), tf.float32)
    mixed, targets = D.timm_mix(images, labels, tf.constant([5, 1], tf.int64), mixup_alpha=ALPHA,
                                cutmix_alpha=1.0, switch_prob=0.5, mode="elem",
                                label_smoothing=0.0)
    mixed, targets = np.asarray(mixed).reshape(n), np.asarray(targets)
    lam = np.concatenate([targets[:half, 0], targets[half:, 1]])  # the own class's weight
    np.testing.assert_allclose(mixed, np.concatenate([lam[:half], 1 - lam[half:]]), atol=1e-6)
    cut = lam == 1.0
    assert abs(cut.mean() - 0.5) < 4 * np.sqrt(0.25 / n), cut.mean()
    lams = lam[~cut].astype(np.float64)
    assert stats.kstest(lams, stats.beta(ALPHA, ALPHA).cdf).pvalue > 1e-3
    uniform = np.random.default_rng(0).beta(1.0, 1.0, len(lams))  # Beta(1, 1): rejected
    assert stats.kstest(uniform, stats.beta(ALPHA, ALPHA).cdf).pvalue < 1e-6


def test_big_vision_mixup_weight_is_the_larger_of_a_beta_pair():
    """`mixup(p)`: one a ~ Beta(p, p) per batch, a = max(a, 1 - a): over
    20,000 batches (two rows: 1 and 0, the first row's value is a) a has the
    folded Beta's CDF 2 F(a) - 1 on [1/2, 1]."""
    import tensorflow as tf

    rows = tf.constant([[1.0], [0.0]])
    ds = tf.data.Dataset.range(20_000).map(
        lambda i: D.mixup(rows, rows, ALPHA, tf.stack([i, tf.constant(5, tf.int64)]))[0][0, 0])
    a = np.concatenate(list(ds.batch(1000).as_numpy_iterator())).astype(np.float64)
    assert a.min() >= 0.5 and a.max() <= 1.0

    def folded(x):
        return np.clip(2 * stats.beta(ALPHA, ALPHA).cdf(x) - 1, 0.0, 1.0)

    assert stats.kstest(a, folded).pvalue > 1e-3
    uniform = np.random.default_rng(0).beta(1.0, 1.0, len(a))  # Beta(1, 1): rejected
    assert stats.kstest(np.maximum(uniform, 1 - uniform), folded).pvalue < 1e-6


def timm_erasing_boxes(n, size, rng, log_area=False):
    """(height, width) of the boxes timm's RandomErasing draws in a `size`
    square: of `ERASE_ATTEMPTS` tries, target area uniform in `ERASE_AREA`
    of the image (with `log_area`, log-uniform: the wrong law), log-aspect
    uniform, sides rounded, the first that fits (h < size, w < size) kept;
    none fits: no box."""
    lo, hi = AUG.ERASE_AREA
    u = rng.uniform(size=(n, AUG.ERASE_ATTEMPTS))
    area = (lo * (hi / lo) ** u if log_area else lo + u * (hi - lo)) * size * size
    aspect = np.exp(rng.uniform(*np.log(AUG.ERASE_ASPECT), (n, AUG.ERASE_ATTEMPTS)))
    h, w = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (h < size) & (w < size)
    first, some = fits.argmax(1), fits.any(1)
    return h[np.arange(n), first][some], w[np.arange(n), first][some]


def test_random_erasing_boxes_follow_timms_area_and_aspect_laws():
    """2,000 images erased with probability 1: the boxes' areas and log
    aspects against 200,000 of timm's draws (two-sample KS); a log-uniform
    area, the nearest wrong law, is rejected at the same size."""
    import tensorflow as tf

    size, n = 32, 2000
    image = tf.fill([size, size, 1], 5.0)
    ds = tf.data.Dataset.range(n).map(lambda i: D.random_erasing(
        image, 1.0, tf.stack([i, tf.constant(11, tf.int64)]))[..., 0] != 5.0)
    mask = np.concatenate(list(ds.batch(500).as_numpy_iterator()))
    h, w = mask.any(2).sum(1), mask.any(1).sum(1)
    np.testing.assert_array_equal(h * w, mask.sum((1, 2)))  # one rectangle each
    assert (h > 0).all()  # some attempt fits (each fails with p 0.008 here: all ten, 1e-21)
    rng = np.random.default_rng(0)
    th, tw = timm_erasing_boxes(200_000, size, rng)
    assert stats.ks_2samp(h * w, th * tw).pvalue > 1e-3
    assert stats.ks_2samp(np.log(h / w), np.log(th / tw)).pvalue > 1e-3
    lh, lw = timm_erasing_boxes(n, size, rng, log_area=True)
    assert stats.ks_2samp(lh * lw, th * tw).pvalue < 1e-6
