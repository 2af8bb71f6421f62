"""The tf.data pipeline from examples to `model.fit` batches: decode late,
crop first, augment, normalise by the model's recipe, batch, MixUp."""

from keras_reluvit._logging import say
from keras_reluvit.data import lazy
from keras_reluvit.data.augment import Augment
from keras_reluvit.data.augment import check_repeats
from keras_reluvit.data.augment import mixup
from keras_reluvit.data.ops import Example
from keras_reluvit.data.ops import eval_ops
from keras_reluvit.data.ops import train_ops
from keras_reluvit.data.timm_augment import parse as parse_timm_augment
from keras_reluvit.data.timm_augment import timm_mix
from keras_reluvit.preprocessing import check_preprocessing


def pipeline(
    ds,
    num_classes,
    image_size,
    batch_size,
    train,
    augment=None,
    seed=0,
    shuffle_buffer=10_000,
    drop_remainder=None,
    cache=False,
    preprocessing=None,
):
    """Maps a tfds `{"image", "label"}` dataset (or an image folder's
    `{"file", "label"}`) to `(images, one_hot)` batches.

    Decode late, crop first (big_vision's order): the shuffle buffer holds
    encoded images (tfds read with `SkipDecoding`, or file names), each is
    decoded after the shuffle, and for training only the crop window of a
    JPEG is decoded; the crop is resized from uint8 and normalised last.
    Decoded `image`s (uint8 or 0-255 floats) are taken too.

    `preprocessing`: the model's recipe (`model.preprocessing`; default
    ours): the evaluation geometry, and the normalisation of every image.

    Train: one shuffled pass per epoch (full batches, so `len(ds)` is the
    number of steps), seeded by `seed` yet different in every epoch,
    augmented; with `augment.aug_repeats` r > 1 (DeiT's repeated augmentation) an
    epoch is as long and holds a new random 1/r of the examples, each r times
    in a row (`repeated`). Eval: one pass, deterministic, the last partial batch kept.
    """
    tf = lazy.tensorflow()
    import keras

    recipe = check_preprocessing(preprocessing)
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    aug = augment or Augment()
    if aug.auto_augment is not None:
        parse_timm_augment(aug.auto_augment)  # a bad name fails here, not in tf.data
    mixed = train and aug.mixed_sources()
    if mixed:
        say(mixed)
    AUTO = tf.data.AUTOTUNE
    randaug = None
    if train and aug.randaug and aug.randaug[1] > 0:
        num_ops, magnitude = aug.randaug
        randaug = keras.layers.RandAugment(
            value_range=(0, 255),
            num_ops=int(num_ops),
            factor=min(float(magnitude) / 10.0, 1.0),
            interpolation="nearest",  # big_vision's (TF models') shear / translate / rotate
            seed=seed,
        )
    ops = train_ops(aug, size, recipe, randaug) if train else eval_ops(size, recipe)

    def decode(example, rnd):
        # Encoded bytes (tfds with its decoding skipped, an image folder's
        # files: read after the shuffle) are decoded by the first operation,
        # the crop window alone for a training JPEG; decoded pixels
        # (for_model) are cropped.
        if "file" in example:  # decoded as predict and the SavedModel decode
            data, dct = tf.io.read_file(example["file"]), "INTEGER_ACCURATE"
        else:  # as tfds decodes
            data, dct = example["image"], ""
        image = Example(data, dct, data.dtype == tf.string)
        for op in ops:
            image = op.fn(image, rnd)
        image = tf.ensure_shape(image, (*size, 3))
        label = tf.one_hot(example["label"], num_classes)
        return image, label

    def randoms(offset):
        # Seeded, and different in every epoch (each new iterator).
        return tf.data.Dataset.random(seed=seed + offset, rerandomize_each_iteration=True)

    if cache:
        ds = ds.cache()
    if train:
        ds = train_examples(ds, aug.aug_repeats, seed, shuffle_buffer)
        ds = tf.data.Dataset.zip((ds, randoms(0)))  # every copy its own draws
    else:
        ds = ds.map(_plain(lambda ex: (ex, tf.constant(0, tf.int64))))
    ds = ds.map(_plain(decode), num_parallel_calls=AUTO, deterministic=True)
    # Train batches are full (one epoch = one pass, len(train) = steps).
    drop = train if drop_remainder is None else drop_remainder
    ds = ds.batch(batch_size, drop_remainder=drop, num_parallel_calls=AUTO)
    if train and aug.timm_mix is not None:
        options = dict(aug.timm_mix)
        ds = tf.data.Dataset.zip((ds, randoms(1)))
        ds = ds.map(_plain(lambda b, r: timm_mix(*b, tf.stack([r, 1]), **options)),
                    num_parallel_calls=AUTO)
    elif train and aug.mixup > 0:
        p = float(aug.mixup)
        ds = tf.data.Dataset.zip((ds, randoms(1)))
        ds = ds.map(_plain(lambda b, r: mixup(*b, p, tf.stack([r, 1]))), num_parallel_calls=AUTO)
    return ds.prefetch(AUTO)


def _plain(fn):
    """`fn` for tf.data as written, not through AutoGraph: our functions and
    Keras' layers use no Python control flow on tensors, and AutoGraph's
    source-to-source conversion of the ~120 functions they call cost each
    process 3-5 s before its first batch (DeiT's chain: 9.8 -> 4.5 s)."""
    return lazy.tensorflow().autograph.experimental.do_not_convert(fn)


def train_examples(ds, repeats=1, seed=0, shuffle_buffer=10_000):
    """One epoch's training examples of `ds` (one pass; a new epoch at each
    new iterator), before any decoding: buffer-shuffled (seeded, reshuffled
    every epoch) and, with `repeats` r > 1, DeiT's repeated augmentation
    (`repeated`). `pipeline` decodes and augments what this yields."""
    check_repeats(repeats)
    if repeats == 1:
        return ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    n = _known_size(ds)
    # Drawn from the whole split, not the buffer; then buffer-shuffled.
    ds = epoch_subset(ds, repeats, seed, shuffle_buffer)
    return repeated(ds, repeats, n)


def _known_size(ds):
    n = int(ds.cardinality())
    if n < 0:
        raise ValueError(
            "Repeated augmentation (Augment(aug_repeats=)) keeps the epoch's length and needs it: "
            "this dataset's size is unknown (after filter, unbatch, ...). Declare it on the "
            "examples: ds.apply(tf.data.experimental.assert_cardinality(NUMBER_OF_IMAGES)) "
            "(after ds.unbatch() if the images come in batches).")
    return n


def epoch_subset(ds, repeats, seed=0, shuffle_buffer=None):
    """The examples of `ds` (n, which must be known) at the positions of a
    uniformly random `ceil(n / repeats)`-subset, a new one at each new
    iterator (epoch), seeded: DeiT's `RASampler` draws a permutation of all
    indices each epoch and shows its first n / r. The subset is drawn over
    positions in the whole pass, so it is a uniform draw of the images
    whatever the source's order, size, shards or shuffle buffer; with
    `shuffle_buffer`, the subset is then buffer-shuffled.

    One epoch's key is the only state: the shuffle is seeded by it. (A
    shuffle of its own, reshuffled per iterator, beneath or above the key's
    draw would not advance when `kr.backup.fit` fast-forwards the epochs
    before a resume by creating their iterators unread: the resumed run
    would see other images than the uninterrupted one.)"""
    tf = lazy.tensorflow()
    n = _known_size(ds)
    k = -(-n // repeats)
    keys = tf.data.Dataset.random(seed=seed + 7, rerandomize_each_iteration=True).take(1)

    def one_epoch(key):
        key = tf.stack([key, tf.constant(repeats, tf.int64)])
        dtype = tf.int32 if n < 2**31 else tf.int64
        rank = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=dtype), key)
        chosen = rank < k  # position i's place in the epoch's permutation
        picked = ds.enumerate().filter(lambda i, *ex: tf.gather(chosen, i))
        picked = picked.map(lambda i, *ex: ex[0] if len(ex) == 1 else ex)
        if shuffle_buffer:
            picked = picked.shuffle(shuffle_buffer, seed=key[0] % (2**31 - 1))
        return picked

    return keys.flat_map(_plain(one_epoch)).apply(tf.data.experimental.assert_cardinality(k))


def repeated(ds, repeats, n=None):
    """DeiT's repeated augmentation (`RASampler`) on one epoch's examples
    `ds` (`epoch_subset`: ceil(n / repeats) of the n): each `repeats` times
    in a row, `n` in all (default: all copies): an epoch of the same length, a new third of the
    images each epoch for DeiT's 3. The copies are consecutive, so they
    meet in one batch (as on one GPU of DeiT; on 8 its sampler deals them
    to 3 GPUs, in the same global batch), and they are augmented apart by
    the draws that follow.

    In a cluster each process repeats the images of its own shard: the
    global batch holds the same mix of copies as DeiT's."""
    tf = lazy.tensorflow()
    check_repeats(repeats)
    if repeats == 1:
        return ds
    n = _known_size(ds) * repeats if n is None else n
    ds = ds.flat_map(_plain(lambda *ex: tf.data.Dataset.from_tensors(ex[0] if len(ex) == 1
                                                                       else ex).repeat(repeats)))
    return ds.take(n).apply(tf.data.experimental.assert_cardinality(n))


def for_model(ds, model, train=False, batch_size=None, augment=None, seed=0,
              shuffle_buffer=1_000):
    """Any `tf.data.Dataset` of images and labels, prepared for `model`:
    `(inputs, one_hot)` batches for `model.fit` / `evaluate` on every
    backend. Eval (`train=False`): the model's own recipe
    (`model.preprocessing`: resize, crop, mean/std), deterministic. Train:
    shuffled, random crop + flip (and `augment`: a `data.Augment`, e.g.
    `Augment(randaug=(2, 10), mixup=0.2)`), normalised as the model expects.
    Batches of `batch_size` (default 32; the input's batching is undone).

    Takes what `keras.utils.image_dataset_from_directory` gives (batched
    `(images, labels)`, integer or one-hot labels, 0-255 float pixels; pass
    a large `image_size` there, or `crop_to_aspect_ratio=True`, so that the
    model's own resize does the work) or tfds' `{"image", "label"}`
    examples, batched or not; pixels in 0-255, RGB, grayscale or RGBA.

    Example:

    ```python
    ds = keras.utils.image_dataset_from_directory("my_images/train", image_size=(256, 256))
    model.fit(kr.data.for_model(ds, model, train=True), epochs=5)
    ```
    """
    tf = lazy.tensorflow()
    files = getattr(ds, "file_paths", None)  # image_dataset_from_directory's: its size
    spec = ds.element_spec
    if isinstance(spec, dict):
        if not {"image", "label"} <= set(spec):
            raise ValueError(f"for_model takes (image, label) pairs or dicts with 'image' and "
                             f"'label'; got the keys {sorted(spec)}.")
        image_spec, label_spec = spec["image"], spec["label"]
        ds = ds.map(lambda ex: (ex["image"], ex["label"]))
    elif isinstance(spec, tuple) and len(spec) >= 2:
        image_spec, label_spec = spec[0], spec[1]
        ds = ds.map(lambda *ex: (ex[0], ex[1]))
    else:
        raise ValueError("for_model takes a dataset of (image, label) pairs (e.g. "
                         "keras.utils.image_dataset_from_directory's) or tfds examples.")
    rank = image_spec.shape.rank
    if rank not in (3, 4):
        raise ValueError(f"Images must be [H, W, C] or batches [N, H, W, C], got shape "
                         f"{image_spec.shape}.")
    if rank == 4:
        ds = ds.unbatch()
        label_spec = tf.TensorSpec(label_spec.shape[1:], label_spec.dtype)
        if files is not None:  # the size unbatch loses (repeated augmentation needs it)
            ds = ds.apply(tf.data.experimental.assert_cardinality(len(files)))
        elif train and augment is not None and augment.aug_repeats != 1:
            raise ValueError(
                "Repeated augmentation (Augment(aug_repeats=)) keeps the epoch's length and needs "
                "the number of images: these batches' size is unknown once unbatched. Declare "
                "it: ds.unbatch().apply(tf.data.experimental.assert_cardinality("
                "NUMBER_OF_IMAGES)), and pass that.")
    num_classes = model.output_shape[-1]
    one_hot = label_spec.shape.rank == 1

    def example(image, label):
        label = tf.argmax(label, output_type=tf.int64) if one_hot else tf.cast(label, tf.int64)
        return {"image": image, "label": label}

    ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
    return pipeline(ds, num_classes, model.image_size, batch_size or 32, train, augment, seed,
                    shuffle_buffer=shuffle_buffer, preprocessing=model.preprocessing)


def skip_passes(dataset, passes):
    """Moves a training set's stream `passes` passes ahead without reading
    them: each iterator created from a `kr.data` training set is a new pass
    with its own shuffle order and augmentation draws (the epoch's key),
    and tf.data starts no work before the first read. A resumed run calls
    this to read the pass the uninterrupted run had (`kr.backup.fit`,
    `StepBackup(dataset=)`, `kr.callbacks.ResumeDataStream`)."""
    for _ in range(int(passes)):
        iter(dataset)


def split_batches(dataset, parts):
    """Each batch of `dataset` as `parts` consecutive micro-batches of equal
    size (the batch size must be a multiple of `parts`): gradient
    accumulation over them is the update of the whole batch, on the same
    images, augmentation draws and MixUp pairs."""
    tf = lazy.tensorflow()
    parts = int(parts)
    if parts == 1:
        return dataset

    def split(*batch):
        def one(t):
            n = tf.shape(t)[0]
            tf.debugging.assert_equal(n % parts, 0, message="batch not divisible by accum_steps")
            return tf.reshape(t, tf.concat([[parts, n // parts], tf.shape(t)[1:]], 0))
        return tf.data.Dataset.from_tensor_slices(tuple(one(t) for t in batch))

    return dataset.flat_map(split)
