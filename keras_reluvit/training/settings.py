"""A training run's settings, typed, each default written once.

`RunSettings` is what `keras-reluvit train` and `kr.train.build_config`
take; `build_config` resolves it (with the recipe, once) into the run's
config. The defaults that other parts repeat -- a folder's held-out share,
the LoRA rank, the backups kept, the recipe, what a fine-tune trains -- are
written once in `keras_reluvit/_defaults.py` (the lowest floor: the data
package and the command line's `--help` read them without importing
TensorFlow) and are this module's names too; every module that needs one
imports it (the CLI's options, `ImageFolder`, `data.load`,
`finetune.set_trainable`, `eval` of an older run).
"""

import dataclasses

from keras_reluvit._defaults import KEEP_CHECKPOINTS
from keras_reluvit._defaults import LORA_RANK
from keras_reluvit._defaults import RECIPE
from keras_reluvit._defaults import TRAINABLE_DEFAULT
from keras_reluvit._defaults import VAL_FRACTION


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One run's settings. None: the recipe's value (or, with `init`, the
    checkpoint's). See `kr.train.build_config` for what each does."""

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
    val_fraction: float = VAL_FRACTION
    checkpoint_every: int = None  # steps between backups; 0: each epoch only; None: the recipe's
    keep_checkpoints: int = KEEP_CHECKPOINTS
    accum_steps: int = None  # None: the recipe's (1)
    ema: float = None  # timm's EMA of the weights, its decay; None: the recipe's (off); 0: off
    aug_repeats: int = None  # DeiT's repeated augmentation; None: the recipe's; 1: off
    auto_augment: str = None  # timm's --aa name; None: the recipe's; "none": off

    @classmethod
    def fields(cls):
        return [f.name for f in dataclasses.fields(cls)]


def check_every(every, name="every"):
    """`every` (steps between two events of a callback: backups, the
    few-shot probe) checked: None or a positive whole number; `name`: how
    the caller's user spells it."""
    if every is not None and (isinstance(every, bool) or int(every) != every or every < 1):
        raise ValueError(f"{name} must be a positive whole number of steps or None, "
                         f"got {every!r}.")
