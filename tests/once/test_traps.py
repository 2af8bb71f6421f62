"""Traps a user who follows the docs word for word once fell into, each
reproduced as it happened (issue 49); the README's and docs/finetune.md's
own blocks are run by test_literal_reader.py, keywords by test_vit.py, the
alpha rule by test_preprocessing.py, the attention of `--init` by
test_checkpoints.py, torchrun off the torch backend by test_engines.py."""

import json

import numpy as np
import pytest

import keras_reluvit as kr
from keras_reluvit import cli
from keras_reluvit import image_folder


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """Real photographs, one folder per class, no val/: the held-out split is
    drawn by the seed."""
    root = tmp_path_factory.mktemp("flat") / "imgs"
    image_folder.sample_folder(str(root), per_class=10)
    return root


def last_json(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def test_eval_scores_the_images_the_run_held_out(flat, tmp_path, capsys):
    """`train --seed 3` on a flat folder, then `eval`: the run directory (or
    its model.keras) gives the run's split and reproduces the accuracy and
    loss the run reported; another --seed, whose held-out images include
    training images, is an error naming the overlap; a model outside a run
    says which split it scores. (Before: eval drew its own split with seed 0
    and scored training images.)"""
    out = tmp_path / "run"
    assert cli.main(["train", "--dataset", str(flat), "--seed", "3", "--epochs", "1",
                     "--batch-size", "9", "--output", str(out), "--quiet", "--no-export"]) == 0
    reported = last_json(capsys.readouterr().out)
    record = json.loads((out / "split.json").read_text())
    held_out = record["splits"]["validation"]
    assert len(held_out) == 3 and not set(held_out) & set(record["splits"]["train"])
    for source in (out, out / "model.keras"):
        assert cli.main(["eval", str(source)]) == 0
        captured = capsys.readouterr()
        scored = last_json(captured.out)
        assert scored["accuracy"] == pytest.approx(reported["accuracy"], abs=1e-6)
        assert scored["loss"] == pytest.approx(reported["loss"], rel=1e-5)
        assert "3 images held out by seed 3" in captured.err
    assert cli.main(["eval", str(out), "--seed", "0"]) == 2
    err = capsys.readouterr().err
    assert "were training images of" in err and "--seed 0" in err
    (tmp_path / "alone").mkdir()
    (out / "model.keras").rename(tmp_path / "alone" / "model.keras")
    assert cli.main(["eval", str(tmp_path / "alone" / "model.keras"), "--dataset", str(flat)]) == 0
    assert "no training run of this folder given" in capsys.readouterr().err


def test_eval_reports_the_runs_own_loss(flat, tmp_path, capsys):
    """A run whose recipe trains with big_vision's sigmoid cross-entropy is
    evaluated with that loss (before: always softmax cross-entropy): the
    reported loss equals the NumPy formula on the model's logits."""
    from keras_reluvit import data as kr_data

    out = tmp_path / "run"
    assert cli.main(["train", "--dataset", str(flat), "--epochs", "1", "--batch-size", "9",
                     "--output", str(out), "--quiet", "--no-export"]) == 0
    capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    config["recipe"] = "augreg_i21k"  # sigmoid_xent
    (out / "config.json").write_text(json.dumps(config))
    assert cli.main(["eval", str(out)]) == 0
    scored = last_json(capsys.readouterr().out)
    import keras

    model = keras.saving.load_model(str(out / "model.keras"), compile=False)
    d = kr_data.load(str(flat), 9, image_size=model.image_size, train_split=False,
                     preprocessing=model.preprocessing)
    z = np.concatenate([keras.ops.convert_to_numpy(model(x)) for x, _ in d.val]).astype("float64")
    y = np.concatenate([np.asarray(t) for _, t in d.val])
    xent = -(y * -np.logaddexp(0, -z) + (1 - y) * -np.logaddexp(0, z)).sum(-1).mean()
    assert scored["loss"] == pytest.approx(xent, rel=1e-4)
    assert abs(scored["loss"] - json.loads((out / "metrics.json").read_text())["final"]["loss"]) > 0.1


def test_a_batch_larger_than_the_folder_names_the_option_and_the_size(flat):
    with pytest.raises(ValueError, match=r"has 27 examples, fewer than one batch of 64: use a "
                                         r"smaller batch size \(batch_size=, keras-reluvit "
                                         r"train --batch-size\)"):
        kr.data.load(str(flat), 64, image_size=32)


def test_an_image_with_a_corrupt_body_is_named(flat, tmp_path, capsys):
    """A JPEG whose header is valid and whose body is cut: tf.data fails
    without a file name; training and `predict` on the folder name the file."""
    import shutil

    root = tmp_path / "imgs"
    shutil.copytree(flat, root)
    good = sorted((root / "cat").iterdir())[0].read_bytes()
    (root / "cat" / "zz_cut.jpg").write_bytes(good[:len(good) // 2])
    assert cli.main(["train", "--dataset", str(root), "--epochs", "1", "--batch-size", "9",
                     "--output", str(tmp_path / "run"), "--quiet", "--no-export"]) == 2
    err = capsys.readouterr().err
    assert "cannot be decoded" in err and "zz_cut.jpg" in err
    model = kr.ViT("Ti/16", image_size=32, depth=1, num_classes=3)
    model.save(tmp_path / "m.keras")
    assert cli.main(["predict", str(tmp_path / "m.keras"), str(root)]) == 2
    err = capsys.readouterr().err
    assert "cannot be decoded" in err and "zz_cut.jpg" in err
