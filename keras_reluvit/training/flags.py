"""The recipe's fields a run changes, their flags under our names and under
timm's (`train.py`) and DeiT's (`main.py`), and timm's meanings of them.

Each `Flag` of the table `FLAGS` sets one recipe field (`grad_clip`,
`augment.erase`, `augment.timm_mix.mixup_alpha`, ...); `RUN_ALIASES` holds
timm's and DeiT's names for the run's own options (`--model-ema-decay` for
`--ema`, `--input-size` for `--image-size`, `--epochs` as ours, ...). The
command line adds them (`keras_reluvit.cli.train_flags`) and turns the ones
given into `RunSettings.recipe_overrides`; `kr.build_config` applies those
to the recipe it resolves (`apply`: timm's meanings, each said in one line);
`config.json` records them. docs/training.md's alias table is `table()`.
Light: it imports no Keras (settings only).
"""

import dataclasses
import inspect

from keras_reluvit.training.settings import RECIPE_NUMBERS
from keras_reluvit.training.settings import check_number
from keras_reluvit.training.settings import thaw

# timm's Mixup as train.py builds it when a run turns it on (its argument defaults):
# what a recipe without timm_mix starts from when a flag sets one of its fields.
TIMM_MIX_DEFAULTS = dict(mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0, switch_prob=0.5,
                         mode="batch", label_smoothing=0.1)
# timm's --opt names -> the recipe's (optimizer, nesterov); timm's sgd is Nesterov's.
OPTIMIZERS = {"adamw": ("adamw", None), "momentum": ("sgd", False), "sgd": ("sgd", True),
              "nesterov": ("sgd", True), "lamb": ("lamb", None), "fusedlamb": ("lamb", None)}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag for a recipe field: `ours` (None: only timm's
    or DeiT's names exist, their meaning differs from any of ours), `theirs`
    (timm's / DeiT's spellings), the `field` it sets (`"smoothing"`,
    `"weight_decay"`: timm's meanings, turned into our fields by `apply`),
    `type` (None: a switch setting `const`), `help`, and `only`: the values
    accepted where we compute one of timm's choices only."""

    ours: str
    theirs: tuple
    field: str
    type: object
    help: str
    const: object = None
    choices: tuple = None
    only: tuple = None
    sets: str = None  # what it sets, for the table (default: the field)

    @property
    def dest(self):
        return "recipe_" + (self.ours or self.theirs[0]).lstrip("-").replace("-", "_").lower()


FLAGS = (
    Flag("--optimizer", ("--opt",), "optimizer", str, "the optimizer: adamw, momentum (SGD "
         "with momentum 0.9), sgd or nesterov (the same, Nesterov's: timm's sgd), lamb or "
         "fusedlamb (timm's / apex's LAMB)", choices=tuple(OPTIMIZERS),
         sets="`optimizer` (timm's `sgd` / `nesterov`: SGD with `nesterov`)"),
    Flag("--opt-eps", ("--opt-eps",), "opt_eps", float, "AdamW's / LAMB's epsilon (timm's and DeiT's "
         "--opt-eps; the recipes' 1e-8)"),
    Flag("--grad-clip", ("--clip-grad",), "grad_clip", float, "clip the gradient's global "
         "norm (timm's --clip-grad with its default --clip-mode norm)"),
    Flag("--wd", (), "wd", float, "decoupled weight decay (big_vision's wd): at the recipe's "
         "batch and lr each update subtracts wd x the kernel; it follows the learning rate "
         "(its schedule, its scaling to another batch)"),
    Flag(None, ("--weight-decay",), "weight_decay", float, "timm's / PyTorch's weight decay, "
         "multiplied by the learning rate: the recipe's wd = this x its lr",
         sets="`wd` = this x the recipe's `lr` (PyTorch's decay, times the lr; decoupled, as "
         "AdamW's and LAMB's: with SGD said, timm's SGD adds it to the gradient)"),
    Flag("--warmup-epochs", ("--warmup-epochs",), "warmup_epochs", float,
         "linear warmup, in epochs (fewer than the run's)",
         sets="`warmup_epochs`, as given (fewer than the run's epochs; a recipe's own warmup "
         "takes at most half a short run)"),
    Flag("--loss", (), "loss", str, "softmax_xent, sigmoid_xent or bce (DeiT III's)",
         choices=("softmax_xent", "sigmoid_xent", "bce")),
    Flag(None, ("--bce-loss",), "loss", None, "DeiT III's binary cross-entropy on binarised "
         "targets (--loss bce; timm's --bce-loss with --bce-target-thresh)", const="bce",
         sets="`loss` = `bce`: DeiT III's (binarised targets; timm's own keeps soft targets "
         "unless --bce-target-thresh)"),
    Flag("--label-smoothing", ("--smoothing",), "smoothing", float, "label smoothing: in "
         "timm's MixUp / CutMix when the run mixes with it, else in the loss (timm's "
         "--smoothing)", sets="`augment.timm_mix.label_smoothing` where the run mixes "
         "with timm's MixUp, else `label_smoothing` (the loss's, as timm's train.py; "
         "`--mixup 0 --cutmix 0` moves the recipe's MixUp smoothing there too)"),
    Flag("--mixup-alpha", ("--mixup",), "augment.timm_mix.mixup_alpha", float,
         "timm's MixUp: its Beta(alpha, alpha); 0: off"),
    Flag("--cutmix-alpha", ("--cutmix",), "augment.timm_mix.cutmix_alpha", float,
         "timm's CutMix: its Beta(alpha, alpha); 0: off"),
    Flag("--mix-prob", ("--mixup-prob",), "augment.timm_mix.prob", float,
         "probability that a batch (or image) is mixed"),
    Flag("--switch-prob", ("--mixup-switch-prob",), "augment.timm_mix.switch_prob", float,
         "with both on: the probability of CutMix"),
    Flag("--mix-mode", ("--mixup-mode",), "augment.timm_mix.mode", str,
         "batch, pair or elem: what one draw mixes", choices=("batch", "pair", "elem")),
    Flag("--erase", ("--reprob",), "augment.erase", float, "random erasing's probability "
         "(per-pixel noise: timm's --remode pixel, one box: --recount 1)"),
    Flag(None, ("--remode",), "augment.erase", str, "random erasing's fill: pixel only "
         "(per-pixel normal noise)", only=("pixel",)),
    Flag(None, ("--recount",), "augment.erase", int, "boxes per erased image: 1 only",
         only=(1,)),
    Flag("--crop", (), "augment.crop", str, "inception (random area and aspect, timm's "
         "RandomResizedCrop) or simple (DeiT III's --src)", choices=("inception", "simple")),
    Flag(None, ("--src",), "augment.crop", None, "DeiT III's simple random crop "
         "(--crop simple)", const="simple"),
    Flag("--color-jitter", ("--color-jitter",), "augment.color_jitter", float, "colour jitter after DeiT "
         "III's 3-Augment (torchvision's ColorJitter(j, j, j))"),
    Flag("--three-augment", ("--ThreeAugment",), "augment.three_augment", None,
         "DeiT III's 3-Augment: one of grayscale, solarize, blur per image, instead of the "
         "recipe's RandAugment and random erasing (as DeiT III's transform)", const=True,
         sets="`augment.three_augment` (the recipe's RandAugment and erasing off)"),
    Flag("--interpolation", ("--train-interpolation",), "augment.interpolation", str,
         "the crop's resize and the geometric augmentations' sampling: bicubic "
         "(Pillow's, DeiT's) or bilinear", choices=("bilinear", "bicubic")),
)
# timm's / DeiT's flags for the run's own options (not recipe fields): theirs ->
# (ours: None where the name is the same, a note where the meaning differs).
RUN_ALIASES = {
    "--model-ema-decay": ("--ema", ""),
    "--model-ema": ("--ema", "a switch: the recipe's decay, else timm's 0.9998"),
    "--input-size": ("--image-size", "DeiT's `N` or timm's `3 N N`"),
    "--aa": ("--auto-augment", ""),
    "--epochs": (None, ""), "--drop-path": (None, ""), "--aug-repeats": (None, ""),
    "--layer-decay": (None, ""), "--seed": (None, ""),
    "--lr": (None, "the peak lr as given; DeiT's main.py scales its --lr by batch / 512 "
                   "first: pass that product (DeiT-S: 5e-4 x 1024 / 512 = 1e-3)"),
    "--batch-size": (None, "the global batch; timm's and DeiT's is per process (DeiT: 8 x "
                           "256 = 2048)"),
}


def _get(recipe, path):
    node = recipe
    for key in path.split("."):
        node = None if node is None else node.get(key)
    return node


def _set(recipe, path, value):
    *parents, last = path.split(".")
    node = recipe
    for key in parents:
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
    node[last] = value


def _fields():
    """{path: default} of every field a flag or `recipe_overrides` may set:
    the recipe's, `augment.<Augment field>`, `augment.timm_mix.<argument>`,
    and timm's meanings `smoothing` and `weight_decay`."""
    from keras_reluvit.data import Augment
    from keras_reluvit.data.timm_augment import timm_mix
    from keras_reluvit.training.recipes import Recipe

    out = {f: None for f in Recipe.fields() if f not in ("name", "augment", "model")}
    out.update({f"augment.{f.name}": getattr(Augment(), f.name)
                for f in dataclasses.fields(Augment)})
    out.update({f"augment.timm_mix.{name}": p.default
                for name, p in inspect.signature(timm_mix).parameters.items()
                if p.default is not inspect.Parameter.empty})
    out.update(smoothing=None, weight_decay=None)
    return out


def check_ranges(fields):
    """Each number of `fields` ({recipe field: value}) in its range
    (`settings.RECIPE_NUMBERS`; a field named as a run setting is the run
    setting's to check), and each field a string: a ValueError naming the
    flag. Light (no Keras)."""
    for field, value in fields.items():
        if not isinstance(field, str):
            raise ValueError(f"recipe_overrides' keys are recipe fields, got {field!r}.")
        if field in RECIPE_NUMBERS:
            check_number(field, value, RECIPE_NUMBERS[field], flag=flag_name(field))


def flag_name(field):
    """The first `keras-reluvit train` spelling of the flag setting `field`."""
    for flag in FLAGS:
        if flag.field == field and not flag.only and flag.type is not None:
            return flag.ours or flag.theirs[0]
    return "recipe_overrides"


def _check(fields):
    known = _fields()
    for field in fields:
        if field not in known:
            raise ValueError(f"Unknown recipe field {field!r} in recipe_overrides; the fields: "
                             f"{', '.join(sorted(known))}.")
    check_ranges(fields)
    return known


def _current(recipe, path, known):
    """The value `path` has in `recipe`: its own, or the default that applies
    where the recipe leaves it out (Augment's, timm_mix's)."""
    value = _get(recipe, path)
    return known.get(path) if value is None and path.startswith("augment.") else value


LAST = ("weight_decay", "smoothing")


def apply(recipe, fields):
    """(`recipe` with `fields` ({field: value}, as `overrides` gives) set, a
    new `Recipe`; one line per field saying what it changed): `recipe`
    itself is left as it was. Checked: every field exists and every number is
    in its range. timm's meanings: `weight_decay` (PyTorch's, x lr) sets
    `wd`, `smoothing` the MixUp's smoothing where the run mixes with timm's
    MixUp, else the loss's; `optimizer` timm's names (`sgd`: Nesterov's); a
    timm_mix field on a recipe without one starts from timm's defaults (and
    replaces big_vision's `mixup`); both alphas 0 turn it off;
    `three_augment` replaces the recipe's RandAugment and erasing (DeiT
    III's transform)."""
    built = type(recipe)
    recipe = thaw(dict(recipe))  # a copy of the fields, changed here
    known = _check(fields)
    lines = []
    # 3-Augment first (it turns the recipe's RandAugment and erasing off, not a flag's);
    # timm's meanings last: the smoothing goes where the MixUp is once the alphas are set
    # (into the loss where they turn it off, as timm's train.py).
    first = [f for f in ("augment.three_augment",) if f in fields]
    ordered = first + [f for f in fields if f not in LAST + tuple(first)] + [
        f for f in LAST if f in fields]
    mixing_settled, created = False, []  # created: a MixUp from timm's defaults, by a flag
    for field in ordered:
        if field in LAST and not mixing_settled:
            _mix_off(recipe, known, lines, keep_smoothing=not created)
            mixing_settled = True
        value, was_name = fields[field], field
        if field == "optimizer":
            if value not in OPTIMIZERS:
                raise ValueError(f"Unknown optimizer {value!r}; valid: {', '.join(OPTIMIZERS)}.")
            value, nesterov = OPTIMIZERS[value]
            if nesterov is not None and bool(recipe.get("nesterov")) != nesterov:
                lines.append(f"the recipe's nesterov {recipe.get('nesterov')!r} -> {nesterov!r}")
                recipe["nesterov"] = nesterov
        elif field == "weight_decay":
            field, value = "wd", round(float(value) * recipe["lr"], 15)
            if recipe.get("optimizer") == "sgd":
                lines.append("--weight-decay with SGD: decoupled here (the kernels shrink by "
                             "wd x the lr's schedule), where timm's SGD adds it to the gradient "
                             "(through the momentum)")
        elif field == "smoothing":
            mix = (recipe.get("augment") or {}).get("timm_mix")
            field = "augment.timm_mix.label_smoothing" if mix is not None else "label_smoothing"
        elif field == "warmup_epochs" and recipe.get("warmup_steps") is not None:
            lines.append(f"the recipe's warmup_steps {recipe['warmup_steps']} -> None")
            recipe["warmup_steps"] = None
        if field == "loss":
            from keras_reluvit.training.losses import check_loss

            check_loss(value)
        if field.startswith("augment."):
            recipe["augment"] = dict(recipe.get("augment") or {})
        if field.startswith("augment.timm_mix.") and _get(recipe, "augment.timm_mix") is None:
            augment = recipe["augment"]
            augment["timm_mix"] = dict(TIMM_MIX_DEFAULTS)
            created.append(True)
            replaced = " (replacing big_vision's mixup)" if augment.pop("mixup", 0) else ""
            lines.append(f"timm's MixUp / CutMix from train.py's defaults "
                         f"{TIMM_MIX_DEFAULTS}{replaced}")
        if field == "augment.three_augment" and value:
            augment = recipe["augment"]
            off = [k for k in ("randaug", "auto_augment", "erase") if augment.get(k)]
            if off:
                lines.append(f"3-Augment replaces the recipe's {', '.join(off)} (DeiT III's "
                             "transform)")
                augment.update(randaug=None, auto_augment=None, erase=0.0)
        before = _current(recipe, field, known)
        _set(recipe, field, value)
        named = "" if was_name == field else f" (timm's {was_name})"
        lines.append(f"the recipe's {field} is already {value!r}{named}" if before == value
                     else f"the recipe's {field} {before!r} -> {value!r}{named}")
    if not mixing_settled:
        _mix_off(recipe, known, lines, keep_smoothing=not created)
    augment = recipe.get("augment") or {}
    if recipe.get("label_smoothing") and recipe.get("loss") == "sigmoid_xent":
        raise ValueError("The sigmoid loss (sigmoid_xent) takes no label smoothing: the "
                         f"recipe's label_smoothing {recipe['label_smoothing']!r} would be "
                         "ignored.")
    if augment.get("color_jitter") and augment.get("auto_augment") and fields:
        raise ValueError("Colour jitter with timm's auto-augment "
                         f"{augment['auto_augment']!r}: timm applies colour jitter only "
                         "without one (--aa none, or --three-augment as DeiT III).")
    return built(**recipe), lines


def _mix_off(recipe, known, lines, keep_smoothing=True):
    """timm's MixUp / CutMix removed where both alphas are 0 (as timm); the
    recipe's MixUp's label smoothing (`keep_smoothing`) then goes into the
    loss (timm's train.py: LabelSmoothingCrossEntropy, or
    BinaryCrossEntropy(smoothing=), without mixing)."""
    augment = recipe.get("augment") or {}
    mix = augment.get("timm_mix")
    if mix is not None and not any(  # the alphas, timm_mix's defaults where left out
            mix.get(k, known[f"augment.timm_mix.{k}"]) > 0 for k in ("mixup_alpha",
                                                                     "cutmix_alpha")):
        augment.pop("timm_mix")
        lines.append("timm's MixUp / CutMix off (both alphas 0, as timm)")
        smoothing = mix.get("label_smoothing", known["augment.timm_mix.label_smoothing"])
        if keep_smoothing and smoothing and smoothing != recipe.get("label_smoothing"):
            lines.append(f"the recipe's label_smoothing {recipe.get('label_smoothing')!r} -> "
                         f"{smoothing!r} (the MixUp's smoothing, into the loss without mixing, "
                         "as timm)")
            recipe["label_smoothing"] = smoothing


def table():
    """The alias table of docs/training.md, as Markdown rows."""
    rows = ["| timm / DeiT | `keras-reluvit train` | sets |", "|---|---|---|"]
    for flag in FLAGS:
        for theirs in flag.theirs:
            ours = (f"`{flag.ours}`" if flag.ours and flag.ours != theirs else
                    "the same" if flag.ours else "only theirs")
            sets = ("accepted: " + ", ".join(f"`{v}`" for v in flag.only) + " (ours computes "
                    "only this)" if flag.only else flag.sets or f"`{flag.field}`")
            rows.append(f"| `{theirs}` | {ours} | {sets} |")
    for theirs, (ours, note) in RUN_ALIASES.items():
        rows.append(f"| `{theirs}` | {f'`{ours}`' if ours else 'the same'} | the run's "
                    f"setting{'; ' + note if note else ''} |")
    return rows


