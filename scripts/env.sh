# Sourced by the scripts: makes (once) and activates the project's venv.
# The venv is keyed by the requirement files, so a change re-creates it;
# KRV_VENV overrides its location. KRV_PROFILE=peers makes the peers
# benchmark's venv instead (benchmarks/env-peers.sh): requirements/test.txt
# without its torch and triton pins (torch 2.14.1 brings its own triton),
# plus benchmarks/requirements-peers.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ "${KRV_PROFILE:-test}" = peers ]; then
  KEY="$(cat "$ROOT"/requirements/test.txt "$ROOT"/benchmarks/requirements-peers.txt | sha256sum | cut -c1-12)"
  VENV="${KRV_PEERS_VENV:-$HOME/.cache/keras-reluvit/peers-$KEY}"
else
  KEY="$(cat "$ROOT"/requirements/*.txt | sha256sum | cut -c1-12)"
  VENV="${KRV_VENV:-$HOME/.cache/keras-reluvit/venv-$KEY}"
fi
# pip compiles every module's bytecode (~55 of a fresh venv's ~120 s): left to
# Python instead (--no-compile) every process compiled TensorFlow, JAX, ...
# from source again where PYTHONDONTWRITEBYTECODE is set, as on our CI machine
# (the JAX suite 10.5 -> 15.7 min).
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[env] creating $VENV" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
  if [ "${KRV_PROFILE:-test}" = peers ]; then
    grep -v -E '^(torch|triton)==' "$ROOT/requirements/test.txt" > "$VENV/test-without-torch.txt"
    "$VENV/bin/pip" install -q -r "$VENV/test-without-torch.txt" \
        -r "$ROOT/benchmarks/requirements-peers.txt"
  else
    # The three largest wheels first (~2.2 GB unpacked and compiled), two pip
    # processes side by side on their own (no dependencies: disjoint files);
    # the full install then finds them in place (a fresh venv ~120 -> ~85 s).
    big() { grep -E "^($1)==" "$ROOT/requirements/test.txt"; }
    "$VENV/bin/pip" install -q --no-deps $(big tensorflow-cpu) &
    "$VENV/bin/pip" install -q --no-deps $(big 'torch|triton')
    wait $!
    "$VENV/bin/pip" install -q -r "$ROOT/requirements/test.txt"
    # keras-hub without its dependencies (they pull tensorflow-text).
    "$VENV/bin/pip" install -q --no-deps -r "$ROOT/requirements/keras-hub.txt"
  fi
  touch "$VENV/.complete"
fi
# The package itself, from this checkout (cheap; no dependencies re-resolved).
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >/dev/null
# Our own modules' bytecode, written once (~0.5 s): where PYTHONDONTWRITEBYTECODE
# is set (our CI machine) each of a test run's hundreds of Python processes
# compiled them from source again (~0.4 s each). A file edited later is
# recompiled in memory, as without this.
"$VENV/bin/python" -m compileall -q "$ROOT/keras_reluvit" "$ROOT/tests" "$ROOT/examples" \
    "$ROOT/benchmarks" >/dev/null || true
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
cd "$ROOT"
