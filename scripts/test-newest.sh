#!/usr/bin/env bash
# The JAX suite on what `pip install` gives a new user today, beside CI's
# pinned set: Python 3.13, the newest JAX (CPU wheels), keras-nightly and
# Pillow; the Pallas kernels in interpret mode and their TPU / CUDA lowerings
# included. torch (CPU build, pinned: an unpinned torch pulls a CUDA build) is
# only the reference of the bicubic position-embedding test.
#   bash scripts/test-newest.sh            # extra arguments go to pytest
# KRV_NEWEST_VENV: the virtual environment (re-created when missing);
# KRV_NEWEST_PYTHON: the interpreter (default: pyenv's 3.13, else python3.13).
set -euo pipefail
export KERAS_BACKEND=jax
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KRV_NEWEST_VENV:-$HOME/.cache/keras-reluvit/newest-py313}"
if [ ! -f "$VENV/.complete" ]; then
  PY="${KRV_NEWEST_PYTHON:-}"
  if [ -z "$PY" ]; then
    if command -v pyenv >/dev/null && PYENV_VERSION=3.13.0 pyenv exec python -V >/dev/null 2>&1; then
      PY="$(PYENV_VERSION=3.13.0 pyenv which python)"
    else
      PY=python3.13
    fi
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q --upgrade "jax[cpu]" keras-nightly pillow h5py safetensors \
      scikit-image scikit-learn pytest "torch==2.13.0"
  touch "$VENV/.complete"
fi
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >/dev/null
cd "$ROOT"
"$VENV/bin/python" -c "import sys, jax, keras; print(f'python {sys.version.split()[0]}, jax {jax.__version__}, keras {keras.__version__}')"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=5 \
  tests/test_kernels.py tests/test_attention.py tests/test_attention_nd.py tests/test_vit.py \
  tests/test_measured_dispatch.py tests/test_accelerator_kernels.py tests/test_layer_harness.py \
  tests/test_keras_compat.py "$@"
