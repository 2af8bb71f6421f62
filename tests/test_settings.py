"""A run's settings (keras_reluvit/training/settings.py, its defaults in
keras_reluvit/_defaults.py): each default written once,
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
DEFAULTS = os.path.join(PKG, "_defaults.py")  # where settings' defaults are written

# A default written again somewhere else: what the settings module is for.
REPEATED = re.compile(r"val_fraction\s*=\s*0\.1\b|\"val_fraction\",\s*0\.1\b|"
                      r"lora_rank\s*=\s*8\b|\"lora_rank\",\s*8\b|"
                      r"--lora-rank.*default=8\b|trainable\s*=\s*\"all\"|"
                      r"\bkeep(_checkpoints)?\s*=\s*2\b|\"keep_checkpoints\",\s*2\b")


def test_each_default_is_written_once():
    found = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and path not in (settings.__file__, DEFAULTS):
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    if REPEATED.search(line.split("#")[0]):
                        found.append(f"{os.path.relpath(path, PKG)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_command_line_writes_no_default_of_a_setting():
    """`keras-reluvit train`'s options for a `RunSettings` field take their
    default from settings.py (a name), never a literal written again (was:
    `--val-fraction` default=0.1, `--keep-checkpoints` default=2, `--seed`
    default=0)."""
    import ast

    tree = ast.parse(open(os.path.join(PKG, "cli.py"), encoding="utf-8").read())
    fields = set(RunSettings.fields())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "t"):
            continue
        flag = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else ""
        dest = flag.lstrip("-").replace("-", "_")
        for kw in node.keywords:
            if (kw.arg == "default" and dest in fields and isinstance(kw.value, ast.Constant)
                    and kw.value.value is not None and kw.value.value is not False):
                found.append(f"cli.py:{node.lineno}: {flag} default={kw.value.value!r}")
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
    assert T.build_config(batch_size=64, drop_path=0.1)["model"]["drop_path"] == 0.1
    assert "drop_path" not in T.build_config(batch_size=64, drop_path=None)["model"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1


def test_recipes_are_typed_and_a_wrong_key_is_an_error(monkeypatch):
    """`recipes.get` gives a `Recipe` dataclass (still a mapping: r["lr"],
    dict(r, lr=...)); a key of the data that is not a field fails, naming it;
    left out, a field is its one default."""
    from keras_reluvit import recipes

    r = recipes.get("bv_transfer")
    assert isinstance(r, recipes.Recipe) and r.optimizer == "sgd" and r["momentum"] == 0.9
    assert dict(r, lr=0.5)["lr"] == 0.5 and r.lr == 0.01
    assert recipes.get("digits").label_smoothing == 0.0  # not in its data: the default
    r["warmup_steps"] = 0
    assert r.warmup_steps == 0
    with pytest.raises(KeyError, match="'warmup' is not a recipe field"):
        r["warmup"] = 5
    monkeypatch.setitem(recipes.RECIPES, "typo", dict(recipes.RECIPES["digits"], warmup=3))
    with pytest.raises(TypeError, match="warmup"):
        recipes.get("typo")
    for name in recipes.RECIPES:
        if name != "typo":
            assert recipes.get(name).name == name
