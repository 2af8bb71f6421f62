"""Where examples come from -- a tfds data set or a folder of images --
and `load`, which turns either into train / validation pipelines."""


from keras_reluvit._defaults import VAL_FRACTION
from keras_reluvit.data import folders as image_folder
from keras_reluvit.data import lazy
from keras_reluvit.data.pipeline import pipeline
from keras_reluvit.data.tfds import SPLITS
from keras_reluvit.data.tfds import builder


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
        return lazy.tensorflow_datasets().even_splits(split, n=count, drop_remainder=True)

    def num_examples(self, shard):
        return self.info.splits[shard].num_examples

    def shuffle_buffer(self, n):
        return 10_000  # encoded images: a buffer, file-shuffled shards beneath it

    def read(self, shard, train, seed):
        # Images stay encoded (a tenth of the memory in the shuffle buffer);
        # `pipeline` decodes them, only the crop window of a training JPEG.
        tfds = lazy.tensorflow_datasets()
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

    def shuffle_buffer(self, n):
        return max(n, 1)  # file names in class order: cheap to shuffle all of them

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
    val_fraction=VAL_FRACTION,
    shuffle_buffer=None,
):
    """Train and validation pipelines of a tfds data set (by name) or of a
    folder of images (by path: one sub-folder per class, see
    `keras_reluvit.image_folder`).

    `preprocessing`: the model's recipe (`model.preprocessing`, default
    ours), for the evaluation geometry and the normalisation of all images.
    `val_fraction`: a folder without `train/` / `val/` sub-folders holds
    out this seeded share of each class as its validation split.

    `shuffle_buffer`: the training examples' shuffle buffer (encoded
    images); default 10,000 for tfds (whose file-shuffled shards mix
    beneath it), a folder's whole split (its file names). Repeated
    augmentation draws each epoch's images from the whole split whatever
    the buffer (`pipeline.epoch_subset`).

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
    run reproduced on one machine; a list of indices, those shards' batches
    side by side (a cluster's run resumed on fewer processes). Every process evaluates on the whole
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
    indices = (list(range(process_count)) if process_index is None
               else [int(i) for i in process_index] if isinstance(process_index, (list, tuple))
               else [int(process_index)])
    if not indices or not all(0 <= i < process_count for i in indices):
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
                            shard_seed, cache=cache, preprocessing=preprocessing,
                            shuffle_buffer=shuffle_buffer or source.shuffle_buffer(n))

        if len(indices) == 1:
            train = shard_pipeline(indices[0])
        else:  # several shards' batches side by side (the whole cluster's: global batches)
            tf = lazy.tensorflow()
            train = tf.data.Dataset.zip(tuple(shard_pipeline(i) for i in indices))
            train = train.map(lambda *batches: tuple(
                tf.concat([bt[k] for bt in batches], 0) for k in range(2)))
    if val_split:
        raw = source.read(source.shards(val_split, 1)[0], False, seed)
        val = pipeline(raw, num_classes, image_size,
                       eval_batch_size or local_batch * len(indices),
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

