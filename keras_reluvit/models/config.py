"""The ViT's arguments checked and made canonical: what `ViT(...)` accepts,
the error naming a bad one, and the config `get_config` returns."""


import numpy as np

from keras_reluvit.models import layers
from keras_reluvit.models import remat as remat_module
from keras_reluvit.models.attention import check_attention_args
from keras_reluvit.models.attention import check_heads
from keras_reluvit.models.attention import check_qk_norm
from keras_reluvit.models.attention import check_rate
from keras_reluvit.models.attention_kinds import resolve_attention
from keras_reluvit.models.variants import parse_variant
from keras_reluvit.preprocessing import check_preprocessing

POOLS = ("gap", "tok", "map", "tok_gap")
POSEMBS = ("learn", "sincos2d")
DROP_PATH_SCHEDULES = ("linear", "uniform")
# The head kernel's initialisation: big_vision's zeros, or timm's trunc_normal_(std=.02)
# (DeiT's VisionTransformer, DeiT III's vit_models; its bounds +-2 are 100 std away).
HEAD_INITS = ("zeros", "trunc_normal")
HEAD_INIT_STD = 0.02


def _pair(value, what):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value), int(value))
    try:
        value = tuple(int(v) for v in value)
    except TypeError:
        value = ()
    if len(value) != 2 or min(value) <= 0:
        raise ValueError(
            f"`{what}` must be a positive int or (height, width), "
            f"got {value!r}."
        )
    return value


def _positive_int(value, what):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value <= 0
    ):
        raise ValueError(f"`{what}` must be a positive int, got {value!r}.")
    return int(value)



def _checked_config(variant, attention, num_classes, image_size, pool, posemb, qk_norm,
                    representation_size, dropout, include_top, mlp_activation,
                    head_bias_init, width, depth, mlp_dim, num_heads, patch_size,
                    class_token, num_register_tokens, posemb_prefix, fc_norm, layer_scale,
                    pre_norm, layer_norm_epsilon, preprocessing, label_names, dtype,
                    remat=None, drop_path=0.0, drop_path_schedule="linear", head_init="zeros"):
    """The ViT's arguments checked (a ValueError naming the argument and what
    would work) and canonical: `(config, attention_args)`, the config as
    `get_config` returns it."""
    dims = parse_variant(variant)
    for key, value in dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads,
                           patch_size=patch_size).items():
        if value is not None:
            dims[key] = value
    if "patch_size" not in dims:
        raise ValueError(
            f"Variant {variant!r} names no patch size; use e.g. "
            f"'{variant}/16' or pass patch_size."
        )
    for key in dims:
        dims[key] = _positive_int(dims[key], key)
    check_heads(dims["width"], dims["num_heads"])
    image_size = _pair(image_size, "image_size")
    patch = dims["patch_size"]
    if image_size[0] % patch or image_size[1] % patch:
        raise ValueError(
            f"image_size {image_size} is not divisible by the patch size "
            f"{patch}; use a multiple of {patch} such as "
            f"{(image_size[0] // patch or 1) * patch}."
        )
    if pool not in POOLS:
        raise ValueError(f"Unknown pool {pool!r}; valid: {POOLS}.")
    if posemb not in POSEMBS:
        raise ValueError(f"Unknown posemb {posemb!r}; valid: {POSEMBS}.")
    layers.check_mlp_activation(mlp_activation)
    dropout = check_rate(dropout, "dropout")
    drop_path = check_rate(drop_path, "drop_path")
    if drop_path_schedule not in DROP_PATH_SCHEDULES:
        raise ValueError(f"Unknown drop_path_schedule {drop_path_schedule!r}; valid: "
                         f"{DROP_PATH_SCHEDULES}.")
    if head_init not in HEAD_INITS:
        raise ValueError(f"Unknown head_init {head_init!r}; valid: {HEAD_INITS}.")
    if include_top:
        num_classes = _positive_int(num_classes, "num_classes")
    if representation_size is not None:
        representation_size = _positive_int(representation_size, "representation_size")
    attention_args = resolve_attention(attention)
    check_attention_args(**attention_args)  # fail now, with the layer's messages
    class_token = pool == "tok" if class_token is None else bool(class_token)
    if pool in ("tok", "tok_gap") and not class_token:
        raise ValueError(f'pool="{pool}" pools the class token; it needs class_token=True.')
    if pool == "tok_gap" and fc_norm:
        raise ValueError('pool="tok_gap" concatenates two normalised features; it has no '
                         'fc_norm (the final LayerNorm comes before the pooling).')
    num_register_tokens = (_positive_int(num_register_tokens, "num_register_tokens")
                           if num_register_tokens else 0)
    layer_norm_epsilon = float(layer_norm_epsilon)
    if not layer_norm_epsilon > 0:
        raise ValueError(f"`layer_norm_epsilon` must be > 0, got {layer_norm_epsilon!r}.")
    preprocessing = check_preprocessing(preprocessing)
    if label_names is not None:
        if isinstance(label_names, str) or not all(isinstance(n, str) for n in label_names):
            raise ValueError("`label_names` must be a list of strings, one per class.")
        label_names = list(label_names)
        if not include_top:
            raise ValueError("`label_names` name the classifier's outputs; this ViT has no "
                             "head (include_top=False).")
        if len(label_names) != num_classes:
            raise ValueError(f"{len(label_names)} `label_names` for num_classes={num_classes}.")
    config = dict(
        variant=variant, attention=attention, num_classes=num_classes,
        image_size=image_size, pool=pool, posemb=posemb, qk_norm=check_qk_norm(qk_norm),
        representation_size=representation_size, dropout=float(dropout),
        include_top=bool(include_top), mlp_activation=mlp_activation,
        head_bias_init=float(head_bias_init), **dims, class_token=class_token,
        num_register_tokens=num_register_tokens, posemb_prefix=bool(posemb_prefix),
        fc_norm=bool(fc_norm), layer_scale=None if layer_scale is None else float(layer_scale),
        pre_norm=bool(pre_norm), layer_norm_epsilon=layer_norm_epsilon,
        remat=remat_module.check(remat), drop_path=float(drop_path),
        drop_path_schedule=drop_path_schedule, head_init=head_init,
        preprocessing=preprocessing, label_names=label_names, dtype=dtype,
    )
    return config, attention_args
