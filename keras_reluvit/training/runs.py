"""A `keras-reluvit train` run directory as later commands read it: its
config, whether a data set is its own, and the split it held out."""

import json
import os

from keras_reluvit.training.settings import VAL_FRACTION


def run_of(source):
    """(the run directory, its config.json) when `source` is the directory of
    a `keras-reluvit train` run or a file in one; (None, None) otherwise."""
    path = os.path.abspath(os.path.expanduser(source))
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config = os.path.join(directory, "config.json")
    if not os.path.isfile(config):
        return None, None
    with open(config) as f:
        run = json.load(f)
    if not (isinstance(run, dict) and "recipe" in run and "dataset" in run):
        return None, None  # a preset's or a transformers directory's config.json
    return directory, run


def run_recipe(run):
    """The recipe a run's config.json trained with: its name's, with the run's
    `recipe_overrides` applied (its loss may differ: `--bce-loss`, `--loss`);
    the name when it is no recipe of ours; None without one."""
    from keras_reluvit.training import flags
    from keras_reluvit.training import recipes

    name = (run or {}).get("recipe")
    if name not in recipes.RECIPES:
        return name
    try:
        r = recipes.get(name, (run.get("model") or {}).get("variant"))
    except ValueError:  # a per-variant table without this variant: the loss is the same
        r = recipes.get(name, next(iter(recipes.RECIPES[name]["augment_by_variant"])))
    flags.apply(r, (run.get("settings") or run).get("recipe_overrides") or {})
    return r


def same_dataset(a, b):
    if os.path.isdir(os.path.expanduser(a)) and os.path.isdir(os.path.expanduser(b)):
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    return a == b


def check_held_out(folder, split, directory, run):
    """An evaluation on the images a run trained on is an error, not a number."""
    from keras_reluvit.data import folders as image_folder

    if split == "train":  # asked for by name
        return
    path = os.path.join(directory, image_folder.SPLIT_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            record = json.load(f)
    else:  # a run from before split.json: its split drawn again from its config
        record = image_folder.ImageFolder(folder.root, run.get("val_fraction", VAL_FRACTION),
                                          run.get("seed", 0)).split_record()
    trained = folder.trained_on(split, record)
    if trained:
        raise ValueError(
            f"{len(trained)} of the {folder.num_examples(split)} images this evaluation would "
            f"score were training images of {directory} (e.g. {trained[0]}): "
            f"--seed {folder.seed} / --val-fraction {folder.val_fraction:g} hold out another "
            "subset than the run did. Leave them out to use the run's own split.")
