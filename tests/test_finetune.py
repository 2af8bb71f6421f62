"""Fine-tuning on every backend: Keras' own quantize / LoRA / dtype policies
through our fast paths, LoRA and linear probes that train what they say,
layer-wise learning-rate decay against its definition, a fresh head from any
weights file, `model.preprocessor` and `kr.data.for_model` inside tf.data,
and a folder of real photographs fine-tuned through the CLI and the API.
"""

import json
import os

import keras
import numpy as np
import pytest
from conftest import END_TO_END_ON_TORCH
from conftest import backend_name

import keras_reluvit as kr
from keras_reluvit import finetune
from keras_reluvit import image_folder
from keras_reluvit import recipes
from keras_reluvit.kernels import torch_fast

TINY = dict(variant="Ti/8", width=64, depth=2, num_heads=2, mlp_dim=128, image_size=32)


def perturbed(model, seed=0, scale=0.05):
    """Every weight moved by numpy noise (the same model on every backend;
    the zero-initialised head would make all logits equal otherwise)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        value = np.asarray(keras.ops.convert_to_numpy(v), "float32")
        v.assign(value + rng.normal(0, scale, v.shape).astype("float32"))
    return model


def npy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), "float64")


def images(n=4, seed=1, size=32):
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


# --------------------------------------------------------------- quantize
@pytest.fixture
def fast_calls(monkeypatch):
    """Counts the torch fast paths taken (attention projections, MLP GEMMs)."""
    calls = {"attention": 0, "mlp": 0}
    qkv, linear = torch_fast.project_qkv, torch_fast.linear

    def project_qkv(*a, **k):
        calls["attention"] += 1
        return qkv(*a, **k)

    def spy_linear(*a, **k):
        calls["mlp"] += 1
        return linear(*a, **k)

    monkeypatch.setattr(torch_fast, "project_qkv", project_qkv)
    monkeypatch.setattr(torch_fast, "linear", spy_linear)
    return calls


def _test_quantize_int8_logits_within_keras_error_with_fast_paths(monkeypatch, fast_calls):
    """`model.quantize("int8")` on a perturbed ViT: the logits' error against
    the float model is Keras' own quantization error, and the fast paths are
    not taken for quantized layers -- on PyTorch the logits with our fast
    paths on (the default) equal Keras' layer code (off) to 1e-6 of the logit
    scale. (All three modes against JAX's: tests/once/test_cross_backend.py.)"""
    x = images()
    errors, logits = {}, {}
    for fast in ("1", "0") if backend_name() == "torch" else ("1",):
        monkeypatch.setenv("KERAS_RELUVIT_TORCH_FAST", fast)
        keras.utils.set_random_seed(0)  # the same model both times
        model = perturbed(kr.ViT(**TINY, num_classes=5))
        ref = npy(model(x))
        model.quantize("int8")
        fast_calls.update(attention=0, mlp=0)
        out = npy(model(x))
        errors[fast], logits[fast] = np.abs(out - ref).max() / np.abs(ref).max(), out
        assert fast_calls == {"attention": 0, "mlp": 0}, "a fast path ran on quantized layers"
        if fast == "0":
            np.testing.assert_allclose(logits["1"], out, rtol=0, atol=1e-6 * np.abs(ref).max())
    assert 1e-3 < errors["1"] < 0.05, errors  # int8 changed the logits, by Keras' error


def _test_a_quantized_model_saves_and_reloads(tmp_path):
    """`model.quantize(mode)` then `model.save`: the config names the mode,
    `load_model` quantizes again before loading the quantized variables, and
    the logits are the quantized model's."""
    x = images()
    for mode in ("int8",):
        model = perturbed(kr.ViT(**TINY, num_classes=5))
        model.quantize(mode)
        logits = npy(model(x))
        assert np.abs(logits).max() > 0.1
        model.save(tmp_path / f"{mode}.keras")
        again = keras.saving.load_model(tmp_path / f"{mode}.keras")
        assert again.get_config()["quantization_mode"] == mode
        np.testing.assert_allclose(npy(again(x)), logits, rtol=1e-5, atol=1e-5)


# Saving is backend-independent Keras code (cross-backend files: tests/once/
# test_cross_backend.py); the quantized reload runs in the PyTorch suite, where
# the fast paths meet quantized layers.
if backend_name() == "torch":
    test_a_quantized_model_saves_and_reloads = _test_a_quantized_model_saves_and_reloads


# JAX's quantized error is measured against PyTorch's in tests/once/test_cross_backend.py
# (eager quantized calls take ~20 s a model on JAX here).
if backend_name() != "jax":
    test_quantize_int8_logits_within_keras_error_with_fast_paths = (
        _test_quantize_int8_logits_within_keras_error_with_fast_paths)


def _test_fast_paths_step_aside_by_layer_state(fast_calls):
    """Decided from each layer's state: plain layers take the fast paths;
    LoRA on one attention projection sends that attention (only) to Keras'
    code; LoRA on one MLP layer does the same for its MLP; a quantized dtype
    policy too. Outputs equal Keras' code (fast paths off) in every case."""
    x = images()
    model = perturbed(kr.ViT(**TINY, num_classes=5))
    model(x)
    assert fast_calls == {"attention": 2, "mlp": 4}
    model.blocks[0].attn._value_dense.enable_lora(2)
    model.blocks[1].mlp.fc2.enable_lora(2)
    for v in model.weights:  # LoRA factors nonzero: the LoRA layers compute something new
        if "lora_kernel_b" in v.path:
            v.assign(np.full(v.shape, 0.05, "float32"))
    fast_calls.update(attention=0, mlp=0)
    out = npy(model(x))
    assert fast_calls == {"attention": 1, "mlp": 2}
    os.environ["KERAS_RELUVIT_TORCH_FAST"] = "0"
    try:
        ref = npy(model(x))
    finally:
        del os.environ["KERAS_RELUVIT_TORCH_FAST"]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


if backend_name() == "torch":  # the torch fast paths: collected in the torch suite only
    test_fast_paths_step_aside_by_layer_state = _test_fast_paths_step_aside_by_layer_state


# ------------------------------------------------------------------- LoRA
def test_lora_trains_only_its_factors_and_saves_merged(tmp_path):
    """`model.enable_lora(rank, train_head=False)`: the trainable variables
    are exactly the LoRA factors of every query / value projection; a fit
    changes only them; the saved `.keras` file is a plain ViT whose logits
    equal the LoRA model's (merged kernels, <= 1e-5)."""
    model = perturbed(kr.ViT(**TINY, num_classes=3))
    model.enable_lora(4, train_head=False)
    names = sorted(v.path for v in model.trainable_variables)
    want = sorted(f"block_{i:02d}/attention/{p}/lora_kernel_{ab}"
                  for i in range(2) for p in ("query", "value") for ab in "ab")
    assert names == want
    before = {v.path: npy(v) for v in model.weights}
    x = images(seed=5)
    logits_before = npy(model(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    y = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    model.fit(images(), y, epochs=3, batch_size=4, verbose=0)
    changed = sorted(p for p, v in before.items() if not np.array_equal(v, _value(model, p)))
    assert changed == want
    lora_logits = npy(model(x))
    assert np.abs(lora_logits - logits_before).max() > 1e-4  # LoRA changed the function
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    assert not any("lora" in v.path for v in reloaded.weights)
    np.testing.assert_allclose(npy(reloaded(x)), lora_logits, rtol=1e-5, atol=1e-5)
    if backend_name() == "torch":  # the SavedModel, written from PyTorch, serves it too
        import tensorflow as tf

        model.export(str(tmp_path / "served"), format="tf_saved_model", verbose=False)
        served = tf.saved_model.load(str(tmp_path / "served"))
        np.testing.assert_allclose(served.serve(x).numpy(), lora_logits, rtol=1e-5, atol=1e-5)


def _value(model, path):
    return next(npy(v) for v in model.weights if v.path == path)


def test_lora_default_targets_and_head(tmp_path):
    """keras-hub's default: LoRA on query and value, the head trains too;
    wrong ranks and targets get errors naming them."""
    model = kr.ViT(**TINY, num_classes=3)
    model.enable_lora(2)
    trainable = {v.path for v in model.trainable_variables}
    assert {"head/kernel", "head/bias"} <= trainable
    assert len(trainable) == 2 + 2 * 2 * 2
    with pytest.raises(ValueError, match="rank"):
        kr.ViT(**TINY, num_classes=3).enable_lora(0)
    with pytest.raises(ValueError, match="No LoRA target named"):
        kr.ViT(**TINY, num_classes=3).enable_lora(2, target_layer_names=["qkv"])
    with pytest.raises(ValueError, match="no classifier head"):
        kr.ViT(**TINY, include_top=False).enable_lora(2)


# ------------------------------------------------------------ linear probe
def test_linear_probe_changes_only_the_head():
    model = perturbed(kr.ViT(**TINY, num_classes=3))
    finetune.set_trainable(model, "head")
    assert sorted(v.path for v in model.trainable_variables) == ["head/bias", "head/kernel"]
    before = {v.path: npy(v) for v in model.weights}
    recipes.compile(model, "bv_transfer", steps_per_epoch=2, batch_size=4, epochs=2, lr=0.1)
    y = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    model.fit(images(8), np.concatenate([y, y]), epochs=2, batch_size=4, verbose=0)
    changed = {p for p, v in before.items() if not np.array_equal(v, _value(model, p))}
    assert changed == {"head/kernel", "head/bias"}
    finetune.set_trainable(model, "all")
    assert len(model.trainable_variables) == len(model.weights)


# ------------------------------------------------------------ layer decay
def _expected_scale(path, depth, decay):
    """BEiT / timm's rule, written out: embedding decay^(depth+1), block i
    decay^(depth-i), everything after the blocks 1."""
    if path.split("/")[0] in ("embedding", "pos_embedding", "cls", "reg", "pre_norm"):
        return decay ** (depth + 1)
    if path.startswith("block_"):
        return decay ** (depth - int(path.split("/")[0][len("block_"):]))
    return 1.0


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_layer_decay_gives_each_block_its_rate(kind):
    """One optimizer step with layer decay 0.5 on a 3-block ViT with a class
    token: every variable moves by exactly its own learning rate (SGD:
    `-lr * scale * g`; AdamW's first step: `-lr * scale * g / |g|` and the
    decoupled decay `-lr * scale * wd * w` on kernels, scaled too)."""
    depth, decay, lr, wd = 3, 0.5, 0.1, 0.3
    model = perturbed(kr.ViT(**dict(TINY, depth=depth), num_classes=3, pool="tok"))
    scales = finetune.layer_decay_scales(model, decay)
    variables = model.trainable_variables
    assert {v.path: scales[v.path] for v in variables} == {
        v.path: _expected_scale(v.path, depth, decay) for v in variables}
    assert min(scales.values()) == decay ** (depth + 1) and max(scales.values()) == 1.0
    if kind == "sgd":
        opt = recipes.LayerDecaySGD(learning_rate=lr, momentum=0.0, layer_scales=scales)
    else:
        opt = recipes.LayerDecayAdamW(learning_rate=lr, weight_decay=wd, layer_scales=scales)
        opt.exclude_from_weight_decay(
            var_list=[v for v in variables if not v.path.endswith("kernel")])
    rng = np.random.default_rng(3)
    grads = [rng.normal(0, 1, v.shape).astype("float32") for v in variables]
    before = [npy(v) for v in variables]
    opt.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    for v, w, g in zip(variables, before, grads):
        s = _expected_scale(v.path, depth, decay)
        if kind == "sgd":
            want = w - lr * s * g
        else:
            decayed = w * (1 - lr * s * wd) if v.path.endswith("kernel") else w
            # Keras' Adam, step 1: lr * g / (|g| + eps / sqrt(1 - beta_2)).
            want = decayed - lr * s * g / (np.abs(g) + 1e-7 / np.sqrt(1 - 0.999))
        np.testing.assert_allclose(npy(v), want, rtol=1e-4, atol=1e-6, err_msg=v.path)


@pytest.mark.full_only(
    "The layer-decay recipe through a SavedModel on TensorFlow (~15 s): JAX's and PyTorch's "
    "run.",
    backends=('tensorflow',))
def test_layer_decay_through_the_recipe_and_a_saved_model(tmp_path):
    """`adamw_finetune` compiles a `RecipeAdamW` with the 0.75 decay; a
    fit runs and the compiled model saves and reloads (registered class)."""
    model = perturbed(kr.ViT(**TINY, num_classes=3))
    recipes.compile(model, "adamw_finetune", steps_per_epoch=1, batch_size=4, epochs=1)
    assert isinstance(model.optimizer, recipes.RecipeAdamW)
    assert model.optimizer.layer_scales["block_00/norm1/gamma"] == pytest.approx(0.75 ** 2)
    y = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    model.fit(images(), y, epochs=1, batch_size=4, verbose=0)
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(again.optimizer, recipes.RecipeAdamW)
    assert again.optimizer.layer_scales == model.optimizer.layer_scales
    with pytest.raises(ValueError, match="layer_decay must be in"):
        finetune.layer_decay_scales(model, 1.5)


# ------------------------------------------------------------ fresh heads
def test_a_fresh_head_from_any_weights_file(tmp_path, capsys):
    """`.weights.h5` and `.keras` files of another class count (or of a
    model without a head) load into a model with a new, zero head -- the
    rest of the weights exactly -- and say so in one line."""
    src = perturbed(kr.ViT(**TINY, num_classes=10))
    src.save_weights(tmp_path / "m.weights.h5")
    src.save(tmp_path / "m.keras")
    feats = perturbed(kr.ViT(**TINY, include_top=False))
    feats.save_weights(tmp_path / "f.weights.h5")
    x = images()
    for path, source in ((tmp_path / "m.weights.h5", src), (tmp_path / "m.keras", src),
                         (tmp_path / "f.weights.h5", feats)):
        model = kr.ViT_Ti8(weights=str(path), **{k: v for k, v in TINY.items()
                                                 if k != "variant"}, num_classes=4)
        assert "fresh" in capsys.readouterr().err
        np.testing.assert_array_equal(npy(model.get_layer("head").kernel), 0)
        feature_model = keras.Model(model.input, model.get_layer("encoder_norm").output)
        source_features = keras.Model(source.input, source.get_layer("encoder_norm").output)
        np.testing.assert_allclose(npy(feature_model(x)), npy(source_features(x)), atol=1e-6)


# ------------------------------------------------------ the smaller fixes
def test_encoder_block_takes_an_attention_kind():
    block = kr.EncoderBlock(num_heads=2, mlp_dim=64, attention="relu")
    y = block(np.zeros((1, 5, 32), "float32"))
    assert tuple(y.shape) == (1, 5, 32)
    assert block.attn.activation == "relu"
    again = kr.EncoderBlock.from_config(block.get_config())
    assert again.attention == block.attention
    with pytest.raises(ValueError, match="Unknown attention kind"):
        kr.EncoderBlock(num_heads=2, mlp_dim=64, attention="rleu")


def test_mixed_precision_model_reports_its_policy(tmp_path):
    model = kr.ViT(**TINY, num_classes=3, dtype="mixed_bfloat16")
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.compute_dtype == "bfloat16"
    assert keras.backend.standardize_dtype(model(images()).dtype) == "float32"  # logits
    model.save(tmp_path / "m.keras")
    assert keras.saving.load_model(tmp_path / "m.keras").dtype_policy.name == "mixed_bfloat16"
    assert kr.ViT(**TINY, num_classes=3).dtype_policy.name == "float32"


# --------------------------------------------------------- tf.data inputs
def test_preprocessor_and_for_model_inside_tf_data():
    """`model.preprocessor` inside `Dataset.map` (the documented Keras path)
    equals the eager call on this backend; `kr.data.for_model` turns
    `image_dataset_from_directory`-style batches (float 0-255, int labels)
    into the model's inputs and one-hot labels."""
    import tensorflow as tf

    model = kr.ViT(**TINY, num_classes=3)
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (6, 40, 52, 3)).astype("float32")
    labels = np.array([0, 1, 2, 0, 1, 2])
    ds = tf.data.Dataset.from_tensor_slices((photos, labels)).batch(3)
    mapped = np.concatenate([x.numpy() for x, _ in ds.map(
        lambda x, y: (model.preprocessor(x), y))])
    np.testing.assert_allclose(mapped, npy(model.preprocessor(photos)), atol=1e-4)
    prepared = list(kr.data.for_model(ds, model, batch_size=6))
    assert len(prepared) == 1
    x, y = (t.numpy() for t in prepared[0])
    np.testing.assert_allclose(x, mapped, atol=1e-4)
    np.testing.assert_array_equal(y, np.eye(3)[labels])
    train = next(iter(kr.data.for_model(ds, model, train=True, batch_size=6)))
    assert train[0].shape == (6, 32, 32, 3) and float(tf.reduce_max(tf.abs(train[0]))) <= 1.0


# --------------------------------- a folder of photographs, CLI and API
# On held-out photographs (val/ is cropped from pixels no training image
# shares; chance is 1/3). Measured on 2026-12-03 (CLI predict / API): JAX
# 0.96 / 0.79, PyTorch 1.0 / 1.0, TensorFlow 1.0 / 1.0.
ACCURACY = 0.7


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """3 classes x 32 real photographs (crops of scikit-image's samples, in
    every format) in train/ + val/ (24 + 8 per class; val/ from a part of
    each photograph no training crop touches), and a "pretrained"
    checkpoint of 10 classes -- the same weights on every backend."""
    root = tmp_path_factory.mktemp("photos")
    image_folder.sample_folder(root / "images", per_class=32, split=True)
    keras.utils.set_random_seed(0)
    model = perturbed(kr.ViT(**TINY, num_classes=10), scale=0.02)
    model.save(root / "pretrained.keras")
    return root


@pytest.mark.full_only(
    "The fine-tune CLI end to end on JAX (~24 s): PyTorch's runs; the literal reader runs the "
    "README's fine-tune commands on JAX with their outcomes checked (the checkpoint's "
    "attention, the classes, eval = the run's score, the served classes). End-to-end runs on "
    "one backend (PyTorch's, the cheapest) where the parts they combine are checked on every "
    "backend (issue 59's rule; ~225 s of ci12's 29.5-min backend lane): - the fine-tune CLI "
    "on TensorFlow (~50 s): PyTorch's runs, the literal reader runs the README's fine-tune, "
    "eval and predict commands on JAX;",
    backends=('jax', 'tensorflow'))
def test_fine_tune_a_folder_through_the_cli(photos, tmp_path, capsys):
    """`keras-reluvit train --dataset DIR --init CKPT` (10 -> 3 classes,
    big_vision's transfer recipe) reaches ACCURACY on val/; `eval` on the
    folder agrees; `predict` on the folder names the folder's classes, one
    line per image, mostly right. (The SavedModel serving the class names:
    tests/once/test_examples.py, the fine-tuning example.)"""
    from keras_reluvit import cli

    out = tmp_path / "run"
    assert cli.main(["train", "--dataset", str(photos / "images"), "--init",
                     str(photos / "pretrained.keras"), "--recipe", "bv_transfer",
                     "--batch-size", "9", "--epochs", "15", "--lr", "0.03",
                     "--output", str(out), "--quiet", "--no-export"]) == 0
    printed = capsys.readouterr()
    assert "fine-tuning all" in printed.err and "fresh" in printed.err
    final = json.loads(printed.out.strip().splitlines()[-1])
    assert final["accuracy"] >= ACCURACY, final
    config = json.loads((out / "config.json").read_text())
    assert config["label_names"] == ["cat", "coffee", "rocket"]
    assert cli.main(["eval", str(out / "model.keras"), "--dataset",
                     str(photos / "images"), "--batch-size", "8"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["accuracy"] == pytest.approx(final["accuracy"], abs=1e-6)
    assert cli.main(["predict", str(out / "model.keras"), str(photos / "images" / "val"),
                     "--json", "--top", "1"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(records) == 24
    right = [r["top"][0]["label"] == r["image"].split(os.sep)[-2] for r in records]
    assert np.mean(right) >= ACCURACY


@END_TO_END_ON_TORCH
def test_fine_tune_controls_the_checkpoint_is_used_and_no_training_is_chance(photos, tmp_path,
                                                                             capsys):
    """The controls of the fine-tune above: with lr 0 the run keeps the
    checkpoint's encoder exactly (a dropped or ignored --init would not) and
    its fresh head exactly zero (big_vision's zero init, untouched): the model
    scored is that one -- every logit equal, so the loss is ln 3 and the
    accuracy the share of val/'s first class, counted from the folder (the
    zero head alone gives that accuracy: the loss and the head's weights are
    what tell an untrained head from a slightly trained or random one)."""
    from keras_reluvit import cli

    out = tmp_path / "zero"
    assert cli.main(["train", "--dataset", str(photos / "images"), "--init",
                     str(photos / "pretrained.keras"), "--recipe", "bv_transfer",
                     "--batch-size", "9", "--epochs", "1", "--lr", "0",
                     "--output", str(out), "--quiet", "--no-export"]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # zero logits: argmax is class 0 ("cat"): its share of val/, from the folder
    val = photos / "images" / "val"
    counts = {c: len(os.listdir(val / c)) for c in ("cat", "coffee", "rocket")}
    assert final["accuracy"] == pytest.approx(counts["cat"] / sum(counts.values()),
                                              abs=1e-6), final
    # equal logits, not merely argmax class 0: cross-entropy ln 3 on every image
    assert final["loss"] == pytest.approx(np.log(3.0), abs=1e-5), final
    trained = keras.saving.load_model(out / "model.keras", compile=False)
    pretrained = keras.saving.load_model(photos / "pretrained.keras", compile=False)
    head = [v for v in trained.weights if v.path.startswith("head/")]
    assert sorted(v.path for v in head) == ["head/bias", "head/kernel"]
    assert head[0].shape[-1] == 3 and all(np.all(npy(v) == 0.0) for v in head)
    encoder = {v.path: npy(v) for v in pretrained.weights if not v.path.startswith("head/")}
    kept = {v.path: npy(v) for v in trained.weights if v.path in encoder}
    assert sorted(kept) == sorted(encoder) and len(encoder) > 20
    for path, value in encoder.items():
        np.testing.assert_array_equal(kept[path], value, err_msg=path)


@END_TO_END_ON_TORCH
def test_fine_tune_a_folder_through_the_api(photos):
    """The Python path: `kr.data.load(DIR)` -> `kr.load_checkpoint(...,
    num_classes=3)` (a fresh head) -> `recipes.compile` (big_vision's
    transfer recipe with layer decay 0.9: `RecipeSGD` inside `fit`) ->
    ACCURACY on val/ -> `decode_predictions` names the classes."""
    train, val, info = kr.data.load(str(photos / "images"), batch_size=9, image_size=32)
    assert info.label_names == ["cat", "coffee", "rocket"]
    model = kr.load_checkpoint(str(photos / "pretrained.keras"), num_classes=3,
                               label_names=info.label_names)
    recipes.compile(model, "bv_transfer", steps_per_epoch=len(train), batch_size=9,
                    epochs=15, lr=0.03, layer_decay=0.9)
    assert isinstance(model.optimizer, recipes.RecipeSGD)
    model.fit(train.repeat(), steps_per_epoch=len(train), epochs=15, verbose=0)
    result = model.evaluate(val, return_dict=True, verbose=0)
    assert result["accuracy"] >= ACCURACY, result
    x, _ = next(iter(val))
    logits = model.predict(x, verbose=0)
    top = kr.decode_predictions(logits, model, from_logits=True, top=1)
    assert [t[0][0] for t in top] == [info.label_names[i] for i in np.argmax(logits, -1)]


def _test_image_dataset_from_directory_trains_through_for_model(photos):
    """Keras' own folder reader + the documented preparation + `model.fit`:
    `kr.data.for_model` turns `image_dataset_from_directory`'s batches into
    the model's inputs; a few epochs lower the training loss and the model's
    accuracy on the prepared val/ batches is what `evaluate` reports."""
    train = keras.utils.image_dataset_from_directory(
        str(photos / "images" / "train"), image_size=(48, 48), batch_size=9, seed=0)
    val = keras.utils.image_dataset_from_directory(
        str(photos / "images" / "val"), image_size=(48, 48), batch_size=8, shuffle=False)
    assert train.class_names == ["cat", "coffee", "rocket"]
    model = kr.load_checkpoint(str(photos / "pretrained.keras"), num_classes=3,
                               label_names=train.class_names)
    prepared = kr.data.for_model(train, model, train=True, batch_size=9)
    recipes.compile(model, "bv_transfer", steps_per_epoch=8, batch_size=9, epochs=6, lr=0.03)
    history = model.fit(prepared, epochs=6, verbose=0)
    loss = history.history["loss"]
    assert loss[-1] < 0.7 * loss[0], loss
    result = model.evaluate(kr.data.for_model(val, model, batch_size=8), return_dict=True,
                            verbose=0)
    assert result["accuracy"] > 0.6, result


# On TensorFlow Keras' own reader feeds TensorFlow tensors natively; the PyTorch suite
# checks the conversion of tf.data batches that `for_model` makes (JAX's in full runs;
# for_model inside tf.data on every backend).
if backend_name() in ("jax", "torch"):
    test_image_dataset_from_directory_trains_through_for_model = pytest.mark.full_only(
        "A Keras image folder through for_model on JAX (~10-16 s): PyTorch's runs; for_model's "
        "tf.data is checked on every backend.", backends=("jax",))(
        _test_image_dataset_from_directory_trains_through_for_model)
