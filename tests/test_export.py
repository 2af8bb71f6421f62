"""SavedModel export from the current backend, checked with plain TensorFlow
in a separate process (no keras_reluvit, no Keras import there)."""

import io
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import subprocess_env

import keras_reluvit as kr

LABELS = ["cat", "dog", "eel", "fox", "gnu", "hen", "owl"]

CHECK = textwrap.dedent("""
    import json, sys, numpy as np, tensorflow as tf
    path, inputs = sys.argv[1], np.load(sys.argv[2], allow_pickle=True)
    m = tf.saved_model.load(path)
    sig = {k: m.signatures[k] for k in ("serving_default", "serve_bytes", "serve_preprocessed",
                                        "serve_preprocessed_xla")}
    out = {}
    for n in (1, 7):
        r = sig["serving_default"](images=tf.constant(inputs["uint8"][:n]))
        out[f"uint8_{n}"] = {k: v.numpy().tolist() if v.dtype != tf.string else
                             [[s.decode() for s in row] for row in v.numpy()] for k, v in r.items()}
    r = sig["serve_bytes"](image_bytes=tf.constant(list(inputs["png"])))
    out["bytes"] = r["probabilities"].numpy().tolist()
    out["preprocessed"] = sig["serve_preprocessed"](images=tf.constant(inputs["pre"]))["logits"].numpy().tolist()
    out["preprocessed_xla"] = sig["serve_preprocessed_xla"](
        images=tf.constant(inputs["pre"]))["logits"].numpy().tolist()
    errors = {}
    for name, fn in (("channels", lambda: sig["serving_default"](images=tf.zeros((1, 40, 40, 4), tf.uint8))),
                     ("bytes", lambda: sig["serve_bytes"](image_bytes=tf.constant([b"not an image"])))):
        try:
            fn()
            errors[name] = None
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {e}"[:400]
    out["errors"] = errors
    print(json.dumps(out))
""")


RECIPE = dict(resize="squash", crop_pct=0.875, interpolation="bicubic", round_uint8=True,
              mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def png_bytes(image):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


# Off TensorFlow, a TensorFlow child process writes the export from the .keras file.
CHILD_ON_TORCH = pytest.mark.full_only(
    "An export through the TensorFlow child process on JAX (~10-40 s each): the child is the "
    "same from PyTorch, where CI runs it; JAX's .keras files load on TensorFlow with the same "
    "logits in test_cross_backend.", backends=("jax",))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    # A checkpoint's recipe, not ours (DeiT's: squash, crop, bicubic with
    # Pillow's rounding, ImageNet mean / std): the signatures must follow it.
    model = kr.ViT("Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=7, attention="relu", preprocessing=RECIPE)
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign((rng.normal(0, 0.3, v.shape) + ("gamma" in v.path)).astype("float32"))
    path = tmp / "serving" / "1"
    kr.export.saved_model(model, path, label_names=LABELS)
    uint8 = rng.integers(0, 256, (7, 45, 60, 3), dtype=np.uint8)
    pre = rng.uniform(-1, 1, (7, 32, 32, 3)).astype("float32")
    png = np.array([png_bytes(im) for im in uint8], dtype=object)
    np.savez(tmp / "inputs.npz", uint8=uint8, pre=pre, png=png)
    proc = subprocess.run([sys.executable, "-c", CHECK, str(path), str(tmp / "inputs.npz")],
                          env=subprocess_env("tensorflow"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model, path, uint8, pre, json.loads(proc.stdout.strip().splitlines()[-1])


@CHILD_ON_TORCH
def test_probabilities_match_predict_on_the_same_preprocessed_images(exported):
    import tensorflow as tf

    model, _, uint8, pre, out = exported
    # The model's own recipe, by the backend's preprocessor (keras.ops under
    # JAX / PyTorch; not the TensorFlow function the signature calls).
    x = to_np(model.preprocessor(uint8))
    logits = model.predict(x, verbose=0)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(out["uint8_7"]["probabilities"], probs, atol=1e-4)
    np.testing.assert_allclose(out["uint8_1"]["probabilities"], probs[:1], atol=1e-4)
    np.testing.assert_allclose(out["bytes"], probs, atol=1e-4)  # PNG: lossless
    # ... which is not our default recipe's (the control).
    default = model.predict(kr.export.preprocess_uint8(tf.constant(uint8), (32, 32)).numpy(),
                            verbose=0)
    assert np.abs(default - logits).max() > 1e-2
    np.testing.assert_allclose(out["preprocessed"], model.predict(pre, verbose=0), atol=1e-4)
    np.testing.assert_allclose(out["preprocessed_xla"], out["preprocessed"], atol=1e-5)


@CHILD_ON_TORCH
def test_top_k_outputs_and_labels(exported):
    _, _, _, _, out = exported
    r = out["uint8_7"]
    probs = np.array(r["probabilities"])
    classes = np.array(r["top_k_classes"])
    assert classes.shape == (7, 5)
    np.testing.assert_array_equal(classes[:, 0], probs.argmax(1))
    np.testing.assert_allclose(r["top_k_scores"], np.take_along_axis(probs, classes, 1), rtol=1e-6)
    assert [[LABELS[c] for c in row] for row in classes] == r["top_k_labels"]


@CHILD_ON_TORCH
def test_bytes_path_equals_uint8_path(exported):
    _, _, _, _, out = exported
    np.testing.assert_allclose(out["bytes"], out["uint8_7"]["probabilities"], atol=1e-6)


@CHILD_ON_TORCH
def test_bad_serving_inputs_raise_clear_errors(exported):
    errors = exported[4]["errors"]
    assert errors["channels"] is not None and "3" in errors["channels"]
    assert errors["bytes"] is not None and "image" in errors["bytes"].lower()


@pytest.mark.full_only(
    "saved_model_cli on the JAX and TensorFlow exports (~9 s each): plain TensorFlow loads "
    "all four signatures of every backend's export in test_export's `exported` fixture (the "
    "dynamic (-1, -1, -1, 3) shape is read on PyTorch's only).",
    backends=('jax', 'tensorflow'))
def test_saved_model_cli_lists_the_signatures(exported):
    _, path, _, _, _ = exported
    cli = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", "show",
                          "--dir", str(path), "--all"], env=subprocess_env("tensorflow"),
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    for name in ("serving_default", "serve_bytes", "serve_preprocessed", "serve_preprocessed_xla"):
        assert f"signature_def['{name}']" in cli.stdout
    assert "shape: (-1, -1, -1, 3)" in cli.stdout  # dynamic batch and size


def test_export_rejects_a_feature_model(tmp_path):
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
                   include_top=False)
    with pytest.raises(ValueError, match="classifier"):
        kr.export.saved_model(model, tmp_path / "x")


# The ONNX graph is written by TensorFlow on every backend (a child process
# from the .keras file under JAX / PyTorch): exact GELU's rewrite is checked
# in the TensorFlow suite, the per-backend export with gelu_tanh everywhere.
@CHILD_ON_TORCH
@pytest.mark.parametrize("mlp_activation", [
    "gelu_tanh", pytest.param("gelu", marks=pytest.mark.backend_independent)])
def test_onnx_matches_predict_with_dynamic_batch(tmp_path, mlp_activation):
    """Also with exact GELU (timm's): TensorFlow writes it with `erfc`, which
    ONNX has no op for; the MLP writes it with `erf`."""
    import onnxruntime as ort

    model = kr.ViT("Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=7, attention="relu", mlp_activation=mlp_activation)
    rng = np.random.default_rng(1)
    for v in model.weights:
        v.assign((rng.normal(0, 0.3, v.shape) + ("gamma" in v.path)).astype("float32"))
    if mlp_activation == "gelu":
        path = kr.export.onnx(model, tmp_path / "m.onnx")
    else:  # through Keras' own call, as users write it
        path = model.export(str(tmp_path / "m.onnx"), format="onnx", verbose=False)
    session = ort.InferenceSession(str(path))
    name = session.get_inputs()[0].name
    for n in (1, 7):
        x = rng.uniform(-1, 1, (n, 32, 32, 3)).astype("float32")
        got = session.run(None, {name: x})[0]
        np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-4)


@CHILD_ON_TORCH
def test_export_of_a_model_with_a_custom_activation(tmp_path):
    """The TensorFlow child (from JAX / PyTorch) imports the module that
    registered the activation; one defined in __main__ gets a clear error."""
    import tensorflow as tf
    from custom_activation import squareplus

    model = kr.ViT("Ti/16", attention={"activation": squareplus}, image_size=32, depth=1,
                   width=32, num_heads=2, mlp_dim=64, num_classes=3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    for v in model.weights:  # a non-zero head, so the logits say something
        if v.path.startswith("head/"):
            v.assign(np.random.default_rng(1).normal(0, 0.5, v.shape).astype("float32"))
    if keras.backend.backend() != "tensorflow":
        assert kr.export.custom_modules(model) == ["custom_activation"]
    path = kr.export.saved_model(model, tmp_path / "sm" / "1")
    served = tf.saved_model.load(str(path))
    got = served.signatures["serve_preprocessed"](images=tf.constant(x))["logits"].numpy()
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-4)

    def in_main(x):
        return keras.ops.relu(x) ** 3

    in_main.__module__ = "__main__"
    keras.saving.register_keras_serializable(package="notebook")(in_main)
    model = kr.ViT("Ti/16", attention={"activation": in_main}, image_size=32, depth=1,
                   width=32, num_heads=2, mlp_dim=64, num_classes=3)
    if keras.backend.backend() != "tensorflow":
        with pytest.raises(ValueError, match="__main__"):
            kr.export.saved_model(model, tmp_path / "sm2" / "1")


KERAS_CALL = textwrap.dedent("""
    import json, sys, numpy as np, tensorflow as tf
    m = tf.saved_model.load(sys.argv[1])
    x = np.load(sys.argv[2])
    print(json.dumps({"serve": m.serve(tf.constant(x)).numpy().tolist(),
                      "signatures": sorted(m.signatures.keys())}))
""")


@CHILD_ON_TORCH
def test_keras_export_call_works_on_every_backend(tmp_path, capsys):
    """`model.export(path, format="tf_saved_model")` as users write it (Keras
    3.15's own writer fails on PyTorch): the archive loads with plain
    TensorFlow, its `serve` equals `model.predict`, and it has the serving
    signatures; one line says what was written. (`format="onnx"`: the ONNX
    test below.)"""
    model = kr.ViT("Ti/8", width=32, depth=2, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=7, attention="relu", label_names=LABELS)
    rng = np.random.default_rng(3)
    for v in model.weights:
        v.assign((rng.normal(0, 0.3, v.shape) + ("gamma" in v.path)).astype("float32"))
    x = rng.uniform(-1, 1, (5, 32, 32, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    path = model.export(str(tmp_path / "vit_relu"), format="tf_saved_model")
    assert "keras_reluvit: wrote a SavedModel" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, "-c", KERAS_CALL, str(path), str(tmp_path / "x.npy")],
                          env=subprocess_env("tensorflow"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["serve"], model.predict(x, verbose=0), atol=1e-4)
    assert {"serving_default", "serve_bytes", "serve", "serve_preprocessed"} <= set(
        out["signatures"])
    # ONNX through the same call: test_onnx_matches_predict_with_dynamic_batch.


def test_keras_export_arguments_are_checked_by_name(tmp_path):
    model = kr.ViT("Ti/8", width=32, depth=1, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=3)
    with pytest.raises(ValueError, match=r"does not take \['is_static'\]"):
        model.export(str(tmp_path / "a"), is_static=True)
    with pytest.raises(ValueError, match=r"takes one input of shape \[batch, 32, 32, 3\]"):
        model.export(str(tmp_path / "b"), input_signature=[keras.InputSpec(shape=(None, 64, 64, 3))])
    # A plain Keras model is not ours: its export is Keras' own.
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert type(plain).export is keras.Model.export


@pytest.mark.backend_independent
def test_a_saved_model_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """Was: `saved_model/1` (the folder TF Serving loads as soon as it
    appears) first appeared holding only `variables/`; a stop then left it
    half written. Now it is written beside (`.1.partial`, not a version) and
    renamed; a write stopped midway leaves the earlier version as it was."""
    from keras_reluvit import export

    target = tmp_path / "saved_model" / "1"
    seen = []

    def writing(model, path, writer, options, modules=None):
        os.makedirs(os.path.join(path, "variables"))
        seen.append((os.path.basename(path), target.exists(), sorted(os.listdir(
            tmp_path / "saved_model"))))
        if options.get("top_k") == 3:
            raise KeyboardInterrupt  # a stop midway
        with open(os.path.join(path, "saved_model.pb"), "w") as f:
            f.write(str(options["top_k"]))

    monkeypatch.setattr(export, "_in_tensorflow", writing)
    model = kr.ViT(width=8, depth=1, num_heads=1, mlp_dim=8, patch_size=8, image_size=16,
                   num_classes=3)
    assert export.saved_model(model, str(target), top_k=2) == str(target)
    assert seen == [(".1.partial", False, [".1.partial"])]
    assert sorted(os.listdir(target)) == ["saved_model.pb", "variables"]
    with pytest.raises(KeyboardInterrupt):
        export.saved_model(model, str(target), top_k=3)
    assert (target / "saved_model.pb").read_text() == "2"  # the earlier version, whole
    export.saved_model(model, str(target), top_k=1)  # replaces it, leaves nothing beside
    assert (target / "saved_model.pb").read_text() == "1"
    assert sorted(os.listdir(tmp_path / "saved_model")) == ["1"]
