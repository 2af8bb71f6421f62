"""Training recipes: big_vision's configs as data, compiled with Keras parts.

`compile(model, "s16_i1k_90ep", steps_per_epoch=len(train))` sets up
`keras.optimizers.AdamW` (decoupled weight decay on kernels only, global
clip 1.0), linear warmup + cosine decay (`keras.optimizers.schedules.
CosineDecay` with `warmup_steps`), the loss (softmax or sigmoid
cross-entropy) and accuracy metrics.

**Weight decay.** big_vision applies `-sched * (lr * adam + wd * theta)` to
`.*/kernel`; Keras' AdamW applies `-lr_t * (adam + weight_decay * theta)`, so
`weight_decay = wd / lr` (1e-4 / 1e-3 = 0.1) gives the same update. Biases,
LayerNorm scales/offsets, position embeddings, class token, MAP probe and
learned attention scales are excluded.

**Smaller batches.** The recipes were tuned at batch 1024 / 4096. Pass your
`batch_size`: the peak learning rate is scaled linearly
(`lr * batch_size / recipe_batch`, Goyal et al.) and the warmup keeps the same
number of *examples* (`warmup_steps * recipe_batch / batch_size`, at most half
the run, said in one line where that shortens it); `weight_decay = wd / lr` is kept, i.e. recomputed with the scaled
lr. Epochs are unchanged.
"""

import collections.abc
import copy
import dataclasses
import json

import keras
import numpy as np

from keras_reluvit._logging import say
from keras_reluvit.models.lora import classifier_head
from keras_reluvit.training.losses import LOSSES  # noqa: F401 - kr.recipes.LOSSES
from keras_reluvit.training.losses import BinarizedCrossEntropy
from keras_reluvit.training.losses import SigmoidCrossEntropy
from keras_reluvit.training.losses import check_loss
from keras_reluvit.training.optimizers import LayerDecayAdamW  # noqa: F401 - saved names
from keras_reluvit.training.optimizers import LayerDecaySGD  # noqa: F401
from keras_reluvit.training.optimizers import RecipeAdamW
from keras_reluvit.training.optimizers import RecipeLamb
from keras_reluvit.training.optimizers import RecipeSGD
from keras_reluvit.training.optimizers import swap_ema  # noqa: F401 - kr.recipes.swap_ema
from keras_reluvit.training.schedules import PerUpdate
from keras_reluvit.training.settings import Fields
from keras_reluvit.training.settings import current_names
from keras_reluvit.training.settings import freeze

_AUGREG_I1K_AUG = {  # variant: (randaug, mixup) -- vit_i1k.py
    "Ti/16": ((2, 0), 0.0),
    "S/32": ((2, 15), 0.2),
    "S/16": ((2, 15), 0.5),
    "B/32": ((2, 15), 0.5),
    "B/16": ((2, 15), 0.5),
    "L/16": ((2, 15), 0.5),
}
_AUGREG_I21K_AUG = {  # vit_i21k.py
    "Ti/16": (None, 0.0),
    "S/32": (None, 0.0),
    "S/16": ((2, 0), 0.0),
    "B/32": ((2, 10), 0.2),
    "B/16": ((2, 10), 0.2),
    "L/16": ((2, 15), 0.5),
}

# What the two AugReg configs share.
_AUGREG = dict(image_size=224, epochs=300, batch_size=4096, lr=1e-3, wd=1e-4,
               warmup_steps=10_000, grad_clip=1.0, loss="sigmoid_xent")

RECIPES = {
    "s16_i1k_90ep": dict(
        description='big_vision vit_s16_i1k.py, "Better plain ViT baselines" (76.5% top-1)',
        dataset="imagenet2012",
        image_size=224,
        epochs=90,
        batch_size=1024,
        lr=1e-3,
        wd=1e-4,
        warmup_steps=10_000,
        grad_clip=1.0,
        loss="softmax_xent",
        head_bias_init=0.0,
        model=dict(variant="S/16", pool="gap", posemb="sincos2d"),
        augment=dict(randaug=(2, 10), mixup=0.2),
    ),
    "augreg_i1k": dict(
        description="big_vision vit_i1k.py (AugReg, ImageNet-1k, 300 epochs)",
        dataset="imagenet2012",
        head_bias_init=-6.9,
        model=dict(variant="B/16", pool="tok", posemb="learn"),
        augment_by_variant=_AUGREG_I1K_AUG,
        **_AUGREG,
    ),
    "augreg_i21k": dict(
        description="big_vision vit_i21k.py (AugReg, ImageNet-21k, 300 epochs; "
        "i21k is not in public tfds: pass your own dataset)",
        dataset="imagenet21k",
        head_bias_init=-10.0,
        model=dict(variant="B/16", pool="gap", posemb="learn"),
        augment_by_variant=_AUGREG_I21K_AUG,
        **_AUGREG,
    ),
    "digits": dict(
        description="the embedded default: a small ReLU/L ViT on sklearn_digits "
        "(32x32), >= 95% test accuracy in minutes on 2 CPU cores",
        dataset="sklearn_digits",
        image_size=32,
        epochs=30,
        batch_size=64,
        lr=2e-3,
        wd=1e-4,
        warmup_steps=60,
        grad_clip=1.0,
        loss="softmax_xent",
        head_bias_init=0.0,
        model=dict(variant="Ti/8", width=96, depth=4, num_heads=3, mlp_dim=192,
                   pool="gap", posemb="learn"),
        augment=dict(crop_area=(0.6, 1.0), crop_aspect=(0.85, 1.18), flip=False),
    ),
    "bv_transfer": dict(
        description="big_vision's transfer recipe (configs/transfer.py): fine-tune a "
        "pretrained checkpoint (--init) with SGD, momentum 0.9, lr 0.01 at batch 512 "
        "(scaled to yours), 500 warmup steps then cosine, gradient clipping at 1.0, no weight "
        "decay, a zero-initialised new head; the checkpoint's resolution unless --image-size "
        "(big_vision fine-tunes at 384 with the position embedding resampled)",
        dataset=None,
        image_size=None,
        epochs=10,
        batch_size=512,
        optimizer="sgd",
        momentum=0.9,
        lr=0.01,
        wd=0.0,
        warmup_steps=500,
        grad_clip=1.0,
        loss="softmax_xent",
        head_bias_init=0.0,
        init_required=True,
        model={},
        augment=dict(crop_area=(0.05, 1.0), flip=True),
    ),
    "adamw_finetune": dict(
        description="timm / BEiT / MAE-style fine-tune of a pretrained checkpoint (--init; "
        "MAE main_finetune.py's settings, 30 epochs where MAE runs 100 for ViT-B): AdamW "
        "(decoupled weight decay 0.05 on kernels), lr 1e-3 at batch 1024 (scaled to yours), 5 "
        "warmup epochs then cosine, layer-wise lr decay 0.75 (BEiT / MAE / timm --layer-decay), "
        "stochastic depth 0.1 (when the blocks train: --trainable all or lora), timm's "
        "RandomResizedCrop, RandAugment rand-m9-mstd0.5-inc1, MixUp 0.8 / CutMix 1.0 with "
        "label smoothing 0.1 in the targets, random erasing 0.25; the weights' EMA with --ema",
        dataset=None,
        image_size=None,
        epochs=30,
        batch_size=1024,
        optimizer="adamw",
        lr=1e-3,
        wd=5e-5,
        warmup_epochs=5,
        layer_decay=0.75,
        grad_clip=None,
        loss="softmax_xent",
        head_bias_init=0.0,
        init_required=True,
        model=dict(drop_path=0.1),
        augment=dict(crop_area=(0.08, 1.0), auto_augment="rand-m9-mstd0.5-inc1", erase=0.25,
                     interpolation="bicubic",
                     timm_mix=dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
                                   label_smoothing=0.1)),
    ),
    "relu_from_softmax": dict(
        description="fine-tune a softmax checkpoint into ReLU/L attention: load it with "
        "`--init CHECKPOINT --attention relu` (same weights, attention swapped), then a short "
        "AdamW run at a tenth of the from-scratch peak lr with a short warmup (our choice; "
        "the paper trains from scratch only)",
        dataset="imagenet2012",
        image_size=224,
        epochs=10,
        batch_size=1024,
        lr=1e-4,
        wd=1e-5,
        warmup_steps=1_000,
        grad_clip=1.0,
        loss="softmax_xent",
        head_bias_init=0.0,
        init_required=True,
        model=dict(attention="relu"),
        augment=dict(randaug=(2, 10), mixup=0.2),
    ),
}

# DeiT (Touvron et al. 2021, facebookresearch/deit main.py's defaults; Table 1 / 7 of
# the paper: 72.2 / 79.8 / 81.8 % top-1): AdamW lr 5e-4 per 512 images (1e-3 at 1024),
# weight decay 0.05 (torch's: here the decay at the peak lr, 0.05 x 1e-3), 5 warmup
# epochs then cosine, timm's RandomResizedCrop (area 8-100 %), rand-m9-mstd0.5-inc1, timm's
# MixUp 0.8 / CutMix 1.0 with label smoothing 0.1 in the targets, random erasing 0.25,
# repeated augmentation 3x (RASampler), stochastic depth 0.1, the weights' EMA 0.99996.
_DEIT = dict(dataset="imagenet2012", image_size=224, epochs=300, batch_size=1024,
             optimizer="adamw", lr=1e-3, wd=5e-5, warmup_epochs=5, loss="softmax_xent",
             head_bias_init=0.0, ema=0.99996,
             augment=dict(crop_area=(0.08, 1.0), auto_augment="rand-m9-mstd0.5-inc1",
                          erase=0.25, aug_repeats=3, interpolation="bicubic",
                          timm_mix=dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
                                        label_smoothing=0.1)))
_DEIT_DIFFERS = (" Differs from DeiT's: qk-layernorm on (the paper's setting for ReLU/L; "
                 "DeiT has none: qk_norm=False); the 3 copies of an image (repeated augmentation) share one "
                 "process' batch, where DeiT's RASampler deals them to 3 GPUs of the same "
                 "global batch; the cosine ends at 0 (timm's at 1e-5); inputs in [-1, 1] (ours; "
                 "DeiT's: ImageNet's mean / std) and evaluated with our resize (the shorter "
                 "side area-resized to 256 / 224 of the size, the centre cropped; DeiT's: "
                 "bicubic).")
for _name, _variant, _top1 in (("deit_ti16_300ep", "Ti/16", 72.2),
                               ("deit_s16_300ep", "S/16", 79.8),
                               ("deit_b16_300ep", "B/16", 81.8)):
    RECIPES[_name] = dict(
        description=f"DeiT-{_variant[:-3]} (Touvron et al. 2021, facebookresearch/deit "
        f"main.py; {_top1}% top-1 with softmax attention, the paper's Table 7)." + _DEIT_DIFFERS,
        model=dict(variant=_variant, pool="tok", posemb="learn", mlp_activation="gelu",
                   drop_path=0.1, head_init="trunc_normal"),
        **_DEIT)

# DeiT III (Touvron et al. 2022, facebookresearch/deit README_revenge.md, its ImageNet-1k
# training commands, 8 GPUs x 256 = batch 2048, the lr not scaled): LAMB (apex FusedLAMB,
# its built-in clipping at 1.0) with weight decay 0.05 (torch's: here 0.05 x lr), 5 warmup
# epochs then cosine, BCE on binarised targets, 3-Augment with colour jitter 0.3 after
# RandomResizedCrop + flip, timm's MixUp 0.8 / CutMix 1.0 without smoothing, repeated
# augmentation, no random erasing, LayerScale 1e-4 (models_v2.py), stochastic depth at
# the same rate in every block, main.py's EMA 0.99996. README commands run 800 epochs
# (81.4 / 83.8 % top-1 for S at 224 / B trained at 192 and fine-tuned at 224). main.py
# passes its --opt-eps (1e-8) to FusedLAMB: the recipes' `opt_eps` (timm's Lamb class
# defaults to 1e-6, as RecipeLamb does when built by hand).
_DEIT3 = dict(dataset="imagenet2012", epochs=400, batch_size=2048, optimizer="lamb",
              warmup_epochs=5, grad_clip=1.0, loss="bce", head_bias_init=0.0, ema=0.99996,
              augment=dict(crop_area=(0.08, 1.0), three_augment=True, color_jitter=0.3,
                           aug_repeats=3, interpolation="bicubic", timm_mix=dict(mixup_alpha=0.8, cutmix_alpha=1.0,
                                                    switch_prob=0.5, label_smoothing=0.0)))
_DEIT3_DIFFERS = (" Differs from DeiT III's: qk-layernorm on (the paper's setting for ReLU/L; "
                  "qk_norm=False for DeiT III's); 400 epochs (the paper's shorter schedule; the "
                  "README's commands run 800); the 3 copies of an image share one process' "
                  "batch; warmup from 0 (DeiT's 1e-6) and the cosine to 0 (timm's 1e-5); "
                  "the Gaussian blur exact (Pillow's: three "
                  "box blurs); inputs in [-1, 1] (ours; DeiT III's: ImageNet's mean / std) and "
                  "evaluated with our resize (area; DeiT III's: bicubic).")
for _name, _variant, _size, _lr, _dp, _top1 in (
        ("deit3_s16_400ep", "S/16", 224, 4e-3, 0.05, "81.4% top-1 at 224 after 800 epochs"),
        ("deit3_b16_400ep", "B/16", 192, 3e-3, 0.2,
         "83.8% top-1 after 800 epochs at 192 and a 20-epoch fine-tune at 224, "
         "deit3_ft224")):
    RECIPES[_name] = dict(
        description=f"DeiT III ViT-{_variant[0]} (Touvron et al. 2022, facebookresearch/deit "
        f"README_revenge.md; {_top1}, softmax attention, the README's table), trained at "
        f"{_size} px." + _DEIT3_DIFFERS,
        image_size=_size, lr=_lr, wd=round(0.05 * _lr, 12),
        model=dict(variant=_variant, pool="tok", posemb="learn", posemb_prefix=False,
                   layer_scale=1e-4, mlp_activation="gelu", drop_path=_dp,
                   drop_path_schedule="uniform", head_init="trunc_normal"),
        **_DEIT3)

# DeiT III's fine-tune at 224 of the models trained at lower resolution (README_revenge.md:
# ViT-B / L / H, 8 GPUs x 64): AdamW lr 1e-5 (not scaled) and weight decay 0.1, 5 warmup
# epochs, 20 epochs, softmax cross-entropy with smoothing 0.1 in timm's MixUp / CutMix
# targets, rand-m9-mstd0.5-inc1, no repeated augmentation, no erasing, stochastic depth.
RECIPES["deit3_ft224"] = dict(
    description="DeiT III's fine-tune at 224 px of a checkpoint trained at lower resolution "
    "(--init, e.g. a deit3_b16_400ep run at 192; README_revenge.md's commands for ViT-B / L / H): "
    "AdamW lr 1e-5 at batch 512 and weight decay 0.1, 5 warmup epochs then cosine, 20 epochs, "
    "timm's RandAugment rand-m9-mstd0.5-inc1, MixUp 0.8 / CutMix 1.0 with smoothing 0.1, "
    "stochastic depth 0.2 (ViT-B's; --drop-path for L / H: 0.45 / 0.55), no repeated "
    "augmentation; the position embedding resampled to 224 on load. Differs from DeiT "
    "III's: warmup from 0 (DeiT's 1e-6) and the cosine to 0 (timm's 1e-5).",
    dataset="imagenet2012", image_size=224, epochs=20, batch_size=512, optimizer="adamw",
    lr=1e-5, wd=1e-6, warmup_epochs=5, loss="softmax_xent", head_bias_init=0.0,
    init_required=True, model=dict(drop_path=0.2), ema=0.99996,
    augment=dict(crop_area=(0.08, 1.0), auto_augment="rand-m9-mstd0.5-inc1",
                 interpolation="bicubic",
                 timm_mix=dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5,
                               label_smoothing=0.1)))

# An ImageNet epoch is hours of a pod: those runs back up every 1000 steps
# (big_vision's `ckpt_steps`), mid-epoch, as well as at each epoch's end.
for _recipe in RECIPES.values():
    if str(_recipe.get("dataset", "")).startswith("imagenet"):
        _recipe.setdefault("checkpoint_every", 1000)


@dataclasses.dataclass(frozen=True)
class Recipe(Fields):
    """One training recipe, typed and frozen: the fields of the `RECIPES`
    data (a key that is not a field is an error), each default written once
    -- the value the recipe means when its data leave the key out. Also a
    read-only mapping (`recipe["lr"]`, `dict(recipe, lr=...)`); a run's
    flags make another (`training.flags.apply`), as `dataclasses.replace`
    does."""

    name: str = None
    description: str = ""
    dataset: str = None  # None: the run names one (--dataset)
    image_size: int = None  # None: the checkpoint's (fine-tuning recipes)
    epochs: int = None
    batch_size: int = None
    optimizer: str = "adamw"  # or "sgd", "lamb"
    lr: float = None  # the peak, at `batch_size`
    wd: float = 0.0  # decoupled weight decay on kernels (big_vision's `wd`)
    momentum: float = 0.9  # SGD's
    nesterov: bool = False  # SGD's (timm's --opt sgd: True)
    opt_eps: float = 1e-8  # AdamW's and LAMB's epsilon (timm's / DeiT's --opt-eps, 1e-8)
    warmup_steps: int = None  # at `batch_size` ...
    warmup_epochs: float = None  # ... or in epochs (over `warmup_steps`)
    grad_clip: float = None  # global norm
    loss: str = "softmax_xent"  # or "sigmoid_xent", "bce" (LOSSES)
    label_smoothing: float = 0.0
    layer_decay: float = None
    head_bias_init: float = 0.0
    init_required: bool = False
    model: dict = dataclasses.field(default_factory=dict)
    augment: dict = dataclasses.field(default_factory=dict)
    augment_by_variant: dict = None
    # Long runs: steps between backups (None: at each epoch's end) and
    # gradient accumulation (K micro-batches of batch_size / K per update).
    checkpoint_every: int = None
    accum_steps: int = 1
    # timm's EMA of the weights: the decay (None: off) and ModelEmaV3's warm-up.
    ema: float = None
    ema_warmup: bool = False

    def __post_init__(self):
        freeze(self, "model", "augment", "augment_by_variant")


def get(name, variant=None):
    """The recipe `name` as a `Recipe`; `variant` picks the augmentation row of
    per-variant tables (AugReg)."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r}; valid: {', '.join(RECIPES)}.")
    recipe = copy.deepcopy(RECIPES[name])
    table = recipe.pop("augment_by_variant", None)
    if table is not None:
        variant = variant or recipe["model"]["variant"]
        if variant not in table:
            raise ValueError(
                f"Recipe {name!r} has augmentation settings for {sorted(table)}, "
                f"not {variant!r}."
            )
        randaug, mix = table[variant]
        recipe["augment"] = dict(randaug=randaug, mixup=mix)
        recipe["model"]["variant"] = variant
        recipe["augment_by_variant"] = {k: list(v) for k, v in table.items()}
    return Recipe(name=name, **recipe)


def probability(recipe):
    """The probability function that matches a recipe's loss (a recipe name,
    dict or loss name): `"sigmoid"` for `sigmoid_xent` and `bce`, else
    `"softmax"`. The one place serving exports and runs decide it."""
    if isinstance(recipe, collections.abc.Mapping):
        loss = recipe.get("loss")
    elif recipe in RECIPES:
        loss = RECIPES[recipe]["loss"]
    else:
        loss = recipe
    if loss is not None:
        check_loss(loss)
    return "sigmoid" if loss in ("sigmoid_xent", "bce") else "softmax"


def describe(name=None):
    """Printable text of one recipe (or all): its fields, then its training
    and evaluation pipelines, one line each (`kr.data.ops.describe`)."""
    from keras_reluvit.data import Augment
    from keras_reluvit.data.ops import describe as describe_pipelines

    names = [name] if name else list(RECIPES)
    def shown(recipe):  # what the recipe sets (momentum: SGD's)
        return {k: v for k, v in recipe.items() if k != "name" and v is not None
                and (k != "momentum" or recipe.optimizer == "sgd")}

    def text(n):
        recipe = get(n)
        lines = describe_pipelines(Augment(**current_names(recipe.augment)), recipe.image_size,
                                   checkpoint=recipe.init_required or recipe.image_size is None)
        return (f"{n}:\n" + json.dumps(shown(recipe), indent=2, default=list) + "\n"
                + "\n".join(f"{k} pipeline: {v}" for k, v in lines.items()))

    return "\n\n".join(text(n) for n in names)


WARMUP_CAP = 0.5  # a recipe's warmup takes at most this share of a (short) run


def scaled(recipe, batch_size, steps_per_epoch, epochs, lr=None, warmup_cap=WARMUP_CAP):
    """(peak lr, warmup steps, total steps) for `batch_size`; `lr` given is
    the peak itself (not scaled). The warmup is at most `warmup_cap` of the
    run's steps (None: as the recipe says, at most the run), said in one
    line where that shortens it."""
    ratio = batch_size / recipe["batch_size"]
    lr = recipe["lr"] * ratio if lr is None else float(lr)
    total = steps_per_epoch * epochs
    if recipe.get("warmup_epochs") is not None:
        warmup = int(round(recipe["warmup_epochs"] * steps_per_epoch))
    else:
        warmup = int(round(recipe["warmup_steps"] / ratio))
    most = total - 1 if warmup_cap is None else int(total * warmup_cap)
    if warmup > most:
        say(f"the warmup of {warmup} steps is longer than "
            + ("the run" if warmup_cap is None else f"{warmup_cap:g} of the run")
            + f" ({total} steps): warming up for {most} steps.")
        warmup = most
    return lr, max(warmup, 0), total


def compile(model, recipe, steps_per_epoch, batch_size=None, epochs=None, lr=None,
            layer_decay=None, accum_steps=None, ema=None, warmup_cap=WARMUP_CAP,
            **compile_kwargs):
    """Compiles `model` with the recipe's optimizer, schedule, loss, metrics.

    Args:
        model: a keras_reluvit ViT (or any Keras classifier on one-hot labels).
        recipe: a recipe name or dict (see `RECIPES`, `describe()`).
        steps_per_epoch: optimizer updates per epoch (`len(train)`; with
            `accum_steps` K, the batches of `batch_size` per epoch, each read
            as K micro-batches).
        batch_size: your global batch size; default the recipe's. Sets the
            learning-rate scaling described in the module docstring.
        epochs: default the recipe's.
        lr: the peak learning rate itself (no batch scaling); default the
            recipe's, scaled to `batch_size`.
        layer_decay: layer-wise learning-rate decay (BEiT / timm; see
            `keras_reluvit.finetune.layer_decay_scales`); default the
            recipe's (`adamw_finetune`: 0.75; others none). 1.0 or 0 is off.
        accum_steps: gradient accumulation: each update averages the
            gradients of K micro-batches (`fit` then steps K times per
            update; Keras' `gradient_accumulation_steps`), and the schedule
            counts updates (`PerUpdate`). Default the recipe's (1: off).
        ema: keep timm's EMA of the weights with this decay (e.g. DeiT's
            0.99996; the recipe's `ema_warmup`: timm's ModelEmaV3 warm-up);
            default the recipe's (None: off). See `RecipeAdamW`, `swap_ema`.
        warmup_cap: the largest share of the run's steps the recipe's warmup
            takes (default half: a short run of a long recipe still decays;
            said in one line when it shortens the warmup); None: the warmup
            as the recipe says (a run's `--warmup-epochs`).
        **compile_kwargs: passed to `model.compile` (e.g. `jit_compile`).
            On TensorFlow `jit_compile` defaults to True (XLA) unless
            `run_eagerly` is set or a `keras.distribution` is active: Keras'
            own "auto" leaves XLA off on machines without a GPU, where the
            unfused graph trains a ViT-S/16 ~1.4x slower (benchmarks/README.md).

    With a sigmoid cross-entropy recipe, a freshly built head (bias all zero)
    gets the recipe's bias init (-6.9 / -10, as big_vision).
    """
    recipe = get(recipe) if isinstance(recipe, str) else recipe
    batch_size = batch_size or recipe["batch_size"]
    epochs = epochs or recipe["epochs"]
    accum = int(recipe.get("accum_steps") or 1) if accum_steps is None else int(accum_steps)
    if accum < 1:
        raise ValueError(f"accum_steps must be at least 1, got {accum_steps!r}.")
    lr, warmup, total = scaled(recipe, batch_size, steps_per_epoch, epochs, lr, warmup_cap)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(total - warmup, 1),
        warmup_target=lr,
        warmup_steps=warmup,
    )
    if accum > 1:
        schedule = PerUpdate(schedule, accum)
    optimizer = _optimizer(model, recipe, schedule, layer_decay, accum, ema)
    loss, metrics = loss_and_metrics(model, recipe)
    if recipe["loss"] == "sigmoid_xent":
        head = classifier_head(model, required=False)
        if head is not None and recipe.get("head_bias_init"):
            bias = keras.ops.convert_to_numpy(head.bias)
            if np.all(bias == 0):
                head.bias.assign(np.full(bias.shape, recipe["head_bias_init"], "float32"))
    if (keras.backend.backend() == "tensorflow" and "jit_compile" not in compile_kwargs
            and not compile_kwargs.get("run_eagerly")
            and keras.distribution.distribution() is None):
        compile_kwargs["jit_compile"] = True
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, **compile_kwargs)
    return model


def loss_and_metrics(model, recipe):
    """The recipe's loss (with its label smoothing) and our metrics
    (accuracy; top-5 above 5 classes): what a run reports, and what
    `keras-reluvit eval` compiles to reproduce it."""
    recipe = get(recipe) if isinstance(recipe, str) else recipe
    check_loss(recipe["loss"])
    smoothing = float(recipe.get("label_smoothing") or 0.0)
    if recipe["loss"] == "sigmoid_xent":
        loss = SigmoidCrossEntropy()
    elif recipe["loss"] == "bce":
        loss = BinarizedCrossEntropy(label_smoothing=smoothing)
    else:
        loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
    metrics = [keras.metrics.CategoricalAccuracy(name="accuracy")]
    num_classes = model.output_shape[-1]
    if num_classes and num_classes > 5:
        metrics.append(keras.metrics.TopKCategoricalAccuracy(5, name="top5"))
    return loss, metrics


def _optimizer(model, recipe, schedule, layer_decay=None, accum=1, ema=None):
    """The recipe's optimizer (AdamW, LAMB, or SGD with momentum), with per-layer
    learning rates when `layer_decay` (or the recipe's) is set and timm's
    EMA of the weights when `ema` (or the recipe's) is a decay."""
    from keras_reluvit.training import finetune

    decay = recipe.get("layer_decay") if layer_decay is None else layer_decay
    scales = (finetune.layer_decay_scales(model, decay)
              if decay and float(decay) != 1.0 else None)
    ema = recipe.get("ema") if ema is None else ema
    kind = recipe.get("optimizer", "adamw")
    common = dict(learning_rate=schedule, global_clipnorm=recipe.get("grad_clip"),
                  **(dict(gradient_accumulation_steps=accum) if accum > 1 else {}))
    ours = bool(scales or ema)
    extra = {}
    if scales:
        extra["layer_scales"] = scales
    if ema:
        extra.update(use_ema=True, ema_momentum=float(ema),
                     ema_warmup=bool(recipe.get("ema_warmup")))
    if kind == "sgd":  # big_vision's has no weight decay; a recipe's wd is decoupled, as AdamW's
        cls = RecipeSGD if ours else keras.optimizers.SGD
        optimizer = cls(momentum=recipe.get("momentum", 0.9),
                        nesterov=bool(recipe.get("nesterov")),
                        weight_decay=(recipe["wd"] / recipe["lr"]) if recipe["wd"] else None,
                        **common, **extra)
    elif kind == "lamb":  # timm's / apex's LAMB always: Keras' differs (RecipeLamb)
        optimizer = RecipeLamb(weight_decay=recipe["wd"] / recipe["lr"], beta_1=0.9,
                               beta_2=0.999, epsilon=recipe["opt_eps"], **common, **extra)
    elif kind == "adamw":
        cls = RecipeAdamW if ours else keras.optimizers.AdamW
        optimizer = cls(weight_decay=recipe["wd"] / recipe["lr"], beta_1=0.9, beta_2=0.999,
                        epsilon=recipe["opt_eps"], **common, **extra)
    else:
        raise ValueError(f"Unknown optimizer {kind!r} in the recipe: adamw, sgd or lamb.")
    # Decay `.*/kernel` only, as big_vision. By variable (not by name regex:
    # a Keras variable's `name` is its full path on some backends, and the
    # stem's kernel path "embedding/kernel" would match "embedding").
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if not v.path.endswith("kernel")]
    )
    return optimizer
