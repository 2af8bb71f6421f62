"""Data sets whose images carry their own id, so a test can read back which
image each example of a pipeline is (after normalisation to [-1, 1])."""

import numpy as np


def id_image(i, size=4):
    """A `size` x `size` image whose pixel is its id (two channels: id // 256,
    id % 256; the third 7)."""
    return np.broadcast_to(np.array([i // 256, i % 256, 7], "uint8"), (size, size, 3)).copy()


def ids_of(images):
    """The ids of `id_image`s in normalised batches ([-1, 1])."""
    px = np.rint((np.asarray(images)[:, 0, 0, :2] + 1.0) * 127.5).astype(int)
    return px[:, 0] * 256 + px[:, 1]


def write_class_files_tfds(data_dir, name, classes, per):
    """A tfds data set `name` in `data_dir` of `classes` train files, file c
    holding class c's `per` images with ids c * per ... (the worst order:
    ImageNet's many shards, one class each); read by the real builder
    (`tfds.builder_from_directory` / `kr.data.load(name, data_dir=...)`)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    out = data_dir / name / "1.0.0"
    out.mkdir(parents=True)
    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(4, 4, 3)),
        "label": tfds.features.ClassLabel(num_classes=classes)})
    for c in range(classes):
        path = out / f"{name}-train.tfrecord-{c:05d}-of-{classes:05d}"
        with tf.io.TFRecordWriter(str(path)) as w:
            for j in range(per):
                w.write(features.serialize_example({"image": id_image(c * per + j),
                                                    "label": c}))
    tfds.folder_dataset.write_metadata(data_dir=str(out), features=features)
