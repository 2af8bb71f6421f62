"""tfds data sets: preparing them (ImageNet from its archives), their
builders, and big_vision's split conventions."""

import os

from keras_reluvit._logging import say
from keras_reluvit.data import folders as image_folder
from keras_reluvit.data import lazy

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


def prepare(name, data_dir=None, manual_dir=None):
    """Builds a tfds dataset into `data_dir` (tfds' progress bars): from the
    archives in `manual_dir` (default: tfds' `DATA_DIR/downloads/manual`)
    where the builder needs them, else by tfds' own download."""
    tfds = lazy.tensorflow_datasets()
    builder = tfds.builder(name, data_dir=_expand(data_dir))
    manual_dir = _expand(manual_dir) or default_manual_dir(builder)
    missing = [f for f in MANUAL_FILES.get(name.split("/")[0], ())
               if not os.path.exists(os.path.join(manual_dir, f))]
    if missing:
        raise FileNotFoundError(
            f"Cannot prepare {name}: {', '.join(missing)} not in {manual_dir}.\n"
            + ILSVRC_HELP.format(data_dir=builder.data_dir_root, manual_dir=manual_dir))
    config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    say(f"preparing {name} into {builder.data_dir}"
        + (f" from {manual_dir}" if name in MANUAL_FILES else ""))
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
    tfds = lazy.tensorflow_datasets()
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
