# Sourced: makes (once) and activates the peers benchmark's venv —
# requirements/test.txt without its torch pin, plus
# benchmarks/requirements-peers.txt (torch 2.14.1, torchvision, timm).
# KRV_PEERS_VENV overrides its location.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEY="$(cat "$ROOT"/requirements/test.txt "$ROOT"/benchmarks/requirements-peers.txt | sha256sum | cut -c1-12)"
VENV="${KRV_PEERS_VENV:-$HOME/.cache/keras-reluvit/peers-$KEY}"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[env-peers] creating $VENV (~6 GB)" >&2
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
  grep -v '^torch==' "$ROOT/requirements/test.txt" > "$VENV/test-without-torch.txt"
  "$VENV/bin/pip" install -q -r "$VENV/test-without-torch.txt" \
      -r "$ROOT/benchmarks/requirements-peers.txt"
  touch "$VENV/.complete"
fi
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT" >/dev/null
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
cd "$ROOT"
