#!/usr/bin/env bash
# The main job: `keras-reluvit train` with no dataset trains a small ReLU/L
# ViT on the embedded digits data set (tfds `sklearn_digits`), evaluates it
# and exports a SavedModel into runs/default. KERAS_BACKEND picks the backend
# (default jax); extra arguments go to `keras-reluvit train`.
source "$(dirname "$0")/env.sh"
KERAS_BACKEND="${KERAS_BACKEND:-jax}" keras-reluvit train --output runs/default --quiet "$@"
