"""The preprocessing recipe: its keys, values and defaults, checked
(the keys are documented in `keras_reluvit.preprocessing`)."""

import math

import numpy as np

RESIZE_MODES = ("shorter", "squash", "crop_resize", "border")
PILLOW_FILTERS = ("nearest", "box", "hamming", "lanczos")
INTERPOLATIONS = ("bicubic", "bilinear", "area") + PILLOW_FILTERS
CROP_OFFSETS = ("floor", "round")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

PASS_ORDERS = ("pillow", "horizontal")
ALPHA_RULES = ("drop", "white")

DEFAULT = dict(resize="shorter", crop_pct=0.875, interpolation="area", antialias=True,
               round_uint8=False, pass_order="pillow", clip=True, alpha="drop",
               input_scale=255.0, crop_offset="floor", resize_rounding="round",
               mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _triple(value, key):
    try:
        values = [float(v) for v in (value if isinstance(value, (list, tuple, np.ndarray))
                                     else [value])]
    except (TypeError, ValueError):
        values = []
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"preprocessing {key!r} must be one number or three (RGB), "
                         f"got {value!r}.")
    return tuple(values)


def check_preprocessing(preprocessing=None):
    """The recipe, complete and canonical (a plain dict, JSON-friendly):
    `None` is `DEFAULT`; a dict overrides `DEFAULT`'s keys. A bad key or
    value raises a ValueError naming it."""
    if preprocessing is None:
        return dict(DEFAULT)
    if not isinstance(preprocessing, dict):
        raise ValueError("preprocessing must be a dict of "
                         f"{sorted(DEFAULT)}, got {type(preprocessing).__name__}.")
    unknown = sorted(set(preprocessing) - set(DEFAULT))
    if unknown:
        raise ValueError(f"Unknown preprocessing key(s) {unknown}; valid: {sorted(DEFAULT)}.")
    p = dict(DEFAULT, **preprocessing)
    for key, valid in (("resize", RESIZE_MODES), ("interpolation", INTERPOLATIONS),
                       ("crop_offset", CROP_OFFSETS), ("resize_rounding", CROP_OFFSETS),
                       ("pass_order", PASS_ORDERS), ("alpha", ALPHA_RULES)):
        if p[key] not in valid:
            raise ValueError(f"preprocessing {key!r} must be one of {valid}, got {p[key]!r}.")
    try:
        crop = float(p["crop_pct"])
    except (TypeError, ValueError):
        crop = float("nan")
    if not 0 < crop <= 1:
        raise ValueError(f"preprocessing 'crop_pct' must be in (0, 1], got {p['crop_pct']!r}.")
    if p["resize"] == "crop_resize" and crop != 1:
        raise ValueError("preprocessing resize='crop_resize' crops the whole centred region; "
                         f"it takes crop_pct=1, got {crop}.")
    for key in ("antialias", "round_uint8", "clip"):
        if not isinstance(p[key], (bool, np.bool_)):
            raise ValueError(f"preprocessing {key!r} must be True or False, got {p[key]!r}.")
    if isinstance(p["input_scale"], bool) or p["input_scale"] not in (1, 255):
        raise ValueError("preprocessing 'input_scale' must be 255 (0-255 pixels) or 1 "
                         f"([0, 1] floats), got {p['input_scale']!r}.")
    mean, std = _triple(p["mean"], "mean"), _triple(p["std"], "std")
    if min(std) <= 0:
        raise ValueError(f"preprocessing 'std' must be positive, got {std}.")
    return dict(p, crop_pct=crop, antialias=bool(p["antialias"]),
                round_uint8=bool(p["round_uint8"]), clip=bool(p["clip"]),
                input_scale=float(p["input_scale"]), mean=mean, std=std)

