"""A training run's settings and configuration, typed, each default written once.

`RunSettings` is what `keras-reluvit train` and `kr.build_config`
take (None: the recipe's value); `build_config` resolves it with the recipe,
once, into the run's `RunConfig`: every value decided, what `kr.train`
reads and `config.json` records (`settings`). The defaults that other parts repeat -- a folder's held-out share,
the LoRA rank, the backups kept, the recipe, what a fine-tune trains -- are
written once in `keras_reluvit/_defaults.py` (the lowest floor: the data
package and the command line's `--help` read them without importing
TensorFlow) and are this module's names too; every module that needs one
imports it (the CLI's options, `ImageFolder`, `data.load`,
`finetune.set_trainable`, `eval` of an older run).
"""

import collections.abc
import copy
import dataclasses
import math
import os

from keras_reluvit._defaults import KEEP_CHECKPOINTS
from keras_reluvit._defaults import LORA_RANK
from keras_reluvit._defaults import RECIPE
from keras_reluvit._defaults import TRAINABLE
from keras_reluvit._defaults import TRAINABLE_DEFAULT
from keras_reluvit._defaults import VAL_FRACTION


class Fields(collections.abc.Mapping):
    """A dataclass that is also a read-only mapping of its fields
    (`obj["lr"]`, `dict(obj)`, `obj.get("ema")`); a key that is not a field
    is a KeyError."""

    @classmethod
    def fields(cls):
        return [f.name for f in dataclasses.fields(cls)]

    def __getitem__(self, key):
        if key not in self.fields():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(self.fields())

    def __len__(self):
        return len(self.fields())

    def __setitem__(self, key, value):
        raise TypeError(f"A {type(self).__name__} is frozen: dataclasses.replace(obj, "
                        f"{key}=...) makes another.")


class FrozenDict(dict):
    """A dict that cannot change: the nested settings of a frozen `RunSettings`,
    `RunConfig` or `Recipe` (`config.model`, `config.augment`). It reads as a
    dict (JSON, `**` unpacking, `dict(...)`, pickling, copies); a change
    through its methods is a TypeError (`dict.__setitem__(d, ...)` called on
    it directly is not stopped); `thaw` gives plain dicts and lists to change.
    Unhashable, as a dict; Keras' and JAX's tree utilities see a leaf (`thaw`
    first)."""

    def __init__(self, *args, **kwargs):
        if getattr(self, "_made", False):  # dict.__init__ again would update it
            self._refuse()
        super().__init__(*args, **kwargs)
        self._made = True

    def _refuse(self, *args, **kwargs):
        raise TypeError("A run's settings are frozen, their dicts too: make another with "
                        "dataclasses.replace, a new dict for the field, e.g. replace(config, "
                        "augment=dict(config.augment, flip=False)) -- or kr.build_config again "
                        "for what the recipe decides.")

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = clear = setdefault = _refuse

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __deepcopy__(self, memo):
        return frozen(copy.deepcopy(thaw(self), memo))


class FrozenList(tuple):
    """A list of a run's settings, frozen: a tuple (JSON writes it as a list;
    `thaw` gives the list back)."""


def frozen(value):
    """`value` with every dict in it a `FrozenDict` and every list a
    `FrozenList` (other sequences, tuples and named tuples, as they are, their
    items frozen)."""
    if isinstance(value, dict):
        return FrozenDict({k: frozen(v) for k, v in value.items()})
    if type(value) is list:
        return FrozenList(frozen(v) for v in value)
    if type(value) is tuple:
        return tuple(frozen(v) for v in value)
    return value


def thaw(value):
    """`value` with every `FrozenDict` in it a plain dict and every
    `FrozenList` a list again (copies), to change or to hand to code that
    walks dicts as trees."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, FrozenList):
        return [thaw(v) for v in value]
    if type(value) is tuple:
        return tuple(thaw(v) for v in value)
    return value


def freeze(obj, *names):
    """The fields `names` of the frozen dataclass `obj` made `frozen` (in its
    `__post_init__`)."""
    for name in names:  # (a frozen dataclass sets its fields through object)
        object.__setattr__(obj, name, frozen(getattr(obj, name)))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One run's settings. None: the recipe's value (or, with `init`, the
    checkpoint's). See `kr.build_config` for what each does."""

    recipe: str = RECIPE
    dataset: str = None
    model: str = None
    attention: object = None
    epochs: int = None
    batch_size: int = None
    image_size: int = None
    data_dir: str = None
    seed: int = 0
    init: str = None
    data_shards: int = None
    trainable: str = TRAINABLE_DEFAULT
    lora_rank: int = LORA_RANK
    layer_decay: float = None
    lr: float = None
    # A folder without split folders: the share of each class held out; None: VAL_FRACTION
    val_fraction: float = None
    checkpoint_every: int = None  # steps between backups; 0: each epoch only; None: the recipe's
    keep_checkpoints: int = KEEP_CHECKPOINTS
    accum_steps: int = None  # None: the recipe's (1)
    steps_per_execution: int = None  # Keras' compile: steps per call (callbacks); None: 1
    ema: float = None  # timm's EMA of the weights, its decay; None: the recipe's (off); 0: off
    aug_repeats: int = None  # DeiT's repeated augmentation; None: the recipe's; 1: off
    auto_augment: str = None  # timm's --aa name; None: the recipe's; "none": off
    # Recipe fields set ({field: value}, e.g. {"grad_clip": 0.5, "augment.erase": 0.1}):
    # keras_reluvit.training.flags (the table of their flags, timm's names included).
    recipe_overrides: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_settings(self)
        freeze(self, "recipe_overrides", "attention")

    @classmethod
    def fields(cls):
        return [f.name for f in dataclasses.fields(cls)]


# The range of each number of a run: (kind, low, high, low included, high included,
# meaning); None: no bound. The recipe fields a run sets (`recipe_overrides`) are checked
# as build_config applies them (flags.check_ranges); `NUMBERS` holds every range:
# RunSettings' fields (checked when one is made), those recipe fields and ViT's drop_path
# (a model flag, checked in build_config): before anything runs or is written.
RECIPE_NUMBERS = {
    "opt_eps": (float, 0, None, False, None, "an epsilon"),
    "grad_clip": (float, 0, None, False, None, "a norm"),
    "wd": (float, 0, None, True, None, "a decay"),
    "weight_decay": (float, 0, None, True, None, "a decay"),
    "warmup_epochs": (float, 0, None, True, None, "epochs"),
    "smoothing": (float, 0, 1, True, False, "a smoothing"),
    "augment.timm_mix.mixup_alpha": (float, 0, None, True, None, "an alpha; 0: off"),
    "augment.timm_mix.cutmix_alpha": (float, 0, None, True, None, "an alpha; 0: off"),
    "augment.timm_mix.prob": (float, 0, 1, True, True, "a probability"),
    "augment.timm_mix.switch_prob": (float, 0, 1, True, True, "a probability"),
    "augment.erase": (float, 0, 1, True, True, "a probability"),
    "augment.color_jitter": (float, 0, None, True, None, "a strength"),
}
NUMBERS = {
    "epochs": (int, 1, None, True, None, "epochs"),
    "batch_size": (int, 1, None, True, None, "the global batch"),
    "image_size": (int, 1, None, True, None, "pixels"),
    "seed": (int, 0, 2**32 - 1, True, True, "a seed, NumPy's range"),
    "data_shards": (int, 1, None, True, None, "processes' shards"),
    "lora_rank": (int, 1, None, True, None, "LoRA's rank"),
    "layer_decay": (float, 0, 1, True, True, "a layer-wise decay; 0 or 1: off"),
    "lr": (float, 0, None, True, None, "a learning rate; 0: the weights stay"),
    "val_fraction": (float, 0, 1, True, False, "a share of each class"),
    "checkpoint_every": (int, 0, None, True, None, "updates between backups; 0: each "
                         "epoch's end"),
    "keep_checkpoints": (int, 1, None, True, None, "backups kept"),
    "accum_steps": (int, 1, None, True, None, "micro-batches per update; 1: off"),
    "steps_per_execution": (int, 1, None, True, None, "steps per call"),
    "ema": (float, 0, 1, True, False, "a decay (DeiT's 0.99996; 0: off)"),
    "aug_repeats": (int, 0, None, True, None, "repeats; 0 or 1: off"),
    **RECIPE_NUMBERS,
    "drop_path": (float, 0, 1, True, False, "a rate"),
}
STRINGS = ("recipe", "dataset", "model", "data_dir", "init", "auto_augment")


def flag_of(field):
    """The `keras-reluvit train` flag of a setting, as errors name it."""
    return "--auto-augment" if field == "auto_augment" else "--" + field.replace("_", "-")


def check_number(field, value, spec, flag=None):
    """`value` checked against `spec` (a `NUMBERS` entry): a ValueError
    naming the setting and its flag (default `flag_of(field)`)."""
    kind, low, high, low_in, high_in, meaning = spec
    whole = isinstance(value, int) and not isinstance(value, bool)
    ok = whole if kind is int else (whole or isinstance(value, float)) and math.isfinite(value)
    if ok and low is not None:
        ok = value >= low if low_in else value > low
    if ok and high is not None:
        ok = value <= high if high_in else value < high
    if not ok:
        span = ("[" if low_in else "(") + f"{low}, " + (
            "inf)" if high is None else f"{high}" + ("]" if high_in else ")"))
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{field} (train {flag or flag_of(field)}) must be {what} in {span} "
                         f"({meaning}), got {value!r}.")


def check_accum(accum, batch_size):
    """`accum` (accumulation steps, in range) dividing the batch it splits;
    returns it."""
    if batch_size % accum:
        raise ValueError(f"accum_steps (train --accum-steps) {accum} must divide the batch size "
                         f"{batch_size} (--batch-size): each update is accum_steps "
                         "micro-batches of batch_size / accum_steps.")
    return accum


def check_settings(s):
    """Every field of a `RunSettings` `s`: its type, its range, the
    combinations that cannot run (the recipe fields of `recipe_overrides`
    are checked as `build_config` applies them: `training.flags.apply`)."""
    for field in RunSettings.fields():
        if field not in NUMBERS:
            continue
        spec, value = NUMBERS[field], getattr(s, field)
        if value is not None or field in ("seed", "lora_rank", "keep_checkpoints"):
            check_number(field, value, spec)
    for field in STRINGS:
        value = getattr(s, field)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"{field} (train {flag_of(field)}) must be a string, "
                             f"got {value!r}.")
    if s.attention is not None and not isinstance(s.attention, (str, dict)):
        raise ValueError(f"attention (train --attention) must be a name or a dict, "
                         f"got {s.attention!r}.")
    if s.trainable not in TRAINABLE:
        raise ValueError(f"trainable (train --trainable) must be one of {TRAINABLE}, "
                         f"got {s.trainable!r}.")
    if s.trainable != "all" and not s.init:
        raise ValueError(f"trainable={s.trainable!r} (train --trainable) fine-tunes a "
                         "pretrained model: pass init= (train --init CHECKPOINT).")
    if s.batch_size is not None and s.accum_steps is not None:
        check_accum(s.accum_steps, s.batch_size)
    if not isinstance(s.recipe_overrides, dict):
        raise ValueError(f"recipe_overrides must be a dict of recipe fields, "
                         f"got {s.recipe_overrides!r}.")


@dataclasses.dataclass(eq=False, frozen=True)
class RunConfig(Fields):
    """One run's configuration, every value decided and frozen:
    `kr.build_config` resolves a `RunSettings` with its recipe (once)
    into it, `kr.train` reads it, `config.json` records it
    (`settings`, `RunConfig.to_dict`). The same names as `RunSettings` (and
    the recipe's fields), plus `model` (the model's config before the data
    set's classes) and `augment` (`kr.data.Augment`'s keywords). Also a
    read-only mapping (`config["epochs"]`, `dict(config)`), its dicts too
    (`FrozenDict`); another value is another config:
    `dataclasses.replace(config, epochs=2)`, or `build_config` again (which
    resolves the recipe anew)."""

    recipe: str = RECIPE
    dataset: str = None
    data_dir: str = None
    init: str = None  # the checkpoint the run starts from
    epochs: int = None
    batch_size: int = None
    image_size: int = None  # None: the checkpoint's
    augment: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    data_shards: int = None  # None: one per process
    trainable: str = TRAINABLE_DEFAULT
    lora_rank: int = LORA_RANK
    layer_decay: float = None  # None: the recipe's
    lr: float = None  # None: the recipe's
    val_fraction: float = VAL_FRACTION
    checkpoint_every: int = None  # updates between backups; None: each epoch's end only
    keep_checkpoints: int = KEEP_CHECKPOINTS
    accum_steps: int = 1
    steps_per_execution: int = 1  # Keras' compile: steps per call, the callbacks' cadence
    ema: float = None  # None: off
    recipe_overrides: dict = dataclasses.field(default_factory=dict)  # applied to the recipe
    model: dict = dataclasses.field(default_factory=dict)
    # The recipe as build_config resolved it, and the overrides it applied then (not
    # settings: rebuilt from `recipe` and `recipe_overrides`).
    resolved_recipe: object = dataclasses.field(default=None, repr=False, compare=False)
    resolved_with: dict = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self):
        check_config(self)
        freeze(self, "augment", "recipe_overrides", "model", "resolved_with")

    @classmethod
    def fields(cls):
        return [f.name for f in dataclasses.fields(cls)
                if f.name not in ("resolved_recipe", "resolved_with")]

    @classmethod
    def of(cls, config):
        """`config` as a RunConfig: itself, or a mapping (a config.json's
        `settings`, a dict of an earlier version) whose keys must be fields."""
        if isinstance(config, cls):
            return config
        unknown = sorted(set(config) - set(cls.fields()))
        if unknown:
            raise ValueError(f"Not run settings: {', '.join(unknown)}; a run config holds "
                             f"{', '.join(cls.fields())} (kr.build_config makes one).")
        config = dict(config)
        config["augment"] = current_names(config.get("augment"))
        return cls(**config)

    def __setitem__(self, key, value):
        raise TypeError(f"A RunConfig is frozen: dataclasses.replace(config, {key}=...) makes "
                        "another (or kr.build_config again, to resolve the recipe anew).")

    def to_dict(self):
        """A JSON-able dict of the fields (tuples as lists)."""
        import json

        return json.loads(json.dumps({k: getattr(self, k) for k in self.fields()},
                                     default=list))


def check_config(c):
    """A `RunConfig`'s values, as `check_settings` checks a `RunSettings`'
    (a config made from a dict, or by `dataclasses.replace`, skips
    `build_config`): each number in its range, the strings, `trainable`,
    the accumulation dividing the batch -- a ValueError naming the flag."""
    for field in RunConfig.fields():
        value = getattr(c, field)
        if field in NUMBERS and value is not None:
            check_number(field, value, NUMBERS[field])
        elif (field in STRINGS and field != "model" and value is not None  # (a dict here)
              and not isinstance(value, (str, os.PathLike))):
            raise ValueError(f"{field} (train {flag_of(field)}) must be a string, got {value!r}.")
    if c.trainable not in TRAINABLE:
        raise ValueError(f"trainable (train --trainable) must be one of {TRAINABLE}, "
                         f"got {c.trainable!r}.")
    for field in ("augment", "recipe_overrides", "model"):
        if not isinstance(getattr(c, field), dict):
            raise ValueError(f"A RunConfig's {field} is a dict, got {getattr(c, field)!r}.")
    if c.batch_size is not None:
        check_accum(c.accum_steps, c.batch_size)


def current_names(augment):
    """`augment` (Augment's keywords) with the names of before 0.2 renamed
    (`repeats`: `aug_repeats`): a recipe or config.json written then."""
    augment = dict(augment or {})
    if "repeats" in augment:
        augment.setdefault("aug_repeats", augment.pop("repeats"))
    return augment


def check_every(every, name="every"):
    """`every` (steps between two events of a callback: backups, the
    few-shot probe) checked: None or a positive whole number; `name`: how
    the caller's user spells it."""
    if every is not None and (isinstance(every, bool) or int(every) != every or every < 1):
        raise ValueError(f"{name} must be a positive whole number of steps or None, "
                         f"got {every!r}.")
