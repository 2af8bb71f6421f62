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


def _settings_changed(before, config):
    """{setting: [before, now]} of what a rerun changes (the model's keys as
    `model.<key>`), `RERUN_FREE` included."""
    now = config.to_dict()
    changed = {}
    for k in sorted(set(before) | set(now)):
        if k != "model" and before.get(k) != now.get(k):
            changed[k] = [before.get(k), now.get(k)]
    was = before.get("model") or {}
    for k in sorted(now.get("model") or {}):
        if was.get(k) != now["model"][k]:
            changed[f"model.{k}"] = [was.get(k), now["model"][k]]
    return changed


def _say(changed):
    def value(v):
        return "the recipe's" if v is None else repr(v)

    return ", ".join(f"{k} {value(a)} -> {value(b)}" for k, (a, b) in changed.items())


# What a run in `output` leaves besides its backups: --restart deletes them too.
ARTEFACTS = ("model.keras", "last.keras", "metrics.json", "curves.png", "tensorboard",
             "saved_model", image_folder.SPLIT_FILE)


def launch(config, output, process, rerun):
    """(this launch's record, the records of the launches before it, the
    run's config.json as it was) for config.json; says in one line that the
    run resumes, and what a rerun with other settings does (`rerun`: see
    `train`)."""
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
    epochs = (old.get("settings") or old).get("epochs")
    complete = epochs is not None and record["epoch"] >= epochs and not record["done"]
    where = (f"a complete run of {epochs} epoch{'s' if epochs != 1 else ''} "
             f"({record['step']} steps)" if complete else
             f"a run at epoch {record['epoch'] + 1}, after step {record['done']} of it (step "
             f"{record['step']} of the run)")
    # Runs of before 0.2 kept no `settings`: the keys this config has; a key an earlier
    # version did not record (recipe_overrides) is its default.
    before = dict(RunConfig().to_dict(), **(old.get("settings")
                                            or {k: old[k] for k in config if k in old}))
    if "augment" in before:
        before["augment"] = current_names(before["augment"])
    changed = _settings_changed(before, config) if old else {}
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
