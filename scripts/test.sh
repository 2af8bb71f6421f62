#!/usr/bin/env bash
# Runs the whole test suite: backend-independent tests once, then the
# per-backend suite under JAX, TensorFlow and PyTorch. Fails if any fails.
# Extra arguments go to every pytest call (e.g. -x, -k attention). `ruff check`
# runs first.
#
# Two lanes run side by side (one per core): `tests/once` (under torch) and
# the three per-backend suites one after the other. Each lane's output is
# printed when it ends; KRV_SERIAL=1 runs everything in one lane instead.
source "$(dirname "$0")/env.sh"
# The linter first ([tool.ruff] in pyproject.toml): pyflakes, pycodestyle,
# import order. A finding fails the run before any test starts.
echo "=== ruff check ==="
ruff check .
LOGS="$(mktemp -d)"
# transformers' reference outputs (tests/conftest.py run_hf_reference) do not
# depend on the backend under test: computed once per run, shared by the suites.
export KRV_REFERENCE_CACHE="$LOGS/references"
mkdir -p "$KRV_REFERENCE_CACHE"
# JAX's persistent compilation cache, shared by the run's processes: the many
# subprocesses that train the same tiny digits ViT (CLI runs, clusters,
# resumes, the notebook) compile each program once (test_resume: 68 s -> 57 s).
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$LOGS/jax-cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0.2}"
suite() {  # label, then the command
  local label="$1"; shift
  if "$@" > "$LOGS/$label.log" 2>&1; then echo passed > "$LOGS/$label.status"
  else echo FAILED > "$LOGS/$label.status"; fi
  echo "=== $label ===" ; cat "$LOGS/$label.log"
}
# The once lane: tests/once plus the tests marked backend_independent (TensorFlow-
# only code, the same under every backend; tests/conftest.py), which the three
# backend suites then leave out.
# --durations: each lane lists its slowest tests (CI must stay within 30 min).
# To balance the lanes, the docs' traps run at the end of the backend lane
# instead, still once, under torch (the wheel test and the README's Python
# blocks moved back to the once lane when the backend lane outgrew it: 35.6
# against 31.4 min in a full run on 2 cores).
SECOND_LANE_ONCE=(tests/once/test_traps.py)
IGNORE_SECOND=()
for f in "${SECOND_LANE_ONCE[@]}"; do IGNORE_SECOND+=(--ignore="$f"); done
once() { suite "backend-independent (torch)" env KERAS_BACKEND=torch KRV_BACKEND_INDEPENDENT=only \
           python -m pytest tests -q --durations=15 "${IGNORE_SECOND[@]}" "$@"; }
backends() {
  for backend in jax tensorflow torch; do
    suite "$backend" env KERAS_BACKEND="$backend" KRV_BACKEND_INDEPENDENT=skip \
      python -m pytest tests -q --durations=10 --ignore=tests/once "$@"
  done
  suite "backend-independent, 2nd lane (torch)" env KERAS_BACKEND=torch KRV_BACKEND_INDEPENDENT=only \
    bash -c 'python -m pytest "$@"; rc=$?; [ $rc = 5 ] && rc=0; exit $rc' _ "${SECOND_LANE_ONCE[@]}" \
    -q --durations=5 "$@"
}  # (exit 5: extra arguments such as -k selected none of its tests)
if [ "${KRV_SERIAL:-0}" = "1" ]; then
  once "$@"
  backends "$@"
else
  once "$@" &
  backends "$@" &
  wait
fi
echo "=== summary ==="
status=0
for label in "backend-independent (torch)" jax tensorflow torch "backend-independent, 2nd lane (torch)"; do
  result="$(cat "$LOGS/$label.status" 2>/dev/null || echo 'FAILED (no result)')"
  echo "$label: $result"
  [ "$result" = passed ] || status=1
done
rm -rf "$LOGS"
exit $status
