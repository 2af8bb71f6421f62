# Sourced: makes (once, ~6 GB) and activates the peers benchmark's venv —
# requirements/test.txt without its torch pin, plus
# benchmarks/requirements-peers.txt (torch 2.14.1, torchvision, timm).
# KRV_PEERS_VENV overrides its location.
KRV_PROFILE=peers source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
