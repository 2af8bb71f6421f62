#!/usr/bin/env bash
# The accelerator benchmark on a GPU machine without Keras (the H200 image:
# jax, torch, triton, no keras and no package registry). Wheels carried in
# .whl/ (keras, namex, optree for python 3.12: README, "Accelerators") are
# installed into /tmp/site first; then benchmarks/accelerator.py runs with
# its arguments. Elsewhere (Keras installed) it just runs the script.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import keras" 2>/dev/null; then
  [ -d .whl ] || { echo "keras is missing and no .whl/ wheels were carried" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
exec python3 benchmarks/accelerator.py "$@"
