"""`keras-reluvit train`'s flags on argparse: the recipe fields' flags
under our, timm's and DeiT's spellings (`add_to`, from the table
`keras_reluvit.training.flags.FLAGS`), the values given as the run's
`recipe_overrides` (`overrides`), timm's / DeiT's spellings of the run's own
options (`also`, `InputSize`, the `--model-ema` switch: `model_ema_decay`),
and the usage errors of a flag given twice with two values (`Once`)."""

import argparse

from keras_reluvit._logging import say
from keras_reluvit.training.flags import FLAGS
from keras_reluvit.training.flags import RUN_ALIASES


class Once(argparse.Action):
    """Stores a flag's value; the same option given again (under another of
    its names) with another value is an error, not a silent last-one-wins."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if self.nargs == 0 else values
        before = getattr(namespace, self.dest, None)
        if before is not None and before != value:
            parser.error(f"{option_string} {value!r}: an earlier flag of the same option "
                         f"({'/'.join(self.option_strings)}) gave {before!r}.")
        setattr(namespace, self.dest, value)


def add_to(parser):
    """Adds every flag (ours and timm's spellings) to an argparse parser."""
    group = parser.add_argument_group(
        "recipe fields", "each overrides the recipe's field (said in one line); timm's and "
        "DeiT's names are accepted (docs/training.md: the alias table)")
    for flag in FLAGS:
        names = list(dict.fromkeys(n for n in (flag.ours, *flag.theirs) if n))
        kwargs = dict(dest=flag.dest, help=flag.help, action=Once)
        if flag.type is None:
            kwargs.update(nargs=0, const=flag.const)
        else:
            kwargs.update(type=flag.type, choices=flag.choices or flag.only)
        group.add_argument(*names, **kwargs)



def overrides(args):
    """{field: value} of the flags given in parsed `args` (a Namespace)."""
    out = {}
    for flag in FLAGS:
        value = getattr(args, flag.dest, None)
        if value is None or flag.only:  # `only`: timm's choice we compute anyway
            continue
        if flag.field in out and out[flag.field] != value:
            raise ValueError(f"{flag.ours or flag.theirs[0]} {value!r} and another flag set "
                             f"the recipe's {flag.field} to {out[flag.field]!r}.")
        out[flag.field] = value
    return out



TIMM_EMA = 0.9998  # timm's --model-ema-decay default


def model_ema_decay(recipe, ema=None):
    """timm's / DeiT's `--model-ema` switch as a decay (said in one line):
    `ema` given (--ema / --model-ema-decay), else the recipe's, else timm's
    0.9998. With `--no-model-ema` (`ema` 0) a ValueError."""
    from keras_reluvit.training import recipes

    if ema == 0.0:
        raise ValueError("--model-ema and --no-model-ema (or --ema 0) both given; choose one.")
    if ema:
        say(f"--model-ema: the weights' EMA at --ema's decay {ema}")
        return ema
    own = recipes.get(recipe).ema
    if own:
        say(f"--model-ema: the weights' EMA at the recipe's decay {own}")
        return own
    say(f"--model-ema: the weights' EMA at timm's decay {TIMM_EMA} (the "
        "recipe has none; --ema DECAY sets another)")
    return TIMM_EMA



class InputSize(argparse.Action):
    """DeiT's `--input-size N` or timm's `--input-size 3 N N` -> the image size N."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) == 3 and values[0] == 3 and values[1] == values[2]:
            values = values[1:2]
        if len(values) != 1:
            parser.error(f"{option_string} {' '.join(map(str, values))}: give N (DeiT's) or "
                         "3 N N (timm's: 3 channels, a square N x N; --image-size N).")
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values[0]:
            parser.error(f"{option_string} {values[0]}: --image-size gave {before}.")
        setattr(namespace, self.dest, values[0])


def also(ours):
    """timm's / DeiT's names for one of our train flags (flags.RUN_ALIASES; the
    switch --model-ema and the 1-or-3-number --input-size have their own)."""
    return [theirs for theirs, (name, _) in RUN_ALIASES.items()
            if name == ours and theirs not in ("--model-ema", "--input-size")]
