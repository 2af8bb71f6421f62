"""DeiT's repeated augmentation (`Augment(aug_repeats=3)`) sees every image: each
epoch a uniformly random third of the *whole* split, whatever the source's
order, size, shards or shuffle buffer. Checked by statistics on the three
kinds of source, each in a fixed order larger than its shuffle buffer or
split into class-ordered shards: each class's share of an epoch's images
(chi-square) and the share of the images seen over E epochs
(1 - (1 - 1/r)^E)."""

import numpy as np
import pytest
from helpers.id_data import id_image
from helpers.id_data import ids_of
from helpers.id_data import write_class_files_tfds
from scipy import stats

from keras_reluvit import data as D

R = 3
WHOLE = dict(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), flip=False)  # pixels kept


def _check(epochs, classes, n, per_class):
    """`epochs`: per epoch the (class, image id) of each example shown."""
    k = -(-n // R)
    seen = set()
    for e, (labels, ids) in enumerate(epochs):
        assert len(ids) == n  # as long as one pass
        unique, counts = np.unique(ids, return_counts=True)
        assert len(unique) == k and (counts == R).sum() >= k - 1  # the last copies cut short
        shown = np.bincount(np.asarray(labels)[np.unique(ids, return_index=True)[1]],
                            minlength=classes)
        # Each class's share of the epoch's images: as a uniform draw of k of the n.
        p = stats.chisquare(shown, np.full(classes, k * per_class / n)).pvalue
        assert p > 1e-3, (e, shown)
        seen |= set(unique.tolist())
    expected = 1 - (1 - 1 / R) ** len(epochs)
    # Independent epochs: the coverage of E epochs (sd ~ sqrt(p (1 - p) / n)).
    assert abs(len(seen) / n - expected) < 5 * np.sqrt(expected * (1 - expected) / n) + 1e-3, (
        len(seen) / n, expected)


@pytest.mark.backend_independent
def test_the_epoch_subset_is_uniform_over_a_class_ordered_split_larger_than_the_buffer():
    """30 classes x 600 examples in class order, a 10,000 buffer (kr.data.load's):
    the old first-third-of-the-buffer kept classes 27-29 out of every epoch."""
    import tensorflow as tf

    from keras_reluvit.data.pipeline import train_examples

    classes, per = 30, 600
    n = classes * per
    ds = tf.data.Dataset.from_tensor_slices({"label": np.repeat(np.arange(classes), per),
                                             "id": np.arange(n)})
    out = train_examples(ds, R, seed=3, shuffle_buffer=10_000)
    assert int(out.cardinality()) == n
    epochs = []
    for _ in range(4):
        batch = next(iter(out.batch(n)))
        epochs.append((batch["label"].numpy(), batch["id"].numpy()))
    _check(epochs, classes, n, per)
    for labels, ids in epochs:  # shuffled within the epoch too (the subset comes in order)
        first = np.unique(ids, return_index=True)[1]
        order = np.sort(first)
        assert abs(stats.spearmanr(np.arange(len(order)), labels[order])[0]) < 0.1
    again = next(iter(train_examples(ds, R, seed=3, shuffle_buffer=10_000).batch(n)))
    np.testing.assert_array_equal(again["id"].numpy(), epochs[0][1])  # seeded


def _png_folder(root, classes, per, size=4):
    """Images of one value per image (the image's id, in two channels)."""
    from PIL import Image

    for c in range(classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True)
        for j in range(per):
            i = c * per + j
            Image.fromarray(id_image(i, size)).save(d / f"{j}.png")


def _epochs(train, count):
    out = []
    for _ in range(count):  # a new iterator each epoch, as Keras' fit on a finite dataset
        labels, ids = [], []
        for x, y in train:
            labels.append(np.argmax(np.asarray(y), 1))
            ids.append(ids_of(x))
        out.append((np.concatenate(labels), np.concatenate(ids)))
    return out


@pytest.mark.backend_independent
def test_a_class_ordered_folder_larger_than_the_buffer_is_drawn_whole(tmp_path):
    """A folder of 11 classes x 1,000 images in class order read through
    `kr.data.load` with a buffer of 1,000: each epoch's third is a uniform draw."""
    classes, per = 11, 1000
    _png_folder(tmp_path / "train", classes, per)
    data = D.load(str(tmp_path), 500, 4, augment=D.Augment(**WHOLE, aug_repeats=R), seed=1,
                  val_split=False, shuffle_buffer=1000)
    n = classes * per
    assert data.steps_per_epoch == n // 500
    _check(_epochs(data.train, 3), classes, n, per)


@pytest.mark.backend_independent
def test_for_model_on_a_fixed_order_set_draws_from_all_of_it():
    """6,000 examples in class order through `for_model` (a 1,000 buffer):
    the old repeats drew every epoch from the first ~2,990."""
    import tensorflow as tf

    import keras_reluvit as kr

    classes, per = 20, 300
    n = classes * per
    ids = np.arange(n)
    images = np.zeros((n, 4, 4, 3), "uint8")
    images[..., 0], images[..., 1] = (ids // 256)[:, None, None], (ids % 256)[:, None, None]
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": ids // per})
    model = kr.ViT("Ti/16", num_classes=classes, image_size=4, patch_size=4, depth=1,
                   width=8, num_heads=1, mlp_dim=8)
    train = D.for_model(ds, model, train=True, batch_size=500,
                        augment=D.Augment(**WHOLE, aug_repeats=R))
    _check(_epochs(train, 3), classes, n, per)


@pytest.mark.backend_independent
def test_a_multi_shard_tfds_set_is_drawn_whole_in_each_process(tmp_path):
    """A tfds data set of 8 files, one class each (ImageNet's many shards in
    the worst order), read by the real tfds builder through `kr.data.load`:
    each epoch a uniform third of the split with a buffer of a twelfth of it
    (ImageNet's is 1 %); in a 2-process cluster each
    process a uniform third of its own shard, the shards disjoint."""
    classes, per = 8, 150
    root = tmp_path / "tfds"
    write_class_files_tfds(root, "shards", classes, per)
    n = classes * per
    data = D.load("shards", 100, 4, data_dir=str(root), augment=D.Augment(**WHOLE, aug_repeats=R),
                  seed=2, train_split="train", val_split=False, shuffle_buffer=100)
    assert data.info.splits["train"].num_shards == classes
    _check(_epochs(data.train, 3), classes, n, per)
    shown, streams = [], []
    for index in (0, 1):
        part = D.load("shards", 100, 4, data_dir=str(root),
                      augment=D.Augment(**WHOLE, aug_repeats=R), seed=2, train_split="train",
                      val_split=False, process_index=index, process_count=2, shuffle_buffer=100)
        # even_splits: process 0 the first 4 classes' files, process 1 the last 4.
        epochs = _epochs(part.train, 2)
        for labels, _ in epochs:
            assert set(labels) == set(range(index * 4, index * 4 + 4))
        _check([(lab - index * 4, ids) for lab, ids in epochs], 4, n // 2, per)
        shown.append(set(np.concatenate([ids for _, ids in epochs])))
        streams.append(epochs[0][1])
    assert not shown[0] & shown[1]
    # Each process its own draws: not the same positions of its shard (ids n / 2 apart).
    assert len(set(streams[1] - streams[0])) > 1


@pytest.mark.backend_independent
def test_epochs_fast_forwarded_unread_are_the_epochs_read():
    """`kr.backup.fit` resumes a run by creating the iterators of the epochs
    before it without reading them: epoch 3 must then be the epoch 3 read in
    order (a second per-iterator shuffle, beneath or above the subset's key,
    does not advance unread: the resumed run saw other images)."""
    import tensorflow as tf

    from keras_reluvit.data.pipeline import train_examples

    def epochs(fast_forward):
        tf.random.set_seed(1)
        ds = train_examples(tf.data.Dataset.range(300), R, seed=4, shuffle_buffer=50)
        for _ in range(fast_forward):
            iter(ds)
        return [list(ds.as_numpy_iterator()) for _ in range(3 - fast_forward)]

    read = epochs(0)
    assert read[0] != read[1] != read[2]
    assert epochs(2)[0] == read[2]
    tf.random.set_seed(1)
    ds = train_examples(tf.data.Dataset.range(300), R, seed=4, shuffle_buffer=50)
    iter(ds)
    assert list(ds.skip(10).as_numpy_iterator()) == read[1][10:]  # a resumed epoch
