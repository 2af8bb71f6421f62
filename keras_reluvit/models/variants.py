"""The ViT size variants (big_vision's `decode_variant`) and the one parser
of variant names; plain data, importable by anything without the model."""

import re

# name: (width, depth, mlp_dim, num_heads) -- big_vision's `decode_variant`.
VARIANTS = {
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
}


def canonical_variant(name):
    """`"S/16"`, `"vit_s16"`, `"ViT_S16"`, `"s16"` -> `"S/16"` (`"S"` stays
    `"S"`): the one parser of variant names (builders, CLI, recipes)."""
    text = str(name).strip()
    m = re.fullmatch(r"(?:vit_)?([A-Za-z][A-Za-z0-9]*?)(?:/?(\d+))?", text, flags=re.IGNORECASE)
    sizes = {k.lower(): k for k in VARIANTS}
    if not m or m.group(1).lower() not in sizes:
        raise ValueError(
            f"Unknown ViT variant {name!r}; use '<size>/<patch>' (or vit_<size><patch>) with "
            f"size one of {', '.join(VARIANTS)} (e.g. 'S/16' or vit_s16)."
        )
    size = sizes[m.group(1).lower()]
    return f"{size}/{m.group(2)}" if m.group(2) else size


def parse_variant(variant):
    """`"S/16"` (or `"vit_s16"`) -> dict(width, depth, mlp_dim, num_heads,
    patch_size) -- big_vision's `decode_variant`."""
    canonical = canonical_variant(variant)
    size, _, patch = canonical.partition("/")
    width, depth, mlp_dim, heads = VARIANTS[size]
    out = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads)
    if patch:
        out["patch_size"] = int(patch)
    return out


def variant_with_patch(name):
    """`canonical_variant`, refusing a name without a patch size (`"S"`):
    what a command that builds a model needs (`"vit_s16"` -> `"S/16"`)."""
    variant = canonical_variant(name)
    if "/" not in variant:
        raise ValueError(f"{name!r} names no patch size; use e.g. vit_s16 or S/16.")
    return variant
