"""One training run: data, model, recipe, callbacks, artefacts.

`train(...)` is what `keras-reluvit train` runs. It writes into `output`:

- `backup/` — `kr.backup.StepBackup`'s `step_<n>/` folders (each epoch's
  end, every `checkpoint_every` updates, and on SIGTERM / SIGINT);
  rerunning the same command after a kill or a preemption resumes at the
  step saved, on the data stream the uninterrupted run had there, and says
  so in one line; a rerun with other settings is an error naming them
  (`rerun="restart"` / `--restart` starts anew, `rerun="override"` /
  `--override` continues with them); in a TensorFlow or torch cluster
  `backup/process_<i>`, one per process, on JAX one shared backup;
- `tensorboard/` — TensorBoard logs;
- `config.json` — everything needed to rebuild the run and the model, the
  settings it trains with (`settings`) and one record per launch
  (`launches`: when, where it resumed, which settings a launch changed);
- `split.json` — on a folder of images: how its splits were made and, where
  the validation split was drawn (no `val/` folder), the files of each, so
  that `keras-reluvit eval` holds out what the run held out;
- `last.keras` (each epoch), `model.keras` (final), `curves.png`;
- `metrics.json` — final evaluation, the per-epoch history, the loss
  after every step (`step_loss`) and `train_seconds`, of the whole run (a
  resumed run's too: its launches before, to their last backup);
- `saved_model/1/` — a TF SavedModel (with `export=True`), in the version
  folder TF Serving loads (`--model_base_path=.../saved_model`).

Below `train`: what a rerun into a run's folder does (resume, write the
artefacts again, or name the settings it would change), and the folder as
later commands (`eval`, `predict`, `export`) read it (`run_of`,
`run_recipe`, `check_held_out`).
"""

import dataclasses
import json
import os
import shutil
import signal
import time

import keras

from keras_reluvit import data as kr_data
from keras_reluvit import distribution as kr_distribution
from keras_reluvit._defaults import VAL_FRACTION
from keras_reluvit._logging import say
from keras_reluvit.data import folders as image_folder
from keras_reluvit.data.augment import check_repeats
from keras_reluvit.data.pipeline import split_batches
from keras_reluvit.distribution.engine import Engine
from keras_reluvit.models.variants import variant_with_patch
from keras_reluvit.models.vit import ViT
from keras_reluvit.models.vit import accepted_keywords
from keras_reluvit.models.vit import check_arguments
from keras_reluvit.training import backup as kr_backup
from keras_reluvit.training import callbacks as kr_callbacks
from keras_reluvit.training import flags
from keras_reluvit.training import recipes
from keras_reluvit.training import signals as noted_signals
from keras_reluvit.training.settings import NUMBERS
from keras_reluvit.training.settings import RunConfig
from keras_reluvit.training.settings import RunSettings
from keras_reluvit.training.settings import check_accum
from keras_reluvit.training.settings import check_number
from keras_reluvit.training.settings import current_names
from keras_reluvit.training.settings import thaw

# What a fine-tuning recipe's `model` may set on a checkpoint's model (with --trainable
# all or lora: a frozen backbone keeps its inference-time behaviour).
FINE_TUNE_MODEL_KEYS = ("drop_path",)
TF_PIPELINE_SEED = 87654321  # tensorflow/python/framework/random_seed.py DEFAULT_GRAPH_SEED


def build_config(settings=None, **kwargs):
    """The run's `RunConfig` (`kr.settings.RunConfig`: typed, every value
    decided, frozen, also a read-only mapping) from a recipe and overrides: a `RunSettings`
    (`kr.settings`), or its fields as keywords (over `settings` when both
    are given); other keywords override the model's config (`pool=`,
    `posemb=`, ...). The recipe is resolved here, once.

    `dataset` is a tfds name or a folder of images (one sub-folder per
    class; `val_fraction` of each class is held out where it has no split
    folders `train/` + `val/`: given for any other data set, an error).
    `init` is a pretrained checkpoint (anything `keras_reluvit.load_checkpoint`
    reads) to start from: its architecture, attention and weights (an
    `attention` given is swapped in, said in one printed line) and a new
    (zero-initialised) head for the data set's classes when they differ;
    `image_size` None keeps its resolution. Without `init`, `attention`
    defaults to `"relu"` (ReLU/L). `trainable`:
    `"all"`, `"head"` (linear probe) or `"lora"` (rank `lora_rank`; see
    `keras_reluvit.finetune`); `layer_decay` and `lr` override the recipe's.
    """
    if isinstance(settings, str):  # build_config("digits"): the recipe
        kwargs = dict(kwargs, recipe=settings)
        settings = None
    own = {k: v for k, v in kwargs.items() if k in RunSettings.fields()}
    model_overrides = {k: v for k, v in kwargs.items() if k not in own}
    s = dataclasses.replace(settings or RunSettings(), **own)
    recipe, init = s.recipe, s.init
    variant = variant_with_patch(s.model) if s.model else None
    # Resolved once, for the variant asked for; what the flags changed (--clip-grad,
    # --mixup, ...) is said once the whole config holds.
    r, lines = flags.apply(recipes.get(recipe, variant), s.recipe_overrides)
    lines = [f"{line}." for line in lines]
    if r.get("init_required") and not init:
        raise ValueError(f"Recipe {recipe!r} fine-tunes a checkpoint: pass init= "
                         "(keras-reluvit train --init CHECKPOINT).")
    if not (s.dataset or r["dataset"]):
        raise ValueError(f"Recipe {recipe!r} has no data set of its own: pass dataset= "
                         "(keras-reluvit train --dataset NAME_OR_FOLDER).")
    model_cfg = dict(r["model"])
    if init:  # the checkpoint's architecture; the recipe's regularisers where blocks train
        model_cfg = {k: v for k, v in model_cfg.items()
                     if k in FINE_TUNE_MODEL_KEYS and s.trainable != "head"}
    if variant and not init:
        model_cfg["variant"] = variant
        if recipe == "digits":  # the tiny-model overrides belong to its default
            for k in ("width", "depth", "num_heads", "mlp_dim"):
                model_cfg.pop(k, None)
    # Given > the recipe's (relu_from_softmax) > with init the checkpoint's own, else ReLU/L.
    attention = s.attention or r["model"].get("attention") or (None if init else "relu")
    if attention is not None:
        model_cfg.update(attention=attention)
    if not init:
        model_cfg.update(head_bias_init=r["head_bias_init"])
    unknown = sorted(set(model_overrides) - set(accepted_keywords()))
    if unknown:
        raise ValueError(f"Neither run settings nor ViT arguments: {', '.join(unknown)} (the "
                         f"settings: {', '.join(RunSettings.fields())}; a recipe field goes "
                         "in recipe_overrides={...}).")
    if model_overrides.get("drop_path") is not None:  # train --drop-path
        check_number("drop_path", model_overrides["drop_path"], NUMBERS["drop_path"])
    model_cfg.update({k: v for k, v in model_overrides.items() if v is not None})
    image_size = r["image_size"] if s.image_size is None else s.image_size
    if not init:  # the model checked now, before any data is read (its classes: any number)
        try:
            check_arguments(**model_cfg, image_size=image_size, num_classes=2)
        except ValueError as e:
            raise ValueError(f"The run's model ({model_cfg.get('variant') or 'its variant'} at "
                             f"{image_size} px; train --model, --image-size or the model "
                             f"flags): {e}") from None
    epochs = r["epochs"] if s.epochs is None else s.epochs
    warmup = s.recipe_overrides.get("warmup_epochs")
    if warmup is not None and warmup >= epochs:
        raise ValueError(f"warmup_epochs (train --warmup-epochs) {warmup} must be fewer than "
                         f"the run's {epochs} epochs (--epochs, else the recipe's): the warmup "
                         "must end before the run does.")
    dataset = s.dataset or r["dataset"]
    val_fraction = _val_fraction(s.val_fraction, dataset)
    batch_size = s.batch_size
    if batch_size is None:
        batch_size = _recipe_batch_size(recipe, r["batch_size"], dataset, val_fraction, s.seed,
                                        s.data_shards, lines)
    accum = check_accum(r["accum_steps"] if s.accum_steps is None else s.accum_steps, batch_size)
    config = RunConfig(
        resolved_recipe=r,
        resolved_with=dict(s.recipe_overrides),
        recipe=recipe,
        init=os.fspath(init) if init else None,
        dataset=dataset,
        data_dir=s.data_dir,
        epochs=epochs,
        batch_size=batch_size,
        image_size=image_size,
        augment=_augment(r.get("augment", {}), 1 if s.aug_repeats == 0 else s.aug_repeats,
                         r["loss"], s.auto_augment,  # timm's --aug-repeats 0: off
                         (s.recipe_overrides or {}).get("augment.three_augment"), lines),
        seed=s.seed,
        data_shards=s.data_shards,
        trainable=s.trainable,
        lora_rank=int(s.lora_rank),
        layer_decay=s.layer_decay,
        lr=s.lr,
        val_fraction=val_fraction,
        checkpoint_every=(r["checkpoint_every"] if s.checkpoint_every is None
                          else int(s.checkpoint_every) or None),
        keep_checkpoints=int(s.keep_checkpoints),
        accum_steps=accum,
        steps_per_execution=_steps_per_execution(s.steps_per_execution, accum),
        ema=(r["ema"] if s.ema is None else s.ema) or None,
        recipe_overrides=dict(s.recipe_overrides),
        model=model_cfg,
    )
    for line in lines:
        say(line)
    return config


def _steps_per_execution(k, accum, calls=None):
    """`--steps-per-execution` as the run's (None: 1): Keras runs one step
    per call on PyTorch; with gradient accumulation a call holds whole
    updates (Keras' steps are its micro-batches), so that the backups and a
    stop fall on an update's end; and it divides the epoch's `calls` Keras
    steps, where known (else Keras would run whole calls past its data)."""
    k = int(k or 1)
    if k > 1 and keras.backend.backend() == "torch":
        raise ValueError(f"--steps-per-execution {k} (steps_per_execution): Keras runs one step "
                         "per call on the PyTorch backend; leave it unset there.")
    if k > 1 and k % accum:
        raise ValueError(f"--steps-per-execution {k} with --accum-steps {accum}: Keras' steps are "
                         f"the micro-batches, so a call must hold whole updates: give a multiple "
                         f"of {accum}.")
    if calls is not None and calls % k:
        raise ValueError(f"--steps-per-execution {k} does not divide the epoch's {calls} steps "
                         "(Keras would run whole calls, past the epoch's data): give one that "
                         "divides it.")
    return k


def _augment(augment, repeats, loss, auto_augment=None, three_augment_flag=None, lines=None):
    """The run's `Augment` keywords: the recipe's, with timm's `--aa`
    (`auto_augment`) and `--aug-repeats` (`repeats`); what they change is
    appended to `lines`."""
    lines = [] if lines is None else lines
    augment = current_names(augment)
    if auto_augment is not None:  # timm's --aa: instead of the recipe's automatic augmentation
        from keras_reluvit.data.timm_augment import parse

        name = None if str(auto_augment).lower() in ("none", "") else auto_augment
        if name is not None and three_augment_flag:
            raise ValueError(f"--aa {name!r} and --ThreeAugment / --three-augment both given: "
                             "DeiT III's 3-Augment replaces the automatic augmentation (as its "
                             "transform); choose one.")
        if name is not None:
            try:
                parse(name)  # an unknown name fails here
            except ValueError as e:
                raise ValueError(f"auto_augment (train --aa): {e}") from None
        replaced = [f"RandAugment{tuple(augment['randaug'])}"] if augment.get("randaug") else []
        if augment.get("auto_augment") and augment["auto_augment"] != name:
            replaced.append(repr(augment["auto_augment"]))
        if augment.get("three_augment"):  # DeiT III's automatic augmentation
            replaced.append("3-Augment (its colour jitter stays)")
        if replaced:
            verb = "turns off" if name is None else f"{name!r} replaces"
            lines.append(f"--aa {verb} the recipe's {' and '.join(replaced)}.")
        elif name is not None and augment.get("auto_augment") != name:
            lines.append(f"--aa {name!r}: timm's augmentation on (the recipe has none).")
        augment.update(randaug=None, auto_augment=name, three_augment=False)
    smoothing = (augment.get("timm_mix") or {}).get("label_smoothing", 0.1)
    if loss == "bce" and augment.get("timm_mix") is not None and smoothing > 0:
        raise ValueError(f"The bce loss (DeiT III's) binarises the targets: with "
                         f"timm_mix label_smoothing={smoothing} every target would be 1. Set "
                         "it to 0 (DeiT III's) or use softmax_xent.")
    if repeats is not None:
        check_repeats(repeats, "aug_repeats (train --aug-repeats)")
        augment["aug_repeats"] = repeats
    return augment


def _val_fraction(val_fraction, dataset):
    """The share of each class a run holds out: `val_fraction` (default
    `VAL_FRACTION`) where the data set is a folder without split folders;
    given for any other data set (whose validation split is its own), an
    error naming it."""
    if val_fraction is None:
        return VAL_FRACTION
    if not image_folder.is_image_folder(dataset):
        what = (f"{dataset} is not a folder" if os.sep in str(dataset) or
                str(dataset).startswith((".", "~")) else
                f"{dataset!r} is a tfds data set, which validates on its own split")
        raise ValueError(f"val_fraction (train --val-fraction) {val_fraction:g} holds out a share "
                         f"of an image folder's classes; {what}: leave --val-fraction out.")
    found = image_folder.split_folders(dataset)
    if found:
        raise ValueError(f"val_fraction (train --val-fraction) {val_fraction:g} holds out a share "
                         f"of a folder without split folders; {dataset} has "
                         f"{', '.join(sorted(d + '/' for d in found.values()))}, which decide "
                         "its splits: leave --val-fraction out.")
    return float(val_fraction)


def _recipe_batch_size(recipe, batch_size, dataset, val_fraction, seed, data_shards, lines):
    """The recipe's batch size, or for a folder of images with fewer
    training images than that (a fine-tune on a few hundred photographs
    with `bv_transfer`'s 512), the largest batch its training split allows,
    said in one line (appended to `lines`); `recipes.compile` scales the learning rate to it as
    the recipe scales it."""
    if not image_folder.is_image_folder(dataset):
        return batch_size
    folder = image_folder.ImageFolder(dataset, val_fraction=val_fraction, seed=seed)
    shards = int(data_shards or kr_distribution.process_count())
    n = folder.num_examples("train")
    if n >= batch_size:
        return batch_size
    largest = n // shards * shards
    if largest < 1:
        raise ValueError(f"{dataset} has {n} training images, fewer than the {shards} "
                         "processes reading it.")
    lines.append(f"{dataset} has {n} training images, fewer than recipe {recipe!r}'s "
                 f"batch of {batch_size}: training with batch {largest}, the learning rate "
                 "scaled as the recipe scales it (--batch-size / batch_size= to choose).")
    return largest


def _json_writer(value, **kwargs):
    """A `write(path)` for `_write_atomically`: `value` as JSON (`json.dump`'s
    keywords)."""
    def write(path):
        with open(path, "w") as f:
            json.dump(value, f, **kwargs)
    return write


def _write_atomically(path, write):
    """`write(tmp)` then renamed into `path`: a kill midway leaves no
    half-written file under the name."""
    base, ext = os.path.splitext(path)
    tmp = f"{base}.partial{ext}"
    write(tmp)
    os.replace(tmp, path)


def train(config, output, export=True, verbose=2, extra_callbacks=(), rerun="error"):
    """Runs `config` (a `RunConfig` from `build_config`, or a mapping of its
    fields) and writes the artefacts to `output`.

    A rerun into an `output` holding a backup continues that run (said in
    one line) when its settings are the run's; with other settings (other
    than `RERUN_FREE`) it is a ValueError naming them, unless `rerun` is
    `"restart"` (the backups deleted, the run starts anew) or `"override"`
    (continues with the new settings; config.json records the change).

    SIGTERM / SIGINT stop the run cleanly at every moment (`Preempted`,
    saved): while the data and model are prepared (before the first step),
    during training and validation (`kr.backup.StepBackup`), and while the
    final scores and artefacts are written (at the evaluation's next batch or
    before the next write; a rerun writes them). In a cluster every process
    stops at the same point (the final evaluation within 10 batches; the
    chief's writes see its own signals, another's finds the run complete).

    In a multi-process cluster (`kr.distribution.initialize`), every process
    runs this with the same arguments: each trains on its shard of the data,
    the backup is kept as `kr.backup.StepBackup` says (so a killed cluster
    resumes), and only process 0 writes the other artefacts.
    `config.data_shards` set in a single process reproduces the global
    batches of a cluster of that many processes on one machine.
    """
    config = RunConfig.of(config)
    with kr_backup.signals_noted():
        return _train(config, output, export, verbose, extra_callbacks, rerun)


def _train(config, output, export, verbose, extra_callbacks, rerun):
    output = os.path.expanduser(os.fspath(output))
    if os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"--output {output} is a file: a run writes a folder there (its "
                         "config.json, backups, model). Name a folder.")
    index, count = kr_distribution.process_index(), kr_distribution.process_count()
    chief = index == 0
    recipe = _recipe_of(config, config.model.get("variant"))
    launch, launches, old = _launch(config, output, (index, count), rerun,
                                    recipe=_recipe_record(recipe))
    shards = int(config.data_shards or count)
    if count > 1 and shards != count:
        raise ValueError(f"data_shards={shards} in a cluster of {count} processes: leave it "
                         "unset (each process reads its own shard).")
    shards, mine = kr_backup.data_layout(os.path.join(output, "backup"), shards, index, count,
                                         config.data_shards)
    def load_data(image_size=None, preprocessing=None, pipelines=True):
        return kr_data.load(
            config.dataset,
            config.batch_size,
            image_size=image_size,
            data_dir=config.data_dir,
            augment=kr_data.Augment(**config.augment),
            seed=config.seed,
            process_index=mine,
            process_count=shards,
            preprocessing=preprocessing,
            val_fraction=config.val_fraction,
            **({} if pipelines else dict(train_split=False, val_split=False)),
        )

    # The data are loaded once, at the model's resolution and by its
    # preprocessing (a checkpoint's own), before the seed is set: preparing a
    # data set on the first run draws from Python's RNG, and a rerun must
    # initialise the same model. TensorFlow's global seed is set first: the
    # pipeline's shuffles and draws pair it with their own seeds, so the data
    # stream must not depend on what ran before in the process (a run resumed
    # in the notebook that was interrupted, a second run) -- only on `seed`.
    # The constant is TensorFlow's DEFAULT_GRAPH_SEED, the global part a fresh
    # process pairs with explicit seeds.
    import tensorflow as tf

    tf.random.set_seed(TF_PIPELINE_SEED)
    kr_backup.stop_if_noted("as the run began", (index, count))
    engine = Engine()
    if config.init:
        classes = load_data(pipelines=False)
        keras.utils.set_random_seed(config.seed)  # what a checkpoint lacks is drawn
        with engine.scope():  # TensorFlow clusters: variables, optimizer and metrics
            model, model_cfg = _checkpoint(config, classes)
        d = load_data(model.image_size, model.preprocessing)
        keras.utils.set_random_seed(config.seed)  # LoRA's factors: the same draws
        with engine.scope():
            _set_trainable(model, config, chief)
    else:
        d = load_data(config.image_size or 224)
        keras.utils.set_random_seed(config.seed)
        model_cfg = dict(thaw(config.model), num_classes=d.num_classes,
                         image_size=config.image_size, label_names=d.label_names)
        with engine.scope():
            model = ViT(**model_cfg)
    with engine.scope():
        folder = d.info if isinstance(d.info, image_folder.ImageFolder) else None
        if launch["resumed"]:
            launch["changed"].update(check_same_data(old, d, folder, output, rerun))
        accum = int(config.accum_steps or 1)
        # Checked again here: a RunConfig made from a dict skips build_config.
        _steps_per_execution(config.steps_per_execution, accum,
                             calls=d.steps_per_epoch * accum)  # Keras' steps: micro-batches
        settings = config.to_dict()
        pipelines = kr_data.ops.describe(kr_data.Augment(**config.augment),
                                         tuple(model.image_size), model.preprocessing)
        full = dict(settings, model=model_cfg, num_classes=d.num_classes,
                    label_names=d.label_names, backend=engine.backend,
                    steps_per_epoch=d.steps_per_epoch, processes=count,
                    distribution=kr_distribution.describe(), settings=settings,
                    recipe_resolved=_recipe_record(recipe), pipelines=pipelines,
                    launches=launches + [launch])
        if chief:  # the first file the run writes (the folder made here)
            for split, line in pipelines.items():
                say(f"{split} pipeline: {line}")
            os.makedirs(output, exist_ok=True)
            # beside, then renamed: a rerun reads them to check its settings and data
            _write_atomically(os.path.join(output, "config.json"),
                              _json_writer(full, indent=2, default=list))
            if folder is not None:  # what `eval` must hold out
                _write_atomically(os.path.join(output, image_folder.SPLIT_FILE),
                                  _json_writer(folder.split_record()))
        # --warmup-epochs is what it says (build_config checked it fits the run);
        # the recipe's own warmup is capped at half a short run (said).
        given = config.recipe_overrides.get("warmup_epochs") is not None
        recipes.compile(model, recipe, d.steps_per_epoch, batch_size=config.batch_size,
                        epochs=config.epochs, lr=config.lr, layer_decay=config.layer_decay,
                        accum_steps=accum, ema=config.ema,
                        warmup_cap=None if given else recipes.WARMUP_CAP,
                        steps_per_execution=config.steps_per_execution)
    kr_backup.stop_if_noted("once the data and the model were ready", (index, count))
    # what fit trains: in a torch / TensorFlow cluster a DataParallelModel (DDP; the
    # strategy with the clip after the all-reduce), files and variables `model`'s
    trained_as = engine.wrap(model)
    # TensorFlow clusters: each worker's own shard (no re-batching, no auto-sharding)
    _, val_data = engine.distribute(trained_as, d.train, d.val)
    every = config.checkpoint_every
    callbacks = kr_callbacks.default(output, process=(index, count),
                                     every=every * accum if every else None,
                                     keep=config.keep_checkpoints,
                                     info=dict(data_shards=shards))
    backup = callbacks.pop()  # kr_backup.fit places it last
    if config.ema and d.val is not None:  # first: its logs reach TensorBoard, history
        callbacks.insert(0, kr_callbacks.EMAEvaluation(val_data))
    # One iterator for the whole run, one new pass per epoch; a resumed run
    # continues the data stream at the step it saved.
    with image_folder.naming_unreadable(folder):
        kr_backup.fit(trained_as, split_batches(d.train, accum), config.epochs, backup,
                      validation_data=val_data, callbacks=callbacks + list(extra_callbacks),
                      steps_per_epoch=d.steps_per_epoch * accum,
                      verbose=verbose if chief else 0,
                      distribute=lambda ds: engine.distribute(trained_as, ds)[0])
        train_seconds = backup.train_seconds  # the whole run's, to its last backup
    # Scoring and writing take long (a spot machine's notice is ~30 s) and the
    # backup holds the trained run: a signal ends the final evaluation at its
    # next batch, or the writes before the next of them, and the run stops (a
    # rerun writes them). In a cluster the processes agree at each of these points
    # (EvaluationStop: every 10 batches).
    where = (f"while scoring and writing the run's artefacts (the training is complete, "
             f"saved in {backup.directory})")

    def stop_point():
        kr_backup.stop_point(where, (index, count))

    with image_folder.naming_unreadable(folder):  # (train's signals_noted around)
        def score():
            scores = (trained_as.evaluate(val_data, return_dict=True, verbose=0,
                                          callbacks=[kr_backup.EvaluationStop((index, count))])
                      if d.val is not None else {})
            stop_point()
            return scores

        stop_point()
        final, trained = score(), {}
        if config.ema:  # the EMA is the model the run saves and exports
            trained = final
            recipes.swap_ema(model)
            final = score()
            if chief:
                held = "model.keras and the export hold" if export else "model.keras holds"
                say(f"{held} the weights' EMA "
                    f"(decay {config.ema}); metrics.json's final is its, "
                    "final_trained the trained weights'.")
        metrics = dict(
            final={k: float(v) for k, v in final.items()},
            **({"final_trained": {k: float(v) for k, v in trained.items()}} if trained else {}),
            history=backup.history,
            step_loss=backup.step_loss,
            optimizer_steps=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
            train_seconds=train_seconds,
        )

        def write_export():
            from keras_reluvit import export as kr_export

            kr_export.saved_model(model, os.path.join(output, "saved_model", "1"),
                                  activation=recipes.probability(recipe))

        writes = [lambda: _write_atomically(os.path.join(output, "model.keras"), model.save),
                  lambda: _write_atomically(os.path.join(output, "metrics.json"),
                                                    _json_writer(metrics, indent=2)),
                  lambda: plot_curves(metrics["history"], os.path.join(output, "curves.png"))]
        # In a cluster: every process gathers the sharded weights, process 0 writes
        # (the others wait); a signal skips the writes after it, and all stop below.
        if export:
            writes.append(write_export)
        cut, failed = False, None
        with kr_distribution.chief_writes(model) as writer:
            try:
                for write in writes if writer else []:
                    if noted_signals.NOTED:  # the chief's own signals (the others': below)
                        cut = True
                        break
                    write()
            except Exception as e:  # raised below, once every process knows
                failed = e
        # Every process here, the chief's writes done, cut or failed: in a cluster
        # they agree on a failure (one process leaving alone would leave the others
        # in the next collective), then stop where the writes were cut; a signal
        # that came during the last write finds the run complete.
        if count > 1 and kr_distribution.any_process(failed is not None) and failed is None:
            raise RuntimeError(f"Process 0 failed writing the run's artefacts into {output} "
                               "(its error is in its output); the training is complete in the "
                               "backup: rerun the same command to write them.")
        if failed is not None:
            raise failed
        kr_backup.stop_point(where, (index, count), stop=cut)
        late = [noted_signals.take() for _ in list(noted_signals.NOTED)]
        if late and chief:
            say(f"{signal.Signals(late[0]).name} came as the last artefact was written: the "
                "run is complete.")
    return model, metrics


def _recipe_of(config, variant):
    """The recipe `config` trains with: build_config's (checked against the
    overrides it was resolved with), or resolved anew with `recipe_overrides`
    (a config from a dict or a config.json)."""
    r = config.resolved_recipe
    if r is not None and r.name == config.recipe and config.resolved_with is not None:
        if config.resolved_with != config.recipe_overrides:
            raise ValueError("recipe_overrides changed after build_config resolved the recipe "
                             f"({config.resolved_with} -> {config.recipe_overrides}): call "
                             "kr.build_config again.")
        if r.augment_by_variant and variant and r.model.get("variant") != variant:
            raise ValueError(f"The model's variant changed after build_config resolved recipe "
                             f"{r.name!r} for {r.model.get('variant')!r} (its augmentation is "
                             f"per variant): call kr.build_config again for {variant!r}.")
        return r
    return flags.apply(recipes.get(config.recipe, variant), config.recipe_overrides)[0]


def _json(value):
    """`value` as JSON reads it back (tuples as lists)."""
    return json.loads(json.dumps(value, default=list))


def _recipe_record(recipe):
    """The resolved recipe as config.json records it (JSON's values; its
    description and per-variant table left out: not what the run trains with)."""
    return _json({k: v for k, v in dict(recipe).items()
                  if k not in ("description", "augment_by_variant")})


def _checkpoint(config, d):
    """The run's model from `config.init`, with a new head for the classes
    of `d` where they differ, and its config."""
    from keras_reluvit.checkpoints import load_checkpoint

    model = load_checkpoint(config.init, num_classes=d.num_classes,
                            image_size=config.image_size,
                            **dict(thaw(config.model), label_names=d.label_names))
    return model, {k: v for k, v in model.get_config().items() if k not in ("name", "trainable")}


def _set_trainable(model, config, chief):
    from keras_reluvit.training import finetune

    finetune.set_trainable(model, config.trainable, config.lora_rank)
    if chief:
        say(f"fine-tuning {config.trainable}: "
            f"{finetune.describe_trainable(model)}.")


def plot_curves(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key in zip(axes, ("loss", "accuracy")):
        for prefix, style in (("", "-"), ("val_", "--")):
            values = history.get(prefix + key)
            if values:
                ax.plot(range(1, len(values) + 1), values, style,
                        label=("validation " if prefix else "train ") + key)
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- a rerun into a run's folder ----------------------------------------------------
# It resumes the run saved there (said in one line), writes its artefacts again when
# it is complete, is an error naming the settings it would change (other than
# `RERUN_FREE`), or, with `rerun="restart"` / `"override"`, starts anew / continues
# with them (the change said and recorded in config.json's launches); and it checks
# that the data it resumes on are the run's.

RERUN = ("error", "restart", "override")  # train(rerun=): a rerun with other settings
# How a run is saved or where its files are, not what it trains: a rerun may change them.
RERUN_FREE = ("checkpoint_every", "keep_checkpoints", "data_dir")


RECIPE_KEY = "recipe_resolved"  # config.json: the recipe as the run resolved it


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


def _say(changed):
    def value(k, v):  # a setting left unset is the recipe's; a nested key absent, unset
        return repr(v) if v is not None else "unset" if "." in k else "the recipe's"

    return ", ".join(f"{k} {value(k, a)} -> {value(k, b)}" for k, (a, b) in changed.items())


# What a run in `output` leaves besides its backups: --restart deletes them too.
ARTEFACTS = ("model.keras", "last.keras", "metrics.json", "curves.png", "tensorboard",
             "saved_model", image_folder.SPLIT_FILE)


def _launch(config, output, process, rerun, recipe=None):
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
            say(f"restart: the backups and artefacts of the run in {output} "
                "are deleted; starting anew.")
        return dict(launch, restart=True), [], {}
    record = kr_backup.StepBackup(kr_backup.backup_folder(root, process)).latest(quiet=True)
    path = os.path.join(output, "config.json")
    try:
        with open(path) as f:
            old = json.load(f)
    except FileNotFoundError:
        old = {}
    except (OSError, ValueError) as e:
        unread = f"{output} holds a backup, but its config.json cannot be read ({e})"
        if record is not None and rerun == "error":  # resuming could change them unseen
            raise ValueError(f"{unread}: the settings it trained with are unknown. --restart "
                             "(Python: rerun='restart') starts anew in this folder, --override "
                             "(rerun='override') continues the backup with these settings.") from None
        if record is not None and index == 0:
            say(f"{unread}: --override continues it with these settings.")
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
    # A complete run trains nothing more: how its steps were grouped does not matter.
    free = RERUN_FREE + (("steps_per_execution",) if complete else ())
    blocking = {k: v for k, v in changed.items() if k not in free}
    was_k = int(record.get("steps_per_execution") or 1)
    if not complete and record.get("step") and was_k != config.steps_per_execution:
        raise ValueError(f"{output} holds {where}, backed up with --steps-per-execution {was_k} "
                         "(its record holds one loss per call): it continues with that. Rerun "
                         f"with --steps-per-execution {was_k}, or --restart to start anew.")
    if blocking and rerun == "error":
        raise ValueError(
            f"{output} holds {where}, trained with other settings: {_say(blocking)}. Rerun "
            "with its settings to continue it; or --restart (Python: rerun='restart') to "
            "start anew in this folder (its backups and artefacts deleted), --override "
            "(rerun='override') to continue it with these settings, or another --output.")
    if index == 0:
        said = (f", with settings changed (--override): {_say(blocking)}" if blocking else "")
        say(f"{output} holds {where}: "
            + ("writing its artefacts again" if complete else "resuming it")
            + said + ".")
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
        say(f"--override: the data changed ({_say(changed)}); continuing.")
    return changed


# --- a run folder as later commands read it (`eval`, `predict`, `export`) -----------
# Its config, whether a data set is its own, and the split it held out.

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
    name = (run or {}).get("recipe")
    if name not in recipes.RECIPES:
        return name
    try:
        r = recipes.get(name, (run.get("model") or {}).get("variant"))
    except ValueError:  # a per-variant table without this variant: the loss is the same
        r = recipes.get(name, next(iter(recipes.RECIPES[name]["augment_by_variant"])))
    return flags.apply(r, (run.get("settings") or run).get("recipe_overrides") or {})[0]


def same_dataset(a, b):
    if os.path.isdir(os.path.expanduser(a)) and os.path.isdir(os.path.expanduser(b)):
        return os.path.samefile(os.path.expanduser(a), os.path.expanduser(b))
    return a == b


def check_held_out(folder, split, directory, run):
    """An evaluation on the images a run trained on is an error, not a number."""
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
