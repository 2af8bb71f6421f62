"""Imports Triton early on the PyTorch backend, when it will be used.

Triton and TensorFlow both carry LLVM; in one process, loading Triton's after
TensorFlow's aborts the process ("CommandLine Error: Option ... registered
more than once"), while the other order works. A PyTorch user's pipeline
(tf.data, tfds) imports TensorFlow after keras_reluvit, so keras_reluvit
imports Triton first where its kernel would run: the torch backend with a
CUDA device, or Triton's interpreter (`TRITON_INTERPRET=1`). Elsewhere
nothing is imported (it costs ~1 s). If TensorFlow is already loaded the
dispatch says so instead of using the kernel.
"""

import importlib.util
import os
import sys


def triton():
    if "triton" in sys.modules or "tensorflow" in sys.modules:
        return
    backend = os.environ.get("KERAS_BACKEND")
    if backend is None:
        import keras

        backend = keras.backend.backend()
    if backend != "torch" or importlib.util.find_spec("triton") is None:
        return
    interpret = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    if not interpret:
        import torch

        if not torch.cuda.is_available():
            return
    import triton  # noqa: F401
