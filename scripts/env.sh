# Sourced by the scripts: makes (once) and activates the project's venv.
# The venv is keyed by the requirement files, so a change re-creates it;
# KRV_VENV overrides its location.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEY="$(cat "$ROOT"/requirements/*.txt | sha256sum | cut -c1-12)"
VENV="${KRV_VENV:-$HOME/.cache/keras-reluvit/venv-$KEY}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[env] creating $VENV" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
  "$VENV/bin/pip" install -q -r "$ROOT/requirements/test.txt"
  # keras-hub without its dependencies (they pull tensorflow-text).
  "$VENV/bin/pip" install -q --no-deps -r "$ROOT/requirements/keras-hub.txt"
  touch "$VENV/.complete"
fi
# The package itself, from this checkout (cheap; no dependencies re-resolved).
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >/dev/null
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
cd "$ROOT"
