"""The compact copy (`kr.data.compact_copy`, `keras-reluvit prepare --out`):
what each image becomes (against TensorFlow's own decoding and resizing of
the original), odd images, the class order, resuming after a stop or a
SIGKILL, and an error for every bad setting. TensorFlow-only code: once."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_reluvit as kr
from keras_reluvit.data import compact
from keras_reluvit.data.folders import ImageFolder
from keras_reluvit.data.folders import ImageFolderError

pytestmark = pytest.mark.backend_independent
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def photo(name):
    from skimage import data

    return getattr(data, name)()


def tf_decode(path):
    data = tf.io.read_file(path)
    return tf.io.decode_image(data, channels=3, expand_animations=False).numpy()


def odd_folder(root):
    """Two classes of photographs, every odd kind of image the readers take."""
    rng = np.random.default_rng(0)
    cat, coffee = photo("chelsea"), photo("coffee")  # 300 x 451, 400 x 600
    os.makedirs(f"{root}/cat"), os.makedirs(f"{root}/coffee")
    Image.fromarray(cat).save(f"{root}/cat/big.jpg", quality=95)
    Image.fromarray(cat).convert("CMYK").save(f"{root}/cat/cmyk.jpg", quality=95)
    Image.fromarray(cat[::4, ::4]).save(f"{root}/cat/small.jpg", quality=80)  # 75 x 113: kept
    Image.fromarray(cat[::4, ::4]).save(f"{root}/cat/small_prog.jpg", quality=80,
                                        progressive=True)
    Image.fromarray(cat[::3, ::3, 1]).save(f"{root}/cat/gray.png")
    Image.fromarray(cat.transpose(1, 0, 2)).save(f"{root}/cat/portrait.jpg", quality=95)
    Image.fromarray(cat[:96, :150]).save(f"{root}/cat/at_bound.jpg", quality=90)  # kept
    Image.fromarray(cat[::4, ::4, 0]).save(f"{root}/cat/small_gray.jpg", quality=90)  # kept
    Image.fromarray(cat[::4, ::4]).convert("CMYK").save(f"{root}/cat/small_cmyk.jpg")
    gray16 = (coffee[::3, ::3, 0].astype("uint16") * 257 + rng.integers(0, 257, (134, 200)))
    Image.fromarray(gray16.astype("uint16")).save(f"{root}/coffee/gray16.png")
    dark16 = (coffee[::5, ::5, 0] // 2).astype("uint16")  # <= 127 of 65,535: nearly black
    Image.fromarray(dark16).save(f"{root}/coffee/dark16.png")
    rgba = Image.fromarray(coffee).convert("RGBA")
    rgba.putalpha(128)
    rgba.save(f"{root}/coffee/rgba.png")
    Image.fromarray(coffee).save(f"{root}/coffee/big.webp", quality=90)
    Image.fromarray(coffee[::2, ::2]).convert("P").save(f"{root}/coffee/palette.gif")
    Image.fromarray(coffee[::5, ::5]).save(f"{root}/coffee/small.bmp")  # 80 x 120
    return root


def test_each_image_is_a_bounded_jpeg_of_what_tensorflow_decodes(tmp_path):
    """Larger than the bound: resized so the shorter side is the bound (the
    aspect kept), near TensorFlow's area resize of its own decoding; within
    it: a baseline JPEG's bytes kept, anything else encoded at the quality,
    near TensorFlow's decoding (mean 0-5.3 levels here: JPEG's error on
    these aliased, detailed images; a flip, swapped channels, 16-bit values
    clipped or CMYK inverted: > 20)."""
    src = odd_folder(str(tmp_path / "src"))
    out = str(tmp_path / "copy")
    manifest = compact.compact_copy(src, out, short_side=96, jpeg_quality=95, progress=False)
    assert manifest["complete"] and manifest["written"] == dict(
        resized=8, encoded=4, copied=3, present=0)
    # kept: small, at_bound, small_gray; encoded: small_prog, small_cmyk, small.bmp, dark16
    assert manifest["class_names"] == ["cat", "coffee"]
    files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out)
                   for f in fs if not f.startswith("."))
    assert files == sorted(os.path.relpath(os.path.join(d, f), src)
                           for d, _, fs in os.walk(src) for f in fs)
    for name in files:
        original, copied = tf_decode(os.path.join(src, name)), tf_decode(os.path.join(out, name))
        assert Image.open(os.path.join(out, name)).format == "JPEG", name
        (h, w), (ch, cw) = original.shape[:2], copied.shape[:2]
        if min(h, w) > 96:
            assert min(ch, cw) == 96 and abs(cw / ch - w / h) < 1.5 / min(ch, cw), name
            reference = tf.image.resize(original, (ch, cw), "area").numpy()
        else:
            assert (ch, cw) == (h, w), name
            reference = original
        diff = np.abs(copied.astype(float) - reference)
        assert diff.mean() < 6, (name, diff.mean())  # flips, channels, 16-bit: > 20
    for name in ("small.jpg", "at_bound.jpg", "small_gray.jpg"):
        with open(os.path.join(src, "cat", name), "rb") as a, open(os.path.join(out, "cat", name),
                                                                     "rb") as b:
            assert a.read() == b.read(), name


def test_a_held_out_split_and_the_pipelines_read_the_copy_as_the_source(tmp_path):
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=8, size=(40, 120))
    out = str(tmp_path / "copy")
    compact.compact_copy(src, out, short_side=48, progress=False)
    a, b = ImageFolder(src, val_fraction=0.25, seed=3), ImageFolder(out, val_fraction=0.25,
                                                                     seed=3)
    assert a.class_names == b.class_names
    for split in ("train", "validation"):
        assert [os.path.relpath(p, src) for p in a.splits[split][0]] == [
            os.path.relpath(p, out) for p in b.splits[split][0]]
        assert a.splits[split][1].tolist() == b.splits[split][1].tolist()
    train, val, info = kr.data.load(out, batch_size=4, image_size=32, val_fraction=0.25, seed=3)
    x, y = next(iter(train))
    assert x.shape == (4, 32, 32, 3) and info.label_names == a.class_names


@pytest.mark.parametrize("split_folders", [False, True])
def test_the_class_order_is_the_copy_manifests(tmp_path, split_folders):
    """A tfds set's label order need not be its names' sorted order: the
    manifest's order gives the labels (with split folders too); a class
    folder it lacks is an error."""
    for c in ("a", "b"):
        for split in ("train", "val") if split_folders else ("",):
            os.makedirs(tmp_path / split / c)
            Image.new("RGB", (8, 8), (10, 200, 30)).save(tmp_path / split / c / "0.jpg")
    record = dict(class_names=["b", "a", "c"], complete=True)
    (tmp_path / compact.MANIFEST).write_text(json.dumps(record))
    folder = ImageFolder(tmp_path, val_fraction=0.0)
    assert folder.class_names == ["b", "a", "c"]
    for paths, labels in folder.splits.values():
        assert {os.path.basename(os.path.dirname(p)): int(k) for p, k in zip(paths, labels)} == {
            "b": 0, "a": 1}
    (tmp_path / compact.MANIFEST).write_text(json.dumps(dict(record, class_names=["b", "c"])))
    with pytest.raises(ImageFolderError, match=r"lacks the class folders \['a'\]"):
        ImageFolder(tmp_path, val_fraction=0.0)


def test_a_tfds_set_keeps_its_labels_and_splits(tmp_path, monkeypatch, capsys):
    """Its splits and label order; where the set's own runs train on part of
    its train split (big_vision's, e.g. imagenet2012's train[:99%]), one
    line says the copy's train/ is all of it."""
    from keras_reluvit.data import tfds as kr_tfds

    monkeypatch.setitem(kr_tfds.SPLITS, "sklearn_digits", ("train[:90%]", None, "test"))
    out = str(tmp_path / "digits")
    manifest = compact.compact_copy("sklearn_digits", out, short_side=16, progress=False)
    assert "trains on all of train/ (the tfds set's own runs train on train[:90%]" in (
        capsys.readouterr().err)
    import tensorflow_datasets as tfds

    b = kr.data.builder("sklearn_digits")
    assert manifest["splits"] == {k: v.num_examples for k, v in b.info.splits.items()}
    folder = ImageFolder(out)
    assert folder.class_names == b.info.features["label"].names
    labels = [int(e["label"]) for e in tfds.as_numpy(b.as_dataset("test", shuffle_files=False))]
    paths, got = folder.splits["test"]
    order = np.argsort([os.path.basename(p) for p in paths])  # NNNNNNNN.jpg: tfds' order
    assert got[order].tolist() == labels


def test_a_stopped_copy_is_refused_then_resumed_to_the_same_bytes(tmp_path):
    """Stopped by an unreadable image: the readers refuse the unfinished copy;
    the same call, the image fixed, writes only what is missing (a half
    written file of a killed run removed) and ends with the bytes of an
    uninterrupted copy."""
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=10, size=(60, 140))
    whole = str(tmp_path / "whole")
    compact.compact_copy(src, whole, short_side=64, progress=False)
    bad = os.path.join(src, "rocket", "rocket_005.jpg")
    with open(bad, "rb") as f:
        good = f.read()
    with open(bad, "wb") as f:
        f.write(good[:200])  # a JPEG header, its body cut
    out = str(tmp_path / "copy")
    with pytest.raises(ValueError, match="rocket_005.jpg: cannot be read"):
        compact.compact_copy(src, out, short_side=64, workers=1, progress=False)
    with pytest.raises(ImageFolderError, match="unfinished compact copy"):
        ImageFolder(out)
    partial = os.path.join(out, "rocket", ".rocket_009.jpg" + compact._PARTIAL)
    with open(partial, "wb") as f:
        f.write(b"\xff\xd8\xff half")
    with open(bad, "wb") as f:
        f.write(good)
    manifest = compact.compact_copy(src, out, short_side=64, workers=1, progress=False)
    assert manifest["complete"] and 0 < manifest["written"]["present"] < 30
    assert not os.path.exists(partial)
    for d, _, fs in os.walk(whole):
        for name in fs:
            rel = os.path.relpath(os.path.join(d, name), whole)
            if name != compact.MANIFEST:
                with open(os.path.join(d, name), "rb") as a, open(os.path.join(out, rel),
                                                                   "rb") as b:
                    assert a.read() == b.read(), rel


def test_ctrl_c_and_sigkill_midway_then_the_same_command_finishes(tmp_path):
    src = str(tmp_path / "src")
    os.makedirs(f"{src}/a"), os.makedirs(f"{src}/b")
    big = np.asarray(Image.fromarray(photo("astronaut")).resize((1024, 1024)))
    for i in range(120):
        Image.fromarray(np.roll(big, 7 * i, axis=1)).save(f"{src}/{'ab'[i % 2]}/{i:03d}.jpg",
                                                          quality=95)
    out = str(tmp_path / "copy")
    command = [sys.executable, "-m", "keras_reluvit_cli", "prepare", src, "--out", out,
               "--short-side", "64", "--workers", "1", "--quiet"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    for stop, at in ((signal.SIGINT, 5), (signal.SIGKILL, 15)):
        p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            written = sum(len(fs) for d, _, fs in os.walk(out) if d != out)
            if written >= at:
                break
            time.sleep(0.05)
        p.send_signal(stop)
        output = p.communicate()[0].decode()
        if stop == signal.SIGINT:  # Ctrl-C: one line saying how to finish, no traceback
            assert p.returncode == 130, output[-2000:]
            assert "prepare stopped (Ctrl-C)" in output and "Traceback" not in output, output
        else:
            assert p.returncode == -signal.SIGKILL, output[-2000:]
    manifest = json.loads(open(os.path.join(out, compact.MANIFEST)).read())
    assert not manifest["complete"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["splits"] == {"train": 120}
    manifest = json.loads(open(os.path.join(out, compact.MANIFEST)).read())
    assert manifest["complete"] and manifest["written"]["present"] >= 10
    folder = ImageFolder(out, val_fraction=0.0)
    assert folder.num_examples("train") == 120
    for path in folder.splits["train"][0]:
        assert Image.open(path).size == (64, 64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(short_side=0), r"short_side \(--[a-z-]*\) must be in \[16, 4096\], got 0"),
    (dict(short_side=-1), r"short_side \(--[a-z-]*\) must be in \[16, 4096\], got -1"),
    (dict(short_side=5000), r"short_side \(--[a-z-]*\) must be in \[16, 4096\], got 5000"),
    (dict(short_side=64.5), r"short_side \(--[a-z-]*\) must be an integer, got 64.5"),
    (dict(jpeg_quality=0), r"jpeg_quality \(--[a-z-]*\) must be in \[1, 100\], got 0"),
    (dict(jpeg_quality=101), r"jpeg_quality \(--[a-z-]*\) must be in \[1, 100\], got 101"),
    (dict(jpeg_quality=True), r"jpeg_quality \(--[a-z-]*\) must be an integer, got True"),
    (dict(workers=0), r"workers \(--[a-z-]*\) must be in \[1, 1024\], got 0"),
])
def test_bad_settings_are_errors_naming_them(tmp_path, kwargs, message):
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=2, size=(20, 30))
    with pytest.raises(ValueError, match=message):
        compact.compact_copy(src, str(tmp_path / "copy"), progress=False, **kwargs)
    assert not os.path.exists(tmp_path / "copy")


def test_a_rerun_elsewhere_or_with_other_settings_is_an_error(tmp_path):
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=2, size=(20, 30))
    out = str(tmp_path / "copy")
    compact.compact_copy(src, out, short_side=24, progress=False)
    with pytest.raises(ValueError, match=r"other settings \(short_side: 24 there, 32 now; "
                                         r"jpeg_quality: 90 there, 80 now\)"):
        compact.compact_copy(src, out, short_side=32, jpeg_quality=80, progress=False)
    manifest = json.loads(open(os.path.join(out, compact.MANIFEST)).read())
    with open(os.path.join(out, compact.MANIFEST), "w") as f:  # as a stopped copy leaves it
        json.dump(dict(manifest, complete=False), f)
    with pytest.raises(ValueError, match=r"other settings \(short_side: 24 there, 32 now\)"):
        compact.compact_copy(src, out, short_side=32, progress=False)
    other = kr.image_folder.sample_folder(str(tmp_path / "other"), per_class=2, size=(20, 30))
    with pytest.raises(ValueError, match="holds the compact copy of another source"):
        compact.compact_copy(other, out, short_side=24, progress=False)
    with pytest.raises(ValueError, match="is not empty and holds no compact copy"):
        compact.compact_copy(src, str(tmp_path / "other"), progress=False)
    assert not os.path.exists(tmp_path / "other" / compact.LOCK)  # nothing written there
    with pytest.raises(ValueError, match="is not a folder of images"):
        compact.compact_copy(str(tmp_path / "missing"), str(tmp_path / "c2"), progress=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="cannot be made a folder"):
        compact.compact_copy(src, str(tmp_path / "afile" / "x"), progress=False)
    with pytest.raises(ValueError, match="is inside its source"):
        compact.compact_copy(src, os.path.join(src, "copy"), progress=False)


def test_class_folders_are_folder_names_and_distinct():
    assert compact.class_folders(["cat", "a/b", " x ", ".hidden", "..", ""]) == [
        "cat", "a_b", "x", "_.hidden", "_..", "_"]
    assert compact.class_folders(["a/b", "a_b", "c"]) == ["00000_a_b", "00001_a_b", "00002_c"]


def test_the_copy_follows_its_source_as_make_would(tmp_path):
    """A rerun after the source changed: an added image written, a replaced
    one written again, a removed one (and its empty class folder) removed, a
    file deleted from the copy written again; nothing else rewritten."""
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=3, size=(20, 30))
    out = str(tmp_path / "copy")
    compact.compact_copy(src, out, short_side=24, progress=False)
    for name in ("new.jpg", "cat_001.jpg"):
        Image.new("RGB", (30, 20), (200, 10, 10)).save(os.path.join(src, "cat", name))
    os.makedirs(os.path.join(src, "zebra"))
    Image.new("RGB", (30, 20)).save(os.path.join(src, "zebra", "z.jpg"))
    os.remove(os.path.join(src, "rocket", "rocket_002.jpg"))
    os.remove(os.path.join(out, "coffee", "coffee_000.jpg"))
    manifest = compact.compact_copy(src, out, short_side=24, progress=False)
    assert manifest["complete"] and manifest["written"]["present"] == 6  # 10 - 4 written
    assert manifest["class_names"] == ["cat", "coffee", "rocket", "zebra"]
    assert not os.path.exists(os.path.join(out, "rocket", "rocket_002.jpg"))
    assert tf_decode(os.path.join(out, "cat", "cat_001.jpg"))[10, 10, 0] > 150  # the new red
    assert ImageFolder(out, val_fraction=0.0).num_examples("train") == 10
    os.remove(os.path.join(src, "zebra", "z.jpg"))
    os.rmdir(os.path.join(src, "zebra"))
    manifest = compact.compact_copy(src, out, short_side=24, progress=False)
    assert not os.path.exists(os.path.join(out, "zebra"))  # an empty class: an error to readers
    assert ImageFolder(out, val_fraction=0.0).class_names == ["cat", "coffee", "rocket"]


def test_one_writer_at_a_time(tmp_path):
    import fcntl

    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=2, size=(20, 30))
    out = tmp_path / "copy"
    out.mkdir()
    with open(out / compact.LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match="is being written by another"):
            compact.compact_copy(src, str(out), progress=False)
    assert compact.compact_copy(src, str(out), progress=False)["complete"]


def test_compact_jpeg_names_an_unreadable_image():
    with pytest.raises(ValueError, match="x.png: cannot be read as an image"):
        compact.compact_jpeg(b"\x89PNG\r\n\x1a\n broken", 64, 90, name="x.png")
    buffer = io.BytesIO()
    Image.fromarray(photo("chelsea")[::8, ::8]).save(buffer, "JPEG")
    assert compact.compact_jpeg(buffer.getvalue(), 64, 90) == (buffer.getvalue(), "copied")
    with pytest.raises(ValueError, match="cut.jpg: cannot be read"):  # its header whole
        compact.compact_jpeg(buffer.getvalue()[:len(buffer.getvalue()) // 2], 64, 90, "cut.jpg")


def test_the_command_line_needs_out_for_a_copy(tmp_path, capsys):
    from keras_reluvit import cli

    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=2, size=(20, 30))
    assert cli.main(["prepare", src]) == 2
    assert "a folder needs --out" in capsys.readouterr().err
    for flag in ("--short-side", "--jpeg-quality", "--workers"):
        assert cli.main(["prepare", "sklearn_digits", flag, "64"]) == 2
        assert f"{flag} needs --out" in capsys.readouterr().err
    for flag, range_ in (("--short-side", "[16, 4096]"), ("--jpeg-quality", "[1, 100]"),
                         ("--workers", "[1, 1024]")):
        assert cli.main(["prepare", src, "--out", str(tmp_path / "c"), flag, "0"]) == 2
        name = flag[2:].replace("-", "_")
        assert f"{name} ({flag}) must be in {range_}, got 0" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert cli.main(["prepare", src, "--out", str(tmp_path / "file")]) == 2
    assert "is a file: the copy is written into a folder" in capsys.readouterr().err
    assert cli.main(["prepare", src, "--out", str(tmp_path / "c"), "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["splits"] == {"train": 6} and ImageFolder(record["out"]).num_classes == 3


def test_each_image_appears_whole_by_a_rename(tmp_path, monkeypatch):
    """Every image is written to a hidden partial file beside it and renamed:
    a stop leaves no half-written image under its own name."""
    src = kr.image_folder.sample_folder(str(tmp_path / "src"), per_class=3, size=(20, 60))
    renamed, replace = [], os.replace

    def checked(a, b):
        if not b.endswith(compact.MANIFEST):
            assert os.path.dirname(a) == os.path.dirname(b) and not os.path.exists(b), (a, b)
            assert os.path.basename(a).startswith(".") and a.endswith(compact._PARTIAL), a
            renamed.append(b)
        return replace(a, b)

    monkeypatch.setattr(os, "replace", checked)
    manifest = compact.compact_copy(src, str(tmp_path / "copy"), short_side=32, progress=False)
    assert len(renamed) == 9 == manifest["written"]["resized"] + manifest["written"]["encoded"] + \
        manifest["written"]["copied"]
