"""Keras' own MultiHeadAttention test suite, unchanged, against
`PointwiseAttention(activation="softmax")`.

The suite ships with Keras (`keras/src/layers/attention/
multi_head_attention_test.py`); a conftest puts our layer where the suite
reads `layers.MultiHeadAttention`, and pytest runs it on each backend in a
child process. Every test must pass (Keras' own backend skips aside: the
suite skips its flash-attention checks on TensorFlow)."""

import re
import subprocess
import sys

import pytest
from conftest import subprocess_env

CONFTEST = '''
import types

import keras
from keras.src.layers.attention import multi_head_attention_test as suite

import keras_reluvit as kr


@keras.saving.register_keras_serializable(package="keras_mha_suite")
class SoftmaxPointwiseAttention(kr.PointwiseAttention):
    def __init__(self, *args, activation="softmax", **kwargs):
        super().__init__(*args, activation=activation, **kwargs)


names = {k: getattr(suite.layers, k) for k in dir(suite.layers) if not k.startswith("__")}
suite.layers = types.SimpleNamespace(**dict(names, MultiHeadAttention=SoftmaxPointwiseAttention))
'''

SUITE = "from keras.src.layers.attention.multi_head_attention_test import *  # noqa\n"


@pytest.mark.full_only("Keras' MultiHeadAttention suite with pointwise attention runs on "
                       "PyTorch in CI; the attention itself is checked on every backend.",
                       ids=("tensorflow", "jax"))
@pytest.mark.parametrize("backend", ["jax", "tensorflow", "torch"])
def test_keras_multi_head_attention_suite_passes_with_pointwise_attention(backend, tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_keras_mha.py").write_text(SUITE)
    env = subprocess_env(backend)
    env.pop("TRITON_INTERPRET", None) if backend == "tensorflow" else None
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", "-rs",
         str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", tail)}
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, tail
    assert counts.get("passed", 0) >= 48, tail
    skips = re.findall(r"SKIPPED \[\d+\] (.*)", tail)
    assert all("flash" in s.lower() or "backend" in s.lower() for s in skips), skips
