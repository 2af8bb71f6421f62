"""One run's configuration as a user meets it (issue 70): every bad number an
error naming its flag before anything is written, timm's meaning for timm's
flags (smoothing without mixing into the loss, --warmup-epochs as given), a
rerun compared whole (every key of either side, the recipe field by field),
and what the recipes compile to (DeiT III's LAMB decay)."""

import dataclasses
import json
import re

import keras
import numpy as np
import pytest

from keras_reluvit import cli
from keras_reluvit.training import recipes
from keras_reluvit.training import run as T
from keras_reluvit.training.settings import RunSettings

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize("flags, named", [
    (["--epochs", "0"], "epochs (train --epochs) must be a whole number in [1, inf)"),
    (["--epochs", "-1"], "epochs (train --epochs) must be a whole number in [1, inf)"),
    (["--lr", "-1"], "lr (train --lr) must be a number in [0, inf)"),
    (["--lr", "nan"], "lr (train --lr) must be a number in [0, inf)"),
    (["--lr", "inf"], "lr (train --lr) must be a number in [0, inf)"),
    (["--clip-grad", "inf"], "grad_clip (train --grad-clip) must be a number in (0, inf)"),
    (["--seed", str(2**32)], "seed (train --seed) must be a whole number in [0, 4294967295]"),
    (["--drop-path", "1"], "drop_path (train --drop-path) must be a number in [0, 1)"),
    (["--batch-size", "0"], "batch_size (train --batch-size) must be a whole number in [1"),
    (["--image-size", "0"], "image_size (train --image-size) must be a whole number in [1"),
    (["--val-fraction", "1.5"], "val_fraction (train --val-fraction) must be a number in [0, 1)"),
    (["--val-fraction", "-0.1"], "val_fraction (train --val-fraction) must be a number in [0"),
    (["--smoothing", "1.0"], "smoothing (train --label-smoothing) must be a number in [0, 1)"),
    (["--layer-decay", "-1"], "layer_decay (train --layer-decay) must be a number in [0, 1]"),
    (["--layer-decay", "1.5"], "layer_decay (train --layer-decay) must be a number in [0, 1]"),
    (["--seed", "-1"], "seed (train --seed) must be a whole number in [0, 4294967295]"),
    (["--lora-rank", "0"], "lora_rank (train --lora-rank) must be a whole number in [1"),
    (["--aug-repeats", "-1"], "aug_repeats (train --aug-repeats) must be a whole number in [0"),
    (["--data-shards", "0"], "data_shards (train --data-shards) must be a whole number in [1"),
    (["--mixup-prob", "1.5"], "augment.timm_mix.prob (train --mix-prob) must be a number in "
                              "[0, 1]"),
    (["--clip-grad", "0"], "grad_clip (train --grad-clip) must be a number in (0, inf)"),
    (["--ema", "1"], "ema (train --ema) must be a number in [0, 1)"),
    (["--keep-checkpoints", "0"], "keep_checkpoints (train --keep-checkpoints) must be a whole "
                                  "number in [1"),
    (["--checkpoint-every", "-1"], "checkpoint_every (train --checkpoint-every) must be a whole "
                                   "number in [0"),
    (["--accum-steps", "0"], "accum_steps (train --accum-steps) must be a whole number in [1"),
    (["--steps-per-execution", "0"], "steps_per_execution (train --steps-per-execution) must be "
     "a whole number in [1"),
    (["--steps-per-execution", "-2"], "steps_per_execution (train --steps-per-execution) must be "
     "a whole number in [1"),
    (["--opt-eps", "0"], "opt_eps (train --opt-eps) must be a number in (0, inf)"),
    (["--weight-decay", "-0.05"], "weight_decay (train --weight-decay) must be a number in [0"),
    (["--warmup-epochs", "-1"], "warmup_epochs (train --warmup-epochs) must be a number in [0"),
    (["--mixup", "-0.2"], "augment.timm_mix.mixup_alpha (train --mixup-alpha) must be a number "
                          "in [0"),
    (["--reprob", "1.5"], "augment.erase (train --erase) must be a number in [0, 1]"),
    (["--color-jitter", "-0.4"], "augment.color_jitter (train --color-jitter) must be a number "
                                 "in [0"),
    (["--warmup-epochs", "30"], "warmup_epochs (train --warmup-epochs) 30.0 must be fewer than "
                                "the run's 30 epochs"),
    (["--epochs", "3", "--warmup-epochs", "3"], "warmup_epochs (train --warmup-epochs) 3.0 must "
                                                "be fewer than the run's 3 epochs"),
    (["--batch-size", "10", "--accum-steps", "3"], "accum_steps (train --accum-steps) 3 must "
                                                   "divide the batch size 10"),
    (["--image-size", "30"], "The run's model (Ti/8 at 30 px; train --model, --image-size or the "
                             "model flags): image_size (30, 30) is not divisible by the patch size 8"),
    (["--model", "vit_s16", "--image-size", "40"], "The run's model (S/16 at 40 px; train --model, "
                                                   "--image-size or the model flags): image_size "
                                                   "(40, 40) is not divisible by the patch size 16"),
    (["--val-fraction", "0.2"], "val_fraction (train --val-fraction) 0.2 holds out a share of an "
                                "image folder's classes; 'sklearn_digits' is a tfds"),
])
def test_a_bad_number_is_an_error_naming_its_flag_before_anything_is_written(
        flags, named, tmp_path, capsys):
    """Was: --epochs 0 trained the recipe's 30, --lr -1 trained to a loss of
    1e5, --epochs -1 wrote a model having trained nothing, --batch-size 0 a
    ZeroDivisionError, --image-size 0 the recipe's, --val-fraction 1.5 was
    ignored on a tfds set, --smoothing 1.0 accepted, --layer-decay -1 refused
    after config.json was written, --warmup-epochs past the run capped,
    --image-size 30 (patches of 8) refused by the model after the data set
    was read."""
    out = tmp_path / "run"
    assert cli.main(["train", "--output", str(out), "--no-export", *flags]) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert not out.exists()


def test_settings_are_checked_when_made():
    """The Python API: a RunSettings with a bad field cannot be made."""
    with pytest.raises(ValueError, match=r"epochs \(train --epochs\)"):
        RunSettings(epochs=2.5)
    with pytest.raises(ValueError, match=r"batch_size \(train --batch-size\)"):
        RunSettings(batch_size=True)
    with pytest.raises(ValueError, match=r"trainable='head' \(train --trainable\) fine-tunes"):
        RunSettings(trainable="head")
    with pytest.raises(ValueError, match=r"dataset \(train --dataset\) must be a string"):
        RunSettings(dataset=3)
    RunSettings(epochs=1, lr=0.0, val_fraction=0.0, layer_decay=1.0, ema=0.0)  # bounds


def test_val_fraction_holds_out_only_where_a_folder_has_no_split_folders(tmp_path):
    """Was: --val-fraction was ignored, unsaid, on a tfds set and on a
    folder with train/ + val/ (their own splits); it holds out a share of
    each class of a folder without them (default 0.1)."""
    def folder(root, classes=("a", "b")):
        for c in classes:
            (root / c).mkdir(parents=True)
            for i in range(4):
                (root / c / f"{i}.jpg").write_bytes(b"")
        return root

    flat = folder(tmp_path / "flat")
    assert T.build_config("digits", dataset=str(flat), batch_size=2).val_fraction == 0.1
    assert T.build_config("digits", dataset=str(flat), batch_size=2,
                          val_fraction=0.25).val_fraction == 0.25
    train_only = folder(tmp_path / "train_only" / "train").parent  # no validation at all
    with pytest.raises(ValueError, match=r"a folder without split folders; .*train_only has "
                       r"train/"):
        T.build_config("digits", dataset=str(train_only), batch_size=2, val_fraction=0.25)
    with pytest.raises(ValueError, match=r"0.25 holds out .* not a folder"):
        T.build_config("digits", dataset=str(tmp_path / "typo"), batch_size=2, val_fraction=0.25)
    split = tmp_path / "split"
    folder(split / "train"), folder(split / "val")
    assert T.build_config("digits", dataset=str(split), batch_size=2).val_fraction == 0.1
    with pytest.raises(ValueError, match=r"val_fraction \(train --val-fraction\) 0.25 holds out "
                       r"a share of a folder without split folders; .*split has train/, val/"):
        T.build_config("digits", dataset=str(split), batch_size=2, val_fraction=0.25)


def _loss_smoothing(recipe):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    loss, _ = recipes.loss_and_metrics(model, recipe)
    return loss.get_config()["label_smoothing"]


@pytest.mark.parametrize("recipe, overrides, smoothing", [
    # timm: --smoothing 0.1 --mixup 0 -> LabelSmoothingCrossEntropy(0.1)
    ("digits", {"smoothing": 0.1, "augment.timm_mix.mixup_alpha": 0.0}, 0.1),
    # DeiT's recipes mix with smoothing 0.1; without mixing it goes into the loss
    ("deit_s16_300ep", {"augment.timm_mix.mixup_alpha": 0.0,
                        "augment.timm_mix.cutmix_alpha": 0.0}, 0.1),
    ("deit_s16_300ep", {"smoothing": 0.2, "augment.timm_mix.mixup_alpha": 0.0,
                        "augment.timm_mix.cutmix_alpha": 0.0}, 0.2),
    # a flag that makes timm's MixUp from its defaults and turns it off adds no smoothing
    ("digits", {"augment.timm_mix.mixup_alpha": 0.0}, 0.0),
    # DeiT III's MixUp has none: nothing moves
    ("deit3_s16_400ep", {"augment.timm_mix.mixup_alpha": 0.0,
                         "augment.timm_mix.cutmix_alpha": 0.0}, 0.0),
    # mixing: the smoothing is the MixUp's, the loss has none (timm's SoftTargetCrossEntropy)
    ("deit_s16_300ep", {"smoothing": 0.2}, 0.0),
    ("digits", {"smoothing": 0.3, "augment.timm_mix.mixup_alpha": 0.8}, 0.0),
    # DeiT III's bce: timm's BinaryCrossEntropy(smoothing=) without mixing
    ("deit3_s16_400ep", {"smoothing": 0.1, "augment.timm_mix.mixup_alpha": 0.0,
                         "augment.timm_mix.cutmix_alpha": 0.0}, 0.1),
])
def test_smoothing_without_mixing_goes_into_the_compiled_loss(recipe, overrides, smoothing,
                                                              capsys):
    """Was: --smoothing 0.1 --mixup 0 trained with smoothing 0.0 while the
    printed lines said it was set; --mixup 0 --cutmix 0 dropped DeiT's 0.1."""
    config = T.build_config(RunSettings(recipe=recipe, dataset="d", batch_size=8,
                                        recipe_overrides=overrides))
    r = config.resolved_recipe
    assert _loss_smoothing(r) == pytest.approx(smoothing)
    mix = r["augment"].get("timm_mix")
    if "smoothing" in overrides and mix is not None:
        assert mix["label_smoothing"] == overrides["smoothing"]
    if smoothing:
        assert re.search(rf"the recipe's label_smoothing [0-9.]+ -> {smoothing}\b",
                         capsys.readouterr().err)


def test_warmup_epochs_given_is_the_warmup_the_run_compiles(tmp_path, digits_dir, capsys):
    """Was: --epochs 3 --warmup-epochs 2 warmed up 7 of 15 steps (capped at
    half the run) while the printed line said 2.0. The recipe's own warmup is
    still capped at half a short run, and says so."""
    config = tiny(digits_dir, epochs=3, recipe_overrides={"warmup_epochs": 2})
    model, metrics = T.train(config, tmp_path / "w", export=False, verbose=0)
    steps = metrics["optimizer_steps"] // 3
    schedule = model.optimizer._learning_rate  # the schedule object compiled
    assert schedule.warmup_steps == 2 * steps
    assert "warming up" not in capsys.readouterr().err
    r = recipes.get("digits")  # 60 warmup steps at batch 64
    lr, warmup, total = recipes.scaled(r, 64, steps_per_epoch=10, epochs=4)
    assert (warmup, total) == (20, 40)
    assert "the warmup of 60 steps is longer than 0.5 of the run (40 steps): warming up for " \
           "20 steps" in capsys.readouterr().err
    assert recipes.scaled(r, 64, 10, 4, warmup_cap=None)[1] == 39


def tiny(digits_dir, epochs=1, **kwargs):
    cfg = T.build_config(recipe="digits", epochs=epochs, data_dir=str(digits_dir),
                         batch_size=256, **kwargs)
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, width=16, depth=1, num_heads=1, mlp_dim=16))
    return cfg


def test_a_rerun_compares_every_key_of_either_side():
    """Keys only the earlier run has (a model built from a variant instead of
    the recipe's widths) and nested ones are named; the recipe is compared
    field by field, not how it was set."""
    before = {"epochs": 1, "model": {"variant": "Ti/8", "width": 96, "depth": 4},
              "recipe_overrides": {}, "recipe_resolved": {"grad_clip": 1.0, "lr": 2e-3}}
    now = {"epochs": 1, "model": {"variant": "Ti/8"}, "recipe_overrides": {"grad_clip": 1.0},
           "recipe_resolved": {"grad_clip": 1.0, "lr": 2e-3}}
    assert T.settings_changed(before, now) == {"model.depth": [4, None],
                                                   "model.width": [96, None]}
    assert T.settings_changed(before, dict(before, epochs=2, extra=1)) == {
        "epochs": [1, 2], "extra": [None, 1]}
    later = dict(before, recipe_resolved={"grad_clip": 0.5, "lr": 2e-3})
    assert T.settings_changed(before, later) == {"recipe_resolved.grad_clip": [1.0, 0.5]}
    old = {k: v for k, v in before.items() if k != "recipe_resolved"}  # a run of before
    assert T.settings_changed(old, now)["recipe_overrides.grad_clip"] == [None, 1.0]


def test_a_rerun_with_another_model_is_refused_before_any_file_is_touched(tmp_path,
                                                                           digits_dir, capsys):
    """Was: a rerun with `--model vit_ti8` into a digits run's folder (the
    recipe's widths dropped) was not seen: config.json was rewritten, the
    restore failed, and the original command was refused after that. And a
    flag set to the recipe's own value (--clip-grad 1.0, 'is already 1.0')
    was refused as a change."""
    out = tmp_path / "run"
    cfg = tiny(digits_dir)
    capsys.readouterr()
    model, metrics = T.train(cfg, out, export=False, verbose=0)
    # the recipe's own 60 warmup steps at batch 64 (15 at 256): half this short run
    total = metrics["optimizer_steps"]
    assert model.optimizer._learning_rate.warmup_steps == int(total * 0.5) < 15
    assert f"warming up for {int(total * 0.5)} steps" in capsys.readouterr().err
    written = (out / "config.json").read_text()
    other = tiny(digits_dir)  # mlp_dim: a key only the earlier run has
    other = dataclasses.replace(other, model=dict(
        {k: v for k, v in other.model.items() if k != "mlp_dim"}, width=32))
    with pytest.raises(ValueError, match=r"model\.mlp_dim 16 -> unset, model\.width 16 -> 32"):
        T.train(other, out, export=False, verbose=0)
    assert (out / "config.json").read_text() == written
    clip = tiny(digits_dir, recipe_overrides={"grad_clip": recipes.get("digits").grad_clip})
    capsys.readouterr()
    T.train(clip, out, export=False, verbose=0)  # the same run: its artefacts written again
    assert "holds a complete run of 1 epoch" in capsys.readouterr().err
    T.train(cfg, out, export=False, verbose=0)  # and the original command still runs
    stronger = tiny(digits_dir, recipe_overrides={"grad_clip": 0.5})
    with pytest.raises(ValueError, match=r"recipe_resolved\.grad_clip 1\.0 -> 0\.5"):
        T.train(stronger, out, export=False, verbose=0)


def test_override_with_more_epochs_says_it_resumes(tmp_path, digits_dir, capsys):
    """Was: `--override --epochs 2` on a complete 1-epoch run printed 'holds a
    complete run: writing its artefacts again', then trained epoch 2: the
    line now says it resumes."""
    out = tmp_path / "run"
    _, first = T.train(tiny(digits_dir), out, export=False, verbose=0)
    capsys.readouterr()
    _, more = T.train(tiny(digits_dir, epochs=2), out, export=False, verbose=0,
                      rerun="override")
    said = capsys.readouterr().err
    assert "holds a complete run of 1 epoch" in said and "writing its artefacts" not in said
    assert ": resuming it, with settings changed (--override): epochs 1 -> 2" in said
    launches = json.loads((out / "config.json").read_text())["launches"]
    assert launches[-1]["changed"] == {"epochs": [1, 2]}
    assert more["optimizer_steps"] == 2 * first["optimizer_steps"]


def test_deit3s_lamb_decays_as_deit3_says_through_the_compiled_recipe():
    """DeiT III's recipe compiles timm's / apex's LAMB with DeiT III's
    --weight-decay 0.05 (PyTorch's decay, inside LAMB's step): a decay 250x
    too weak was missed while tests built RecipeLamb by hand."""
    from keras_reluvit.models.vit import ViT

    model = ViT(width=8, depth=1, num_heads=1, mlp_dim=8, patch_size=8, image_size=16,
                num_classes=3)
    for name in ("deit3_s16_400ep", "deit3_b16_400ep"):
        recipes.compile(model, name, steps_per_epoch=10, batch_size=2048)
        opt = model.optimizer
        assert type(opt).__name__ == "RecipeLamb"
        assert float(opt.weight_decay) == pytest.approx(0.05, rel=1e-6)
        assert float(np.asarray(keras.ops.convert_to_numpy(opt.epsilon))) == pytest.approx(1e-8)
        assert opt.global_clipnorm == 1.0  # DeiT III's --clip-grad 1.0 (apex's FusedLAMB's)
        assert opt.use_ema and opt.ema_momentum == pytest.approx(0.99996)  # --model-ema-decay
    assert json.dumps(recipes.get("deit3_s16_400ep")["opt_eps"]) == "1e-08"


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bce_smoothing_is_timms_binary_cross_entropy(smoothing):
    """`--bce-loss --smoothing 0.1` without mixing: timm's train.py uses
    BinaryCrossEntropy(smoothing=0.1), whose targets are 0.1 / C off and
    1 - 0.1 + 0.1 / C on (was Keras' 0.05 / 0.95); the NumPy formula of
    torch's binary_cross_entropy_with_logits on those targets."""
    from keras_reluvit.training.losses import BinarizedCrossEntropy

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 10)).astype("float32") * 3
    labels = np.eye(10, dtype="float32")[[1, 4, 4, 9]]
    off = smoothing / 10
    target = labels * (1 - smoothing + off) + (1 - labels) * off
    want = np.mean(np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits))))
    loss = BinarizedCrossEntropy(label_smoothing=smoothing)
    got = float(keras.ops.convert_to_numpy(loss(labels, logits)))
    assert got == pytest.approx(want, rel=1e-5)
    again = BinarizedCrossEntropy.from_config(loss.get_config())
    assert float(keras.ops.convert_to_numpy(again(labels, logits))) == pytest.approx(want, rel=1e-5)


def test_timms_weight_decay_with_sgd_says_it_is_decoupled(capsys):
    """`--opt sgd --weight-decay 0.05`: timm's SGD couples the decay (added to
    the gradient, through the momentum); ours is decoupled, and says so."""
    config = T.build_config(RunSettings(batch_size=8, recipe_overrides={
        "optimizer": "sgd", "weight_decay": 0.05}))
    assert config.resolved_recipe.wd == pytest.approx(0.05 * recipes.get("digits").lr)
    assert "--weight-decay with SGD: decoupled here" in capsys.readouterr().err
    T.build_config(RunSettings(batch_size=8, recipe_overrides={"weight_decay": 0.05}))
    assert "SGD" not in capsys.readouterr().err  # AdamW: decoupled in both


def test_the_cli_prints_a_traceback_only_for_errors_raised_outside_the_package(capsys):
    """Was: any ValueError / RuntimeError became one line and exit 2, a bug
    inside Keras or a backend losing where it came from. Ours stay one line;
    one raised elsewhere (here: this test file) prints its traceback first."""
    import argparse

    from keras_reluvit.training.settings import check_number

    def ours(args):
        check_number("epochs", 0, (int, 1, None, True, None, "epochs"))

    def foreign(args):
        raise RuntimeError("raised outside keras_reluvit")

    for func, traceback_shown in ((ours, False), (foreign, True)):
        assert cli._run(argparse.Namespace(func=func, command="train")) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith("keras-reluvit: error: ")
        assert ("Traceback (most recent call last)" in err) == traceback_shown, err
        assert ('in foreign' in err) == traceback_shown, err


def test_every_run_setting_is_a_flag_of_train_with_the_same_default():
    """The CLI makes RunSettings from the flags by field name: each field
    has its flag's dest (recipe_overrides: the recipe-field flags), and a
    command line without the flag means what RunSettings' default means."""
    args = cli.parser().parse_args(["train"])
    fields = [f for f in RunSettings.fields() if f != "recipe_overrides"]
    missing = [f for f in fields if not hasattr(args, f)]
    assert not missing, missing
    default = RunSettings()
    assert {f: getattr(args, f) for f in fields} == {f: getattr(default, f) for f in fields}


def test_a_recipe_field_named_as_a_run_setting_keeps_the_recipes_checks():
    """recipe_overrides' fields are checked by the recipe fields' ranges; a
    field also named as a run setting (ema: None, the recipe's "off") is
    the run setting's to check, not refused with RunSettings' range."""
    assert T.build_config("digits", batch_size=8, recipe_overrides={"ema": None}).ema is None
    with pytest.raises(ValueError, match=r"grad_clip \(train --grad-clip\) must be a number"):
        T.build_config("digits", batch_size=8, recipe_overrides={"grad_clip": 0})
