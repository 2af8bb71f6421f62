"""A pipeline as a list of named operations (`kr.data.ops`): each recipe's
one-line description names what its settings turn on, the pipeline runs
exactly the operations the line names, in order, and each operation draws
from its own key."""

import dataclasses
import re

import numpy as np
import pytest

from keras_reluvit import data as D
from keras_reluvit.data import ops as O
from keras_reluvit.preprocessing import check_preprocessing
from keras_reluvit.training import recipes
from keras_reluvit.training.settings import current_names

pytestmark = pytest.mark.backend_independent

# Combinations the recipes do not hold (DeiT III's simple crop, timm's --aa after a bilinear
# crop, AugMix, big_vision's RandAugment with timm's erasing) besides every recipe's.
OTHERS = [dict(crop="simple", three_augment=True, color_jitter=0.3, interpolation="bicubic"),
          dict(auto_augment="rand-m9-mstd0.5-inc1", erase=0.25),
          dict(auto_augment="augmix-m3-w3-d-1", interpolation="bicubic", flip=False),
          dict(randaug=(2, 10), erase=0.25, mixup=0.2), dict(color_jitter=0.4),
          dict(auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic", flip=False,
               crop_area=(0.3, 0.9), crop_aspect=(0.5, 2.0))]


def augments():
    out = {n: (D.Augment(**current_names(recipes.get(n).augment)), recipes.get(n))
           for n in recipes.RECIPES}
    out.update({f"other{i}": (D.Augment(**a), None) for i, a in enumerate(OTHERS)})
    return out


@pytest.mark.parametrize("name", list(augments()))
def test_each_pipeline_line_names_what_its_settings_turn_on(name):
    """The line of each recipe (and other combinations) against its
    `Augment` fields, read independently: each augmentation on is named with
    its values, each one off is absent; a fine-tune's normalisation and
    evaluation are its checkpoint's."""
    aug, recipe = augments()[name]
    size = recipe.image_size if recipe else 32
    checkpoint = bool(recipe and (recipe.init_required or recipe.image_size is None))
    lines = O.describe(aug, size, checkpoint=checkpoint)
    train = lines["train"]
    assert train.startswith("shuffle|") and "|onehot|batch" in train
    expect = {
        "randaug({}, {})".format(*(aug.randaug or (0, 0))): bool(aug.randaug),
        f"|mixup({aug.mixup:g})": aug.mixup > 0 and aug.timm_mix is None,
        f"random_erasing({aug.erase:g})": aug.erase > 0,
        f"aa({aug.auto_augment}, {aug.interpolation})": aug.auto_augment is not None,
        "three_augment": aug.three_augment,
        f"color_jitter({aug.color_jitter:g})": aug.color_jitter > 0,
        f"aug_repeats({aug.aug_repeats})": aug.aug_repeats > 1,
        "flip_lr": aug.flip,
        "simple_random_crop": aug.crop == "simple",
        "inception_crop": aug.crop == "inception",
        f"area=({aug.crop_area[0]:.4g}, {aug.crop_area[1]:.4g})": aug.crop == "inception",
        "pillow(": (aug.crop == "inception" and aug.interpolation == "bicubic"
                    and aug.auto_augment is not None and "augmix" not in aug.auto_augment),
        "pillow_levels": (aug.interpolation == "bilinear" and bool(
            aug.auto_augment or aug.three_augment or aug.color_jitter)),
        "normalize(the checkpoint's)": checkpoint,
        "value_range(-1, 1)": not checkpoint,
        "timm_mix(": aug.timm_mix is not None,
    }
    expect[f"aspect=({aug.crop_aspect[0]:.4g}, {aug.crop_aspect[1]:.4g})"] = (
        aug.crop == "inception")
    wrong = {text: on for text, on in expect.items() if (text in train) != on}
    assert not wrong, (train, wrong)
    # timm's order: erasing after the normalisation; Pillow's operations on levels; the
    # fused call: the crop's resize, the flip, then timm's operations
    steps = top_level(train)
    names = [step.split("(")[0] for step in steps]
    norm = "normalize" if "normalize" in names else "value_range"
    if "random_erasing" in names:
        assert names.index("random_erasing") == names.index(norm) + 1, train
    if "pillow_levels" in names:
        assert names.index("pillow_levels") < min(
            names.index(n) for n in ("aa", "three_augment", "color_jitter") if n in names)
    if "pillow" in names:
        inner = steps[names.index("pillow")]
        assert re.fullmatch(r"pillow\(inception_crop\(.*\)" + (r"\|flip_lr" if aug.flip else "")
                            + r"\|aa\(.*\)\)", inner), inner
    for k, v in (aug.timm_mix or {}).items():
        assert f"{k}={v}" in train
    assert f"{aug.interpolation})" in train or f"{aug.interpolation}," in train
    assert ("preprocess(the checkpoint's)" in lines["eval"]) == checkpoint


def _photos(n=4):
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 256, (n, 40, 52, 3)).astype("uint8"),
            "label": np.arange(n) % 3}


@pytest.mark.parametrize("name", ["s16_i1k_90ep", "deit_s16_300ep", "deit3_s16_400ep",
                                  "other0", "other1", "other3"])
def test_the_pipeline_runs_the_named_operations_in_order(name, monkeypatch):
    """Each operation of the list is called, in the line's order, and no
    other: `pipeline` is the list (the operations recorded as tf.data
    traces them)."""
    import importlib

    import tensorflow as tf

    P = importlib.import_module("keras_reluvit.data.pipeline")  # the module, not the function

    aug, _ = augments()[name]
    called = []

    def recorded(build):
        def wrapped(*args, **kwargs):
            return [O.Op(o.name, o.args, lambda x, r, o=o: called.append(str(o)) or o.fn(x, r))
                    for o in build(*args, **kwargs)]
        return wrapped

    monkeypatch.setattr(P, "train_ops", recorded(O.train_ops))
    monkeypatch.setattr(P, "eval_ops", recorded(O.eval_ops))
    ds = tf.data.Dataset.from_tensor_slices(_photos())
    next(iter(D.pipeline(ds, 3, 32, 2, train=True, augment=aug, seed=1, shuffle_buffer=4)))
    lines = O.describe(aug, 32)
    steps = top_level(lines["train"])
    per_image = steps[1 + (aug.aug_repeats > 1):steps.index("onehot")]  # after shuffle
    assert called == per_image
    called.clear()
    next(iter(D.pipeline(ds, 3, 32, 2, train=False, augment=aug)))
    steps = top_level(lines["eval"])
    assert called == steps[1:steps.index("onehot")]  # after decode


def top_level(line):
    """The `|`-separated steps of a line, a step's own `|` (inside its
    parentheses: the fused Pillow call) kept."""
    steps, depth, start = [], 0, 0
    for i, c in enumerate(line):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "|" and depth == 0:
            steps.append(line[start:i])
            start = i + 1
    return steps + [line[start:]]


@pytest.mark.parametrize("name", ["s16_i1k_90ep", "deit_s16_300ep", "deit3_s16_400ep", "other0",
                                  "other1", "other3", "other4", "other5"])
def test_each_operation_is_given_its_settings_and_its_own_key(name, monkeypatch):
    """What each operation hands the function doing its work, against the
    `Augment` fields (a value shown in the line but another one used fails
    here), and the key each operation draws from (its own `SLOTS` name)."""
    import importlib

    import tensorflow as tf

    P = importlib.import_module("keras_reluvit.data.pipeline")
    aug, _ = augments()[name]
    got, keys, current = {}, [], [None]

    def spy(module, fn, record):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, **k: got.__setitem__(fn, record(*a, **k))
                            or real(*a, **k))

    spy(O, "inception_crop", lambda image, size, area, aspect, seed, interpolation:
        (tuple(area), tuple(aspect), interpolation))
    spy(O, "random_crop", lambda image, area, aspect, seed: (tuple(area), tuple(aspect)))
    spy(O, "simple_random_crop", lambda image, size, seed, interpolation: interpolation)
    spy(O, "timm_by_name", lambda image, name, key, interpolation, first=None: (
        name, interpolation, None if first is None else first[1] is False))
    spy(O, "switch_randaugment", lambda layer, image, key: (layer.num_ops, layer.factor[1]))
    spy(O, "random_erasing", lambda image, p, key: p)
    spy(O, "color_jitter", lambda image, strength, key: strength)
    spy(P, "mixup", lambda images, labels, p, seed: p)
    spy(P, "timm_mix", lambda images, labels, seed, **options: options)
    spy(P, "train_examples", lambda ds, repeats, seed, buffer: repeats)
    real_key = O.key
    monkeypatch.setattr(O, "key", lambda rnd, slot: keys.append((current[0], slot))
                        or real_key(rnd, slot))

    def named(*args, **kwargs):
        return [O.Op(o.name, o.args, lambda x, r, o=o: current.__setitem__(0, o.name)
                     or o.fn(x, r)) for o in O.train_ops(*args, **kwargs)]

    monkeypatch.setattr(P, "train_ops", named)
    ds = tf.data.Dataset.from_tensor_slices(_photos(6))
    next(iter(D.pipeline(ds, 3, 32, 2, train=True, augment=aug, seed=1, shuffle_buffer=4)))
    fused = O.fuses(aug)
    if aug.crop == "simple":
        assert got["simple_random_crop"] == aug.interpolation
    elif fused:
        assert got["random_crop"] == (tuple(aug.crop_area), tuple(aug.crop_aspect))
        assert got["timm_by_name"] == (aug.auto_augment, aug.interpolation, not aug.flip)
    else:
        assert got["inception_crop"] == (tuple(aug.crop_area), tuple(aug.crop_aspect),
                                         aug.interpolation)
    if aug.auto_augment and not fused:
        assert got["timm_by_name"] == (aug.auto_augment, aug.interpolation, None)
    if aug.randaug:
        assert got["switch_randaugment"] == (aug.randaug[0], min(aug.randaug[1] / 10, 1.0))
    assert got.get("random_erasing") == (aug.erase or None)
    assert got.get("color_jitter") == (aug.color_jitter or None)
    assert got.get("mixup") == (aug.mixup if aug.mixup and aug.timm_mix is None else None)
    assert got.get("timm_mix") == aug.timm_mix
    assert got["train_examples"] == aug.aug_repeats
    own = {"inception_crop": {"crop"}, "simple_random_crop": {"crop"}, "flip_lr": {"flip"},
           "pillow": {"crop", "flip", "auto_augment"} if aug.flip else {"crop", "auto_augment"},
           "randaug": {"randaug"}, "aa": {"auto_augment"}, "three_augment": {"three_augment"},
           "color_jitter": {"color_jitter"}, "random_erasing": {"erase"}}
    asked = {}
    for op, slot in keys:
        asked.setdefault(op, set()).add(slot)
    ran = [o.name for o in O.train_ops(aug, (32, 32), check_preprocessing(None))]
    assert asked == {op: own[op] for op in ran if op in own}, asked


def test_each_operation_draws_from_its_own_key():
    """Every operation's key differs from every other's for the same
    example; the slots and the crop's and the flip's halves of `[rnd, 0]`
    split are those of every earlier version (a resumed run's batches
    stay)."""
    import tensorflow as tf

    assert O.SLOTS == dict(crop=0, flip=0, randaug=2, erase=3, three_augment=4,
                           color_jitter=5, auto_augment=6)

    for rnd in (0, 7, 2**40 + 3):
        rnd = tf.constant(rnd, tf.int64)
        keys = {name: tuple(np.asarray(O.key(rnd, name))) for name in O.SLOTS}
        assert len(set(keys.values())) == len(keys), keys
        halves = tf.random.experimental.stateless_split(tf.stack([rnd, tf.constant(0, tf.int64)]),
                                                        2)
        assert keys["crop"] == tuple(np.asarray(halves[0]))
        assert keys["flip"] == tuple(np.asarray(halves[1]))


def test_options_of_one_job_from_two_sources_are_an_error_and_mixed_sources_said(capsys):
    """Two automatic augmentations (big_vision's RandAugment, timm's --aa,
    DeiT III's 3-Augment) or two MixUps are an error where the `Augment` is
    made, naming both and their sources; options of sources that none of
    their recipes combines (big_vision's RandAugment with timm's erasing)
    are said in one line when a training pipeline is built; a source's own
    combination (DeiT III's 3-Augment with timm's MixUp and repeats, as its
    recipes) is not."""
    import tensorflow as tf

    for one_job in (dict(randaug=(2, 10), auto_augment="rand-m9-mstd0.5-inc1"),
                    dict(three_augment=True, auto_augment="rand-m9-mstd0.5-inc1"),
                    dict(randaug=(2, 10), three_augment=True),
                    dict(mixup=0.2, timm_mix={})):
        named = sorted(one_job, key=list(D.augment.SOURCES).index)  # in field order
        job = "MixUp" if "mixup" in one_job else "automatic augmentation"
        with pytest.raises(ValueError, match=f"{named[0]} \\((big_vision|timm).*and {named[1]} "
                                             f"\\(.*both on: each is the pipeline's {job}"):
            D.Augment(**one_job)
        first, second = named  # made one at a time, then the other set: refused all the same
        with pytest.raises(ValueError, match="both on"):
            dataclasses.replace(D.Augment(**{first: one_job[first]}), **{second: one_job[second]})
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(D.Augment(**{first: one_job[first]}), second, one_job[second])
    D.Augment(randaug=(2, 0), auto_augment="rand-m9-mstd0.5-inc1")  # magnitude 0: randaug off
    ds = tf.data.Dataset.from_tensor_slices(_photos())
    for augment, mixed in ((dict(randaug=(2, 10), erase=0.25), "randaug (big_vision), erase (timm)"),
                           (dict(crop="simple", mixup=0.2), "mixup (big_vision), crop=simple"),
                           (dict(three_augment=True, color_jitter=0.3, aug_repeats=3,
                                 timm_mix={}), None),
                           (dict(auto_augment="rand-m9-mstd0.5-inc1", erase=0.25, timm_mix={}),
                            None)):
        capsys.readouterr()
        D.pipeline(ds, 3, 32, 2, train=True, augment=D.Augment(**augment))
        out = capsys.readouterr().err
        if mixed is None:
            assert "more than one source" not in out, out
        else:
            assert out.count("more than one source") == 1 and mixed in out, out
        D.pipeline(ds, 3, 32, 2, train=False, augment=D.Augment(**augment))
        assert "more than one source" not in capsys.readouterr().err  # training's own


@pytest.mark.parametrize("field, value, named", [
    ("crop_area", (0.0, 1.0), "crop_area"), ("crop_area", (0.5, 0.2), "crop_area"),
    ("crop_area", 0.5, "crop_area"), ("crop_area", (0.5, 1.5), "crop_area"),
    ("crop_aspect", (2.0, 0.5), "crop_aspect"), ("crop_aspect", (0.0, 1.0), "crop_aspect"),
    ("flip", 1, "flip"), ("three_augment", "yes", "three_augment"),
    ("randaug", (2,), "randaug"), ("randaug", (2.5, 10), "num_ops"), ("randaug", (2, -1), "magnitude"),
    ("mixup", -1.0, "mixup"), ("erase", 1.5, "erase"), ("erase", float("nan"), "erase"),
    ("color_jitter", -0.1, "color_jitter"), ("aug_repeats", 0, "aug_repeats"),
    ("aug_repeats", 2.5, "aug_repeats"), ("crop", "random", "crop"),
    ("auto_augment", 9, "auto_augment"), ("timm_mix", {"mixup": 0.8}, "'mixup'"),
    ("timm_mix", {"prob": 2.0}, "prob"), ("timm_mix", {"mode": "row"}, "mode"),
    ("timm_mix", [0.8], "timm_mix"),
])
def test_a_bad_augment_value_is_an_error_naming_its_field(field, value, named):
    """Every field checked where the `Augment` is made (was: `erase=1.5`
    trained erasing every image, `mixup=-1` was silently off, a bad crop
    range failed inside tf.data at the first batch)."""
    with pytest.raises(ValueError, match=re.escape(named)):
        D.Augment(**{field: value})


def test_augments_timm_mix_keys_are_timm_mixs_arguments():
    import inspect

    from keras_reluvit.data.augment import TIMM_MIX_KEYS

    takes = [p for p in inspect.signature(D.timm_mix).parameters][3:]
    assert tuple(takes) == TIMM_MIX_KEYS
