"""Input pipelines: any tfds image-classification dataset into `model.fit`.

tf.data end to end (parallel decode and augmentation with AUTOTUNE, no
Python per image), big_vision's preprocessing:

- train: the encoded examples shuffled (tfds read with `SkipDecoding`, or
  file names) | inception crop (area 5-100 %, aspect 3/4-4/3), only the
  window decoded for a JPEG, resized (bilinear) from uint8 to the model
  resolution | random left-right flip | RandAugment (Keras core layer,
  per image, see `switch_randaugment`) |
  value range [-1, 1] | one-hot labels | MixUp (big_vision semantics).
- eval: the model's own recipe (`preprocessing=`, see
  `keras_reluvit.preprocessing`; by default ours and big_vision's: the
  shorter side to `round(resolution * 256 / 224)`, area | central crop |
  [-1, 1]) | one-hot labels. Deterministic.

Train images are normalised with the recipe's mean/std too, so a checkpoint
fine-tuned here sees the value range it was trained on.

The batches feed `model.fit` on every Keras backend (Keras converts tf.data
batches for JAX and PyTorch).

RandAugment mapping: big_vision's `randaug(num_layers, magnitude)` is Keras'
`RandAugment(num_ops=num_layers, factor=magnitude / 10,
interpolation="nearest")` (nearest, as big_vision's shear, translate and
rotate sample; ~40 % cheaper than bilinear) — Keras' factor is
the magnitude as a fraction of the TF-models maximum level 10 that
big_vision's implementation uses; magnitudes above 10 (big_vision's 15) are
clipped to factor 1.0 (Keras caps the strength of each op at its maximum).
"""

import dataclasses
import os

from keras_reluvit import image_folder
from keras_reluvit.preprocessing import check_preprocessing
from keras_reluvit.preprocessing import decode_image
from keras_reluvit.preprocessing import normalise
from keras_reluvit.preprocessing import tf_preprocess
from keras_reluvit.preprocessing import tf_to_rgb

ILSVRC_HELP = """ImageNet (imagenet2012) is not prepared in {data_dir}.
tfds cannot download it. Put the two official archives in a manual directory:
  {manual_dir}/ILSVRC2012_img_train.tar   (one inner tar per synset, e.g. n01440764.tar)
  {manual_dir}/ILSVRC2012_img_val.tar     (ILSVRC2012_val_00000001.JPEG ...)
and the first `keras-reluvit train|eval|bench --data-dir {data_dir}` builds it
(several hours, ~150 GB), or build it explicitly:
  keras-reluvit prepare imagenet2012 --data-dir {data_dir} [--manual-dir DIR]
  keras_reluvit.data.prepare("imagenet2012", data_dir="{data_dir}", manual_dir="{manual_dir}")
"""

# The archives tfds' builders read from a manual directory.
MANUAL_FILES = {
    "imagenet2012": ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"),
}

# big_vision's split conventions per dataset: (train, minival, validation).
SPLITS = {
    "imagenet2012": ("train[:99%]", "train[99%:]", "validation"),
    "imagenet2012_real": (None, None, "validation"),
    "imagenet_v2": (None, None, "test"),
    "cifar10": ("train[:98%]", "train[98%:]", "test"),
    "cifar100": ("train[:98%]", "train[98%:]", "test"),
    "oxford_flowers102": ("train", "validation", "test"),
    "sklearn_digits": ("train", None, "test"),
}


@dataclasses.dataclass
class Augment:
    """Training augmentation. `randaug=(num_ops, magnitude)` as big_vision;
    `mixup` is the Beta parameter p (0 = off)."""

    crop_area: tuple = (0.05, 1.0)
    crop_aspect: tuple = (3 / 4, 4 / 3)
    flip: bool = True
    randaug: tuple = None
    mixup: float = 0.0

    def to_dict(self):
        return dataclasses.asdict(self)


def _tf():
    import tensorflow as tf

    return tf


def _tfds():
    # Registers the embedded data set too.
    import tensorflow_datasets as tfds

    from keras_reluvit import embedded  # noqa: F401

    return tfds


def prepare(name, data_dir=None, manual_dir=None):
    """Builds a tfds dataset into `data_dir` (tfds' progress bars): from the
    archives in `manual_dir` (default: tfds' `DATA_DIR/downloads/manual`)
    where the builder needs them, else by tfds' own download."""
    tfds = _tfds()
    builder = tfds.builder(name, data_dir=_expand(data_dir))
    manual_dir = _expand(manual_dir) or default_manual_dir(builder)
    missing = [f for f in MANUAL_FILES.get(name.split("/")[0], ())
               if not os.path.exists(os.path.join(manual_dir, f))]
    if missing:
        raise FileNotFoundError(
            f"Cannot prepare {name}: {', '.join(missing)} not in {manual_dir}.\n"
            + ILSVRC_HELP.format(data_dir=builder.data_dir_root, manual_dir=manual_dir))
    config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    print(f"keras_reluvit: preparing {name} into {builder.data_dir}"
          + (f" from {manual_dir}" if name in MANUAL_FILES else ""), flush=True)
    builder.download_and_prepare(download_config=config)
    return builder


def default_manual_dir(builder):
    """tfds' default manual directory: `DATA_DIR/downloads/manual`."""
    root = builder.data_dir_root if hasattr(builder, "data_dir_root") else None
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(builder.data_dir)))
    return os.path.join(root, "downloads", "manual")


def _has_archives(name, manual_dir):
    files = MANUAL_FILES.get(name.split("/")[0])
    return bool(files) and all(os.path.exists(os.path.join(manual_dir, f)) for f in files)


def _expand(path):
    return None if path is None else os.path.expanduser(os.fspath(path))


def builder(name, data_dir=None, manual_dir=None):
    """The prepared tfds builder. Not yet prepared, it is built from the
    archives in `manual_dir` (default `DATA_DIR/downloads/manual`, as
    `tfds.load` users expect) when they are there; otherwise the error says
    how to prepare it."""
    if image_folder.is_image_folder(name):
        raise ValueError(f"{name} is a folder of images, not a tfds data set: read it with "
                         "keras_reluvit.data.load (or image_folder.ImageFolder).")
    tfds = _tfds()
    data_dir = _expand(data_dir)
    b = tfds.builder(name, data_dir=data_dir)
    if not b.is_prepared():
        manual = _expand(manual_dir) or default_manual_dir(b)
        if _has_archives(name, manual):
            return prepare(name, data_dir, manual)
        if name.startswith("imagenet2012"):
            root = data_dir or os.path.expanduser("~/tensorflow_datasets")
            raise FileNotFoundError(
                ILSVRC_HELP.format(
                    data_dir=root, manual_dir=os.path.join(root, "downloads", "manual")
                )
            )
        if name == "sklearn_digits":
            b.download_and_prepare()
        else:
            raise FileNotFoundError(
                f"tfds dataset {name!r} is not prepared in {b.data_dir}; "
                f"prepare it with keras_reluvit.data.prepare({name!r}, "
                "data_dir=...) on a machine that can download it (or with "
                "manual_dir= for manually downloaded files)."
            )
    return b


def crop_window(shape, area, aspect, seed):
    """big_vision's inception crop window of an image of `shape` ([H, W, C]):
    (offset, size), each `[y, x]`, drawn statelessly from `seed`."""
    tf = _tf()
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([1, 0, 4]),
        seed=seed,
        area_range=area,
        aspect_ratio_range=aspect,
        min_object_covered=0.0,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[:2], crop_size[:2]


def random_crop(image, area, aspect, seed):
    """The inception crop window of decoded pixels `image` (`[H, W, C]`)."""
    tf = _tf()
    begin, crop = crop_window(tf.shape(image), area, aspect, seed)
    return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([crop, [-1]], 0))


def decode_random_crop(data, area, aspect, seed, dct_method="", alpha="drop"):
    """Encoded image bytes -> the inception crop window, uint8 `[h, w, 3]`: a
    JPEG's window is decoded alone (`decode_and_crop_jpeg`, as big_vision's
    `decode_jpeg_and_inception_crop`), other formats are decoded whole and
    cropped. The window equals `random_crop`'s on the decoded image for the
    same `seed`."""
    tf = _tf()

    def jpeg():
        begin, crop = crop_window(tf.image.extract_jpeg_shape(data), area, aspect, seed)
        return tf.image.decode_and_crop_jpeg(data, tf.concat([begin, crop], 0), channels=3,
                                             dct_method=dct_method)

    def other():
        return random_crop(decode_image(data, alpha=alpha), area, aspect, seed)

    return tf.ensure_shape(tf.cond(tf.io.is_jpeg(data), jpeg, other), (None, None, 3))


def inception_crop(image, size, area, aspect, seed):
    """The random crop of decoded pixels `image` (`[H, W, C]`), resized to
    `size` (bilinear, float32 out)."""
    return _tf().image.resize(random_crop(image, area, aspect, seed), size, method="bilinear")


def decode_inception_crop(data, size, area, aspect, seed, dct_method="", alpha="drop"):
    """Encoded image bytes -> the random crop (`decode_random_crop`), resized
    to `size` (float32) from the uint8 crop (no float copy of the image)."""
    return _tf().image.resize(decode_random_crop(data, area, aspect, seed, dct_method, alpha), size,
                              method="bilinear")


def resize_small_central_crop(image, size):
    """Our evaluation geometry: the shorter side to `round(size * 256 / 224)`
    (area; the longer side in proportion, rounded), central crop `size`;
    0-255 pixels out. `image` is `[H, W, C]` or a batch `[N, H, W, C]`."""

    return tf_preprocess(image, size, normalize=False)


class _KeyedSeed:
    """Stands in for a `keras.random.SeedGenerator` inside tf.data: each
    `next()` is a stateless seed derived from a key tensor, so the draws of
    Keras' augmentation layers depend on (seed, epoch, example) only, never
    on the order in which parallel map calls advance a shared state."""

    def __init__(self, key):
        self.key, self.count = key, 0

    def next(self, ordered=True):
        tf = _tf()
        self.count += 1
        return tf.random.experimental.stateless_fold_in(self.key, self.count)


def _keyed(key):
    from keras.random import SeedGenerator

    seed = object.__new__(type("KeyedSeedGenerator", (_KeyedSeed, SeedGenerator), {}))
    _KeyedSeed.__init__(seed, key)
    return seed


def _histogram_by_bincount(sub):
    """Keras 3.15's `Equalization` chooses its histogram by the global
    backend: under JAX a 256-step loop of comparisons, which it also runs
    where the layer computes with TensorFlow ops (tf.data), ~50 ms per
    224 px image. This binds the layer's own other branch (`bincount`, what
    it runs under TensorFlow and PyTorch; the same counts, ~1 ms) to the
    instance."""
    if not hasattr(sub, "_custom_histogram_fixed_width") or "_custom_histogram_fixed_width" in vars(sub):
        return
    ops = sub.backend

    def histogram(values, value_range, nbins):
        lo, hi = (ops.cast(v, "float32") for v in value_range)
        scaled = (ops.cast(values, "float32") - lo) * (nbins - 1) / (hi - lo)
        indices = ops.numpy.clip(ops.cast(scaled, "int32"), 0, nbins - 1)
        return ops.numpy.bincount(ops.numpy.reshape(indices, [-1]), minlength=nbins)

    sub._custom_histogram_fixed_width = histogram


def switch_randaugment(layer, image, key=None):
    """Applies a `keras.layers.RandAugment` to one image, running only the
    chosen ops.

    Keras 3.15's `RandAugment.transform_images` computes every one of its
    ops on the whole batch `num_ops` times and keeps one with `where()`
    (~14 images/s at 224 px on 2 CPU cores). Here each of the `num_ops` ops
    is drawn uniformly from the layer's `_AUGMENT_LAYERS` (as the layer
    draws them), its strength with that op's own `get_random_transformation`,
    and it is dispatched with `tf.switch_case`, so one op runs per draw: the
    same augmentation distribution, ~10x the throughput. `key` (a stateless
    seed, shape (2,)) makes every draw a function of it; without it the
    layer's seed generator is used.
    """
    tf = _tf()
    shape = tuple(image.shape[:2]) + (3,)
    image = tf.ensure_shape(image, shape)
    names = list(layer._AUGMENT_LAYERS)
    for name in names:  # in a tf.data graph, the layers compute with TF ops
        getattr(layer, name).backend.set_backend("tensorflow")
        _histogram_by_bincount(getattr(layer, name))
    for op in range(layer.num_ops):
        if key is None:
            t = layer.get_random_transformation(image[None], training=True)
            index = t["layer_idxes"][0]
        else:
            op_key = tf.random.experimental.stateless_fold_in(key, op)
            index = tf.random.stateless_uniform([], op_key, 0, len(names), dtype=tf.int32)

        def branch(name, current=image, op_key=None if key is None else op_key):
            sub = getattr(layer, name)
            if key is None:
                transformation = t["transforms"][name]
            else:
                transformation = sub.get_random_transformation(
                    current[None], training=True, seed=_keyed(op_key))
            return tf.cast(sub.transform_images(current[None], transformation)[0], tf.float32)

        image = tf.switch_case(tf.cast(index, tf.int32),
                               [lambda n=n, im=image: branch(n, im) for n in names])
        image = tf.ensure_shape(image, shape)
    return image


def mixup(images, labels, p, seed):
    """big_vision MixUp: a ~ Beta(p, p), a = max(a, 1 - a), one a per batch,
    every example mixed with the batch rolled by one (images and labels)."""
    tf = _tf()
    s1, s2 = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    g1 = tf.random.stateless_gamma([], s1, alpha=p)
    g2 = tf.random.stateless_gamma([], s2, alpha=p)
    a = g1 / (g1 + g2)
    a = tf.maximum(a, 1.0 - a)
    def mix(x):
        return a * x + (1.0 - a) * tf.roll(x, shift=1, axis=0)

    return mix(images), mix(labels)


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
    augmented. Eval: one pass, deterministic, the last partial batch kept.
    """
    tf = _tf()
    import keras

    recipe = check_preprocessing(preprocessing)
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    aug = augment or Augment()
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

    def decode(example, rnd):
        # Encoded bytes (tfds with its decoding skipped, an image folder's
        # files: read after the shuffle) are decoded here, the crop window
        # alone for a training JPEG; decoded pixels (for_model) are cropped.
        if "file" in example:  # decoded as predict and the SavedModel decode
            data, dct = tf.io.read_file(example["file"]), "INTEGER_ACCURATE"
        else:  # as tfds decodes
            data, dct = example["image"], ""
        encoded = data.dtype == tf.string
        if train:
            s1, s2 = tf.unstack(
                tf.random.experimental.stateless_split(tf.stack([rnd, 0]), 2)
            )
            if encoded:
                image = decode_inception_crop(data, size, aug.crop_area, aug.crop_aspect, s1, dct,
                                              recipe["alpha"])
            else:
                image = inception_crop(tf_to_rgb(data, recipe), size, aug.crop_area, aug.crop_aspect, s1)
            image = tf.ensure_shape(image, (*size, 3))
            if aug.flip:
                image = tf.image.stateless_random_flip_left_right(image, s2)
            if randaug is not None:  # keyed by the example's own random draw
                image = switch_randaugment(randaug, image, tf.stack([rnd, 2]))
            image = normalise(tf.clip_by_value(image, 0.0, 255.0), recipe)
        else:
            image = tf_preprocess(
                decode_image(data, dct, recipe["alpha"]) if encoded else data,
                size, recipe)
        image = tf.ensure_shape(image, (*size, 3))
        label = tf.one_hot(example["label"], num_classes)
        return image, label

    def randoms(offset):
        # Seeded, and different in every epoch (each new iterator).
        return tf.data.Dataset.random(seed=seed + offset, rerandomize_each_iteration=True)

    if cache:
        ds = ds.cache()
    if train:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        ds = tf.data.Dataset.zip((ds, randoms(0)))
    else:
        ds = ds.map(lambda ex: (ex, tf.constant(0, tf.int64)))
    ds = ds.map(decode, num_parallel_calls=AUTO, deterministic=True)
    # Train batches are full (one epoch = one pass, len(train) = steps).
    drop = train if drop_remainder is None else drop_remainder
    ds = ds.batch(batch_size, drop_remainder=drop, num_parallel_calls=AUTO)
    if train and aug.mixup > 0:
        p = float(aug.mixup)
        ds = tf.data.Dataset.zip((ds, randoms(1)))
        ds = ds.map(
            lambda b, r: mixup(*b, p, tf.stack([r, 1])),
            num_parallel_calls=AUTO,
        )
    return ds.prefetch(AUTO)


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
    tf = _tf()
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
    num_classes = model.output_shape[-1]
    one_hot = label_spec.shape.rank == 1

    def example(image, label):
        label = tf.argmax(label, output_type=tf.int64) if one_hot else tf.cast(label, tf.int64)
        return {"image": image, "label": label}

    ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
    return pipeline(ds, num_classes, model.image_size, batch_size or 32, train, augment, seed,
                    shuffle_buffer=shuffle_buffer, preprocessing=model.preprocessing)


class Data:
    """What `load` returns: datasets plus what a training run needs."""

    def __init__(self, train, val, info, num_classes, steps_per_epoch, label_names):
        self.train, self.val, self.info = train, val, info
        self.num_classes = num_classes
        self.steps_per_epoch = steps_per_epoch
        self.label_names = label_names

    def __iter__(self):  # train, val, info = kr.data.load(...)
        return iter((self.train, self.val, Info(self)))


class Info:
    """The tfds `DatasetInfo` plus `num_classes`, `label_names` and
    `steps_per_epoch` (other attributes are the tfds info's)."""

    def __init__(self, data):
        self.num_classes = data.num_classes
        self.label_names = data.label_names
        self.steps_per_epoch = data.steps_per_epoch
        self.tfds_info = data.info

    def __getattr__(self, name):
        return getattr(self.__dict__["tfds_info"], name)


class _TfdsSource:
    """A prepared tfds data set, as `load` reads it."""

    def __init__(self, name, data_dir, manual_dir):
        self.name, self.builder = name, builder(name, data_dir, manual_dir)
        self.info = self.builder.info
        self.label_names = list(self.info.features["label"].names)
        train, _, val = SPLITS.get(name, ("train", None, "validation"))
        self.default_splits = (train, val)

    def shards(self, split, count):
        if count == 1:
            return [split]
        return _tfds().even_splits(split, n=count, drop_remainder=True)

    def num_examples(self, shard):
        return self.info.splits[shard].num_examples

    def read(self, shard, train, seed):
        # Images stay encoded (a tenth of the memory in the shuffle buffer);
        # `pipeline` decodes them, only the crop window of a training JPEG.
        tfds = _tfds()
        decoders = None
        if isinstance(self.info.features["image"], tfds.features.Image):
            decoders = {"image": tfds.decode.SkipDecoding()}
        if train:
            return self.builder.as_dataset(split=shard, shuffle_files=True, decoders=decoders,
                                           read_config=tfds.ReadConfig(shuffle_seed=seed))
        return self.builder.as_dataset(split=shard, shuffle_files=False, decoders=decoders)


class _FolderSource:
    """A folder of images (`keras_reluvit.image_folder`), as `load` reads it."""

    def __init__(self, root, val_fraction, seed):
        self.folder = image_folder.ImageFolder(root, val_fraction=val_fraction, seed=seed)
        self.name, self.info = self.folder.root, self.folder
        self.label_names = list(self.folder.class_names)
        val = next((s for s in ("validation", "test") if s in self.folder.splits), None)
        self.default_splits = ("train", val)

    def shards(self, split, count):
        return [(split, i, count) for i in range(count)]

    def num_examples(self, shard):
        split, i, count = shard
        return self.folder.num_examples(split) // count

    def read(self, shard, train, seed):
        split, i, count = shard
        return self.folder.dataset(split, shard=(i, count))


def load(
    name,
    batch_size,
    image_size=224,
    data_dir=None,
    augment=None,
    train_split=None,
    val_split=None,
    seed=0,
    eval_batch_size=None,
    cache=False,
    manual_dir=None,
    process_index=0,
    process_count=1,
    preprocessing=None,
    val_fraction=0.1,
):
    """Train and validation pipelines of a tfds data set (by name) or of a
    folder of images (by path: one sub-folder per class, see
    `keras_reluvit.image_folder`).

    `preprocessing`: the model's recipe (`model.preprocessing`, default
    ours), for the evaluation geometry and the normalisation of all images.
    `val_fraction`: a folder without `train/` / `val/` sub-folders holds
    out this seeded share of each class as its validation split.

    Returns a `Data`, which unpacks as `(train, val, info)`; `len(train)` is
    the number of steps of one epoch (one pass over the split);
    `info.label_names` are the class names (a folder's: its sub-folders).

    In a cluster of `process_count` processes (hosts), process
    `process_index` reads only its shard of the training split (tfds
    `even_splits`, equal sizes) with its own shuffle and augmentation seed,
    in batches of `batch_size // process_count`; `keras.distribution`
    assembles the per-host batches into the global batch of `batch_size`.
    `process_index=None` with `process_count > 1` builds the same global
    batches in one process (host 0's batch, then host 1's, ...): a cluster's
    run reproduced on one machine. Every process evaluates on the whole
    validation split (so the metrics are those of one process).

    Example:

    ```python
    train, val, info = kr.data.load("my_images/", batch_size=32, image_size=224)
    info.label_names        # the folder's class names
    ```
    """
    if image_folder.is_image_folder(name):
        source = _FolderSource(name, val_fraction, seed)
    else:
        source = _TfdsSource(name, data_dir, manual_dir)
    default_train, default_val = source.default_splits
    # None: the source's default split; False / "": no such pipeline.
    train_split = default_train if train_split is None else train_split
    val_split = default_val if val_split is None else val_split
    label_names = source.label_names
    num_classes = len(label_names)
    train = val = None
    steps = None
    process_count = int(process_count)
    if process_count < 1 or batch_size % process_count:
        raise ValueError(f"batch_size {batch_size} must be a multiple of the number of "
                         f"processes ({process_count}): each feeds batch_size / processes.")
    if process_index is not None and not 0 <= int(process_index) < process_count:
        raise ValueError(f"process_index {process_index} is out of range for {process_count} "
                         "processes.")
    local_batch = batch_size // process_count
    if train_split:
        shards = source.shards(train_split, process_count)
        n = source.num_examples(shards[0])
        if n < local_batch:
            per = "" if process_count == 1 else f" per process ({process_count} processes)"
            raise ValueError(f"{name} {train_split} has {n} examples{per}, fewer than one batch "
                             f"of {local_batch}: use a smaller batch size (batch_size=, "
                             "keras-reluvit train --batch-size).")
        steps = n // local_batch

        def shard_pipeline(i):
            shard_seed = seed + 1_000_003 * i  # its own shuffle and augmentation
            raw = source.read(shards[i], True, shard_seed)
            return pipeline(raw, num_classes, image_size, local_batch, True, augment,
                            shard_seed, cache=cache, preprocessing=preprocessing)

        if process_index is not None:
            train = shard_pipeline(int(process_index))
        else:  # the global batches of the whole cluster, in one process
            tf = _tf()
            train = tf.data.Dataset.zip(tuple(shard_pipeline(i) for i in range(process_count)))
            train = train.map(lambda *batches: tuple(
                tf.concat([bt[k] for bt in batches], 0) for k in range(2)))
    if val_split:
        raw = source.read(source.shards(val_split, 1)[0], False, seed)
        val = pipeline(raw, num_classes, image_size,
                       eval_batch_size or (batch_size if process_index is None else local_batch),
                       False, cache=cache, preprocessing=preprocessing)
    return Data(train, val, source.info, num_classes, steps, label_names)


def imagenet(batch_size, data_dir=None, image_size=224, augment=None, seed=0, **kwargs):
    """tfds `imagenet2012`: train[:99%] / validation, big_vision preprocessing.

    Example:

    ```python
    train, val, info = kr.data.imagenet(batch_size=1024, data_dir="~/tensorflow_datasets")
    ```
    """
    return load("imagenet2012", batch_size, image_size, data_dir, augment, seed=seed, **kwargs)
