"""The seam for Keras' private code (keras_reluvit/_keras_compat.py): every
private API it lists holds on the installed Keras, a change is reported by
name, and nothing else in the package reaches into Keras' internals."""

import os
import re

import keras

from keras_reluvit import _keras_compat as compat

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_reluvit")

# What only the seam may touch: Keras' private modules and attributes.
PRIVATE_USES = re.compile(
    r"keras\.src|\._flatten_layers\b|\._symbolic_build\b|\._maybe_symbolic_build\b|"
    r"\._AUGMENT_LAYERS\b|_custom_histogram_fixed_width|\._all_reduce_sum_gradients\b|"
    r"\._clip_gradients\b|\._compute_loss\b|\._loss_tracker\b|\._call_has_training_arg\b|"
    r"\bv\._value\b|\.backend\.set_backend\b|_collective_all_reduce_multi_worker")


def test_every_private_keras_api_holds_on_this_keras():
    assert compat.check() == {}, compat.check()


def test_a_keras_change_is_reported_by_name(monkeypatch):
    """Seeded: Keras renames MultiHeadAttention's hook and RandAugment's
    table of sub-layers."""
    monkeypatch.delattr(keras.layers.MultiHeadAttention, "_compute_attention")
    monkeypatch.delattr(keras.layers.RandAugment, "_AUGMENT_LAYERS", raising=False)
    failed = compat.check()
    # (calling a MultiHeadAttention fails too: "attention")
    assert {"overridden", "augment"} <= set(failed) <= {"overridden", "augment", "attention"}, failed
    assert "MultiHeadAttention._compute_attention" in failed["overridden"]


def test_nothing_outside_the_seam_reaches_into_keras():
    found = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if not f.endswith(".py") or f == "_keras_compat.py":
                continue
            for i, line in enumerate(open(path, encoding="utf-8"), 1):
                if PRIVATE_USES.search(line.split("#")[0]):
                    found.append(f"{os.path.relpath(path, PKG)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
