"""Export for serving: a TF SavedModel with real serving signatures, ONNX.

Keras 3.15's `model.export(format="tf_saved_model")` fails on PyTorch
(torch_xla) and, on JAX, converts through jax2tf, where in-graph image
decoding and resizing cannot live. So the archive is always written by the
TensorFlow backend: in this process when it runs TensorFlow, otherwise in a
child process that loads the same `.keras` file (config and weights are
backend-independent; the logits agree across backends to <= 1e-4).

Signatures (dynamic batch):

- `serving_default`: uint8 images `[N, H, W, 3]` of any H, W -> the
  model's own preprocessing in the graph (`model.preprocessing`: its
  checkpoint's resize, crop and mean/std, antialiased; see
  `keras_reluvit.preprocessing`) -> `probabilities` `[N, C]`,
  `top_k_classes`, `top_k_scores` (k = min(5, C)) and `top_k_labels` when
  class names are known (`model.label_names` by default);
- `serve_bytes`: encoded JPEG/PNG/GIF/BMP strings `[N]` -> the same outputs
  (decoded in the graph, JPEG with the accurate integer DCT as PIL does;
  each image is preprocessed on its own size);
- `serve_preprocessed`: float model inputs `[N, res, res, 3]` (after the
  preprocessing) -> `logits`;
- `serve_preprocessed_xla`: the same, XLA-compiled (`jit_compile=True`);
- `serve`: Keras' own endpoint, as `model.export` names it: the model
  inputs -> the model's output (logits), `reloaded.serve(x)` equal to
  `model.predict(x)`.

`ViT.export(path, format="tf_saved_model")` — Keras' own call — writes this
archive on every backend (Keras 3.15's writer fails on PyTorch and cannot
hold the in-graph image decoding on JAX), a superset of Keras' archive
except that `serving_default` is the uint8-image signature (Keras': the
model inputs, which `serve` keeps). `format="onnx"` writes `onnx(...)`.

`onnx(model, path)` writes the classifier (preprocessed float images ->
logits, dynamic batch) through tf2onnx, also from every backend.

`probabilities` are the softmax of the logits, or their sigmoid for models
trained with a sigmoid cross-entropy (`activation="sigmoid"`).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras

from keras_reluvit._keras_compat import flatten_layers
from keras_reluvit.models import extensions

_CHILD = (
    "import sys, json, importlib, keras, keras_reluvit\n"
    "from keras_reluvit import export\n"
    "for name in json.loads(sys.argv[5]):\n"
    "    importlib.import_module(name)  # registers the model's custom objects\n"
    "model = keras.saving.load_model(sys.argv[1], compile=False)\n"
    "getattr(export, sys.argv[4])(model, sys.argv[2], **json.loads(sys.argv[3]))\n"
)


def custom_modules(model):
    """Modules the TensorFlow child process must import so that `.keras`
    loading finds the model's custom objects: where each registered object
    named in the model's serialized config was defined (its
    `register_keras_serializable` runs on import), and of callables the
    attention layers use. Raises for objects defined in `__main__`, which a
    child process cannot import."""
    modules, from_main = set(), []

    def walk(node):
        if isinstance(node, dict):
            name = node.get("registered_name")
            if isinstance(name, str):
                obj = keras.saving.get_registered_object(name)
                module = getattr(obj, "__module__", None) or ""
                if module == "__main__":
                    from_main.append(name)
                elif module and not module.startswith(("keras_reluvit", "keras.")):
                    modules.add(module)
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(keras.saving.serialize_keras_object(model))
    for layer in flatten_layers(model):
        fn = getattr(layer, "activation", None)
        if callable(fn) and type(layer).__name__ == "PointwiseAttention":
            module = getattr(fn, "__module__", "")
            if module == "__main__":
                from_main.append(getattr(fn, "__name__", repr(fn)))
            elif module and not module.startswith(("keras_reluvit", "keras.")):
                modules.add(module)
    if from_main:
        raise ValueError(
            f"Export runs in a TensorFlow child process, which cannot import {sorted(set(from_main))} "
            "defined in __main__ (a notebook or script). Put them in an importable module "
            "(a .py file on the path), register them there with "
            "@keras.saving.register_keras_serializable(), import it, and export again; or "
            "export under KERAS_BACKEND=tensorflow, which needs no child process.")
    return sorted(modules)


def _in_tensorflow(model, path, writer, options, modules=None):
    """Runs `writer(model, path, **options)` under the TensorFlow backend:
    here if that is the backend, else in a child process on a `.keras` copy
    that first imports `modules` (default: `custom_modules(model)`)."""
    if keras.backend.backend() == "tensorflow":
        globals()[writer](model, path, **options)
        return path
    modules = custom_modules(model) if modules is None else list(modules)
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "model.keras")
        model.save(file)
        # The child sees what this process imports from (custom modules
        # next to a script or a test).
        env = dict(os.environ, KERAS_BACKEND="tensorflow",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, file, path, json.dumps(options), writer,
             json.dumps(modules)],
            env=env, capture_output=True, text=True,
        )
        if proc.returncode:
            raise RuntimeError("Export in a TensorFlow child process failed:\n"
                               f"{proc.stderr[-3000:]}")
    return path


def saved_model(model, path, label_names=None, activation="softmax", top_k=5,
                custom_modules=None, input_signature=None):
    """Writes a TF-Serving SavedModel of a keras_reluvit ViT to `path`.

    Works for a model built and trained under any backend. `path` is the
    version directory TF Serving expects (e.g. `serving/vit_s16_relu/1`).
    From JAX / PyTorch a TensorFlow child process writes it; it imports the
    modules where the model's custom objects (e.g. a registered attention
    activation) live, found automatically, or `custom_modules` (names).
    `input_signature`: the shape of the `serve` endpoint's input, as Keras'
    `model.export` takes it (default `[None, *image_size, 3]` float32).

    Example:

    ```python
    kr.export.saved_model(model, "serving/vit_s16_relu/1")  # label names: the model's
    ```
    """
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}.")
    if not hasattr(model, "image_size") or not model.get_config().get("include_top", True):
        raise ValueError("saved_model exports a keras_reluvit ViT classifier (include_top=True).")
    label_names = label_names or model.label_names
    options = dict(label_names=list(label_names) if label_names else None,
                   activation=activation, top_k=int(top_k),
                   input_shape=serve_shape(model, input_signature))
    path = os.path.expanduser(os.fspath(path))
    return whole(path, lambda tmp: _in_tensorflow(model, tmp, "_write_saved_model", options,
                                                  custom_modules))


def whole(path, write):
    """`write(tmp)` into a folder beside `path` (`.NAME.partial`: not a
    version TF Serving loads), then renamed to `path`, replacing what was
    there: a server or a rerun sees the earlier folder or the new one whole,
    never a half-written one. Returns `path`."""
    parent, name = os.path.split(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp, old = os.path.join(parent, f".{name}.partial"), os.path.join(parent, f".{name}.old")
    if os.path.isdir(old) and not os.path.exists(path):  # stopped between the two renames
        os.replace(old, path)
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    write(tmp)
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def serve_shape(model, input_signature):
    """The input shape (a list, batch None or fixed) of Keras' `serve`
    endpoint from a Keras-style `input_signature` (one spec with `.shape`:
    `tf.TensorSpec`, `keras.InputSpec`, a `KerasTensor`, or a shape), checked
    against the model: `[batch, *image_size, 3]`."""
    want = [None, *model.image_size, 3]
    if input_signature is None:
        return want
    spec = input_signature
    if isinstance(spec, (list, tuple)) and len(spec) == 1 and hasattr(spec[0], "shape"):
        spec = spec[0]
    shape = getattr(spec, "shape", spec)
    try:
        shape = [None if d is None else int(d) for d in shape]
    except TypeError:
        shape = None
    if shape is None or len(shape) != 4 or shape[1:] != want[1:] or (
            shape[0] is not None and shape[0] < 1):
        raise ValueError(f"input_signature {input_signature!r}: {model.name} takes one input "
                         f"of shape [batch, {want[1]}, {want[2]}, 3] (batch None or a size).")
    return shape


def onnx(model, path, custom_modules=None, input_signature=None):
    """Writes an ONNX model of the classifier: float images `[N, res, res, 3]`
    (the model inputs, after the preprocessing) -> `logits` (dynamic batch,
    or the batch of `input_signature`), via tf2onnx from any backend.

    Example:

    ```python
    kr.export.onnx(model, "vit_s16_relu.onnx")
    ```
    """
    if not hasattr(model, "image_size"):
        raise ValueError("onnx exports a keras_reluvit ViT.")
    path = os.path.expanduser(os.fspath(path))
    options = {"input_shape": serve_shape(model, input_signature)}
    return _in_tensorflow(model, path, "_write_onnx", options, custom_modules)


def _write_onnx(model, path, input_shape=None):
    import tensorflow as tf

    spec = tf.TensorSpec(input_shape or (None, *model.image_size, 3), tf.float32, name="images")
    # Keras' own ONNX writer (ViT.export routes "onnx" here).
    keras.Model.export(model, path, format="onnx", verbose=False, input_signature=[spec])
    return path


def preprocess_uint8(images, size, preprocessing=None):
    """uint8 `[N, H, W, 3]` -> the model inputs `[N, h, w, 3]` under the
    recipe `preprocessing` (default ours), in TensorFlow ops, as the
    `serving_default` signature computes them."""
    from keras_reluvit.preprocessing import tf_preprocess

    return tf_preprocess(images, tuple(size), preprocessing)


def _write_saved_model(model, path, label_names=None, activation="softmax", top_k=5,
                       input_shape=None):
    import tensorflow as tf

    from keras_reluvit.preprocessing import decode_image
    from keras_reluvit.preprocessing import tf_preprocess

    size = tuple(model.image_size)
    recipe = model.preprocessing
    num_classes = int(model.output_shape[-1])
    k = min(top_k, num_classes)
    if label_names is not None and len(label_names) != num_classes:
        raise ValueError(f"{len(label_names)} label names for {num_classes} classes.")
    labels = tf.constant(label_names) if label_names else None

    def outputs(logits):
        probs = tf.nn.sigmoid(logits) if activation == "sigmoid" else tf.nn.softmax(logits)
        scores, classes = tf.math.top_k(probs, k=k)
        out = {"probabilities": probs, "top_k_classes": classes, "top_k_scores": scores}
        if labels is not None:
            out["top_k_labels"] = tf.gather(labels, classes)
        return out

    def serve_uint8(images):
        return outputs(model(tf_preprocess(images, size, recipe), training=False))

    def decode_one(data):
        return tf_preprocess(decode_image(data, alpha=recipe["alpha"]), size, recipe)

    def serve_bytes(data):
        x = tf.map_fn(decode_one, data, fn_output_signature=tf.TensorSpec((*size, 3), tf.float32))
        return outputs(model(x, training=False))

    def serve_preprocessed(images):
        return {"logits": model(images, training=False)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve_uint8,
                         [tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")])
    archive.add_endpoint("serve_bytes", serve_bytes,
                         [tf.TensorSpec([None], tf.string, name="image_bytes")])
    preprocessed = [tf.TensorSpec([None, *size, 3], tf.float32, name="images")]
    archive.add_endpoint("serve_preprocessed", serve_preprocessed, preprocessed)
    # The same, compiled by XLA when called (~1.4x on a CPU; needs a
    # TensorFlow / TF Serving build with XLA, as the pip wheels are).
    archive.add_endpoint("serve_preprocessed_xla", tf.function(
        serve_preprocessed, jit_compile=True, input_signature=preprocessed, autograph=False))
    # Keras' own endpoint (what `model.export` writes): inputs -> the output.
    archive.add_endpoint("serve", lambda x: model(x, training=False),
                         [tf.TensorSpec(input_shape or [None, *size, 3], tf.float32,
                                        name="inputs")])
    archive.write_out(path, verbose=False)
    return path


def timm_state_dict(model, path=None, strict=True):
    """Writes / returns the ViT in timm's `VisionTransformer` layout; see
    `keras_reluvit.checkpoints.timm_state_dict`."""
    from keras_reluvit import checkpoints

    return checkpoints.timm_state_dict(model, path, strict=strict)


def big_vision_npz(model, path=None):
    """Writes / returns the ViT in big_vision's `.npz` naming; see
    `keras_reluvit.checkpoints.big_vision_npz`."""
    from keras_reluvit import checkpoints

    return checkpoints.big_vision_npz(model, path)



def hf_state_dict(model, directory=None, strict=True):
    """Writes / returns the ViT as a transformers `ViTForImageClassification`
    (or headless `ViTModel`) directory; see
    `keras_reluvit.checkpoints.hf_state_dict`."""
    from keras_reluvit import checkpoints

    return checkpoints.hf_state_dict(model, directory, strict=strict)


# `ViT.export(format="tf_saved_model" | "onnx")` asks here.
extensions.register("export", sys.modules[__name__])
