"""The DeiT recipes end to end: `deit_s16_300ep` overridden to one epoch of a
tiny model on the embedded digits runs on every backend with everything it
turns on -- stochastic depth, timm's MixUp / CutMix with smoothed targets,
random erasing, RandAugment, the weights' EMA evaluated beside the trained
weights and saved as the model."""

import dataclasses
import json

import keras
import numpy as np
import pytest

import keras_reluvit as kr
from keras_reluvit import _keras_compat as compat
from keras_reluvit import recipes
from keras_reluvit.training import run as T


class WeightsRecorder(keras.callbacks.Callback):
    """The trainable weights before training and after every step."""

    def __init__(self):
        super().__init__()
        self.initial, self.steps = None, []

    def _weights(self):
        return [np.array(keras.ops.convert_to_numpy(v), "float64")
                for v in self.model.trainable_variables]

    def on_train_begin(self, logs=None):
        self.initial = self._weights()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(self._weights())


@pytest.mark.full_only(
    "DeiT's tiny epoch on JAX (~20-30 s): it runs on PyTorch; its parts (RecipeAdamW and the "
    "EMA, timm_mix, erasing, timm's RandAugment in tf.data) are checked apart on every "
    "backend or once. - DeiT's tiny epoch on TensorFlow (~33 s): PyTorch's runs; the XLA "
    "recipe step on TensorFlow in "
    "test_recipes_compile_uses_xla_on_tensorflow_and_trains_the_same (digits, no EMA), the "
    "EMA on every backend in test_ema (plain compile): the EMA inside TensorFlow's XLA step "
    "and `train`'s ema_val metrics run on PyTorch only;",
    backends=('jax', 'tensorflow'))
def test_deit_s16_runs_one_tiny_epoch_with_everything_it_turns_on(tmp_path, digits_dir):
    r = recipes.get("deit_s16_300ep")
    assert (r["ema"], r["model"]["drop_path"], r["augment"]["erase"]) == (0.99996, 0.1, 0.25)
    assert r["augment"]["timm_mix"]["label_smoothing"] == 0.1 and r["label_smoothing"] == 0.0
    assert r["augment"]["aug_repeats"] == 3  # DeiT's RASampler
    assert r["augment"]["auto_augment"] == "rand-m9-mstd0.5-inc1"  # timm's, DeiT's --aa
    off = T.build_config(recipe="deit_s16_300ep", batch_size=8, aug_repeats=1)
    assert off["augment"]["aug_repeats"] == 1 and r["augment"]["aug_repeats"] == 3
    # timm's --aug-repeats 0 is off, as 1; below 0 an error naming the flag
    assert T.build_config(recipe="deit_s16_300ep", batch_size=8,
                          aug_repeats=0)["augment"]["aug_repeats"] == 1
    with pytest.raises(ValueError, match=r"aug_repeats \(train --aug-repeats\) must be a "
                                         r"whole number in \[0, inf\)"):
        T.build_config(recipe="deit_s16_300ep", batch_size=8, aug_repeats=-1)
    # timm's --aa: instead of the recipe's automatic augmentation, said where it replaces one
    aa = T.build_config(recipe="s16_i1k_90ep", batch_size=8, auto_augment="augmix-m3")
    assert aa["augment"]["auto_augment"] == "augmix-m3" and aa["augment"]["randaug"] is None
    off = T.build_config(recipe="deit_s16_300ep", batch_size=8, auto_augment="none")
    assert off["augment"]["auto_augment"] is None
    with pytest.raises(ValueError,
                       match=r"auto_augment \(train --aa\): Unknown auto_augment 'rand_m9'"):
        T.build_config(recipe="deit_s16_300ep", batch_size=8, auto_augment="rand_m9")
    cfg = T.build_config(recipe="deit_s16_300ep", dataset="sklearn_digits", epochs=1,
                         image_size=32, batch_size=256, data_dir=str(digits_dir),
                         ema=0.9)
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, width=32, depth=3, num_heads=2, mlp_dim=64))
    recorder = WeightsRecorder()
    model, metrics = T.train(cfg, tmp_path / "run", export=False, verbose=0,
                             extra_callbacks=[recorder])
    assert [b.drop_path for b in model.blocks] == [0.0, 0.05, 0.1]
    optimizer = model.optimizer
    assert isinstance(optimizer, recipes.RecipeAdamW) and optimizer.ema_momentum == 0.9
    # the saved model is the EMA (swapped in at the end; the trained weights are the
    # optimizer's now)
    ema = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    trained = [keras.ops.convert_to_numpy(a) for a in compat.ema_averages(optimizer)]
    assert max(np.abs(a - b).max() for a, b in zip(ema, trained)) > 1e-4
    # ... and it is timm's EMA of the weights the run went through: from the initial
    # weights, d * average + (1 - d) * weights after each of the 5 updates (no warm-up).
    assert not r.get("ema_warmup") and len(recorder.steps) == 5
    for a, b in zip(trained, recorder.steps[-1]):  # the trained weights: the last step's
        np.testing.assert_array_equal(a, b)
    expected = recorder.initial
    for w in recorder.steps:
        expected = [0.9 * e + 0.1 * v for e, v in zip(expected, w)]
    for v, a, b in zip(model.trainable_variables, ema, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=v.path)
    # the average moved off the initial weights (an EMA never updated stays there) by
    # far more than the tolerance above (5 warm-up steps move it ~1.5e-4)
    assert max(np.abs(a - b).max() for a, b in zip(ema, recorder.initial)) > 5e-5
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["ema"] == 0.9 and saved["augment"]["timm_mix"]["cutmix_alpha"] == 1.0
    history = metrics["history"]
    assert set(history) >= {"loss", "val_loss", "ema_val_loss", "ema_val_accuracy"}
    np.testing.assert_allclose(metrics["final"]["loss"], history["ema_val_loss"][-1],
                               rtol=1e-5)
    np.testing.assert_allclose(metrics["final_trained"]["loss"], history["val_loss"][-1],
                               rtol=1e-5)
    assert np.isfinite(metrics["step_loss"]).all() and metrics["optimizer_steps"] == 5
    back = kr.load_model(str(tmp_path / "run" / "model.keras"))
    assert [b.drop_path for b in back.blocks] == [0.0, 0.05, 0.1]
    for a, b in zip(back.trainable_variables, ema):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), b)


def test_adamw_finetune_is_timms_fine_tune(tmp_path):
    """`adamw_finetune` turns on what timm / MAE fine-tunes use: stochastic
    depth on the checkpoint's blocks (not on a frozen backbone), timm's
    MixUp / CutMix with smoothed targets, random erasing, timm's crop."""
    r = recipes.get("adamw_finetune")
    mix = r["augment"]["timm_mix"]
    assert (mix["mixup_alpha"], mix["cutmix_alpha"], mix["label_smoothing"]) == (0.8, 1.0, 0.1)
    assert r["label_smoothing"] == 0.0 and r["augment"]["erase"] == 0.25  # smoothed once
    common = dict(recipe="adamw_finetune", init=str(tmp_path / "ckpt.keras"),
                  dataset="sklearn_digits", batch_size=8)
    assert T.build_config(**common)["model"] == {"drop_path": 0.1}
    assert T.build_config(**common, trainable="lora")["model"] == {"drop_path": 0.1}
    assert T.build_config(**common, trainable="head")["model"] == {}
    assert T.build_config(**common, drop_path=0.2)["model"] == {"drop_path": 0.2}
