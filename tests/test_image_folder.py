"""Folders of images as a data source (`keras_reluvit.image_folder`,
`kr.data.load(DIR)`): layouts, the seeded hold-out, every format, and a
clear error for every bad folder. TensorFlow-only code (tf.data): collected
in the TensorFlow suite."""

import os

import numpy as np
import pytest
from PIL import Image

import keras_reluvit as kr
from keras_reluvit import image_folder
from keras_reluvit.data.folders import ImageFolder
from keras_reluvit.data.folders import ImageFolderError

pytestmark = pytest.mark.backend_independent


def write(path, color=(200, 30, 30), size=(12, 9), fmt="PNG", mode="RGB"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, color).convert(mode).save(path, fmt)
    return path


def test_flat_layout_holds_out_a_seeded_share_of_each_class(tmp_path):
    for c in ("b_dog", "a_cat"):
        for i in range(10):
            write(str(tmp_path / c / f"{i}.png"))
    folder = ImageFolder(tmp_path, val_fraction=0.2, seed=1)
    assert folder.class_names == ["a_cat", "b_dog"]  # sorted: label i = i-th name
    assert folder.num_examples("train") == 16 and folder.num_examples("val") == 4
    train, val = folder.splits["train"], folder.splits["validation"]
    assert not set(train[0]) & set(val[0])
    assert np.bincount(val[1]).tolist() == [2, 2]  # per class
    assert ImageFolder(tmp_path, val_fraction=0.2, seed=1).splits["validation"][0] == val[0]
    assert ImageFolder(tmp_path, val_fraction=0.2, seed=2).splits["validation"][0] != val[0]
    assert "validation" not in ImageFolder(tmp_path, val_fraction=0.0).splits


def test_split_folders_and_every_format_decode_to_rgb(tmp_path, capsys):
    """train/ + val/ are the splits; JPEG, PNG (grey, RGBA), BMP, GIF and WebP
    all decode to 3 channels with the right colour; hidden files are skipped
    with one printed line."""
    formats = [("jpg", "JPEG", "RGB"), ("png", "PNG", "L"), ("png", "PNG", "RGBA"),
               ("bmp", "BMP", "RGB"), ("gif", "GIF", "P"), ("webp", "WEBP", "RGB")]
    for split in ("train", "val"):
        for c, color in (("red", (250, 0, 0)), ("blue", (0, 0, 250))):
            for i, (ext, fmt, mode) in enumerate(formats):
                write(str(tmp_path / split / c / f"{i}.{ext}"), color, fmt=fmt,
                      mode=mode if c == "red" else "RGB")
    (tmp_path / "train" / "red" / ".DS_Store").write_bytes(b"\0\1")
    train, val, info = kr.data.load(str(tmp_path), batch_size=4, image_size=8,
                                    preprocessing={"mean": 0.0, "std": 1.0 / 255})
    assert "skipped 1 hidden" in capsys.readouterr().err
    assert info.label_names == ["blue", "red"] and info.num_classes == 2
    assert len(train) == 12 // 4
    images, labels = [], []
    for x, y in val:
        images.append(np.asarray(x))
        labels.append(np.asarray(y))
    x, y = np.concatenate(images), np.concatenate(labels).argmax(1)
    assert x.shape == (12, 8, 8, 3)
    red = x[y == 1].mean(axis=(1, 2))  # 0-255 (mean 0, std 1/255)
    grey = red[1]  # the grey PNG: R = G = B
    assert abs(grey[0] - grey[1]) < 2 and abs(grey[1] - grey[2]) < 2
    for i in (0, 2, 3, 4, 5):
        assert red[i][0] > 200 and red[i][2] < 40, (formats[i], red[i])


def test_transparent_images_follow_the_recipes_alpha_rule(tmp_path):
    """Half-transparent red PNGs, through the training and the evaluation
    pipeline: composited onto white (`alpha="white"`, transformers'
    `convert_to_rgb`: Pillow's `alpha_composite`) or the alpha channel
    dropped (`"drop"`, PIL's `convert("RGB")`), as the model's recipe says."""
    for split in ("train", "val"):
        for c, color in (("red", (250, 0, 0, 128)), ("blue", (0, 0, 250, 255))):
            for i in range(2):
                path = tmp_path / split / c / f"{i}.png"
                os.makedirs(path.parent, exist_ok=True)
                Image.new("RGBA", (12, 9), color).save(path)
    white = np.asarray(Image.alpha_composite(Image.new("RGBA", (1, 1), (255,) * 4),
                                             Image.new("RGBA", (1, 1), (250, 0, 0, 128))))
    want = {"white": white[0, 0, :3].astype("float64"), "drop": np.array([250.0, 0.0, 0.0])}
    for rule, rgb in want.items():
        train, val, info = kr.data.load(str(tmp_path), batch_size=4, image_size=8,
                                        preprocessing={"mean": 0.0, "std": 1.0 / 255,
                                                       "alpha": rule})
        for ds in (train, val):
            x, y = (np.concatenate(a) for a in zip(*[(np.asarray(a), np.asarray(b))
                                                     for a, b in ds]))
            red = x[y.argmax(1) == info.label_names.index("red")]
            np.testing.assert_allclose(red.reshape(-1, 3).mean(0), rgb, atol=0.6, err_msg=rule)


@pytest.mark.parametrize("case,match", [
    ("missing", "is not a folder"),
    ("empty", "is empty"),
    ("one_class", "one class"),
    ("loose_files", "no class sub-folders"),
    ("beside", "lies beside the class folders"),
    ("not_an_image", "notes.txt is not an image"),
    ("empty_class", "has no images"),
    ("val_class", "classes that train/ lacks"),
    ("val_only", "no train/ folder"),
])
def test_bad_folders_get_errors_naming_the_problem(tmp_path, case, match):
    root = tmp_path / "data"
    root.mkdir()
    if case == "one_class":
        write(str(root / "cat" / "0.png"))
    elif case == "loose_files":
        write(str(root / "0.png"))
    elif case == "beside":
        write(str(root / "cat" / "0.png"))
        write(str(root / "dog" / "0.png"))
        write(str(root / "stray.png"))
    elif case == "not_an_image":
        write(str(root / "cat" / "0.png"))
        write(str(root / "dog" / "0.png"))
        (root / "dog" / "notes.txt").write_text("a label must never pass silently")
    elif case == "empty_class":
        write(str(root / "cat" / "0.png"))
        (root / "dog").mkdir()
    elif case == "val_class":
        for c in ("cat", "dog"):
            write(str(root / "train" / c / "0.png"))
        write(str(root / "val" / "eel" / "0.png"))
    elif case == "val_only":
        write(str(root / "val" / "cat" / "0.png"))
    path = tmp_path / "nowhere" if case == "missing" else root
    with pytest.raises(ImageFolderError, match=match):
        ImageFolder(path)
    if case != "missing":  # the data source and the CLI say the same
        with pytest.raises(ValueError, match=match):
            kr.data.load(str(path), batch_size=1, image_size=8)


def test_cli_errors_for_folders_and_heads(tmp_path, capsys):
    """The command line: a bad folder, a batch larger than the folder, a
    weights file that stores no architecture as --init, and a linear probe
    without a checkpoint -- exit code 2 and one line naming the problem."""
    from keras_reluvit import cli

    root = tmp_path / "data"
    for c in ("cat", "dog"):
        for i in range(3):
            write(str(root / c / f"{i}.png"))
    (root / "dog" / "x.txt").write_text("no")
    assert cli.main(["train", "--dataset", str(root), "--output", str(tmp_path / "r")]) == 2
    assert "x.txt is not an image" in capsys.readouterr().err
    os.remove(root / "dog" / "x.txt")
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=16,
                   num_classes=5, include_top=False)
    model.save_weights(tmp_path / "m.weights.h5")
    assert cli.main(["train", "--dataset", str(root), "--init", str(tmp_path / "m.weights.h5"),
                     "--recipe", "bv_transfer", "--batch-size", "2",
                     "--output", str(tmp_path / "r")]) == 2
    assert "stores no architecture" in capsys.readouterr().err
    assert cli.main(["train", "--dataset", str(root), "--trainable", "head",
                     "--output", str(tmp_path / "r")]) == 2
    assert "pass init=" in capsys.readouterr().err
    assert cli.main(["train", "--dataset", str(root), "--batch-size", "64",
                     "--output", str(tmp_path / "r")]) == 2
    assert "fewer than one batch" in capsys.readouterr().err
    assert cli.main(["predict", str(tmp_path / "m.weights.h5"), str(tmp_path / "none")]) == 2


def test_a_features_only_checkpoint_gets_no_linear_probe(tmp_path):
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=16,
                   include_top=False)
    with pytest.raises(ValueError, match="no classifier head"):
        kr.finetune.set_trainable(model, "head")


def test_sample_folder_is_real_photographs_in_every_format(tmp_path):
    root = image_folder.sample_folder(tmp_path / "s", classes=("cat", "rocket"), per_class=12)
    names = sorted(os.listdir(os.path.join(root, "cat")))
    assert {n.rsplit(".", 1)[1] for n in names} == {"jpg", "png", "bmp", "gif", "webp"}
    assert ImageFolder(root).class_names == ["cat", "rocket"]
    with pytest.raises(ValueError, match="No sample photograph"):
        image_folder.sample_folder(tmp_path / "t", classes=("zebra",))
