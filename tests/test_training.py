"""Training on the current backend: a real tfds ImageNet built from generated
archives, the input pipeline, recipes, weight decay, resume, the CLI."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
from conftest import END_TO_END_ON_TORCH
from helpers.id_data import id_image
from helpers.id_data import write_class_files_tfds

import keras_reluvit as kr
from keras_reluvit import data as D
from keras_reluvit import recipes


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds_digits")


# The tfds builder and the pipeline are TensorFlow's; the fit / evaluate of a ViT on
# tf.data batches runs on every backend in test_finetune.py and the CLI test below.
@pytest.mark.backend_independent
def test_real_imagenet_builder_pipeline_fit_and_eval(imagenet_dir):
    train, val, info = D.imagenet(batch_size=4, data_dir=imagenet_dir, image_size=32,
                                  augment=D.Augment(randaug=(2, 10), mixup=0.2))
    assert info.splits["train"].num_examples == 18
    assert info.features["label"].num_classes == info.num_classes == 1000
    assert len(train) == 17 // 4  # train[:99%] of 18 examples, full batches
    x, y = next(iter(train))
    assert tuple(x.shape) == (4, 32, 32, 3) and tuple(y.shape) == (4, 1000)
    x = np.asarray(x)
    assert -1.0 <= x.min() and x.max() <= 1.0 and x.std() > 0.01
    plain, _, _ = D.imagenet(batch_size=4, data_dir=imagenet_dir, image_size=32,
                             augment=D.Augment())
    xp = np.asarray(next(iter(plain))[0])  # random-noise JPEGs span the range
    assert -1.0 <= xp.min() < -0.5 and 0.5 < xp.max() <= 1.0
    np.testing.assert_allclose(np.asarray(y).sum(1), 1.0, rtol=1e-6)
    xv = np.concatenate([np.asarray(b[0]) for b in val])
    assert xv.shape == (6, 32, 32, 3)
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=1000)
    recipes.compile(model, "s16_i1k_90ep", steps_per_epoch=len(train), batch_size=4, epochs=1)
    hist = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(hist.history["loss"][0])
    result = model.evaluate(val, return_dict=True, verbose=0)
    # The metric is the fraction of argmax hits over the 6 validation images
    # (computed here from predict), the loss near ln(1000) for 1000 classes
    # after one step on noise.
    logits = model.predict(val, verbose=0)
    labels = np.concatenate([np.asarray(b[1]) for b in val]).argmax(1)
    assert result["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == labels))
    assert 5.0 < result["loss"] < 9.0


@pytest.mark.backend_independent
def test_eval_pipeline_is_deterministic_and_center_crops(imagenet_dir):
    import tensorflow as tf

    _, val, _ = D.imagenet(batch_size=4, data_dir=imagenet_dir, image_size=32)
    a = np.concatenate([np.asarray(b[0]) for b in val])
    b = np.concatenate([np.asarray(b[0]) for b in val])
    np.testing.assert_array_equal(a, b)
    # Each image: shorter side resized to round(32 * 256 / 224) = 37 (area; the
    # longer side in proportion, rounded, as big_vision's resize_small), then
    # the central 32 x 32, in [-1, 1] -- spelled out here on the raw tfds images.
    raw = D.builder("imagenet2012", imagenet_dir).as_dataset(split="validation",
                                                             shuffle_files=False)
    for got, ex in zip(a, raw):
        img = tf.cast(ex["image"], tf.float32)
        if img.shape[-1] == 1:
            img = tf.repeat(img, 3, axis=-1)
        h, w = img.shape[:2]
        nh, nw = round(h * 37 / min(h, w)), round(w * 37 / min(h, w))
        small = tf.image.resize(img, (nh, nw), method="area").numpy()
        top, left = (nh - 32) // 2, (nw - 32) // 2
        want = np.clip(small[top:top + 32, left:left + 32], 0, 255) / 127.5 - 1.0
        np.testing.assert_allclose(got, want, atol=1e-4)


def _raw(imagenet_dir, split, encoded):
    import tensorflow_datasets as tfds

    decoders = {"image": tfds.decode.SkipDecoding()} if encoded else None
    return D.builder("imagenet2012", imagenet_dir).as_dataset(
        split=split, shuffle_files=False, decoders=decoders)


@pytest.mark.backend_independent
def test_pipeline_shuffles_encoded_images_and_decodes_the_crop_window(imagenet_dir):
    import tensorflow as tf

    # load reads tfds with its decoding skipped: the shuffle holds JPEG bytes.
    source = D.sources._TfdsSource("imagenet2012", imagenet_dir, None)
    assert source.read("train", True, 0).element_spec["image"].dtype == tf.string
    # The same seeds draw the same crop windows and flips as the pipeline on
    # tfds' decoded pixels; decode_and_crop_jpeg differs from a full decode
    # only at chroma-subsampled window edges (noise JPEGs: the worst case).
    aug = D.Augment(crop_area=(0.3, 1.0))

    def images(encoded):
        ds = D.pipeline(_raw(imagenet_dir, "train", encoded), 1000, 24, 6, True, aug, seed=5,
                        shuffle_buffer=1)
        return np.concatenate([np.asarray(x) for x, _ in ds])

    late, early = images(True), images(False)
    assert late.shape == early.shape == (18, 24, 24, 3)
    same = np.isclose(late, early, atol=1e-6)
    assert same.mean() > 0.9, same.mean()
    assert same.all(axis=(1, 2, 3)).sum() >= 3  # some windows decode identically
    # A different seed draws other windows: far from equal.
    other = np.concatenate([np.asarray(x) for x, _ in D.pipeline(
        _raw(imagenet_dir, "train", True), 1000, 24, 6, True, aug, seed=6, shuffle_buffer=1)])
    assert np.isclose(other, early, atol=1e-6).mean() < 0.5


@pytest.mark.backend_independent
def test_eval_of_encoded_images_equals_tfds_decoding_exactly(imagenet_dir):
    def images(encoded):
        ds = D.pipeline(_raw(imagenet_dir, "validation", encoded), 1000, 32, 4, False)
        return np.concatenate([np.asarray(x) for x, _ in ds])

    np.testing.assert_array_equal(images(True), images(False))


@pytest.mark.backend_independent
@pytest.mark.parametrize("stats", ["bv", "imagenet"])
def test_normalise_is_the_per_channel_formula_bitwise(stats):
    import tensorflow as tf

    from keras_reluvit import preprocessing as P

    p = P.check_preprocessing(None if stats == "bv" else dict(
        mean=P.IMAGENET_MEAN, std=P.IMAGENET_STD))
    x = np.random.default_rng(0).uniform(0, 255, (2, 14, 10, 3)).astype("float32")
    std = np.asarray(p["std"], "float64")
    want = x / (255 * std).astype("float32") - (np.asarray(p["mean"]) / std).astype("float32")
    assert want.dtype == np.float32
    for got in (P.normalise(tf.constant(x), p), P.normalise(tf.constant(x[0]), p)[None],
                P.normalise(keras.ops.convert_to_tensor(x), p, keras.ops.convert_to_tensor)):
        got = keras.ops.convert_to_numpy(got)
        np.testing.assert_array_equal(got, want[:len(got)])
    # In a graph (tf.data, SavedModel) TensorFlow's optimiser may turn the
    # division by a constant into a product with its reciprocal: <= 2 ulp.
    for shape in ([14, 10, 3], [None, None, 3]):
        graph = tf.function(lambda v: P.normalise(v, p),
                            input_signature=[tf.TensorSpec(shape, tf.float32)])
        np.testing.assert_allclose(graph(tf.constant(x[0])).numpy(), want[0], rtol=0, atol=5e-7)


@pytest.mark.backend_independent
def test_resize_small_central_crop_geometry():
    import tensorflow as tf

    # A 40x80 image with a bright column band in the centre.
    img = np.zeros((40, 80, 3), "float32")
    img[:, 36:44] = 255.0
    out = D.resize_small_central_crop(tf.constant(img), (28, 28)).numpy()
    assert out.shape == (28, 28, 3)
    # shorter side -> 28*256/224 = 32, i.e. 32x64; the band lands in the crop centre
    col = out[14, :, 0]
    assert col[12:16].min() > 200 and col[:6].max() < 1 and col[-6:].max() < 1


@pytest.mark.backend_independent
def test_mixup_has_big_vision_semantics():
    import tensorflow as tf

    images = tf.constant(np.arange(5 * 2 * 2 * 3, dtype="float32").reshape(5, 2, 2, 3))
    labels = tf.one_hot(np.arange(5), 5)
    mi, ml = D.mixup(images, labels, 0.5, tf.constant([3, 7], tf.int64))
    ml = ml.numpy()
    a = ml[0, 0]
    assert 0.5 <= a <= 1.0
    np.testing.assert_allclose(ml.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ml, a * np.eye(5) + (1 - a) * np.roll(np.eye(5), 1, axis=0), rtol=1e-6)
    ref = a * images.numpy() + (1 - a) * np.roll(images.numpy(), 1, axis=0)
    np.testing.assert_allclose(mi.numpy(), ref, rtol=1e-5)


@pytest.mark.backend_independent
def test_train_pipeline_is_seeded_and_mixup_rows_sum_to_one(digits_dir):
    aug = D.Augment(crop_area=(0.5, 1.0), flip=False, mixup=0.8)
    first = [next(iter(D.load("sklearn_digits", 16, 32, digits_dir, aug, seed=3).train))
             for _ in range(2)]
    np.testing.assert_array_equal(np.asarray(first[0][0]), np.asarray(first[1][0]))
    y = np.asarray(first[0][1])
    np.testing.assert_allclose(y.sum(1), 1.0, rtol=1e-5)
    assert y.max(1).min() < 1.0  # mixed
    other = next(iter(D.load("sklearn_digits", 16, 32, digits_dir, aug, seed=4).train))
    assert not np.array_equal(np.asarray(other[0]), np.asarray(first[0][0]))


@pytest.mark.backend_independent
@pytest.mark.parametrize("recipe", ["deit_s16_300ep", "deit3_s16_400ep", "s16_i1k_90ep"])
def test_the_pipelines_build_without_autograph_converting_a_function(digits_dir, recipe):
    """Every tf.data function of the train and eval pipelines (DeiT's chain with
    repeated augmentation and MixUp / CutMix, 3-Augment, big_vision's RandAugment
    and MixUp) runs as written: AutoGraph's conversion, 3-5 s a process before
    the first batch, writes one `__autograph_generated_file` module per function."""
    import sys

    def converted():
        return {m for m in sys.modules if "autograph_generated" in m}

    before = converted()
    aug = D.Augment(**recipes.get(recipe)["augment"])
    train, val, _ = D.load("sklearn_digits", 16, 32, digits_dir, aug, seed=1)
    next(iter(train)), next(iter(val))
    assert converted() == before, sorted(converted() - before)


def erased_boxes(images, fill):
    """(erased?, box height, box width) of each image that was `fill`
    everywhere before: the erased pixels must form one full rectangle."""
    out = []
    for image in images:
        mask = (image != fill).any(-1)
        if not mask.any():
            out.append((False, 0, 0))
            continue
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        box = mask[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
        assert box.all() and mask.sum() == box.size  # one rectangle, every channel
        assert (image[mask] != fill).all()
        out.append((True, len(rows), len(cols)))
    return out


@pytest.mark.backend_independent
def test_random_erasing_draws_timms_boxes_of_normal_noise():
    """timm's RandomErasing (DeiT: probability 0.25, area 2-33 %, aspect
    0.3-3.3 log-uniform, per-pixel N(0, 1), one box): over 3000 images the
    erased share is the probability, every box is one a draw in those ranges
    rounds to, tall and wide boxes are equally likely, the noise is N(0, 1)."""
    import tensorflow as tf

    size, p, n = 40, 0.25, 3000
    image = tf.fill([size, size, 3], 5.0)
    ds = tf.data.Dataset.range(n).map(
        lambda i: D.random_erasing(image, p, tf.stack([i, tf.constant(11, tf.int64)])))
    images = np.stack(list(ds.as_numpy_iterator()))
    boxes = erased_boxes(images, 5.0)
    erased = np.array([b[0] for b in boxes])
    assert abs(erased.mean() - p) < 4 * np.sqrt(p * (1 - p) / n), erased.mean()
    hw = np.array([(h, w) for e, h, w in boxes if e], float)
    h, w = hw[:, 0], hw[:, 1]
    # Some area a in [0.02, 1/3] of the image and aspect r in [0.3, 3.3] round to (h, w):
    # a in [(h - .5)(w - .5), (h + .5)(w + .5)], r in [(h - .5)/(w + .5), (h + .5)/(w - .5)].
    area = size * size
    assert ((h + .5) * (w + .5) >= 0.02 * area).all() and ((h - .5) * (w - .5) <= area / 3).all()
    assert ((h + .5) / (w - .5) >= 0.3).all() and ((h - .5) / (w + .5) <= 1 / 0.3).all()
    assert (h < size).all() and (w < size).all()
    log_aspect = np.log(h / w)
    assert abs(log_aspect.mean()) < 0.1 and (log_aspect > np.log(2)).mean() > 0.1
    assert (log_aspect < -np.log(2)).mean() > 0.1
    assert 0.08 < np.median(h * w / area) < 0.2  # area uniform in [0.02, 1/3]: 0.18, less rejections
    noise = images[images != 5.0]
    assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02


@pytest.mark.backend_independent
def test_the_train_pipeline_erases_with_the_augments_probability(digits_dir):
    """`Augment(erase=p)` in `kr.data.load`: the same stream as without it
    except one rectangle of noise in about p of the images."""
    base = D.Augment(crop_area=(0.5, 1.0))
    plain = next(iter(D.load("sklearn_digits", 128, 32, digits_dir, base, seed=3).train))[0]
    erasing = D.Augment(crop_area=(0.5, 1.0), erase=0.5)
    erased = next(iter(D.load("sklearn_digits", 128, 32, digits_dir, erasing, seed=3).train))[0]
    plain, erased = np.asarray(plain), np.asarray(erased)
    changed = [(a != b).any() for a, b in zip(plain, erased)]
    assert 0.3 < np.mean(changed) < 0.7, np.mean(changed)
    for a, b in zip(plain, erased):
        mask = (a != b).any(-1)
        if mask.any():
            rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
            assert mask[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].mean() > 0.99  # a box


def _epochs_of_labels(ds, epochs):
    """Per epoch: the label of each example in stream order, and the images."""
    out = []
    for _ in range(epochs):
        batches = list(ds)
        out.append((np.concatenate([np.argmax(y, 1) for _, y in batches]),
                    np.concatenate([np.asarray(x) for x, _ in batches])))
    return out


@pytest.mark.backend_independent
def test_repeated_augmentation_shows_a_new_third_three_times_in_an_epoch_as_long():
    """DeiT's RASampler (`Augment(aug_repeats=3)`): each epoch holds ceil(n / 3)
    images, each 3 times in a row with its own crop, in as many steps as
    without; the next epoch takes other images."""
    import tensorflow as tf

    from keras_reluvit.data.pipeline import pipeline

    n, batch = 60, 6  # label = the image's index
    images = np.random.default_rng(0).integers(0, 256, (n, 16, 16, 3), dtype="uint8")
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(n)})
    aug = D.Augment(crop_area=(0.3, 1.0), flip=False)
    plain = pipeline(ds, n, 8, batch, True, aug, seed=1)
    rep = pipeline(ds, n, 8, batch, True, D.Augment(crop_area=(0.3, 1.0), flip=False,
                                                    aug_repeats=3), seed=1)
    assert len(rep) == len(plain) == n // batch
    (plain_labels, _), = _epochs_of_labels(plain, 1)
    assert sorted(plain_labels) == list(range(n))  # one pass: every image once
    epochs = _epochs_of_labels(rep, 2)
    for labels, pixels in epochs:
        assert len(labels) == n
        values, counts = np.unique(labels, return_counts=True)
        assert len(values) == n // 3 and (counts == 3).all()
        runs = labels.reshape(-1, 3)  # the copies are consecutive ...
        assert (runs == runs[:, :1]).all()
        copies = pixels.reshape(-1, 3, *pixels.shape[1:])  # ... and cropped apart
        assert all((c[0] != c[1]).any() and (c[1] != c[2]).any() for c in copies)
    assert set(epochs[0][0]) != set(epochs[1][0])  # a new third each epoch
    with pytest.raises(ValueError, match="size is unknown"):
        pipeline(ds.filter(lambda ex: True), n, 8, batch, True, D.Augment(aug_repeats=3))
    with pytest.raises(ValueError, match="whole number >= 1"):
        pipeline(ds, n, 8, batch, True, D.Augment(aug_repeats=0))


@pytest.mark.backend_independent
def test_repeated_augmentation_repeats_each_process_shard(digits_dir):
    """In a cluster each process repeats the images of its own shard: every
    image of a process' epoch 3 times, the processes' images disjoint, the
    steps as without repeats."""
    import hashlib

    whole = D.Augment(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), flip=False, aug_repeats=3)
    seen = []
    for index in (0, 1):
        data = D.load("sklearn_digits", 64, 16, digits_dir, whole, seed=2, val_split=False,
                      process_index=index, process_count=2)
        plain = D.load("sklearn_digits", 64, 16, digits_dir, val_split=False,
                       process_index=index, process_count=2)
        assert len(data.train) == len(plain.train) == data.steps_per_epoch
        (labels, pixels), = _epochs_of_labels(data.train, 1)
        keys = [hashlib.sha1(p.tobytes()).hexdigest() + str(y) for p, y in zip(pixels, labels)]
        counts = sorted(np.unique(keys, return_counts=True)[1])  # the last one cut short
        assert counts[1:] == [3] * (len(counts) - 1) and counts[0] >= 1
        seen.append(set(keys))
    assert not seen[0] & seen[1]


@pytest.mark.backend_independent
def test_for_model_repeats_a_keras_image_directory(tmp_path):
    """`kr.data.for_model` on `keras.utils.image_dataset_from_directory`'s
    batches knows their size (its `file_paths`), so repeated augmentation
    runs on them; an unknown size is an error naming the cure."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(9):
            Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype="uint8")).save(
                tmp_path / c / f"{i}.png")
    ds = keras.utils.image_dataset_from_directory(str(tmp_path), image_size=(20, 20),
                                                  batch_size=4, seed=0)
    model = kr.ViT("Ti/16", num_classes=2, image_size=16, depth=1)
    aug = D.Augment(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), flip=False, aug_repeats=3)
    train = D.for_model(ds, model, train=True, batch_size=6, augment=aug)
    assert len(train) == 3  # 18 images, batches of 6
    images = np.concatenate([np.asarray(x) for x, _ in train])
    counts = np.unique([im.tobytes() for im in images], return_counts=True)[1]
    assert len(images) == 18 and sorted(counts) == [3] * 6  # a third, each 3 times
    with pytest.raises(ValueError, match="size is unknown.*ds.unbatch"):
        D.for_model(ds.map(lambda x, y: (x, y)), model, train=True, augment=aug)


def timm_mixed(n_batches, batch=16, size=12, classes=16, **options):
    """Batches of images each filled with its own value (its index) mixed by
    `timm_mix`: (images, labels) stacked, and the values each image held."""
    import tensorflow as tf

    values = np.arange(batch, dtype="float32")
    images = tf.constant(np.broadcast_to(values[:, None, None, None], (batch, size, size, 3)))
    labels = tf.one_hot(np.arange(batch) % classes, classes)
    out = [D.timm_mix(images, labels, tf.constant([i, 5], tf.int64), **options)
           for i in range(n_batches)]
    return (np.stack([o[0].numpy() for o in out]), np.stack([o[1].numpy() for o in out]),
            values)


@pytest.mark.backend_independent
def test_timm_cutmix_label_weight_is_the_pasted_share_of_every_image():
    """CutMix per image (timm's "elem" mode, no smoothing): each image holds a
    box of its partner in the reversed batch, and its label weight on its own
    class equals the share of its own pixels, exactly (timm's correct_lam)."""
    images, labels, values = timm_mixed(20, mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem",
                                        label_smoothing=0.0)
    b = len(values)
    shares = []
    for imgs, labs in zip(images, labels):
        for i in range(b):
            own = (imgs[i] == values[i]).all(-1).mean()
            partner = (imgs[i] == values[b - 1 - i]).all(-1).mean()
            assert own + partner == 1.0  # pixels are one image's or the other's
            np.testing.assert_allclose(labs[i, i], own, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(labs[i, b - 1 - i], partner, rtol=1e-6, atol=1e-7)
            shares.append(partner)
    # lam ~ Beta(1, 1), box sides int(12 sqrt(1 - lam)) with the centre uniform
    # (clipped at the borders): less than 1 - lam on average, sometimes nothing
    assert 0.15 < np.mean(shares) < 0.5 and np.mean(np.array(shares) == 0) < 0.3


def rand_bbox_timm_1_0_31(h, w, lam, cy, cx):
    """timm 1.0.31's `timm.data.mixup.rand_bbox` (margin 0) for a given centre,
    in NumPy: the definition our boxes must equal."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    return (np.clip(cy - cut_h // 2, 0, h), np.clip(cy + (cut_h + 1) // 2, 0, h),
            np.clip(cx - cut_w // 2, 0, w), np.clip(cx + (cut_w + 1) // 2, 0, w))


@pytest.mark.backend_independent
def test_cutmix_boxes_are_timms_rand_bbox():
    """Every centre of a 12 x 20 image and 41 weights: the box is timm 1.0.31's
    (an unclipped side exactly int(size * sqrt(1 - lam)), odd ones included;
    timm 0.3.2's `cy + cut_h // 2` made every side even). And through
    `timm_mix`: boxes away from the borders have odd sides too."""
    import tensorflow as tf

    from keras_reluvit.data import timm_augment as AUG

    h, w = 12, 20
    lams = np.linspace(0.0, 1.0, 41).astype("float32")
    cy, cx, lam = (a.ravel() for a in np.meshgrid(np.arange(h), np.arange(w), lams,
                                                   indexing="ij"))
    centre = np.stack([(cy + 0.5) / h, (cx + 0.5) / w], -1).astype("float32")
    ours = np.stack([np.asarray(t) for t in AUG.cutmix_box(tf.constant(lam), tf.constant(centre),
                                                           h, w)], -1)
    timm = np.array([rand_bbox_timm_1_0_31(h, w, lam[i], cy[i], cx[i]) for i in range(len(lam))])
    np.testing.assert_array_equal(ours, timm)
    images, _, values = timm_mixed(20, size=h, mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem",
                                   label_smoothing=0.0)
    sides = []
    for imgs in images:
        for i in range(len(values)):
            rows, cols = np.nonzero((imgs[i] == values[-1 - i]).all(-1))
            if len(rows) and rows.min() > 0 and rows.max() < h - 1:
                sides.append(rows.max() - rows.min() + 1)
    assert len(sides) > 20 and any(s % 2 for s in sides), sides


@pytest.mark.backend_independent
def test_timm_mix_switches_at_its_rate_and_draws_beta_lambdas():
    """Per image: CutMix (only whole pixels of one image or the other) with
    switch_prob 0.5, MixUp otherwise; MixUp's lam ~ Beta(0.8, 0.8): mean 1/2,
    variance 1 / (4 (2 alpha + 1)); labels smoothed as timm's mixup_target."""
    images, labels, values = timm_mixed(40, mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem",
                                        label_smoothing=0.1)
    b, k = len(values), labels.shape[-1]
    cut, lams = [], []
    for imgs, labs in zip(images, labels):
        for i in range(b):
            pixels = imgs[i, ..., 0]
            whole = np.isin(pixels, [values[i], values[b - 1 - i]]).all()
            cut.append(whole)
            if not whole:  # MixUp: every pixel lam * own + (1 - lam) * partner
                lam = (pixels[0, 0] - values[b - 1 - i]) / (values[i] - values[b - 1 - i])
                np.testing.assert_allclose(pixels, pixels[0, 0], rtol=1e-6)
                lams.append(lam)
                off, on = 0.1 / k, 1 - 0.1 + 0.1 / k
                np.testing.assert_allclose(labs[i, i], lam * on + (1 - lam) * off, atol=1e-5)
    n = len(cut)
    assert abs(np.mean(cut) - 0.5) < 4 * np.sqrt(0.25 / n), np.mean(cut)
    lams = np.array(lams)
    assert abs(lams.mean() - 0.5) < 0.03, lams.mean()
    assert abs(lams.var() - 1 / (4 * 2.6)) < 0.012, lams.var()


@pytest.mark.backend_independent
def test_timm_mix_per_batch_and_its_probability():
    """"batch" mode: one draw for the whole batch; `prob` 0.3: about 30 % of
    the batches mixed, the rest only label-smoothed."""
    images, labels, values = timm_mixed(400, mode="batch", prob=0.3, label_smoothing=0.1)
    mixed = [not (imgs[..., 0] == values[:, None, None]).all() for imgs in images]
    assert abs(np.mean(mixed) - 0.3) < 4 * np.sqrt(0.21 / 400), np.mean(mixed)
    for imgs, labs, m in zip(images, labels, mixed):
        lam = labs[:, np.arange(16)].diagonal()  # weight on the own class (k = 16)
        assert np.allclose(lam, lam[0])  # one lam for the batch
        if not m:
            np.testing.assert_allclose(labs, 0.1 / 16 + 0.9 * np.eye(16), atol=1e-6)
    with pytest.raises(ValueError, match="Unknown timm_mix mode 'pairs'"):
        timm_mixed(1, mode="pairs")
    # every batch mixed: each image's pixels against its label's own weight (MixUp's
    # blend, CutMix's pasted share), the one mix drawn for the batch
    images, labels, values = timm_mixed(40, mode="batch", label_smoothing=0.0)
    batch, kinds = len(values), set()
    for imgs, labs in zip(images, labels):
        own = labs[np.arange(batch), np.arange(batch)]
        cutmix = np.isin(imgs[..., 0], values).all()
        kinds.add(bool(cutmix))
        for i in range(batch):
            a, j = imgs[i, ..., 0], batch - 1 - i
            if cutmix:
                np.testing.assert_allclose((a == values[i]).mean() if i != j else 1.0, own[i],
                                           atol=1e-6)
            else:
                np.testing.assert_allclose(a, own[i] * values[i] + (1 - own[i]) * values[j],
                                           rtol=1e-5)
    assert kinds == {True, False}  # both mixes drawn


@pytest.mark.backend_independent
def test_timm_mix_pair_mode_swaps_the_same_box_or_weight_within_each_pair():
    """timm's "pair" mode: images i and B-1-i draw together -- CutMix swaps one
    box between them, MixUp blends them with one weight -- and each label
    weight is still the share the image keeps."""
    images, labels, values = timm_mixed(30, mode="pair", label_smoothing=0.0)
    batch = len(values)
    for imgs, labs in zip(images, labels):
        own = labs[np.arange(batch), np.arange(batch)]
        np.testing.assert_allclose(own, own[::-1], atol=1e-6)  # one lam per pair
        for i in range(batch // 2):
            j = batch - 1 - i
            a, b = imgs[i, ..., 0], imgs[j, ..., 0]
            if np.isin(a, values).all():  # CutMix (or none): the same box, swapped
                np.testing.assert_array_equal(a == values[j], b == values[i])
                np.testing.assert_allclose((a == values[i]).mean(), own[i], atol=1e-6)
            else:  # MixUp: a = l x_i + (1 - l) x_j and b = l x_j + (1 - l) x_i
                np.testing.assert_allclose(a, own[i] * values[i] + (1 - own[i]) * values[j],
                                           rtol=1e-5)
                np.testing.assert_allclose(b, own[i] * values[j] + (1 - own[i]) * values[i],
                                           rtol=1e-5)


@pytest.mark.backend_independent
def test_the_train_pipeline_mixes_as_timm_when_asked(digits_dir):
    aug = D.Augment(crop_area=(0.5, 1.0), timm_mix={"mixup_alpha": 0.8, "cutmix_alpha": 1.0,
                                                    "label_smoothing": 0.1})
    x, y = next(iter(D.load("sklearn_digits", 64, 32, digits_dir, aug, seed=3).train))
    y = np.asarray(y)
    np.testing.assert_allclose(y.sum(1), 1.0, rtol=1e-5)
    assert y.min() >= 0.1 / 10 - 1e-6 and y.max(1).min() < 1.0  # smoothed, mixed
    with pytest.raises(ValueError, match="mixup .* and timm_mix .* both on"):
        D.load("sklearn_digits", 64, 32, digits_dir, D.Augment(mixup=0.2, timm_mix={}),
               seed=3)


@pytest.mark.backend_independent
def test_unprepared_imagenet_error_names_the_archives(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        D.imagenet(batch_size=8, data_dir=tmp_path)
    msg = str(e.value)
    assert "ILSVRC2012_img_train.tar" in msg and "ILSVRC2012_img_val.tar" in msg
    assert str(tmp_path / "downloads" / "manual") in msg
    assert "keras-reluvit prepare imagenet2012" in msg


@pytest.mark.backend_independent
def test_cli_prepares_imagenet_from_the_default_and_an_explicit_manual_dir(
        tmp_path, imagenet_manual, capsys):
    from keras_reluvit import cli

    # The archives in tfds' default DATA_DIR/downloads/manual: the first
    # `bench` (as `train` and `eval`) builds the data set, like tfds.load.
    default = tmp_path / "a" / "downloads" / "manual"
    default.mkdir(parents=True)
    for f in ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"):
        (default / f).symlink_to(imagenet_manual / f)
    assert cli.main(["bench", "--dataset", "imagenet2012", "--data-dir", str(tmp_path / "a"),
                     "--batch-size", "4", "--image-size", "32", "--steps", "1"]) == 0
    assert "preparing imagenet2012" in capsys.readouterr().err
    assert D.builder("imagenet2012", tmp_path / "a").info.splits["train"].num_examples == 18
    # `prepare` with the archives elsewhere.
    assert cli.main(["prepare", "imagenet2012", "--data-dir", str(tmp_path / "b"),
                     "--manual-dir", str(imagenet_manual)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["splits"] == {"train": 18, "validation": 6}
    assert cli.main(["prepare", "imagenet2012", "--data-dir", str(tmp_path / "c"),
                     "--manual-dir", str(tmp_path / "empty")]) != 0


def test_weight_decay_reaches_kernels_only():
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=5, pool="map", attention="relu_learned")
    recipe = dataclasses.replace(recipes.get("digits"), warmup_steps=0)
    recipes.compile(model, recipe, steps_per_epoch=10, epochs=1)
    rng = np.random.default_rng(0)
    for v in model.trainable_variables:
        v.assign(rng.normal(0, 1, v.shape).astype("float32"))
    before = {v.path: np.array(keras.ops.convert_to_numpy(v)) for v in model.trainable_variables}
    opt = model.optimizer
    opt.apply_gradients([(keras.ops.zeros(v.shape), v) for v in model.trainable_variables])
    lr, wd = recipe["lr"], recipe["wd"] / recipe["lr"]
    for v in model.trainable_variables:
        now, old = np.asarray(keras.ops.convert_to_numpy(v)), before[v.path]
        if v.path.endswith("kernel"):
            np.testing.assert_allclose(now, old * (1 - lr * wd), rtol=1e-6)
        else:
            np.testing.assert_array_equal(now, old, err_msg=v.path)
    decayed = [v.path for v in model.trainable_variables if v.path.endswith("kernel")]
    assert len(decayed) >= 8


def test_recipes_compile_uses_xla_on_tensorflow_and_trains_the_same():
    """On TensorFlow the recipes compile with XLA (Keras' "auto" would not on
    this GPU-less machine); a user's `jit_compile` / `run_eagerly` wins. The
    XLA step equals the eager and the plain-graph step (same updated weights;
    trained on TensorFlow, whose default this is -- elsewhere the flags)."""
    x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    y = keras.utils.to_categorical(np.arange(4) % 5, 5)
    models = {}
    for name, kwargs in (("default", {}), ("eager", {"run_eagerly": True}),
                         ("no_xla", {"jit_compile": False})):
        keras.utils.set_random_seed(0)
        model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
                       num_classes=5, attention="relu")
        recipes.compile(model, "digits", steps_per_epoch=10, **kwargs)
        if keras.backend.backend() == "tensorflow":
            model.train_on_batch(x, y)
        models[name] = model
    # jax: Keras' "auto" is XLA already; torch: never.
    want = {"tensorflow": True, "jax": True, "torch": False}[keras.backend.backend()]
    assert models["default"].jit_compile is want
    assert models["eager"].jit_compile is False and models["no_xla"].jit_compile is False
    if keras.backend.backend() != "tensorflow":
        return
    ref = [keras.ops.convert_to_numpy(v) for v in models["eager"].trainable_variables]
    for name in ("default", "no_xla"):
        for a, v in zip(ref, models[name].trainable_variables):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(v), a, rtol=2e-4, atol=2e-5,
                                       err_msg=f"{name}: {v.path}")


def test_sigmoid_xent_matches_formula_and_sets_head_bias():
    logits = np.array([[2.0, -1.0, 0.5], [-3.0, 0.0, 4.0]], "float32")
    labels = np.array([[1, 0, 0], [0, 0.3, 0.7]], "float32")
    got = float(keras.ops.convert_to_numpy(recipes.SigmoidCrossEntropy()(labels, logits)))
    p = 1 / (1 + np.exp(-logits.astype("float64")))
    ref = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).sum(1).mean()
    assert got == pytest.approx(ref, rel=1e-5)
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32, num_classes=4)
    recipes.compile(model, "augreg_i1k", steps_per_epoch=10, batch_size=64)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.get_layer("head").bias), -6.9, rtol=1e-6)


def test_recipes_are_data_and_scale_with_batch():
    r = recipes.get("s16_i1k_90ep")
    assert (r["epochs"], r["batch_size"], r["augment"]) == (90, 1024, {"randaug": (2, 10), "mixup": 0.2})
    assert r["model"] == {"variant": "S/16", "pool": "gap", "posemb": "sincos2d"}
    assert recipes.get("augreg_i1k", "S/32")["augment"] == {"randaug": (2, 15), "mixup": 0.2}
    assert recipes.get("augreg_i21k", "L/16")["augment"] == {"randaug": (2, 15), "mixup": 0.5}
    assert recipes.get("augreg_i21k")["head_bias_init"] == -10.0
    lr, warmup, total = recipes.scaled(r, 256, steps_per_epoch=5000, epochs=90)
    assert lr == pytest.approx(2.5e-4) and warmup == 40_000 and total == 450_000
    assert "s16_i1k_90ep" in recipes.describe() and "randaug" in recipes.describe("augreg_i1k")
    with pytest.raises(ValueError, match="Unknown recipe"):
        recipes.get("nope")


# The CLI's train, eval and predict on PyTorch: test_finetune.py (a folder of
# photographs; on JAX the literal reader runs them; on TensorFlow in full runs);
# the main job's run
# with its SavedModel: here, in one suite.
@pytest.mark.backend_independent
def test_cli_train_eval_export_and_saved_model(tmp_path, digits_dir, capsys):
    import json

    import tensorflow as tf

    from keras_reluvit import cli

    out = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--batch-size", "128", "--data-dir", str(digits_dir),
                     "--output", str(out), "--quiet", "--reprob", "0.25"]) == 0
    for name in ("config.json", "model.keras", "metrics.json", "curves.png", "saved_model"):
        assert (out / name).exists(), name
    # The run's pipelines, its flags included (--reprob), said and recorded.
    pipelines = json.loads((out / "config.json").read_text())["pipelines"]
    assert pipelines == kr.data.ops.describe(kr.data.Augment(**kr.recipes.get("digits").augment,
                                                             erase=0.25), 32)
    assert "random_erasing(0.25)" in pipelines["train"]
    said = capsys.readouterr().err
    assert f"keras_reluvit: train pipeline: {pipelines['train']}\n" in said
    assert f"keras_reluvit: eval pipeline: {pipelines['eval']}\n" in said
    assert cli.main(["eval", str(out / "model.keras"), "--data-dir", str(digits_dir)]) == 0
    assert cli.main(["train", "--recipe", "nope", "--output", str(tmp_path / "x")]) == 2
    # The SavedModel reproduces the Keras model (plain TF, no keras_reluvit).
    model = keras.saving.load_model(out / "model.keras")
    x = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    served = tf.saved_model.load(str(out / "saved_model" / "1"))  # TF Serving's version folder
    got = served.signatures["serve_preprocessed"](images=tf.constant(x))["logits"].numpy()
    top = served.signatures["serving_default"](images=tf.zeros((1, 40, 40, 3), tf.uint8))
    assert top["top_k_labels"].numpy()[0, 0].decode() in [str(i) for i in range(10)]
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-4)


@END_TO_END_ON_TORCH
def test_attention_stats_callback_logs_per_layer_statistics(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 8)]
    stats = {}
    for attention in ("relu", "softmax"):
        model = kr.ViT("Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
                       num_classes=4, attention=attention)
        model.compile(optimizer="adam", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        cb = kr.callbacks.AttentionStats(x[:4])
        hist = model.fit(x, y, epochs=2, verbose=0,
                         callbacks=[cb, keras.callbacks.TensorBoard(str(tmp_path / attention))])
        stats[attention] = hist.history
        assert any((tmp_path / attention).rglob("*tfevents*"))
    soft, relu = stats["softmax"], stats["relu"]
    for i in ("00", "01"):
        np.testing.assert_allclose(soft[f"attn_{i}_row_sum"], 1.0, rtol=1e-5)
        assert soft[f"attn_{i}_zero_frac"][-1] == 0.0
        assert 0.0 < relu[f"attn_{i}_zero_frac"][-1] < 1.0  # ReLU zeroes some weights
        assert relu[f"attn_{i}_out_norm"][-1] > 0
        assert len(relu[f"attn_{i}_row_sum"]) == 2


@pytest.mark.backend_independent
def test_cli_bench_reports_pipeline_throughput(digits_dir, capsys):
    import re

    from keras_reluvit import cli

    assert cli.main(["bench", "--data-dir", str(digits_dir), "--image-size", "32",
                     "--batch-size", "64", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert float(re.search(r"([\d,.]+) images/s", out).group(1).replace(",", "")) > 0


def _shard_contents(monkeypatch, name, data_dir, count, **kwargs):
    """What each of `count` processes reads through `D.load` (process i,
    then the one-process reproduction of the cluster): the examples of the
    shard each `read` call received, identified by their bytes."""
    import hashlib

    from keras_reluvit.data import sources

    cls = sources._FolderSource if os.path.isdir(name) else sources._TfdsSource
    read, seen = cls.read, []

    def spy(self, shard, train, seed):
        ds = read(self, shard, train, seed)
        if train:
            rows = [hashlib.sha1(
                (ex["image"] if "image" in ex else ex["file"]).numpy()).hexdigest()
                    + str(int(ex["label"])) for ex in read(self, shard, False, seed)]
            seen.append(rows)
        return ds

    monkeypatch.setattr(cls, "read", spy)
    per_process = []
    for i in range(count):
        del seen[:]
        D.load(name, 4 * count, 16, data_dir, process_index=i, process_count=count, **kwargs)
        (rows,) = seen
        per_process.append(rows)
    del seen[:]
    D.load(name, 4 * count, 16, data_dir, process_index=None, process_count=count, **kwargs)
    assert seen == per_process  # the one-process reproduction reads the same shards
    return per_process


def _assert_disjoint_and_covering(per_process, whole):
    count = len(per_process)
    sizes = {len(rows) for rows in per_process}
    assert sizes == {len(whole) // count}, (sizes, len(whole))  # equal; the remainder dropped
    union = [r for rows in per_process for r in rows]
    assert len(set(union)) == len(union), "two processes read the same example"
    assert set(union) <= set(whole) and len(union) == len(whole) // count * count


@pytest.mark.backend_independent
@pytest.mark.parametrize("count", [2, 3])
def test_tfds_shards_are_disjoint_and_cover_the_split(monkeypatch, digits_dir, count):
    """Each process of a cluster reads its own part of the training split: no
    example twice, none but the remainder left out (tfds even_splits); the
    one-process reproduction of the cluster reads the same parts."""
    import hashlib

    from keras_reluvit.data import sources

    source = sources._TfdsSource("sklearn_digits", digits_dir, None)
    whole = [hashlib.sha1(ex["image"].numpy()).hexdigest() + str(int(ex["label"]))
             for ex in source.read("train", False, 0)]
    assert len(set(whole)) == len(whole)  # the digits are distinct examples
    _assert_disjoint_and_covering(
        _shard_contents(monkeypatch, "sklearn_digits", digits_dir, count), whole)


@pytest.mark.backend_independent
@pytest.mark.parametrize("count", [2, 3])
def test_folder_shards_are_disjoint_and_cover_the_split(monkeypatch, tmp_path, count):
    import hashlib

    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(11):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype="uint8")).save(
                tmp_path / "imgs" / c / f"{i}.png")
    root = str(tmp_path / "imgs")
    folder = kr.image_folder.ImageFolder(root, val_fraction=0.2, seed=0)
    whole = [hashlib.sha1(ex["file"].numpy()).hexdigest() + str(int(ex["label"]))
             for ex in folder.dataset("train")]
    _assert_disjoint_and_covering(
        _shard_contents(monkeypatch, root, None, count, val_fraction=0.2), whole)


WHOLE_IMAGE = dict(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), flip=False)  # pixels kept


def _training_reads(name, data_dir, count=2, batch_size=16, epochs=2):
    """Per process of `count`: the (label, id) pairs its *training* pipeline
    yields over `epochs` epochs (each a new iterator, as `fit`)."""
    per_process = []
    for index in range(count):
        data = D.load(name, batch_size, 4, data_dir, augment=D.Augment(**WHOLE_IMAGE), seed=3,
                      val_split=False, process_index=index, process_count=count)
        epochs_read = []
        for _ in range(epochs):
            pairs = []
            for x, y in data.train:
                px = np.rint((np.asarray(x)[:, 0, 0, :2] + 1.0) * 127.5).astype(int)
                pairs += list(zip(np.argmax(np.asarray(y), 1).tolist(),
                                  (px[:, 0] * 256 + px[:, 1]).tolist()))
            assert len(pairs) == data.steps_per_epoch * batch_size // count
            epochs_read.append(pairs)
        per_process.append(epochs_read)
    return per_process


def _assert_training_shards_partition(per_process, n, per_class):
    shards = []
    for epochs_read in per_process:
        first = sorted(epochs_read[0])
        assert len(set(first)) == len(first)  # an epoch: each of its images once
        assert all(sorted(e) == first for e in epochs_read[1:])  # the same shard each epoch
        assert all(label == i // per_class for label, i in first)  # the pixels are the images
        shards.append({i for _, i in first})
    assert not shards[0] & shards[1], "two processes train on the same images"
    assert shards[0] | shards[1] == set(range(n))  # together: the whole split


@pytest.mark.backend_independent
def test_folder_training_pipelines_of_two_processes_read_disjoint_halves(tmp_path):
    """The *training* reads (not the evaluation read of each shard that
    `_shard_contents` spies on): process 0 and 1 of 2 train on disjoint
    images whose union is the whole split, identified by their pixels."""
    from PIL import Image

    classes, per = 3, 16
    for c in range(classes):
        (tmp_path / "train" / f"c{c}").mkdir(parents=True)
        for j in range(per):
            Image.fromarray(id_image(c * per + j)).save(tmp_path / "train" / f"c{c}" / f"{j}.png")
    _assert_training_shards_partition(_training_reads(str(tmp_path), None), classes * per, per)


@pytest.mark.backend_independent
def test_tfds_training_pipelines_of_two_processes_read_disjoint_halves(tmp_path):
    """The same for a tfds set (4 files, one class each) read by the real
    builder: the training read of each process is its `even_splits` half."""
    classes, per = 4, 16
    write_class_files_tfds(tmp_path, "idshards", classes, per)
    _assert_training_shards_partition(_training_reads("idshards", str(tmp_path)),
                                      classes * per, per)
