"""A compact copy of a data set: every image a JPEG whose shorter side is at
most `short_side` pixels, written as a folder of images that `train
--dataset COPY` reads like any other (`folders`).

Decoding is most of a training input pipeline's cost on a CPU, and it grows
with the pixels decoded: ImageNet's photographs (~500 x 375, some far
larger) decoded from a copy bounded at 256-320 px decode and resize roughly
twice as fast, at the price of detail a 224 px crop rarely keeps. The idea
is FFCV's (`RGBImageField(max_resolution=, jpeg_quality=)`), which bounds
the longer side; here the shorter side is bounded, the side a crop of the
model's resolution and the evaluation's `resize_small` need
(docs/training.md: the measured trade).

What the copy holds, per image of the source:
- larger than the bound: decoded (a JPEG at the smallest DCT scale that
  keeps twice the target size), resized with Pillow's box filter (the
  area average, as the evaluation's `resize_small`) so that the shorter
  side is `short_side`, encoded as JPEG at `jpeg_quality`;
- within it and already a baseline RGB or grayscale JPEG: its bytes,
  unchanged (no second compression);
- within it and anything else (PNG, GIF, BMP, WebP, a CMYK JPEG, 16-bit
  PNG): encoded as JPEG at `jpeg_quality`, in RGB as the pipelines decode
  it (alpha dropped, 16-bit values scaled to 8 bits, CMYK converted).

The layout: a folder of images is copied file for file (the same relative
paths, so a seeded validation hold-out holds out the same images; a PNG's
name keeps `.png` over JPEG bytes: the readers go by content); a tfds data
set becomes `SPLIT/CLASS/NNNNNNNN.jpg` per split (train/, validation/,
test/). The class order is the source's, recorded in the copy's manifest
`.compact-copy.json` (a tfds set's label order need not be its names'
sorted order), with the settings and whether the copy is complete: an
incomplete copy is refused by the readers, and the same command resumes it
(each file is written beside and renamed: present means whole). A folder's
copy follows its source as make would: a rerun writes the images whose copy
is missing or older than the source file and removes those whose source is
gone (then the copy is complete again); another source or other settings
are an error naming each difference. One writer at a time (a lock file in
the copy). A baseline JPEG kept byte for byte is decoded first: a
truncated one is an error naming it here, not in training.

Example:

```python
kr.data.compact_copy("imagenet2012", "~/imagenet-256", short_side=256,
                     data_dir="~/tensorflow_datasets")
# keras-reluvit train --dataset ~/imagenet-256 ...
```
"""

import concurrent.futures
import contextlib
import fcntl
import io
import json
import os
import sys
import time

import numpy as np

from keras_reluvit._defaults import COPY_JPEG_QUALITY
from keras_reluvit._defaults import COPY_SHORT_SIDE
from keras_reluvit._logging import say
from keras_reluvit.data import folders
from keras_reluvit.data import lazy

MANIFEST = folders.COPY_MANIFEST
LOCK = ".compact-copy.lock"
FORMAT = 1
_PARTIAL = ".partial"


def compact_copy(source, out, short_side=COPY_SHORT_SIDE, jpeg_quality=COPY_JPEG_QUALITY,
                 data_dir=None, manual_dir=None, workers=None, progress=True):
    """Writes (or resumes) the compact copy of `source` into `out`; returns
    the manifest (a dict: settings, class names, images per split, bytes).

    Args:
        source: a tfds name (prepared, or prepared here from `manual_dir`'s
            archives) or a folder of images (`keras_reluvit.data.folders`).
        out: the copy's folder (created; a copy there is resumed).
        short_side: the bound on each image's shorter side, in pixels
            (16-4096; larger images are resized, smaller ones kept).
        jpeg_quality: the JPEG quality of the images it encodes (1-100;
            Pillow's scale).
        data_dir: tfds' data_dir for a tfds `source`.
        manual_dir: the archives a tfds set is built from where it is not
            prepared yet (see `keras_reluvit.data.prepare`).
        workers: threads decoding and encoding (Pillow releases the GIL;
            default the machine's cores).
        progress: a progress bar (tqdm) on stderr.
    """
    short_side, jpeg_quality = _check(short_side, jpeg_quality, workers)
    if not os.fspath(out):
        raise ValueError("The copy's folder (--out) is empty: name a folder.")
    out = os.path.abspath(os.path.expanduser(os.fspath(out)))
    folder = folders.is_image_folder(source)
    if not folder and (os.path.exists(os.path.expanduser(os.fspath(source)))
                       or str(source).startswith(("/", ".", "~"))):
        raise ValueError(f"{source} is not a folder of images (nor a tfds data set's name).")
    if folder:
        src = os.path.abspath(os.path.expanduser(os.fspath(source)))
        if out == src or out.startswith(src + os.sep):
            raise ValueError(f"The copy's folder {out} is inside its source {src}: the source "
                             "would read the copy as images. Write it elsewhere.")
        items, class_names, splits = _folder_items(src, out)
        settings = dict(format=FORMAT, source={"folder": src}, short_side=short_side,
                        jpeg_quality=jpeg_quality)
    else:
        from keras_reluvit.data.tfds import builder

        b = builder(source, data_dir, manual_dir)
        class_names = class_folders(b.info.features["label"].names)
        splits = {name: s.num_examples for name, s in b.info.splits.items()}
        items = _tfds_items(b, out, class_names)
        settings = dict(format=FORMAT, source={"tfds": source, "version": str(b.info.version)},
                        short_side=short_side, jpeg_quality=jpeg_quality,
                        class_names=class_names, splits=splits)
    total = sum(splits.values())
    with _locked(out):
        manifest = _start(out, settings)
        images, partials = _files(out)
        if folder:  # the copy follows its source: what it no longer has goes
            expected = {path for _, path in items}
            stale = [path for path in images if path not in expected]
            items = [(None if _current(src_path, path) else src_path, path)
                     for src_path, path in items]  # None: up to date
            todo = sum(src_path is not None for src_path, _ in items)
        else:  # a tfds version does not change: only files gone from the copy
            manifest["data_dir"] = b.data_dir  # where it was read from (not compared)
            stale, todo = [], max(0, total - len(images))
        if manifest.get("complete") and not stale and not todo:
            say(f"{out} holds the complete copy already ({total} images): "
                "nothing to do.")
            return manifest
        if manifest.get("complete"):
            say(f"{out}: the copy is behind its source ({todo} image(s) to "
                f"write, {len(stale)} to remove): updating it")
        manifest.update(complete=False, class_names=class_names, splits=splits)
        _write_json(os.path.join(out, MANIFEST), manifest)
        _remove(out, partials + stale)
        say(f"writing the compact copy of {source} into {out} (shorter side "
            f"<= {short_side} px, JPEG quality {jpeg_quality}; {total} images)")
        from PIL import Image

        limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # data sets are trusted
        try:
            counts = _write_all(items, total, short_side, jpeg_quality,
                                workers or os.cpu_count() or 1, progress)
        finally:
            Image.MAX_IMAGE_PIXELS = limit
        manifest.update(complete=True, written=counts)
        manifest["bytes"] = _size(out)
        _write_json(os.path.join(out, MANIFEST), manifest)
    say(f"{out} is complete: {json.dumps(counts)}, "
        f"{manifest['bytes'] / 1e6:,.1f} MB")
    if not folder:
        from keras_reluvit.data.tfds import SPLITS

        train = SPLITS.get(source, ("train",))[0]
        if train not in (None, "train"):  # the copy's train/ is the whole split
            say(f"`train --dataset {out}` trains on all of train/ (the tfds "
                f"set's own runs train on {train}: big_vision's split)")
    return manifest


def _check(short_side, jpeg_quality, workers):
    for name, value, low, high in (("short_side", short_side, 16, 4096),
                                   ("jpeg_quality", jpeg_quality, 1, 100),
                                   ("workers", 1 if workers is None else workers, 1, 1024)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be an integer, got "
                             f"{value!r}.")
        if not low <= value <= high:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) must be in [{low}, {high}], "
                             f"got {value}.")
    return int(short_side), int(jpeg_quality)


def _folder_items(src, out):
    """(items, class names, {split: count}) of a folder of images: every
    image (`folders.ImageFolder`'s checks: classes, formats) with its path
    in the copy."""
    found = folders.ImageFolder(src, val_fraction=0.0)
    items, splits = [], {}
    for split, (paths, _) in found.splits.items():
        splits[split] = len(paths)
        items += [(path, os.path.join(out, os.path.relpath(path, src))) for path in paths]
    return items, list(found.class_names), splits


def _current(src, path):
    """Whether the copy's `path` is up to date with its source file `src`
    (written after the source's last change, as make decides)."""
    try:
        return os.stat(path).st_mtime_ns >= os.stat(src).st_mtime_ns
    except FileNotFoundError:
        return False


def _files(out):
    """The copy's image files and the files a killed run left half written
    (`NAME.partial`), in one walk (the manifest and the lock are neither)."""
    images, partials = [], []
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.endswith(_PARTIAL):
                partials.append(os.path.join(dirpath, name))
            elif not name.startswith("."):
                images.append(os.path.join(dirpath, name))
    return images, partials


def _remove(out, paths):
    """Removes `paths`, then the folders left empty (an empty class folder
    is an error to the readers)."""
    for path in paths:
        os.remove(path)
    if paths:
        for dirpath, _, _ in sorted(os.walk(out), key=lambda w: -len(w[0])):
            if dirpath != out and not os.listdir(dirpath):
                os.rmdir(dirpath)


@contextlib.contextmanager
def _locked(out):
    """Holds `out/.compact-copy.lock` (one writer at a time: a second is an
    error naming the folder); creates `out`."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{out} is a file: the copy is written into a folder.")
    if os.path.isdir(out) and not os.path.exists(os.path.join(out, MANIFEST)) and [
            name for name in os.listdir(out) if name != LOCK]:
        raise ValueError(f"{out} is not empty and holds no compact copy: write the copy into "
                         "a new folder.")
    try:
        os.makedirs(out, exist_ok=True)
        f = open(os.path.join(out, LOCK), "w")
    except OSError as e:
        raise ValueError(f"{out} cannot be made a folder ({e.strerror}).") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(f"{out} is being written by another `keras-reluvit prepare` "
                             "(it holds the lock): wait for it, or stop it.") from None
        yield


def _tfds_items(b, out, names):
    """(encoded bytes, path in the copy) of every example of every split of
    the tfds builder `b`, in tfds' order (read lazily); `names`: the class
    folders (`class_folders`)."""
    tfds = lazy.tensorflow_datasets()
    decoders = None
    if isinstance(b.info.features["image"], tfds.features.Image):
        decoders = {"image": tfds.decode.SkipDecoding()}
    for split in b.info.splits:
        ds = b.as_dataset(split=split, shuffle_files=False, decoders=decoders)
        for i, example in enumerate(ds.as_numpy_iterator()):
            path = os.path.join(out, split, names[int(example["label"])], f"{i:08d}.jpg")
            if not os.path.exists(path):
                yield example["image"], path
            else:
                yield None, path


def class_folders(label_names):
    """The folder of each label of a tfds set, in label order: its name, made
    a folder name (path separators and NUL as `_`, no surrounding spaces,
    no leading dot); all prefixed with their label (`00007_name`) where two
    would be the same folder."""
    names = []
    for name in label_names:
        name = str(name).replace(os.sep, "_").replace("\0", "_").strip()
        names.append("_" + name if name in ("", ".", "..") or name.startswith(".") else name)
    if len(set(names)) != len(names):
        names = [f"{i:05d}_{n}" for i, n in enumerate(names)]
    return names


def _start(out, settings):
    """The copy's manifest: a new one (written before any image), or the one
    in `out` when it was written from the same source with the same
    settings (to resume or bring up to date); another source or other
    settings are an error naming each difference."""
    path = os.path.join(out, MANIFEST)
    if os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
        diffs = [f"{k}: {manifest.get(k)!r} there, {v!r} now"
                 for k, v in settings.items() if json.loads(json.dumps(v)) != manifest.get(k)]
        if "source" in dict(d.split(":", 1) for d in diffs):
            raise ValueError(f"{out} holds the compact copy of another source ({diffs[0]}): "
                             "write this copy into another folder, or remove that one.")
        if diffs:
            raise ValueError(f"{out} holds a compact copy made with other settings ("
                             + "; ".join(d if len(d) < 300 else d[:300] + " ..." for d in diffs)
                             + "): write the copy into another folder, or remove this one.")
        if not manifest.get("complete"):
            say(f"resuming the compact copy in {out}")
        return manifest
    manifest = dict(settings, complete=False)
    _write_json(path, manifest)
    return manifest


def _write_json(path, record):
    partial = path + _PARTIAL
    with open(partial, "w") as f:
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def _write_all(items, total, short_side, quality, workers, progress):
    """Writes every (source, path) of `items` (source: a file, encoded bytes,
    or None where the copy is up to date) with `workers` threads, at most
    4 x workers images in flight (a source larger than memory streams);
    returns the counts: resized, re-encoded, copied (bytes kept), present
    (written by an earlier run)."""
    counts = dict(resized=0, encoded=0, copied=0, present=0)
    bar = _bar(total, progress)
    made = set()

    def one(item):
        data, path = item
        if data is None:
            return "present"
        name = data if isinstance(data, str) else path
        if isinstance(data, str):
            with open(data, "rb") as f:
                data = f.read()
        out, how = compact_jpeg(data, short_side, quality, name=name)
        partial = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + _PARTIAL)
        with open(partial, "wb") as f:
            f.write(out)
        os.replace(partial, path)
        return how

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        pending = set()
        try:
            for item in items:
                parent = os.path.dirname(item[1])
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                pending.add(pool.submit(one, item))
                if len(pending) >= 4 * workers:
                    pending = _collect(pending, counts, bar, concurrent.futures.FIRST_COMPLETED)
            _collect(pending, counts, bar, concurrent.futures.ALL_COMPLETED)
        except BaseException:  # Ctrl-C, an unreadable image: what runs ends, the rest not
            for future in pending:
                future.cancel()
            raise
        finally:
            bar.close()
    return counts


def _collect(pending, counts, bar, when):
    done, pending = concurrent.futures.wait(pending, return_when=when)
    for future in done:
        counts[future.result()] += 1
        bar.update(1)
    return pending


def compact_jpeg(data, short_side, quality, name="image"):
    """The copy of one encoded image (`data`: bytes): `(jpeg bytes, how)`,
    how one of "resized", "encoded", "copied" (the module docstring)."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        w, h = image.size
        scale = short_side / min(w, h)
        if scale >= 1 and image.format == "JPEG" and image.mode in ("RGB", "L") and not (
                image.info.get("progressive") or image.info.get("progression")):
            image.load()  # decodes: a truncated or corrupt body is an error here, not in training
            return data, "copied"
        if scale < 1:
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            if image.format == "JPEG":  # decode at the DCT scale that keeps 2x the target
                image.draft(image.mode, (2 * size[0], 2 * size[1]))
        image = _rgb(image)
        how = "encoded"
        if scale < 1:
            image = image.resize(size, Image.Resampling.BOX)
            how = "resized"
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"{name}: cannot be read as an image ({e}).") from None
    return buffer.getvalue(), how


def _rgb(image):
    """`image` in RGB (or gray: "L") as TensorFlow's decoders give it
    (channels=3): 16-bit values scaled to 8 bits (their high byte), alpha
    dropped, CMYK and palettes converted; an animation's first frame."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        array = np.asarray(image).astype("int64")
        array = array >> 8 if array.max(initial=0) > 255 or image.mode != "I" else array
        image = Image.fromarray(np.clip(array, 0, 255).astype("uint8"), "L")
    elif image.mode == "LA":
        image = image.convert("L")
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.asarray(image), 0, 255).astype("uint8"), "L")
    return image if image.mode == "L" else image.convert("RGB")


def _bar(total, progress):
    if progress:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="img", file=sys.stderr, smoothing=0.05)
        except ImportError:
            pass
    return _Lines(total, progress)


class _Lines:
    """A progress line every 10 seconds, where tqdm is missing."""

    def __init__(self, total, on):
        self.total, self.on, self.n, self.last = total, on, 0, time.monotonic()

    def update(self, n):
        self.n += n
        if self.on and time.monotonic() - self.last > 10:
            self.last = time.monotonic()
            print(f"keras_reluvit: {self.n}/{self.total} images", file=sys.stderr, flush=True)

    def close(self):
        pass


def _size(out):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
