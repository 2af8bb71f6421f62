"""What a rerun into a run's `--output` does: it resumes the run saved
there (said in one line), writes its artefacts again when it is complete, is
an error naming the settings it would change (other than `RERUN_FREE`), or,
with `rerun="restart"` / `"override"`, starts anew / continues with them (the
change said and recorded in config.json's launches); and it checks that the
data it resumes on are the run's."""

import json
import os
import shutil
import time

from keras_reluvit import distribution as kr_distribution
from keras_reluvit.data import folders as image_folder
from keras_reluvit.training import backup as kr_backup
from keras_reluvit.training.settings import RunConfig
from keras_reluvit.training.settings import current_names

RERUN = ("error", "restart", "override")  # train(rerun=): a rerun with other settings
# How a run is saved or where its files are, not what it trains: a rerun may change them.
RERUN_FREE = ("checkpoint_every", "keep_checkpoints", "data_dir")


def _json(value):
    return json.loads(json.dumps(value, default=list))


def _flat(value, prefix=""):
    """{"a.b.c": leaf} of nested dicts (a model's, the augmentation's, the
    recipe's keys), JSON's values (tuples as lists)."""
    value = _json(value)
    if not isinstance(value, dict):
        return {prefix: value}
    out = {}
    for k, v in value.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})  # {}: no keys
    return out


def settings_changed(before, now):
    """{setting: [before, now]} of what a rerun changes, every key of either
    side compared (nested ones as `model.width`, `recipe.grad_clip`; one only
    one side has is None on the other), `RERUN_FREE` included. `before` /
    `now`: a run's `settings` with its resolved recipe under `recipe_resolved`;
    where both have it, the recipe is compared field by field and
    `recipe_overrides` (how it was set) is not."""
    before, now = dict(before), dict(now)
    if before.get(RECIPE_KEY) is not None and now.get(RECIPE_KEY) is not None:
        before.pop("recipe_overrides", None)
        now.pop("recipe_overrides", None)
    else:
        before.pop(RECIPE_KEY, None)
        now.pop(RECIPE_KEY, None)
    a, b = _flat(before), _flat(now)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


RECIPE_KEY = "recipe_resolved"  # config.json: the recipe as the run resolved it


def _say(changed):
    def value(k, v):  # a setting left unset is the recipe's; a nested key absent, unset
        return repr(v) if v is not None else "unset" if "." in k else "the recipe's"

    return ", ".join(f"{k} {value(k, a)} -> {value(k, b)}" for k, (a, b) in changed.items())


# What a run in `output` leaves besides its backups: --restart deletes them too.
ARTEFACTS = ("model.keras", "last.keras", "metrics.json", "curves.png", "tensorboard",
             "saved_model", image_folder.SPLIT_FILE)


def launch(config, output, process, rerun, recipe=None):
    """(this launch's record, the records of the launches before it, the
    run's config.json as it was) for config.json; says in one line that the
    run resumes, and what a rerun with other settings does (`rerun`: see
    `train`). `recipe`: the recipe `config` resolves to, as a dict (compared
    with the run's `recipe_resolved`, field by field)."""
    if rerun not in RERUN:
        raise ValueError(f"rerun must be one of {RERUN}, got {rerun!r}.")
    index, count = process
    root = os.path.join(output, "backup")
    launch = dict(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), processes=count,
                  resumed=None, changed={})
    if rerun == "restart":
        # Whatever the backups' layout (another process count's included):
        # every process deletes them (its own, or the shared folder), then all wait.
        shutil.rmtree(root, ignore_errors=True)
        if index == 0:  # and what the earlier run wrote, so that nothing of it is taken for ours
            for name in ARTEFACTS:
                path = os.path.join(output, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.exists(path):
                    os.remove(path)
        if count > 1:
            kr_distribution.barrier("restart")
        if index == 0:
            print(f"keras_reluvit: restart: the backups and artefacts of the run in {output} "
                  "are deleted; starting anew.", flush=True)
        return dict(launch, restart=True), [], {}
    record = kr_backup.StepBackup(kr_backup.backup_folder(root, process)).latest(quiet=True)
    try:
        with open(os.path.join(output, "config.json")) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {}
    if record is None:
        return launch, [], {}
    # The run as it is (its own epochs), and what this launch does: write the
    # artefacts again where the epochs it asks for are done, else resume.
    epochs = (old.get("settings") or old).get("epochs") or config.epochs
    was_complete = record["epoch"] >= epochs and not record["done"]
    complete = record["epoch"] >= config.epochs and not record["done"]
    where = (f"a complete run of {epochs} epoch{'s' if epochs != 1 else ''} "
             f"({record['step']} steps)" if was_complete else
             f"a run at epoch {record['epoch'] + 1}, after step {record['done']} of it (step "
             f"{record['step']} of the run)")
    # Runs of before 0.2 kept no `settings`: the keys this config has; a key an earlier
    # version did not record (recipe_overrides) is its default.
    before = dict(RunConfig().to_dict(), **(old.get("settings")
                                            or {k: old[k] for k in config if k in old}))
    if "augment" in before:
        before["augment"] = current_names(before["augment"])
    before[RECIPE_KEY] = old.get(RECIPE_KEY)
    changed = settings_changed(before, dict(config.to_dict(), **{RECIPE_KEY: recipe})) \
        if old else {}
    blocking = {k: v for k, v in changed.items() if k not in RERUN_FREE}
    if blocking and rerun == "error":
        raise ValueError(
            f"{output} holds {where}, trained with other settings: {_say(blocking)}. Rerun "
            "with its settings to continue it; or --restart (Python: rerun='restart') to "
            "start anew in this folder (its backups and artefacts deleted), --override "
            "(rerun='override') to continue it with these settings, or another --output.")
    if index == 0:
        said = (f", with settings changed (--override): {_say(blocking)}" if blocking else "")
        print(f"keras_reluvit: {output} holds {where}: "
              + ("writing its artefacts again" if complete else "resuming it")
              + said + ".", flush=True)
    launch.update(resumed=dict(epoch=record["epoch"], done=record["done"],
                               step=record["step"], complete=complete), changed=changed)
    return launch, list(old.get("launches", [])), old


def check_same_data(old, d, folder, output, rerun):
    """A resumed run reads the data it was trained on: the same steps per
    epoch and, for a folder, the same split (a folder that gained images
    would resume on other batches and hold out other images). Named, or with
    --override said and recorded; returns the changes."""
    if not old:
        return {}
    changed = {}
    if old.get("steps_per_epoch") not in (None, d.steps_per_epoch):
        changed["steps_per_epoch"] = [old["steps_per_epoch"], d.steps_per_epoch]
    split = os.path.join(output, image_folder.SPLIT_FILE)
    if folder is not None and os.path.exists(split):
        with open(split) as f:
            was = json.load(f)
        now = _json(folder.split_record())
        if was.get("splits") != now.get("splits"):  # the files of each drawn split

            def counts(record):
                return {k: len(v) for k, v in (record.get("splits") or {}).items()} or None

            changed["split"] = [counts(was), counts(now)]
    if changed and rerun == "error":
        raise ValueError(
            f"The data of the run in {output} changed since it was trained: {_say(changed)} "
            "(images added or removed?). Resuming would read other batches and hold out other "
            "images: --restart to start anew on them, --override to continue anyway.")
    if changed:
        print(f"keras_reluvit: --override: the data changed ({_say(changed)}); continuing.",
              flush=True)
    return changed
