#!/usr/bin/env bash
# The main job: train a small ReLU/L ViT on the embedded digits data set.
# KERAS_BACKEND picks the backend (default jax).
source "$(dirname "$0")/env.sh"
KERAS_BACKEND="${KERAS_BACKEND:-jax}" python examples/quickstart.py "$@"
