"""DeiT III's parts on the current backend: LAMB as timm / apex compute it
(`recipes.RecipeLamb`) against the algorithm written out in numpy, the
binarised BCE loss against its formula, and `deit3_s16_400ep` overridden to
one tiny epoch with everything it turns on."""

import copy
import dataclasses
import json

import keras
import numpy as np
import pytest

import keras_reluvit as kr
from keras_reluvit import recipes
from keras_reluvit.training import run as T


def lamb_reference(params, grads_seq, lr, wd, decayed, clip, b1=0.9, b2=0.999, eps=1e-6):
    """timm's `Lamb` / apex's `FusedLAMB` (grad averaging, bias correction,
    the global norm clipped at `clip`, the trust ratio on decaying params)."""
    params = [p.astype("float64").copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_seq, 1):
        norm = np.sqrt(sum(np.sum(g.astype("float64") ** 2) for g in grads))
        grads = [g * (clip / max(norm, clip)) for g in grads]
        for i, (p, g) in enumerate(zip(params, grads)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            step = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps)
            if decayed[i]:
                step = step + wd * p
                w_norm, s_norm = np.linalg.norm(p), np.linalg.norm(step)
                step = step * (w_norm / s_norm if w_norm > 0 and s_norm > 0 else 1.0)
            params[i] = p - lr * step
    return params


def _run(optimizer, params, grads_seq, exclude):
    variables = [keras.Variable(p, name=f"v{i}") for i, p in enumerate(params)]
    optimizer.exclude_from_weight_decay(var_list=[variables[i] for i in exclude])
    optimizer.build(variables)
    for grads in grads_seq:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def test_recipe_lamb_is_timms_lamb_step_by_step():
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32"),
              np.zeros((3,), "float32")]  # a kernel (decays), a scale and a zero bias (not)
    grads_seq = [[rng.normal(size=p.shape).astype("float32") * s for p in params]
                 for s in (3.0, 0.1, 1.0, 0.5)]  # the first one is clipped
    lr, wd = 0.02, 0.05
    ours = _run(recipes.RecipeLamb(learning_rate=lr, weight_decay=wd, global_clipnorm=1.0),
                params, grads_seq, exclude=[1, 2])
    want = lamb_reference(params, grads_seq, lr, wd, [True, False, False], clip=1.0)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # Keras' own Lamb (decay apart, the ratio on every variable) is another algorithm
    theirs = _run(keras.optimizers.Lamb(learning_rate=lr, weight_decay=wd, epsilon=1e-6,
                                        global_clipnorm=1.0), params, grads_seq, exclude=[1, 2])
    assert max(np.abs(a - b).max() for a, b in zip(theirs, want)) > 1e-3


def test_bce_binarises_mixed_targets_and_averages_over_classes():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 5)).astype("float32")
    targets = np.zeros((4, 5), "float32")
    targets[np.arange(4), [0, 1, 2, 3]] = 0.7  # a mixed image: two classes, 0.7 / 0.3
    targets[np.arange(4), [4, 0, 1, 2]] = 0.3
    binary = (targets > 0).astype("float64")
    p = 1 / (1 + np.exp(-logits.astype("float64")))
    want = np.mean(-(binary * np.log(p) + (1 - binary) * np.log(1 - p)))
    got = keras.ops.convert_to_numpy(recipes.BinarizedCrossEntropy()(targets, logits))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert recipes.probability("bce") == "sigmoid"
    loss, _ = recipes.loss_and_metrics(kr.ViT("Ti/16", num_classes=6, image_size=16, depth=1),
                                       "deit3_s16_400ep")
    assert isinstance(loss, recipes.BinarizedCrossEntropy)
    with pytest.raises(ValueError, match="Unknown loss 'bce_xent'; valid: softmax_xent"):
        recipes.probability("bce_xent")


@pytest.mark.full_only(
    "DeiT III's tiny epoch on JAX and TensorFlow (~19 s each): PyTorch's runs in CI; "
    "RecipeLamb and the bce loss are checked on every backend apart, 3-Augment once "
    "(tf.data), and DeiT's own tiny epoch runs on all three.",
    backends=('jax', 'tensorflow'))
def test_deit3_s16_runs_one_tiny_epoch_with_everything_it_turns_on(tmp_path, digits_dir):
    r = recipes.get("deit3_s16_400ep")
    assert (r["optimizer"], r["loss"], r["lr"], r["batch_size"]) == ("lamb", "bce", 4e-3, 2048)
    assert r["model"]["layer_scale"] == 1e-4 and r["model"]["posemb_prefix"] is False
    aug = r["augment"]
    assert aug["three_augment"] and aug["color_jitter"] == 0.3 and aug["aug_repeats"] == 3
    assert aug["timm_mix"]["label_smoothing"] == 0.0 and not aug.get("auto_augment")
    cfg = T.build_config(recipe="deit3_s16_400ep", dataset="sklearn_digits", epochs=1,
                         image_size=32, batch_size=128, data_dir=str(digits_dir))
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, width=32, depth=2, num_heads=2, mlp_dim=64))
    model, metrics = T.train(cfg, tmp_path / "run", export=False, verbose=0)
    assert [b.drop_path for b in model.blocks] == [0.05, 0.05]  # DeiT III: every block
    assert isinstance(model.optimizer, recipes.RecipeLamb)
    assert model.optimizer.epsilon == 1e-8  # DeiT III's main.py: --opt-eps 1e-8 to FusedLAMB
    scales = [v for v in model.trainable_variables if "ls1" in v.path]
    assert len(scales) == 2 and not any(model.optimizer._use_weight_decay(v) for v in scales)
    assert isinstance(model.loss, recipes.BinarizedCrossEntropy)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["augment"]["three_augment"] and saved["model"]["drop_path_schedule"] == "uniform"
    assert np.isfinite(metrics["step_loss"]).all() and metrics["optimizer_steps"] == 11
    back = kr.load_model(str(tmp_path / "run" / "model.keras"))
    assert back.get_config()["layer_scale"] == 1e-4


def test_bce_with_smoothed_mixing_targets_is_refused(monkeypatch):
    bad = copy.deepcopy(recipes.RECIPES["deit3_s16_400ep"])
    bad["augment"]["timm_mix"]["label_smoothing"] = 0.1
    monkeypatch.setitem(recipes.RECIPES, "smoothed_bce", bad)
    with pytest.raises(ValueError, match="binarises the targets: with timm_mix "
                                         "label_smoothing=0.1 every target would be 1"):
        T.build_config(recipe="smoothed_bce", batch_size=8)


def test_deit3_ft224_fine_tunes_a_checkpoint_at_224(tmp_path):
    """README_revenge.md's fine-tune at 224: AdamW lr 1e-5 and decay 0.1 at
    batch 512, softmax with smoothing 0.1 in the mixed targets, no repeats;
    stochastic depth reaches the checkpoint's model."""
    r = recipes.get("deit3_ft224")
    assert (r["optimizer"], r["lr"], r["batch_size"], r["epochs"]) == ("adamw", 1e-5, 512, 20)
    assert r["wd"] / r["lr"] == pytest.approx(0.1) and r["loss"] == "softmax_xent"
    assert r["augment"]["timm_mix"]["label_smoothing"] == 0.1
    assert r["augment"].get("aug_repeats", 1) == 1 and r["init_required"]
    cfg = T.build_config(recipe="deit3_ft224", init=str(tmp_path / "deit3.keras"),
                         dataset="sklearn_digits", batch_size=8)
    assert cfg["model"] == {"drop_path": 0.2} and cfg["image_size"] == 224
