#!/usr/bin/env bash
# Runs the whole test suite: backend-independent tests once, then the
# per-backend suite under JAX, TensorFlow and PyTorch. Fails if any fails.
# Extra arguments go to every pytest call (e.g. -x, -k attention).
source "$(dirname "$0")/env.sh"
status=0
summary=()
run() {
  local label="$1"; shift
  echo "=== $label ==="
  if "$@"; then summary+=("$label: passed"); else summary+=("$label: FAILED"); status=1; fi
}
run "backend-independent (torch)" env KERAS_BACKEND=torch python -m pytest tests/once -q "$@"
for backend in jax tensorflow torch; do
  run "$backend" env KERAS_BACKEND="$backend" python -m pytest tests -q --ignore=tests/once "$@"
done
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
exit $status
