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
# KRV_JAX_FAST_COMPILE (default 1): the JAX suite's process, and the JAX child
# processes that tests start for a few steps, compile with most of XLA's
# optimisations off (tests/conftest.py subprocess_env); 0 keeps them
# (docs/development.md).
export KRV_JAX_FAST_COMPILE="${KRV_JAX_FAST_COMPILE:-1}"
# Every pytest run keeps each test's seconds (tests/helpers/durations.py):
# per-file totals at the end of its output, and the per-test numbers in
# KRV_DURATIONS_DIR (default: the run's temporary folder), from which
# `python scripts/lanes.py update DIR` refreshes tests/durations.json.
DURATIONS_DIR="${KRV_DURATIONS_DIR:-$LOGS}"
mkdir -p "$DURATIONS_DIR"
# Two lanes on two cores: each process's math libraries get one thread
# (OpenMP / torch's intra-op pool, TensorFlow's intra-op pool) instead of one
# per core, so the lanes do not oversubscribe the cores. KRV_THREADS=0 keeps
# the libraries' defaults (the A/B in docs/development.md).
if [ "${KRV_THREADS:-1}" != 0 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${KRV_THREADS:-1}}"
  export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-${KRV_THREADS:-1}}"
fi
suite() {  # label, durations file's name, then the command
  local label="$1" name="$2"; shift 2
  local start=$SECONDS
  if env KRV_DURATIONS_OUT="$DURATIONS_DIR/durations-$name.json" "$@" -p tests.helpers.durations \
      > "$LOGS/$label.log" 2>&1; then echo passed > "$LOGS/$label.status"
  else echo FAILED > "$LOGS/$label.status"; fi
  echo "$label: $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s" \
    > "$LOGS/$label.time"
  echo "=== $label ===" ; cat "$LOGS/$label.log"
}
# The once lane: tests/once plus the tests marked backend_independent (TensorFlow-
# only code, the same under every backend; tests/conftest.py), which the three
# backend suites then leave out.
# --durations: each lane lists its slowest tests (CI must stay within 25 min).
# To balance the lanes, files of tests/once run at the end of the backend lane
# instead, still once, under torch: which ones, scripts/lanes.py computes from
# the durations measured last (tests/durations.json).
read -r -a SECOND_LANE_ONCE <<< "$(python scripts/lanes.py second-lane)"
python scripts/lanes.py totals
IGNORE_SECOND=()
for f in "${SECOND_LANE_ONCE[@]}"; do IGNORE_SECOND+=(--ignore="$f"); done
once() { suite "backend-independent (torch)" once env KERAS_BACKEND=torch \
           KRV_BACKEND_INDEPENDENT=only python -m pytest tests -q --durations=15 \
           "${IGNORE_SECOND[@]}" "$@"; }
backends() {
  local start=$SECONDS
  for backend in jax tensorflow torch; do
    local fast=()
    if [ "$backend" = jax ] && [ "$KRV_JAX_FAST_COMPILE" = 1 ]; then
      fast=(JAX_DISABLE_MOST_OPTIMIZATIONS=1)
    fi
    suite "$backend" "$backend" env KERAS_BACKEND="$backend" KRV_BACKEND_INDEPENDENT=skip \
      "${fast[@]}" python -m pytest tests -q --durations=10 --ignore=tests/once "$@"
  done
  if [ ${#SECOND_LANE_ONCE[@]} -gt 0 ]; then
    suite "backend-independent, 2nd lane (torch)" once-2 env KERAS_BACKEND=torch \
      KRV_BACKEND_INDEPENDENT=only bash -c \
      'python -m pytest "$@"; rc=$?; [ $rc = 5 ] && rc=0; exit $rc' _ "${SECOND_LANE_ONCE[@]}" \
      -q --durations=5 "$@"
  else
    echo passed > "$LOGS/backend-independent, 2nd lane (torch).status"
  fi
  echo "== backend lane: $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s" \
    > "$LOGS/~lane.time"
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
cat "$LOGS"/*.time 2>/dev/null
status=0
for label in "backend-independent (torch)" jax tensorflow torch "backend-independent, 2nd lane (torch)"; do
  result="$(cat "$LOGS/$label.status" 2>/dev/null || echo 'FAILED (no result)')"
  echo "$label: $result"
  [ "$result" = passed ] || status=1
done
rm -rf "$LOGS"
exit $status
