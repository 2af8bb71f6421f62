"""SavedModel export from every backend.

Keras 3.15's `model.export(format="tf_saved_model")` works on JAX and
TensorFlow; on PyTorch it needs torch_xla. There we save the `.keras` file
and export it from a TensorFlow-backend child process (same config, same
weights; the weights file format is backend-independent).
"""

import os
import subprocess
import sys
import tempfile

import keras

_CHILD = (
    "import sys, keras, keras_reluvit\n"
    "model = keras.saving.load_model(sys.argv[1], compile=False)\n"
    "model.export(sys.argv[2], format='tf_saved_model', verbose=False)\n"
)


def saved_model(model, path):
    """Writes a TF SavedModel of `model` (float images in [-1, 1] -> outputs)."""
    path = os.path.expanduser(os.fspath(path))
    if keras.backend.backend() in ("jax", "tensorflow"):
        model.export(path, format="tf_saved_model", verbose=False)
        return path
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, "model.keras")
        model.save(file)
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        proc = subprocess.run([sys.executable, "-c", _CHILD, file, path], env=env,
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"SavedModel export in a TensorFlow child process failed:\n"
                               f"{proc.stderr[-3000:]}")
    return path
