"""Parameter counts of every builder equal timm's VisionTransformer.

Backend-independent (variable shapes come from keras.ops-only code), so this
runs once. Models are built inside a StatelessScope, on PyTorch's "meta"
device (the once lane's backend): shapes without the cost of initialising
600M parameters (the initialisers' random draws took 10 s for g/14).
"""

import contextlib

import keras
import pytest

import keras_reluvit as kr

# timm's published counts (VisionTransformer, class token, learned posemb,
# 1000 classes) where timm has the model, e.g. vit_small_patch16_224.
PUBLISHED = {
    "ViT_Ti16": 5_717_416,
    "ViT_S16": 22_050_664,
    "ViT_S32": 22_878_952,
    "ViT_B16": 86_567_656,
    "ViT_B32": 88_224_232,
    "ViT_L16": 304_326_632,
    "ViT_L32": 306_535_400,
    "ViT_H14": 632_045_800,
}


@contextlib.contextmanager
def shapes_only():
    """Variables with shapes but no values drawn: a StatelessScope, and on
    PyTorch the "meta" device (no memory, no random draws)."""
    device = keras.device("meta") if keras.backend.backend() == "torch" else (
        contextlib.nullcontext())
    with device, keras.StatelessScope():
        yield


def timm_count(width, depth, mlp, patch, image=224, classes=1000):
    """timm VisionTransformer.__init__, counted by hand."""
    n = (image // patch) ** 2
    patch_embed = 3 * patch * patch * width + width
    cls_token, pos_embed = width, (n + 1) * width
    block = (
        2 * width                          # norm1
        + 3 * width * width + 3 * width    # qkv
        + width * width + width            # proj
        + 2 * width                        # norm2
        + width * mlp + mlp + mlp * width + width  # fc1, fc2
    )
    return patch_embed + cls_token + pos_embed + depth * block + 2 * width + width * classes + classes


@pytest.mark.parametrize("name", list(kr.BUILDERS))
def test_parameter_count_equals_timm(name):
    with shapes_only():
        model = kr.BUILDERS[name](pool="tok", posemb="learn", qk_norm=False, num_classes=1000)
    cfg = model.get_config()
    expected = timm_count(cfg["width"], cfg["depth"], cfg["mlp_dim"], cfg["patch_size"])
    assert model.count_params() == expected
    if name in PUBLISHED:
        assert model.count_params() == PUBLISHED[name]


# big_vision's sizes without a builder, as docs/models.md lists them.
OTHER_VARIANTS = {"M/16": 38_837_736, "So400m/14": 413_597_656, "g/14": 1_012_611_432}


@pytest.mark.parametrize("variant", list(OTHER_VARIANTS))
def test_other_variants_count_as_timm_and_the_docs_say(variant):
    with shapes_only():
        model = kr.ViT(variant, pool="tok", posemb="learn", qk_norm=False, num_classes=1000)
    cfg = model.get_config()
    assert model.count_params() == timm_count(cfg["width"], cfg["depth"], cfg["mlp_dim"],
                                              cfg["patch_size"]) == OTHER_VARIANTS[variant]
    if variant == "g/14":  # timm's vit_giant_patch14_224 card: 1012.6 M
        assert round(model.count_params() / 1e5) == 10126


def test_docs_models_table_holds_every_count():
    """The counts docs/models.md prints are the counted ones (no drift)."""
    import os
    import re

    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "models.md")).read()
    for name, count in list(PUBLISHED.items()) + list(OTHER_VARIANTS.items()):
        label = name if name.startswith("ViT_") else f"`\"{name}\"`"
        row = re.search(re.escape(label) + r" \|[^\n]*?([\d,]{9,})", text)
        assert row and int(row.group(1).replace(",", "")) == count, name


def test_qk_norm_adds_two_head_dim_scales_per_block():
    with shapes_only():
        a = kr.ViT_S16(qk_norm=False)
        b = kr.ViT_S16(qk_norm=True)
    assert b.count_params() - a.count_params() == 12 * 2 * 64
