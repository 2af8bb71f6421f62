"""A run's settings (keras_reluvit/training/settings.py, its defaults in
keras_reluvit/_defaults.py): each default written once,
the command line's defaults the same, and `build_config` taking either the
dataclass or its fields."""

import collections
import copy
import dataclasses
import json
import os
import pickle
import re

import pytest

from keras_reluvit import settings
from keras_reluvit.training import flags
from keras_reluvit.training import run as T
from keras_reluvit.training.settings import RunSettings

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

    tree = ast.parse(open(os.path.join(PKG, "cli", "__init__.py"), encoding="utf-8").read())
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
                found.append(f"cli/__init__.py:{node.lineno}: {flag} default={kw.value.value!r}")
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
    """`recipes.get` gives a frozen `Recipe` dataclass (a read-only mapping:
    r["lr"], dict(r, lr=...)); a key of the data that is not a field fails,
    naming it; left out, a field is its one default; the run's flags make
    another recipe (`flags.apply`), the one given left as it was."""
    from keras_reluvit import recipes
    from keras_reluvit.training import flags

    r = recipes.get("bv_transfer")
    assert isinstance(r, recipes.Recipe) and r.optimizer == "sgd" and r["momentum"] == 0.9
    assert dict(r, lr=0.5)["lr"] == 0.5 and r.lr == 0.01
    assert recipes.get("digits").label_smoothing == 0.0  # not in its data: the default
    with pytest.raises(TypeError, match=r"A Recipe is frozen: dataclasses.replace\(obj, "
                       r"warmup_steps=...\) makes another"):
        r["warmup_steps"] = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.warmup_steps = 0
    changed, lines = flags.apply(r, {"warmup_epochs": 2, "augment.erase": 0.25,
                                     "optimizer": "momentum"})
    assert isinstance(changed, recipes.Recipe) and changed.warmup_epochs == 2
    assert changed.warmup_steps is None and changed.augment["erase"] == 0.25
    assert changed.nesterov is False and len(lines) == 4
    assert r == recipes.get("bv_transfer")  # the recipe given, its augment dict included
    deit = recipes.get("deit_s16_300ep")
    mixed, _ = flags.apply(deit, {"augment.timm_mix.mixup_alpha": 0.3})
    assert mixed.augment["timm_mix"]["mixup_alpha"] == 0.3
    assert deit == recipes.get("deit_s16_300ep")  # its nested timm_mix too
    for made in (r, changed, mixed):  # frozen all the way down, what apply makes too
        assert isinstance(made.augment, settings.FrozenDict)
        with pytest.raises(TypeError, match="frozen, their dicts too"):
            made.augment["erase"] = 1.0
    assert isinstance(mixed.augment["timm_mix"], settings.FrozenDict)
    with pytest.raises(TypeError, match="frozen, their dicts too"):
        mixed.augment["timm_mix"]["mixup_alpha"] = 0.0
    with pytest.raises(ValueError, match="Unknown recipe field 'warmup'"):
        flags.apply(r, {"warmup": 5})
    monkeypatch.setitem(recipes.RECIPES, "typo", dict(recipes.RECIPES["digits"], warmup=3))
    with pytest.raises(TypeError, match="warmup"):
        recipes.get("typo")
    for name in recipes.RECIPES:
        if name != "typo":
            assert recipes.get(name).name == name


def test_build_config_gives_one_typed_run_config_that_train_reads(monkeypatch):
    """`build_config` returns a `RunConfig` (typed, every value decided, still
    a mapping as the dict it replaces); the recipe is resolved there, once;
    a mapping given to `train` must hold only its fields (named otherwise);
    `to_dict` is what config.json records."""

    from keras_reluvit import recipes

    calls = []
    get = recipes.get
    monkeypatch.setattr(recipes, "get", lambda *a, **k: calls.append(a) or get(*a, **k))
    config = T.build_config(recipe="deit_s16_300ep", batch_size=8, aug_repeats=2)
    assert len(calls) == 1 and isinstance(config, settings.RunConfig)
    assert config.resolved_recipe.name == "deit_s16_300ep" and config.accum_steps == 1
    assert config.augment["aug_repeats"] == 2 and config["epochs"] == 300
    assert "resolved_recipe" not in config and "resolved_recipe" not in config.to_dict()
    saved = config.to_dict()
    assert json.loads(json.dumps(saved)) == saved  # JSON-able as it is
    assert settings.RunConfig.of(saved).to_dict() == saved  # config.json's settings read back
    import collections.abc

    assert not isinstance(config, collections.abc.MutableMapping)
    with pytest.raises(TypeError, match="frozen: dataclasses.replace"):
        config["epochs"] = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 2
    changed = dataclasses.replace(config, epochs=2)
    assert changed.epochs == 2 and config.epochs == 300 and changed["batch_size"] == 8
    with pytest.raises(KeyError):
        config["epoch"]
    with pytest.raises(ValueError, match="Not run settings: epoch, lrate"):
        settings.RunConfig.of(dict(saved, epoch=2, lrate=1.0))
    # The old name of aug_repeats (a recipe or config.json of before 0.2).
    from keras_reluvit.data import Augment

    assert Augment(repeats=3).aug_repeats == 3 and "repeats" not in Augment(repeats=3).to_dict()
    with pytest.raises(ValueError, match="repeats=3 is aug_repeats' old name"):
        Augment(repeats=3, aug_repeats=2)
    assert T._augment(dict(repeats=3), None, "softmax_xent") == dict(aug_repeats=3)


@pytest.mark.backend_independent
def test_train_reads_the_resolved_recipe_and_records_the_run_config(tmp_path, digits_dir,
                                                                   monkeypatch):
    """`train` compiles with the recipe `build_config` resolved (not a second
    lookup) and config.json's `settings` is the RunConfig's `to_dict`."""

    from keras_reluvit import recipes

    config = T.build_config(recipe="digits", epochs=1, data_dir=str(digits_dir), batch_size=512)
    config = dataclasses.replace(
        config, model=dict(config.model, width=16, depth=1, num_heads=1, mlp_dim=16))
    # seen by train only if it reads this object
    config = dataclasses.replace(config, resolved_recipe=dataclasses.replace(
        config.resolved_recipe, opt_eps=0.125))

    def refused(*a, **k):
        raise AssertionError("train looked the recipe up again")

    monkeypatch.setattr(recipes, "get", refused)
    model, _ = T.train(config, tmp_path / "run", export=False, verbose=0)

    assert model.optimizer.epsilon == 0.125
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert set(written["settings"]) == set(settings.RunConfig.fields())
    assert written["settings"]["augment"] == json.loads(json.dumps(config.augment))
    assert written["settings"]["model"] == config.model
    monkeypatch.undo()
    # A mapping (config.json's settings): the recipe resolved anew, with its overrides.
    saved = dict(written["settings"], recipe_overrides={"opt_eps": 0.25})
    model, _ = T.train(saved, tmp_path / "from_dict", export=False, verbose=0)
    assert model.optimizer.epsilon == 0.25
    # its dicts frozen too; overrides replaced after build_config: an error, not the stale
    # recipe
    model = dict(config.model)
    for change in (lambda m: m.__setitem__("width", 32), lambda m: m.__delitem__("width"),
                   lambda m: m.update(width=32), lambda m: m.pop("width"), lambda m: m.popitem(),
                   lambda m: m.clear(), lambda m: m.setdefault("x", 1),
                   lambda m: m.__ior__({"x": 1}), lambda m: m.__init__(x=1)):
        with pytest.raises(TypeError, match="frozen, their dicts too"):
            change(config.model)
    assert config.model == model
    with pytest.raises(TypeError, match="frozen, their dicts too"):
        config.recipe_overrides["grad_clip"] = 0.3
    deit = T.build_config(recipe="deit_s16_300ep", batch_size=8,
                          recipe_overrides={"opt_eps": 0.1},
                          attention={"activation": "relu"})
    assert isinstance(deit.augment["crop_area"], tuple)  # lists and tuples: tuples
    for nested in (lambda: deit.augment["timm_mix"].update(mixup_alpha=0.0),
                   lambda: deit.recipe_overrides.update(x=1),
                   lambda: copy.deepcopy(deit).augment["timm_mix"].update(mixup_alpha=0.0),
                   lambda: settings.RunSettings(attention={"activation": "relu"}).attention.clear(),
                   lambda: settings.RunSettings(recipe_overrides={"x": 1}).recipe_overrides.clear()):
        with pytest.raises(TypeError, match="frozen, their dicts too"):
            nested()
    point = collections.namedtuple("point", "x y")(1, [2])
    made = settings.frozen({"a": [1, {"b": [2]}], "t": (3, [4]), "p": point})
    assert isinstance(made["a"], tuple) and isinstance(made["a"][1], settings.FrozenDict)
    assert type(made["p"]) is type(point)  # a named tuple as it is
    assert settings.thaw(made) == {"a": [1, {"b": [2]}], "t": (3, [4]), "p": point}
    assert type(settings.thaw(made)["a"]) is list and json.dumps(made) == json.dumps(
        {"a": [1, {"b": [2]}], "t": [3, [4]], "p": [1, [2]]})
    with pytest.raises(TypeError, match="frozen, their dicts too"):
        settings.frozen({}).__init__(a=1)  # an empty one too
    # A RunConfig made from a dict or by replace is checked as build_config's (was: any value)
    for bad, named in ((dict(epochs=-1), r"epochs \(train --epochs\)"),
                       (dict(batch_size=0), "batch_size"), (dict(lr=-1.0), "lr"),
                       (dict(ema=5.0), "ema"), (dict(val_fraction=1.5), "val_fraction"),
                       (dict(trainable="x"), "trainable"), (dict(dataset=3), "dataset"),
                       (dict(batch_size=8, accum_steps=3), "accum_steps")):
        with pytest.raises(ValueError, match=named):
            settings.RunConfig.of(bad)
    with pytest.raises(ValueError, match="epochs"):
        dataclasses.replace(deit, epochs=0)
    thawed = settings.thaw(deit.augment)  # a plain copy, to change
    thawed["timm_mix"]["mixup_alpha"] = 0.0
    assert type(thawed["timm_mix"]) is dict and deit.augment["timm_mix"]["mixup_alpha"] == 0.8
    assert pickle.loads(pickle.dumps(deit.augment)) == deit.augment
    stale = dataclasses.replace(config, recipe_overrides=dict(grad_clip=0.3))
    with pytest.raises(ValueError, match="recipe_overrides changed after build_config"):
        T.train(stale, tmp_path / "stale", export=False, verbose=0)


def parse_train(argv):
    from keras_reluvit import cli

    return cli.parser().parse_args(["train"] + argv)


def test_timms_flag_names_set_the_recipe_fields_and_say_so(capsys):
    """Every timm / DeiT flag of `keras_reluvit.training.flags` parses, sets
    its recipe field (timm's meaning: --weight-decay x lr, --smoothing in the
    MixUp where the recipe mixes, --opt momentum = sgd), says so in one line
    each, and reaches the compiled optimizer; a value we do not compute
    (--remode const) is refused by the parser; docs/training.md holds the table."""
    import keras

    from keras_reluvit import recipes
    from keras_reluvit.cli import train_flags

    argv = ("--opt momentum --opt-eps 1e-7 --clip-grad 0.5 --weight-decay 0.02 "
            "--warmup-epochs 2 --smoothing 0.2 --mixup 0.3 --cutmix 0.7 --mixup-prob 0.9 "
            "--mixup-switch-prob 0.25 --mixup-mode elem --reprob 0.1 --remode pixel --recount 1 "
            "--src --color-jitter 0.2 --ThreeAugment --train-interpolation bilinear "
            "--model-ema-decay 0.999 --input-size 64 --aa none").split()
    args = parse_train(argv)
    assert (args.ema, args.image_size, args.auto_augment) == (0.999, 64, "none")
    fields = train_flags.overrides(args)
    config = T.build_config(RunSettings(recipe="deit_s16_300ep", batch_size=8,
                                        auto_augment=args.auto_augment, recipe_overrides=fields))
    said = [line for line in capsys.readouterr().err.splitlines() if "the recipe's" in line]
    assert len(said) == len(fields) + 2, said  # and 3-Augment's and --aa's lines
    r, was = config.resolved_recipe, recipes.get("deit_s16_300ep")
    assert (r.optimizer, r.opt_eps, r.grad_clip, r.warmup_epochs) == ("sgd", 1e-7, 0.5, 2.0)
    assert r.wd == pytest.approx(0.02 * was.lr)  # PyTorch's decay: times the lr
    mix = config.augment["timm_mix"]
    assert (mix["mixup_alpha"], mix["cutmix_alpha"], mix["prob"], mix["switch_prob"],
            mix["mode"], mix["label_smoothing"]) == (0.3, 0.7, 0.9, 0.25, "elem", 0.2)
    assert r.label_smoothing == was.label_smoothing  # the smoothing went to the MixUp
    assert (config.augment["erase"], config.augment["crop"], config.augment["color_jitter"],
            config.augment["three_augment"]) == (0.1, "simple", 0.2, False)  # --aa none: off
    assert was.augment["interpolation"] == "bicubic" and config.augment["interpolation"] == "bilinear"
    assert config.to_dict()["recipe_overrides"] == fields
    for bad in ("--remode const", "--recount 2", "--train-interpolation lanczos", "--opt adam"):
        with pytest.raises(SystemExit):
            parse_train(bad.split())
    # Without a timm MixUp in the recipe a MixUp flag starts one from timm's defaults,
    # replacing big_vision's mixup (said), and --smoothing goes in it (timm's train.py);
    # alone, --smoothing goes to the loss.
    c = T.build_config(RunSettings(recipe="s16_i1k_90ep", batch_size=8, recipe_overrides=train_flags
                                   .overrides(parse_train("--smoothing 0.1 --cutmix 1".split()))))
    assert c.resolved_recipe.label_smoothing == 0.0 and "mixup" not in c.augment
    assert c.augment["timm_mix"] == dict(flags.TIMM_MIX_DEFAULTS, cutmix_alpha=1.0,
                                         label_smoothing=0.1)
    assert "replacing big_vision's mixup" in capsys.readouterr().err
    c = T.build_config(RunSettings(recipe="s16_i1k_90ep", batch_size=8,
                                   recipe_overrides={"smoothing": 0.1}))
    assert c.resolved_recipe.label_smoothing == 0.1 and "timm_mix" not in c.augment
    # The compiled optimizer is the overridden recipe's.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    recipes.compile(model, config.resolved_recipe, steps_per_epoch=10, batch_size=8, epochs=1)
    assert isinstance(model.optimizer, recipes.RecipeSGD)
    assert model.optimizer.global_clipnorm == 0.5
    docs = open(os.path.join(os.path.dirname(PKG), "docs", "training.md")).read()
    assert "\n".join(flags.table()) in docs, "docs/training.md's alias table is stale"


def test_flag_meanings_and_refusals(capsys):
    """timm's meanings whatever the order (--smoothing goes in the MixUp a
    --mixup creates), timm's --opt names (sgd: Nesterov's, with the weight
    decay), DeiT's --ThreeAugment replacing RandAugment and erasing, both
    alphas 0 turning the MixUp off; refused: two names of one option with two
    values, an abbreviation (--drop is timm's dropout), smoothing with the
    sigmoid loss, an unknown field, a number out of range."""
    import keras

    from keras_reluvit import recipes
    from keras_reluvit.cli import train_flags

    def built(recipe, argv):
        args = parse_train(argv.split())
        return T.build_config(RunSettings(recipe=recipe, batch_size=8,
                                          recipe_overrides=train_flags.overrides(args)))

    for argv in ("--mixup 0.8 --smoothing 0.0", "--smoothing 0.0 --mixup 0.8"):
        c = built("digits", argv)
        assert c.augment["timm_mix"]["label_smoothing"] == 0.0, argv
        assert c.resolved_recipe.label_smoothing == 0.0, argv
    for name, (kind, nesterov) in flags.OPTIMIZERS.items():
        r = built("digits", f"--opt {name}").resolved_recipe
        assert r.optimizer == kind and (nesterov is None or r.nesterov == nesterov), name
    r = built("digits", "--opt sgd --weight-decay 0.05").resolved_recipe
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    recipes.compile(model, r, steps_per_epoch=10, batch_size=8, epochs=1)
    assert model.optimizer.nesterov and model.optimizer.weight_decay == pytest.approx(0.05)
    assert built("digits", "--bce-loss").resolved_recipe.loss == "bce"
    c = built("deit_s16_300ep", "--ThreeAugment")
    assert c.augment["three_augment"] and not c.augment.get("auto_augment")
    assert not c.augment.get("erase") and "3-Augment replaces" in capsys.readouterr().err
    assert "timm_mix" not in built("deit_s16_300ep", "--mixup 0 --cutmix 0").augment
    capsys.readouterr()
    built("deit_s16_300ep", "--train-interpolation bicubic")  # the recipe's own value
    assert "the recipe's augment.interpolation is already 'bicubic'" in capsys.readouterr().err
    c = T.build_config(RunSettings(recipe="digits", batch_size=8, auto_augment="v0"))
    assert c.augment["auto_augment"] == "v0"
    assert "--aa 'v0': timm's augmentation on (the recipe has none)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="3-Augment is --three-augment"):
        T.build_config(RunSettings(recipe="digits", batch_size=8, auto_augment="3a"))
    with pytest.raises(ValueError, match="--aa 'v0' and --ThreeAugment / --three-augment both"):
        T.build_config(RunSettings(recipe="deit_s16_300ep", batch_size=8, auto_augment="v0",
                                   recipe_overrides={"augment.three_augment": True}))
    with pytest.raises(SystemExit):
        parse_train("--reprob 0.1 --erase 0.3".split())
    assert "an earlier flag of the same option" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_train("--drop 0.1".split())
    for argv, match in [("--loss sigmoid_xent --smoothing 0.1", "takes no label smoothing"),
                        ("--clip-grad -1", r"grad_clip \(train --grad-clip\) must be a number "
                                           r"in \(0, inf\)"),
                        ("--reprob 1.5", r"augment.erase \(train --erase\) must be a number "
                                         r"in \[0, 1\] \(a probability\)"),
                        ("--color-jitter 0.3", "Colour jitter with timm's auto-augment")]:
        with pytest.raises(ValueError, match=match):
            built("deit_s16_300ep" if "jitter" in argv else "digits", argv)
    for fields, match in [({"augment.erasee": 0.1}, "Unknown recipe field 'augment.erasee'"),
                          ({"augment.repeats": 1}, "Unknown recipe field 'augment.repeats'")]:
        with pytest.raises(ValueError, match=match):
            T.build_config(RunSettings(batch_size=8, recipe_overrides=fields))
    with pytest.raises(ValueError, match="Neither run settings nor ViT arguments: grad_clip"):
        T.build_config(batch_size=8, grad_clip=0.5)
    assert T.build_config(batch_size=8, aug_repeats=0).augment["aug_repeats"] == 1  # timm's off


def test_eval_and_export_read_the_runs_recipe_overrides():
    """A run trained with --loss sigmoid_xent: `keras-reluvit eval` scores its
    loss, the export its sigmoid (config.json's recipe_overrides)."""
    from keras_reluvit import recipes
    run = dict(recipe="digits", settings=dict(recipe_overrides={"loss": "sigmoid_xent"}))
    assert T.run_recipe(run).loss == "sigmoid_xent"
    assert recipes.probability(T.run_recipe(run)) == "sigmoid"
    assert T.run_recipe(dict(recipe="digits")).loss == "softmax_xent"
    assert T.run_recipe(dict(recipe="my_own")) == "my_own"


@pytest.mark.backend_independent
def test_timms_input_size_and_model_ema_switch(capsys):
    """DeiT's `--input-size N` and timm's `--input-size 3 N N` are the image
    size; `--model-ema` (timm's switch) turns the EMA on at the recipe's
    decay, else at timm's 0.9998, and says so; with --no-model-ema it is an
    error."""
    from keras_reluvit.cli import train_flags

    assert parse_train("--input-size 3 96 96".split()).image_size == 96
    assert parse_train("--input-size 96".split()).image_size == 96
    for bad in ("--input-size 3 96 64", "--input-size 1 96 96", "--input-size 96 96",
                "--image-size 64 --input-size 96", "--input-size 96 --image-size 64"):
        with pytest.raises(SystemExit):
            parse_train(bad.split())
    assert "3 channels, a square" in capsys.readouterr().err
    args = parse_train(["--model-ema"])
    assert args.model_ema and args.ema is None
    assert train_flags.model_ema_decay("digits", args.ema) == train_flags.TIMM_EMA == 0.9998
    assert "--model-ema: the weights' EMA at timm's decay 0.9998" in capsys.readouterr().err
    assert train_flags.model_ema_decay("deit_s16_300ep", None) == 0.99996
    assert "--model-ema: the weights' EMA at the recipe's decay 0.99996" in capsys.readouterr().err
    assert train_flags.model_ema_decay("digits", 0.99) == 0.99
    assert "at --ema's decay 0.99" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--model-ema and --no-model-ema"):
        train_flags.model_ema_decay("deit_s16_300ep", 0.0)


@pytest.mark.backend_independent
def test_the_cli_turns_timms_model_ema_switch_into_the_runs_ema(tmp_path, digits_dir,
                                                                 monkeypatch, capsys):
    """`keras-reluvit train --model-ema` reaches the run: the config train()
    gets has timm's decay (the digits recipe has none); with --ema its decay;
    with --no-model-ema a usage error before any training."""
    from keras_reluvit import cli

    got = []
    monkeypatch.setattr(T, "train", lambda config, out, **kw: got.append(config.ema) or (
        None, {"final": {}, "train_seconds": 0.0}))
    base = ["train", "--output", str(tmp_path / "r"), "--data-dir", str(digits_dir),
            "--batch-size", "64"]
    assert cli.main(base + ["--model-ema"]) == 0 and got[-1] == 0.9998
    assert cli.main(base + ["--model-ema", "--ema", "0.99"]) == 0 and got[-1] == 0.99
    assert cli.main(base) == 0 and not got[-1]  # the recipe's: off
    assert cli.main(base + ["--model-ema", "--no-model-ema"]) == 2 and len(got) == 3
    assert "--model-ema and --no-model-ema" in capsys.readouterr().err


def test_nothing_is_said_of_a_config_that_is_refused(capsys):
    """The lines saying what the flags changed come once the whole
    configuration holds: a refused one says only its error (was: "the
    recipe's warmup_steps 60 -> None" before the error that refused the
    warmup; "three_augment False -> True" before --aa's)."""
    for given in (dict(recipe="digits", epochs=1, recipe_overrides={"warmup_epochs": 5}),
                     dict(recipe="deit3_s16_400ep", auto_augment="rand-m9-mstd0.5-inc1",
                          batch_size=8, recipe_overrides={"augment.three_augment": True})):
        capsys.readouterr()
        with pytest.raises(ValueError):
            T.build_config(RunSettings(**given))
        assert "keras_reluvit:" not in capsys.readouterr().err
    T.build_config(RunSettings(recipe="digits", epochs=3, recipe_overrides={"warmup_epochs": 1}))
    assert "the recipe's warmup_epochs" in capsys.readouterr().err
