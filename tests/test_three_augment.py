"""DeiT III's 3-Augment, colour jitter and simple random crop
(`keras_reluvit.data.three_augment`, `Augment(three_augment=, color_jitter=,
crop="simple")`) against Pillow's operations (what DeiT and torchvision run
on PIL images), scipy's exact Gaussian filter, and the draws' definitions."""

import numpy as np
import pytest
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageFilter
from PIL import ImageOps

from keras_reluvit import data as D
from keras_reluvit.data import pillow_graph as P
from keras_reluvit.data import three_augment as T

pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def photo():
    from skimage import data

    return np.ascontiguousarray(data.astronaut()[::4, ::4])  # 128 x 128 RGB


def _diff(ours, reference):
    return np.abs(np.asarray(ours, np.float32) - np.asarray(reference, np.float32))


def test_each_operation_is_pillows(photo):
    """Each writes Pillow's uint8 levels (its rounded gray, its truncating
    blends): equal to Pillow's on a uint8 image."""
    import tensorflow as tf

    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    assert _diff(P.grayscale(x), pil.convert("L").convert("RGB")).max() == 0
    assert _diff(P.solarize(x), ImageOps.solarize(pil, 128)).max() == 0
    for factor in (0.7, 0.93, 1.0, 1.3):
        for ours, theirs in ((P.brightness, ImageEnhance.Brightness),
                             (P.contrast, ImageEnhance.Contrast),
                             (P.color, ImageEnhance.Color)):
            d = _diff(ours(x, factor), theirs(pil).enhance(factor))
            assert d.max() == 0, (ours.__name__, factor, d.max())


def test_the_blur_is_the_exact_gaussian_and_close_to_pillows(photo):
    import tensorflow as tf
    from scipy import ndimage

    x = tf.constant(photo, tf.float32)
    for sigma in (0.5, 1.0, 2.0):
        ours = np.asarray(T.gaussian_blur(x, sigma))
        exact = np.stack([ndimage.gaussian_filter(photo[..., c].astype("float64"), sigma,
                                                  mode="nearest", truncate=T.BLUR_TAPS / sigma)
                          for c in range(3)], -1)
        levels = np.floor(exact + 0.5)  # written as levels (a float32 sum may cross a .5)
        assert (ours == levels).mean() > 0.999 and np.abs(ours - levels).max() <= 1, sigma
        # Pillow's three box blurs approximate it: under a level on average
        pillow = Image.fromarray(photo).filter(ImageFilter.GaussianBlur(sigma))
        assert _diff(ours, pillow).mean() < 1.0, sigma


def _applied(n, fn):
    import tensorflow as tf

    return [fn(tf.constant([i, 7], tf.int64)) for i in range(n)]


def test_three_augment_picks_each_operation_a_third_of_the_time(photo):
    import tensorflow as tf

    x = tf.constant(photo, tf.float32)
    gray, solar = np.asarray(P.grayscale(x)), np.asarray(P.solarize(x))
    picked = {"grayscale": 0, "solarize": 0, "blur": 0}
    n = 600
    for out in _applied(n, lambda key: T.three_augment(x, key)):
        out = np.asarray(out)
        if np.array_equal(out, gray):
            picked["grayscale"] += 1
        elif np.array_equal(out, solar):
            picked["solarize"] += 1
        else:  # a blur: smoother than the photo, same mean
            assert np.abs(np.diff(out, axis=1)).mean() < np.abs(np.diff(photo, axis=1)).mean()
            assert abs(out.mean() - photo.mean()) < 1.0
            picked["blur"] += 1
    for name, count in picked.items():  # binomial(600, 1/3): sd 11.5
        assert abs(count - n / 3) < 50, picked


def test_color_jitter_draws_its_factors_uniformly_in_range(monkeypatch):
    """torchvision's ColorJitter(0.3, 0.3, 0.3): the three operations (each
    Pillow's, checked above) spied on: each runs once per image, with a factor
    uniform in [0.7, 1.3] (KS; a range of 0.2 or 0.4 fails) drawn apart from
    the others, in an order uniform over the 6 permutations (chi-square)."""
    import tensorflow as tf
    from scipy import stats

    def spy(op):
        def record(image, factor):  # writes (op, factor) in the next free row
            row = tf.reduce_sum(tf.cast(image[:, 0, 0] != 0, tf.int32))
            return tf.tensor_scatter_nd_update(image, [[row, 0, 0], [row, 0, 1]],
                                               [float(op), factor])
        return record

    for i, name in enumerate(("brightness", "contrast", "color")):
        monkeypatch.setattr(T, name, spy(i + 1))
    x = tf.zeros((3, 1, 3))
    runs = np.array([np.asarray(out)[:, 0, :2] for out in
                     _applied(1200, lambda key: T.color_jitter(x, 0.3, key))])  # [n, 3, 2]
    ops, factors = runs[..., 0].astype(int), runs[..., 1]
    assert (np.sort(ops, 1) == [1, 2, 3]).all()  # each once
    orders = np.unique(ops, axis=0, return_counts=True)[1]
    assert len(orders) == 6 and stats.chisquare(orders).pvalue > 1e-3, orders
    by_op = [factors[ops == k] for k in (1, 2, 3)]
    for f in by_op:
        assert f.min() >= 0.7 - 1e-6 and f.max() <= 1.3 + 1e-6
        assert stats.kstest(f, stats.uniform(0.7, 0.6).cdf).pvalue > 1e-3
        assert stats.kstest(f, stats.uniform(0.8, 0.4).cdf).pvalue < 1e-6  # jitter 0.2
    for a, b in ((0, 1), (0, 2), (1, 2)):  # drawn apart
        assert abs(np.corrcoef(by_op[a], by_op[b])[0, 1]) < 0.15, (a, b)


def test_the_pipeline_runs_deit3s_augmentation(tmp_path):
    """`Augment(crop="simple", three_augment=True, color_jitter=0.3)` in the
    training pipeline: full-size crops of the padded image, one of the three
    operations, seeded."""
    import tensorflow as tf

    from keras_reluvit.data.pipeline import pipeline

    images = np.random.default_rng(0).integers(0, 256, (24, 20, 28, 3), dtype="uint8")
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(24) % 3})
    aug = D.Augment(crop="simple", three_augment=True, color_jitter=0.3, flip=False)
    first = [np.asarray(x) for x, _ in pipeline(ds, 3, 16, 8, True, aug, seed=4)]
    again = [np.asarray(x) for x, _ in pipeline(ds, 3, 16, 8, True, aug, seed=4)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert first[0].shape == (8, 16, 16, 3)
    # grayscale is picked for about a third: equal channels (colour jitter keeps them)
    flat = np.concatenate(first)
    gray = [np.allclose(im[..., 0], im[..., 1], atol=1e-4) for im in flat]
    assert 2 <= sum(gray) <= 16
    # Pillow's operations run on levels, the 3-Augment's and the colour jitter's alone
    # too: every image is levels (normalised to [-1, 1] here)
    for only in (dict(three_augment=True), dict(color_jitter=0.3)):
        one = D.Augment(crop="simple", flip=False, **only)
        levels = (np.concatenate([np.asarray(x) for x, _ in pipeline(ds, 3, 16, 8, True, one,
                                                                     seed=4)]) + 1.0) * 127.5
        assert np.abs(levels - np.round(levels)).max() < 1e-3, only
    with pytest.raises(ValueError, match="Augment\\(crop=\\) must be one of .*got 'center'"):
        D.Augment(crop="center")  # refused where it is made


def test_simple_random_crop_is_a_shifted_window_of_the_resized_image():
    import tensorflow as tf

    from keras_reluvit.data.three_augment import simple_random_crop

    image = tf.constant(np.arange(20 * 30 * 3, dtype=np.float32).reshape(20, 30, 3))
    resized = np.asarray(tf.image.resize(image, (16, 24), method="bilinear"))
    padded = np.pad(resized, [(4, 4), (4, 4), (0, 0)], mode="reflect")
    offsets = set()
    for i in range(40):
        crop = np.asarray(simple_random_crop(image, (16, 16), tf.constant([i, 1], tf.int64)))
        hits = [(y, x) for y in range(9) for x in range(17)
                if np.array_equal(padded[y:y + 16, x:x + 16], crop)]
        assert len(hits) == 1
        offsets.add(hits[0])
    assert len(offsets) > 20  # uniform over the 9 x 17 offsets


def _mapped(n, fn):
    """`fn(key)` over n keys in a tf.data map (traced once), as numpy."""
    import tensorflow as tf

    ds = tf.data.Dataset.range(n).map(lambda i: fn(tf.stack([i, tf.constant(5, tf.int64)])))
    return np.stack(list(ds.as_numpy_iterator()))


def test_color_jitter_applies_its_operations_in_a_uniformly_random_order(monkeypatch):
    """torchvision's `ColorJitter.get_params` draws `torch.randperm(4)` per
    image; with hue 0 (DeiT III's `ColorJitter(0.3, 0.3, 0.3)`) its 24 orders
    are the 6 orders of brightness, contrast and saturation, equally likely.
    The three operations replaced by spies that append their digit (1, 2, 3)
    to the image's value in base 4: over 3000 images each order is read back
    about 500 times (chi-square); a fixed order, or one of a few, fails."""
    import itertools

    import tensorflow as tf
    from scipy import stats

    for digit, name in enumerate(("brightness", "contrast", "color"), 1):
        monkeypatch.setattr(T, name, lambda im, f, d=digit: im * 4.0 + d)
    codes = _mapped(3000, lambda key: T.color_jitter(tf.zeros([1, 1, 3]), 0.3, key))
    codes = codes[:, 0, 0, 0].astype(int)
    orders = [tuple(p) for p in itertools.permutations((1, 2, 3))]
    index = {a * 16 + b * 4 + c: k for k, (a, b, c) in enumerate(orders)}
    assert set(codes) <= set(index)  # each operation exactly once
    counts = np.bincount([index[c] for c in codes], minlength=6)
    assert stats.chisquare(counts).pvalue > 1e-3, dict(zip(orders, counts))


def test_three_augments_blur_draws_sigma_uniformly_in_deit3s_range(monkeypatch):
    """DeiT III's `GaussianBlur(p=1.0)` (deit/augment.py): radius
    `random.uniform(0.1, 2.0)`, Pillow's `GaussianBlur(radius)` (its sigma).
    The blur spied on (its sigma written into the image, the other two
    choices -1): over 2400 images about a third blur, their sigmas uniform
    on [0.1, 2.0] by a KS test and within it; the range halved, doubled,
    cut or shifted fails."""
    import tensorflow as tf
    from scipy import stats

    assert T.BLUR_SIGMA == (0.1, 2.0)
    monkeypatch.setattr(T, "gaussian_blur", lambda im, sigma: im * 0.0 + sigma)
    monkeypatch.setattr(T, "grayscale", lambda im: im * 0.0 - 1.0)
    monkeypatch.setattr(T, "solarize", lambda im: im * 0.0 - 1.0)
    out = _mapped(2400, lambda key: T.three_augment(tf.zeros([1, 1, 3]), key))[:, 0, 0, 0]
    sigmas = out[out > -1.0]
    assert abs(len(sigmas) - 800) < 5 * np.sqrt(2400 * 2 / 9), len(sigmas)
    assert sigmas.min() >= 0.1 - 1e-6 and sigmas.max() <= 2.0 + 1e-6
    assert stats.kstest(sigmas, stats.uniform(0.1, 1.9).cdf).pvalue > 1e-3
    # the test tells them apart: the range halved, doubled, cut at 1.0 (a range shifted out
    # of [0.1, 2.0] fails the bounds above)
    for wrong in (stats.uniform(0.05, 0.95), stats.uniform(0.2, 3.8), stats.uniform(0.1, 0.9)):
        assert stats.kstest(sigmas, wrong.cdf).pvalue < 1e-6
