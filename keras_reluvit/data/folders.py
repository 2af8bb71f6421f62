"""Folders of images as data sets: one sub-folder per class.

The layout every image tool reads (timm's `ImageFolder`, torchvision,
`keras.utils.image_dataset_from_directory`, Hugging Face `imagefolder`):

    my_images/cat/0001.jpg          my_images/train/cat/0001.jpg
    my_images/cat/0002.png    or    my_images/train/dog/...
    my_images/dog/...               my_images/val/cat/...   (or validation/, test/)

Class names are the sub-folder names, sorted (label `i` is the `i`-th name),
and travel into the model (`label_names`). With `train/` (and `val/`,
`validation/` or `test/`) the splits are those folders; without, a seeded,
per-class `val_fraction` of each class (default 10 %, at least one image)
is held out as the validation split -- the same files for the same folder
and seed, whatever the machine.

Files are recognised by their first bytes, not their names: JPEG, PNG, GIF,
BMP and WebP. Any other file in a class folder is an error that names it
(a wrong label must never pass silently); hidden files (`.DS_Store`,
`._*`) and `Thumbs.db` / `desktop.ini` are skipped, with one printed line
counting them. Only the file list is held in memory: images are read and
decoded inside tf.data, after the shuffle (`keras_reluvit.data.pipeline`).

Why not tfds' `ImageFolder`: it needs `train/`-style split folders and reads
only `.jpg`/`.jpeg`/`.png`; `image_dataset_from_directory` resizes every
image to one size before any crop. Both remain usable: see
`keras_reluvit.data.for_model`.
"""

import contextlib
import os
import re

import numpy as np

from keras_reluvit._defaults import VAL_FRACTION
from keras_reluvit._logging import say

# The first bytes of each format tf.io.decode_image reads.
_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")
SPLIT_DIRS = {"train": ("train",), "validation": ("val", "validation", "valid"),
              "test": ("test",)}
_SYSTEM_FILES = {"thumbs.db", "desktop.ini"}


# The file a training run on a folder writes into its directory: the split it used.
SPLIT_FILE = "split.json"
# The manifest of a compact copy (`keras_reluvit.data.compact`): its settings, its
# class order, whether it is complete.
COPY_MANIFEST = ".compact-copy.json"


def _split_name(split):
    """A split's canonical name (`val`, `valid` -> `validation`)."""
    return {"val": "validation", "valid": "validation"}.get(split, split)


class ImageFolderError(ValueError):
    """A folder that cannot be read as an image data set (the message says
    what to change)."""


def image_format(path):
    """`"jpeg"`, `"png"`, `"gif"`, `"bmp"`, `"webp"` from the file's first
    bytes, or None when it is none of them."""
    with open(path, "rb") as f:
        head = f.read(16)
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def is_image_folder(path):
    """Whether `path` is a directory (the data sources take a tfds name or a
    folder: this decides which)."""
    return isinstance(path, (str, os.PathLike)) and os.path.isdir(os.path.expanduser(path))


def split_folders(root):
    """{split: its sub-folder's name} of the split folders (`SPLIT_DIRS`)
    `root` holds; {} where it holds none (its validation split is then drawn
    by `val_fraction`)."""
    root = os.path.expanduser(os.fspath(root))
    subdirs = {d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))}
    return {split: next(d for d in names if d in subdirs)
            for split, names in SPLIT_DIRS.items() if any(d in subdirs for d in names)}


def _skipped(name):
    return name.startswith(".") or name.lower() in _SYSTEM_FILES


def list_images(folder, strict=True):
    """Every image under `folder` (sub-folders included, hidden ones not),
    sorted, and the count of files passed over: hidden and system files
    always; with `strict` any other non-image file is an error naming it,
    without it (`keras-reluvit predict DIR`) it is passed over too."""
    files, skipped = [], 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if _skipped(name):
                skipped += 1
                continue
            try:
                kind = image_format(path)
            except OSError:
                if strict:
                    raise
                kind = None
            if kind is None:
                if strict:
                    raise ImageFolderError(
                        f"{path} is not an image ({', '.join(FORMATS)} are read, recognised "
                        "by their content): move it out of the class folder, or convert it.")
                skipped += 1
                continue
            files.append(path)
    return files, skipped


def _scan(split_dir, what):
    """`(class names, {class: [files]}, skipped)` of one split folder."""
    if not os.path.isdir(split_dir):
        raise ImageFolderError(f"{split_dir} is not a folder.")
    entries = sorted(os.listdir(split_dir))
    classes = [e for e in entries if os.path.isdir(os.path.join(split_dir, e))
               and not e.startswith(".")]
    loose = [e for e in entries if os.path.isfile(os.path.join(split_dir, e))
             and not _skipped(e)]
    if not classes:
        if loose:
            raise ImageFolderError(
                f"{split_dir} holds files ({loose[0]}, ...) but no class sub-folders: put each "
                f"class' images in a sub-folder named after the class ({what}/<class>/*.jpg).")
        raise ImageFolderError(f"{split_dir} is empty: expected one sub-folder of images per "
                               f"class ({what}/<class>/*.jpg).")
    if loose:
        raise ImageFolderError(
            f"{os.path.join(split_dir, loose[0])} lies beside the class folders: every image "
            "must be inside its class' sub-folder (the folder name is its label).")
    files, skipped = {}, 0
    for c in classes:
        files[c], n = list_images(os.path.join(split_dir, c))
        skipped += n
        if not files[c]:
            raise ImageFolderError(f"Class folder {os.path.join(split_dir, c)} has no images.")
    return classes, files, skipped


class ImageFolder:
    """The splits of a folder of images (see the module docstring).

    Args:
        root: the folder.
        val_fraction: without split folders, the share of each class held
            out for validation (seeded by `seed`); 0 holds none out.
        seed: the hold-out's seed.

    Attributes: `class_names`, `splits` (`{"train": (files, labels), ...}`),
    `split_names`.

    Example:

    ```python
    folder = kr.image_folder.ImageFolder("my_images/")
    folder.class_names, folder.num_examples("train")
    ```
    """

    def __init__(self, root, val_fraction=VAL_FRACTION, seed=0):
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        if not os.path.isdir(self.root):
            raise ImageFolderError(f"{root} is not a folder.")
        val_fraction = float(val_fraction)
        if not 0.0 <= val_fraction < 1.0:
            raise ImageFolderError(f"val_fraction must be in [0, 1), got {val_fraction}.")
        self.val_fraction, self.seed = val_fraction, int(seed)
        found = split_folders(self.root)
        skipped = 0
        self.copy = _copy_manifest(self.root)
        self.drawn = "train" not in found  # the validation split drawn by the seed
        if "train" in found:
            classes, files, skipped = _scan(os.path.join(self.root, found["train"]), "train")
            classes = self.class_names = self._ordered(classes)
            self.splits = {"train": self._labelled(files)}
            for split, d in found.items():
                if split == "train":
                    continue
                names, other, n = _scan(os.path.join(self.root, d), d)
                skipped += n
                unknown = sorted(set(names) - set(classes))
                if unknown:
                    raise ImageFolderError(
                        f"{os.path.join(self.root, d)} has classes that train/ lacks: "
                        f"{unknown[:5]} (the model learns train/'s classes).")
                self.splits[split] = self._labelled(other)
        else:
            if found:
                raise ImageFolderError(
                    f"{self.root} has {', '.join(sorted(found.values()))}/ but no train/ folder.")
            classes, files, skipped = _scan(self.root, os.path.basename(self.root) or "root")
            self.class_names = self._ordered(classes)
            train, val = {}, {}
            rng = np.random.default_rng(self.seed)
            for c in classes:
                order = rng.permutation(len(files[c]))
                n_val = (int(round(len(files[c]) * val_fraction)) if val_fraction else 0)
                n_val = min(max(n_val, 1 if val_fraction and len(files[c]) > 1 else 0),
                            len(files[c]) - 1)
                held = set(order[:n_val].tolist())
                val[c] = [f for i, f in enumerate(files[c]) if i in held]
                train[c] = [f for i, f in enumerate(files[c]) if i not in held]
            self.splits = {"train": self._labelled(train)}
            if any(val.values()):
                self.splits["validation"] = self._labelled(val)
        if len(self.class_names) < 2:
            raise ImageFolderError(
                f"{self.root} has one class ({self.class_names[0]}): a classifier needs at "
                "least two class sub-folders.")
        if skipped:
            say(f"{self.root}: skipped {skipped} hidden / system file(s) "
                "(.DS_Store, Thumbs.db, ...).")

    def _ordered(self, classes):
        """The class names: the folders' (sorted), or a compact copy's (its
        source's order, `COPY_MANIFEST`), of which the folders are a part."""
        if self.copy is None:
            return classes
        names = list(self.copy["class_names"])
        stray = sorted(set(classes) - set(names))
        if stray:
            raise ImageFolderError(f"{self.root} is a compact copy whose manifest "
                                   f"({COPY_MANIFEST}) lacks the class folders {stray[:5]}.")
        return names

    def _labelled(self, files):
        paths, labels = [], []
        for c, fs in files.items():
            paths += fs
            labels += [self.class_names.index(c)] * len(fs)
        return paths, np.asarray(labels, "int64")

    @property
    def split_names(self):
        return list(self.splits)

    @property
    def num_classes(self):
        return len(self.class_names)

    def num_examples(self, split):
        return len(self._split(split)[0])

    def _split(self, split):
        name = _split_name(split)
        if name not in self.splits:
            raise ImageFolderError(
                f"{self.root} has no {split!r} split; it has {', '.join(self.splits)}.")
        return self.splits[name]

    def dataset(self, split, shard=(0, 1)):
        """A `tf.data.Dataset` of `{"file": path, "label": int64}` (file names
        only: `keras_reluvit.data.pipeline` reads and decodes them), in a
        fixed order; `shard=(index, count)` takes every `count`-th example
        from `index` (equal sizes: the remainder is dropped)."""
        import tensorflow as tf

        paths, labels = self._split(split)
        index, count = shard
        if count > 1:
            n = len(paths) // count * count
            paths, labels = paths[index:n:count], labels[index:n:count]
        return tf.data.Dataset.from_tensor_slices({"file": list(paths), "label": labels})

    def describe_split(self, split):
        """One line: which images `split` is and how it was made."""
        name = _split_name(split)
        n = self.num_examples(name)
        if not self.drawn:
            return f"{self.root}: the {name} split, its own folder ({n} images)"
        what = "held out" if name == "validation" else "kept for training"
        return (f"{self.root}: the {name} split, {n} images {what} by seed {self.seed} "
                f"with val_fraction {self.val_fraction:g}")

    def split_record(self):
        """What a training run writes into its directory (`SPLIT_FILE`): the
        folder, how its splits were made and, where they were drawn, each
        split's files (relative to the folder), so that an evaluation can
        prove it holds out what the run held out."""
        record = dict(root=self.root, drawn=self.drawn, seed=self.seed,
                      val_fraction=self.val_fraction)
        if self.drawn:
            record["splits"] = {name: [os.path.relpath(p, self.root) for p in paths]
                                for name, (paths, _) in self.splits.items()}
        return record

    def trained_on(self, split, record):
        """The files of `split` that the run described by `record` (its
        `split_record()`) trained on: empty for a proper held-out split."""
        name = _split_name(split)
        paths, _ = self._split(name)
        if not record.get("drawn"):  # train/ and val/ folders: a file is in one of them
            return [] if name != "train" else list(paths)
        trained = set(record["splits"].get("train", ()))
        return [p for p in paths if os.path.relpath(p, self.root) in trained]

    def __repr__(self):
        sizes = ", ".join(f"{k}: {len(v[0])}" for k, v in self.splits.items())
        return f"ImageFolder({self.root!r}, classes={self.class_names}, {sizes})"


def _copy_manifest(root):
    """The manifest of the compact copy `root` is (None where it is none);
    an unfinished copy is an error saying how to finish it."""
    import json

    path = os.path.join(root, COPY_MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        manifest = json.load(f)
    if not manifest.get("complete"):
        raise ImageFolderError(
            f"{root} is an unfinished compact copy (its `keras-reluvit prepare --out` was "
            "stopped): run the same command again to finish it.")
    return manifest


def unreadable(paths):
    """The files among `paths` that TensorFlow cannot decode (a valid header
    over a corrupt or truncated body), decoded one by one as the pipelines
    decode them."""
    import tensorflow as tf

    from keras_reluvit.preprocessing import decode_image

    bad = []
    for path in paths:
        try:
            decode_image(tf.io.read_file(path))
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
            why = re.sub(r"\{\{.*?\}\}\s*", "", e.message).strip().splitlines()
            bad.append(f"{path} ({why[0][:80] if why else type(e).__name__})")
    return bad


@contextlib.contextmanager
def naming_unreadable(folder):
    """Runs a fit / evaluate / predict over `folder`'s files (an
    `ImageFolder`, or a list of paths); a decode error raised inside tf.data
    (which does not know the file) becomes an `ImageFolderError` naming the
    file(s) that cannot be decoded."""
    try:
        yield
    except Exception as e:
        import tensorflow as tf

        if folder is None or not isinstance(e, (tf.errors.InvalidArgumentError,
                                                tf.errors.DataLossError)):
            raise
        paths = (folder if isinstance(folder, (list, tuple))
                 else [p for paths, _ in folder.splits.values() for p in paths])
        say(f"an image failed to decode inside tf.data; looking for it among "
            f"{len(paths)} files ...")
        bad = unreadable(paths)
        if not bad:
            raise
        raise ImageFolderError(
            f"{len(bad)} image file(s) cannot be decoded (a valid header over a corrupt or "
            f"truncated body): {'; '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}. Remove or "
            "replace them.") from None


# scikit-image's bundled photographs behind `sample_folder`'s classes.
SAMPLE_PHOTOS = {"cat": "chelsea", "coffee": "coffee", "rocket": "rocket", "astronaut": "astronaut"}


def sample_folder(root, classes=("cat", "coffee", "rocket"), per_class=24, size=(48, 96),
                  split=False, seed=0):
    """Writes a small folder of real photographs to fine-tune on, offline:
    random crops (20-80 % of the side, any aspect), flips and rescales of
    scikit-image's bundled photographs (`SAMPLE_PHOTOS`: one photograph per
    class), saved in every format the readers take (JPEG at varied
    qualities, PNG, also grayscale and RGBA, BMP, GIF, WebP). Needs
    scikit-image and Pillow (`pip install "keras-reluvit[samples]"`).
    Returns `root`.

    Args:
        root: the folder to write (`root/<class>/*.jpg`; with `split=True`
            `root/train/<class>/` and `root/val/<class>/`, a quarter in
            val/, cropped from the photograph's right third, which no
            training image shares a pixel of: a held-out split).
        classes: names from `SAMPLE_PHOTOS`.
        per_class: images per class.
        size: (min, max) side of the written images, in pixels.
        seed: the crops' seed (the same folder for the same arguments).

    Example:

    ```python
    root = kr.image_folder.sample_folder("my_images")   # 3 classes x 24 photos
    train, val, info = kr.data.load(root, batch_size=16, image_size=32)
    ```
    """
    try:
        from PIL import Image
        from skimage import data as skdata
    except ImportError as e:
        raise ModuleNotFoundError(f"sample_folder needs scikit-image and Pillow ({e.name} is "
                                  "missing): pip install \"keras-reluvit[samples]\".",
                                  name=e.name) from None

    unknown = [c for c in classes if c not in SAMPLE_PHOTOS]
    if unknown:
        raise ValueError(f"No sample photograph for {unknown}; choose from {list(SAMPLE_PHOTOS)}.")
    rng = np.random.default_rng(seed)
    formats = [("jpg", "JPEG", "RGB")] * 6 + [("png", "PNG", "L"), ("png", "PNG", "RGB"),
                                              ("png", "PNG", "RGBA"), ("bmp", "BMP", "RGB"),
                                              ("gif", "GIF", "P"), ("webp", "WEBP", "RGB")]
    root = os.path.expanduser(os.fspath(root))
    for c in classes:
        photo = getattr(skdata, SAMPLE_PHOTOS[c])()
        h, w = photo.shape[:2]
        for i in range(per_class):
            held_out = split and i % 4 == 3
            # split: training crops from the left two thirds, held-out ones from the rest
            x0, x1 = ((2 * w // 3, w) if held_out else (0, 2 * w // 3)) if split else (0, w)
            ch = int(h * rng.uniform(0.2, 0.8))
            cw = int((x1 - x0) * rng.uniform(0.3, 1.0) if split else w * rng.uniform(0.2, 0.8))
            top, left = rng.integers(0, h - ch + 1), x0 + rng.integers(0, x1 - x0 - cw + 1)
            crop = photo[top:top + ch, left:left + cw]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            side = int(rng.integers(size[0], size[1] + 1))
            scale = side / max(ch, cw)
            image = Image.fromarray(np.ascontiguousarray(crop)).resize(
                (max(1, round(cw * scale)), max(1, round(ch * scale))), Image.BICUBIC)
            ext, fmt, mode = formats[i % len(formats)]
            image = image.convert(mode)
            if mode == "RGBA":  # an alpha gradient
                alpha = np.linspace(64, 255, image.size[0] * image.size[1]).astype("uint8")
                image.putalpha(Image.fromarray(alpha.reshape(image.size[1], image.size[0])))
            part = ("val" if held_out else "train") if split else ""
            folder = os.path.join(root, part, c)
            os.makedirs(folder, exist_ok=True)
            kwargs = {"quality": int(rng.integers(70, 96))} if fmt == "JPEG" else {}
            image.save(os.path.join(folder, f"{c}_{i:03d}.{ext}"), fmt, **kwargs)
    return root
