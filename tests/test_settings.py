"""A run's settings (keras_reluvit/settings.py): each default written once,
the command line's defaults the same, and `build_config` taking either the
dataclass or its fields."""

import dataclasses
import os
import re

import pytest

from keras_reluvit import settings
from keras_reluvit import train as T
from keras_reluvit.settings import RunSettings

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_reluvit")

# A default written again somewhere else: what the settings module is for.
REPEATED = re.compile(r"val_fraction\s*=\s*0\.1\b|\"val_fraction\",\s*0\.1\b|"
                      r"lora_rank\s*=\s*8\b|\"lora_rank\",\s*8\b|"
                      r"--lora-rank.*default=8\b|trainable\s*=\s*\"all\"")


def test_each_default_is_written_once():
    found = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and path != settings.__file__:
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    if REPEATED.search(line.split("#")[0]):
                        found.append(f"{os.path.relpath(path, PKG)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_command_line_defaults_are_the_settings():
    from keras_reluvit import cli

    train = next(a for a in cli.parser()._subparsers._group_actions[0].choices.items()
                 if a[0] == "train")[1]
    parsed = vars(train.parse_args([]))
    for field in RunSettings.fields():
        if field in parsed:
            assert parsed[field] == getattr(RunSettings(), field), field


def test_build_config_takes_the_dataclass_or_its_fields():
    s = RunSettings(epochs=3, seed=7, batch_size=64)
    assert T.build_config(s) == T.build_config(epochs=3, seed=7, batch_size=64)
    assert T.build_config(s, seed=8)["seed"] == 8  # keywords over the dataclass
    assert T.build_config("digits", batch_size=64)["recipe"] == "digits"
    config = T.build_config(batch_size=64, pool="tok")  # a model override
    assert config["model"]["pool"] == "tok" and config["val_fraction"] == settings.VAL_FRACTION
    assert config["lora_rank"] == settings.LORA_RANK
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1
