"""`keras-reluvit train | eval | predict | export | convert | prepare | bench | recipes | attention`.

Examples:

    keras-reluvit train --output runs/digits            # embedded default data set
    keras-reluvit train --dataset my_images/ --init vit_s16.safetensors --recipe bv_transfer \\
        --output runs/mine                               # fine-tune on a folder of images
    keras-reluvit train --model vit_s16 --attention relu --dataset imagenet2012 \\
        --data-dir ~/tensorflow_datasets --recipe s16_i1k_90ep --output runs/s16_relu
    keras-reluvit eval runs/s16_relu/        # the run's data set, split, seed and loss
    keras-reluvit predict hf://timm/vit_small_patch16_224.augreg_in21k_ft_in1k cat.jpg
    keras-reluvit predict runs/mine/model.keras my_images/val/   # one line per image
    keras-reluvit export runs/s16_relu/model.keras serving/vit_s16_relu/1
    keras-reluvit bench --dataset imagenet2012 --data-dir ~/tensorflow_datasets
    keras-reluvit prepare imagenet2012 --data-dir ~/tensorflow_datasets --manual-dir ~/ilsvrc
    keras-reluvit recipes s16_i1k_90ep
    keras-reluvit convert vit_small_patch16_224.safetensors vit_s16.keras --attention relu
    KERAS_BACKEND=torch torchrun --nproc_per_node 8 -m keras_reluvit_cli train ...  # DDP

The backend is Keras' (`KERAS_BACKEND=jax|tensorflow|torch`).
"""

import argparse
import json
import os
import signal
import sys
import traceback

from keras_reluvit._defaults import COPY_JPEG_QUALITY
from keras_reluvit._defaults import COPY_SHORT_SIDE
from keras_reluvit.cli import train_flags
from keras_reluvit.training import run as kr_run
from keras_reluvit.training import signals
from keras_reluvit.training.settings import KEEP_CHECKPOINTS
from keras_reluvit.training.settings import LORA_RANK
from keras_reluvit.training.settings import RECIPE
from keras_reluvit.training.settings import TRAINABLE_DEFAULT
from keras_reluvit.training.settings import VAL_FRACTION
from keras_reluvit.training.settings import RunSettings


def _train(args):
    if args.restart and args.override:
        raise ValueError("--restart starts the run in --output anew, --override continues it "
                         "with new settings: pass one.")
    _train_noted(args)


def _train_noted(args):
    from keras_reluvit import distribution as kr_distribution
    from keras_reluvit.distribution.engine import Engine

    engine = Engine()
    engine.check(mesh=args.mesh, sequence_axis=args.sequence_axis, sharding=args.sharding,
                 coordinator=args.coordinator, accum_steps=args.accum_steps)
    in_cluster = engine.join(args.coordinator, args.num_processes, args.process_id,
                             distributed=args.distributed, timeout=args.init_timeout)
    # The flags as one typed RunSettings, resolved with the recipe (once) into the
    # RunConfig that train() reads; pool / posemb / remat / drop_path set the model.
    ema = args.ema
    if args.model_ema:  # timm's / DeiT's switch: a decay, said
        ema = train_flags.model_ema_decay(args.recipe, args.ema)
    # (each RunSettings field is the dest of its flag)
    settings = RunSettings(**{f: getattr(args, f) for f in RunSettings.fields()
                              if f not in ("ema", "recipe_overrides")},
                           ema=ema, recipe_overrides=train_flags.overrides(args))
    config = kr_run.build_config(settings, pool=args.pool, posemb=args.posemb,
                                   remat=args.remat, drop_path=args.drop_path)
    if kr_distribution.process_index() == 0:  # one process prepares, the others wait
        _prepared(config.dataset, config.data_dir, args.manual_dir)
    kr_distribution.barrier("data prepared")
    engine.layout(args.mesh, args.sharding, args.sequence_axis, in_cluster)
    rerun = "restart" if args.restart else "override" if args.override else "error"
    _, metrics = kr_run.train(config, args.output, export=not args.no_export,
                                verbose=2 if args.quiet else 1, rerun=rerun)
    final = metrics["final"]
    print(json.dumps({"output": args.output, "backend": engine.backend,
                      "process": kr_distribution.process_index(), **final,
                      "train_seconds": round(metrics["train_seconds"], 1)}), flush=True)


def _prepared(dataset, data_dir, manual_dir):
    """Builds the tfds data set on first use: from `--manual-dir`, or from the
    archives in tfds' default `DATA_DIR/downloads/manual`. A folder of images
    needs nothing."""
    from keras_reluvit import data as kr_data
    from keras_reluvit.data import folders as image_folder

    if not image_folder.is_image_folder(dataset):
        kr_data.builder(dataset, data_dir, manual_dir)


def _prepare(args):
    from keras_reluvit import data as kr_data
    from keras_reluvit.data import folders as image_folder

    if args.out is not None:
        try:
            manifest = _compact_copy(args)
        except KeyboardInterrupt:  # each image is whole or absent: the same command resumes
            print(f"keras-reluvit: prepare stopped (Ctrl-C): the copy in {args.out} is "
                  "unfinished; run the same command again to finish it.", file=sys.stderr)
            raise SystemExit(130) from None
        print(json.dumps({"dataset": args.name,
                          "out": os.path.abspath(os.path.expanduser(args.out)),
                          "splits": manifest["splits"], "bytes": manifest["bytes"]}))
        return
    compact = [f for f, v in (("--short-side", args.short_side), ("--jpeg-quality",
               args.jpeg_quality), ("--workers", args.workers)) if v is not None]
    if image_folder.is_image_folder(args.name) or compact:
        raise ValueError(f"{args.name}: {' '.join(compact) or 'a folder'} needs --out: "
                         "the folder the compact copy is written into.")
    b = kr_data.prepare(args.name, args.data_dir, args.manual_dir)
    splits = {k: v.num_examples for k, v in b.info.splits.items()}
    print(json.dumps({"dataset": args.name, "data_dir": b.data_dir, "splits": splits}))


def _compact_copy(args):
    from keras_reluvit import data as kr_data

    return kr_data.compact_copy(
        args.name, args.out,
        short_side=COPY_SHORT_SIDE if args.short_side is None else args.short_side,
        jpeg_quality=COPY_JPEG_QUALITY if args.jpeg_quality is None else args.jpeg_quality,
        data_dir=args.data_dir, manual_dir=args.manual_dir, workers=args.workers,
        progress=not args.quiet)


def _eval(args):
    from keras_reluvit import data as kr_data
    from keras_reluvit.data import folders as image_folder
    from keras_reluvit.training import recipes

    directory, run = kr_run.run_of(args.model)
    source = args.model
    if directory is not None and os.path.isdir(args.model):
        source = os.path.join(directory, "model.keras")
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{args.model} has no model.keras: the run has not finished "
                                    "(last.keras holds its last epoch: eval that file).")
    run = run or {}
    dataset = args.dataset or run.get("dataset")
    if dataset is None:
        raise ValueError(f"{args.model} is not in a run directory (no config.json of "
                         "`keras-reluvit train` beside it): pass --dataset.")
    same = run.get("dataset") is not None and kr_run.same_dataset(dataset, run["dataset"])
    defaults = run if same else {}
    seed = args.seed if args.seed is not None else defaults.get("seed", 0)
    val_fraction = (args.val_fraction if args.val_fraction is not None
                    else defaults.get("val_fraction", VAL_FRACTION))
    data_dir = args.data_dir or defaults.get("data_dir")
    recipe = args.recipe or kr_run.run_recipe(run) or RECIPE  # its loss, overrides included
    model = _load_any(source)
    _prepared(dataset, data_dir, args.manual_dir)
    d = kr_data.load(dataset, args.batch_size, image_size=model.image_size,
                     data_dir=data_dir, train_split=False, val_split=args.split,
                     preprocessing=getattr(model, "preprocessing", None),
                     val_fraction=val_fraction, seed=seed)
    if d.val is None:
        raise ValueError(f"{dataset} has no validation split: pass --split.")
    names = getattr(model, "label_names", None)
    if names is not None and list(names) != list(d.label_names):
        raise ValueError(f"{args.model} names its classes {list(names)[:5]}..., "
                         f"{dataset} {list(d.label_names)[:5]}...: the labels would not "
                         "match (another data set, or a folder with other class folders).")
    folder = d.info if isinstance(d.info, image_folder.ImageFolder) else None
    if folder is not None:
        split = args.split or next(s for s in ("validation", "test") if s in folder.splits)
        print(f"keras-reluvit: evaluating on {folder.describe_split(split)}"
              + ("" if same else " (no training run of this folder given: pass the run "
                 "directory to evaluate on the split it held out)"), file=sys.stderr)
        if same:
            kr_run.check_held_out(folder, split, directory, run)
    loss, metrics = recipes.loss_and_metrics(model, recipe)
    model.compile(loss=loss, metrics=metrics)
    with image_folder.naming_unreadable(folder):
        result = model.evaluate(d.val, return_dict=True, verbose=0)
    print(json.dumps({k: float(v) for k, v in result.items()}))


def _load_any(source):
    """A `.keras` file, a preset / hub directory, a checkpoint file or an
    `hf://` handle, as a model."""
    from keras_reluvit import checkpoints

    return checkpoints.load_model(source)


def _predict(args):
    from keras_reluvit import preprocessing
    from keras_reluvit.data import folders as image_folder

    model = _load_any(args.model)
    activation = args.activation
    files, folders = _image_files(args.images)
    if folders:  # a folder: one line (or JSON record) per image, in batches
        with image_folder.naming_unreadable(files):  # streamed: one batch in memory
            for paths, probs in _predict_batches(model, files, args.batch_size, activation):
                for path, top in zip(paths, preprocessing.decode_predictions(probs, model,
                                                                             top=args.top)):
                    if args.json:
                        print(json.dumps({"image": path, "top": [
                            {"label": n, "probability": round(p, 6)} for n, p in top]}))
                    else:
                        print(path + "\t" + "\t".join(f"{n} {p:.4f}" for n, p in top))
        return
    # any sizes; RGBA kept for the preprocessor's alpha rule (the checkpoint's)
    images = [preprocessing.load_image(path, alpha="keep") for path in files]
    probs = preprocessing.probabilities(model.predict(model.preprocessor(images), verbose=0),
                                        activation)
    results = []
    for path, top in zip(files, preprocessing.decode_predictions(probs, model, top=args.top)):
        results.append({"image": path, "top": [{"label": n, "probability": round(p, 6)}
                                               for n, p in top]})
        if not args.json:
            print(path)
            for name, p in top:
                print(f"  {p:8.4f}  {name}")
    if args.json:
        print(json.dumps(results, indent=2))


def _image_files(items):
    """The image files named by `items` (files, or folders searched
    recursively, sorted; non-image files in folders passed over): (files,
    whether a folder was given)."""
    from keras_reluvit.data import folders as image_folder

    files, folders = [], False
    for item in items:
        if os.path.isdir(item):
            folders = True
            found, _ = image_folder.list_images(item, strict=False)
            if not found:
                raise ValueError(f"{item} holds no images ({', '.join(image_folder.FORMATS)}).")
            files += found
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise FileNotFoundError(f"No image file or folder at {item}.")
    return files, folders


def _predict_batches(model, files, batch_size, activation):
    """(paths, probabilities) per batch: files read and decoded by tf.data
    (the model's own preprocessing), never all in memory."""
    import tensorflow as tf

    from keras_reluvit import preprocessing

    pre = model.preprocessor

    def load(path):
        image = preprocessing.decode_image(tf.io.read_file(path), alpha="keep")
        return pre(image)[0]

    ds = tf.data.Dataset.from_tensor_slices(files)
    # As written, not through AutoGraph (as data/pipeline.py's maps).
    ds = ds.map(tf.autograph.experimental.do_not_convert(lambda p: (p, load(p))),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    for paths, images in ds.batch(batch_size).prefetch(2):
        logits = model.predict_on_batch(images.numpy())
        yield ([p.decode() for p in paths.numpy()],
               preprocessing.probabilities(logits, activation))


def _export(args):
    import keras

    from keras_reluvit import export as kr_export

    model = keras.saving.load_model(args.model, compile=False)
    # A run directory's config.json knows the class names and the loss.
    label_names, activation = None, "softmax"
    config = os.path.join(os.path.dirname(os.path.abspath(args.model)), "config.json")
    if os.path.exists(config):
        with open(config) as f:
            run = json.load(f)
        label_names = run.get("label_names")
        activation = recipes_probability(kr_run.run_recipe(run))
    if args.format == "onnx":
        print(kr_export.onnx(model, args.path))
        return
    print(kr_export.saved_model(model, args.path, label_names=label_names,
                                activation=activation))


def recipes_probability(name):
    from keras_reluvit.training import recipes

    try:
        return recipes.probability(name)
    except ValueError:  # an unknown (renamed) recipe: the common case
        return "softmax"


def _bench(args):
    import keras

    from keras_reluvit import bench

    _prepared(args.dataset, args.data_dir, args.manual_dir)
    ips = bench.pipeline_throughput(args.dataset, args.batch_size, args.image_size,
                                    args.data_dir, args.steps)
    print(f"train pipeline ({args.dataset}, {args.image_size}px, randaug(2,10) + mixup): "
          f"{ips:,.0f} images/s")
    if args.model:
        from keras_reluvit.models.variants import variant_with_patch

        res = bench.model_throughput(variant_with_patch(args.model), image_size=args.image_size)
        print(f"{args.model} inference on {keras.backend.backend()}: relu {res['relu']:.1f} "
              f"images/s, softmax {res['softmax']:.1f} images/s "
              f"({res['relu'] / res['softmax']:.2f}x)")


def _convert(args):
    from keras_reluvit import checkpoints

    overrides = {k: v for k, v in dict(num_heads=args.num_heads,
                                       mlp_activation=args.mlp_activation).items()
                 if v is not None}
    model = checkpoints.load_checkpoint(args.source, attention=args.attention,
                                        num_classes=args.num_classes,
                                        image_size=args.image_size,
                                        posemb_resampling=args.posemb_resampling,
                                        architecture=args.architecture, **overrides)
    out = args.output
    if out.endswith(".keras"):
        model.save(out)
    elif out.endswith((".safetensors", ".pth", ".bin")):
        checkpoints.timm_state_dict(model, out)
    elif out.endswith(".npz"):
        checkpoints.big_vision_npz(model, out)
    elif args.to == "hf":
        checkpoints.hf_state_dict(model, out)
    else:
        model.save_to_preset(out)
    cfg = model.get_config()
    print(json.dumps({"output": out, "format": model.checkpoint_source["format"],
                      "parameters": int(model.count_params()),
                      **{k: cfg[k] for k in ("width", "depth", "num_heads", "patch_size",
                                             "image_size", "pool", "attention")}}))


def _recipes(args):
    from keras_reluvit.training import recipes

    print(recipes.describe(args.name))


def _attention(args):
    from keras_reluvit.models.attention_kinds import attention_kinds

    if args.command == "presets":
        print("keras-reluvit: `presets` is renamed `attention` (it lists attention kinds); "
              "the old name goes in 0.3.", file=sys.stderr)
    for name, doc in attention_kinds().items():
        print(f"{name:13s} {doc}")


def parser():
    p = argparse.ArgumentParser(prog="keras-reluvit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from keras_reluvit._version import __version__

    p.add_argument("--version", action="version", version=f"keras-reluvit {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    # No abbreviations: timm's --drop (dropout) must not become our --drop-path.
    t = sub.add_parser("train", help="train a ViT (default: the embedded digits data set)",
                       allow_abbrev=False)
    t.add_argument("--model", help="the ViT variant: S/16, B/32, ... or vit_s16, vit_b32, ... "
                   "(default: the recipe's)")
    t.add_argument("--attention", help="attention kind (see `attention`; default relu, or "
                   "with --init the checkpoint's own)")
    t.add_argument("--dataset", help="tfds name, or a folder of images with one sub-folder "
                   "per class (and optionally train/ + val/ splits); default: the recipe's")
    t.add_argument("--manual-dir", help="archives to prepare the data set from "
                   "(default: DATA_DIR/downloads/manual)")
    t.add_argument("--data-dir", help="tfds data_dir")
    t.add_argument("--recipe", default=RECIPE, help="recipe name (see `recipes`)")
    t.add_argument("--init", help="start from a pretrained checkpoint (timm, big_vision, "
                   "keras-hub, transformers, preset, .keras, hf://...): a new zero-initialised "
                   "head when the classes differ; e.g. with --recipe bv_transfer")
    t.add_argument("--trainable", choices=["all", "head", "lora"], default=TRAINABLE_DEFAULT,
                   help="with --init: fine-tune every weight (default), only the head "
                   "(linear probe), or LoRA on the attention's query/value (+ the head)")
    t.add_argument("--lora-rank", type=int, default=LORA_RANK,
                   help="rank with --trainable lora")
    t.add_argument("--layer-decay", type=float, help="layer-wise lr decay (BEiT / timm "
                   "--layer-decay, e.g. 0.75); default: the recipe's")
    t.add_argument("--lr", type=float, help="peak learning rate (default: the recipe's, "
                   "scaled to the batch size)")
    t.add_argument("--val-fraction", type=float,
                   help="a folder without train/ + val/: the seeded share of each class held "
                   f"out for validation (default {VAL_FRACTION}; refused for other data sets)")
    t.add_argument("--output", default="runs/default", help="run directory (default "
                   "runs/default); rerunning into a folder that holds a backup continues that "
                   "run, with the same settings only (see --restart, --override)")
    t.add_argument("--restart", action="store_true", help="start anew in --output, deleting "
                   "the backups of the run there")
    t.add_argument("--override", action="store_true", help="continue the run in --output "
                   "with settings other than its own (the changes are said and recorded in "
                   "config.json's launches)")
    t.add_argument("--epochs", type=int, help="epochs (default: the recipe's)")
    t.add_argument("--batch-size", type=int, help="global batch size, over all processes "
                   "(default: the recipe's; a folder smaller than it: its training images)")
    t.add_argument("--image-size", type=int, action=train_flags.Once, help="input resolution in "
                   "pixels (default: the recipe's; with --init the checkpoint's)")
    t.add_argument("--input-size", dest="image_size", nargs="+", type=int, metavar="N",
                   action=train_flags.InputSize, help="DeiT's --input-size N or timm's --input-size 3 N N "
                   "(channels, height, width): --image-size N")
    t.add_argument("--pool", choices=["gap", "tok", "map", "tok_gap"],
                   help="the head's input: gap (mean of the patch tokens), tok (the class "
                   "token), map (attention pooling), tok_gap (class token and mean); default "
                   "the recipe's")
    t.add_argument("--posemb", choices=["learn", "sincos2d"], help="position embedding: "
                   "learned, or fixed 2-D sin-cos (big_vision's); default the recipe's")
    t.add_argument("--remat", help="recompute each block's activations in the backward pass "
                   "to save memory: full, or a jax.checkpoint_policies name (see "
                   "keras_reluvit.remat)")
    t.add_argument("--drop-path", type=float, metavar="RATE",
                   help="stochastic depth: the last block's rate, linearly from 0 in the first "
                   "(timm's --drop-path; ViT(drop_path=))")
    t.add_argument("--seed", type=int, default=RunSettings.seed,
                   help="seed of the initialisation, the data order and the augmentation "
                   f"draws (default {RunSettings.seed})")
    t.add_argument("--mesh", help="device mesh, e.g. batch=2,model=4 (JAX)")
    t.add_argument("--sharding", choices=["data", "fsdp", "tensor"],
                   help="weight layout (default: fsdp on JAX; data, the only one, on torch "
                   "(DistributedDataParallel) and TensorFlow (MultiWorkerMirroredStrategy))")
    t.add_argument("--sequence-axis", help="mesh axis to split the tokens over, e.g. seq "
                   "with --mesh batch=2,seq=4 (sequence parallelism, JAX)")
    t.add_argument("--coordinator", help="multi-process cluster: HOST:PORT of process 0, the "
                   "same on every process (JAX, or torch without torchrun; with "
                   "--num-processes and --process-id). torchrun (torch) and TF_CONFIG "
                   "(TensorFlow) clusters are joined without it")
    t.add_argument("--num-processes", type=int, help="processes in the cluster")
    t.add_argument("--process-id", type=int, help="this process' index, 0 ... N-1")
    t.add_argument("--distributed", action="store_true", help="join the cluster described "
                   "by the environment (JAX: TPU pods, KERAS_DISTRIBUTION_* variables; torch: "
                   "torchrun's; TensorFlow: TF_CONFIG)")
    t.add_argument("--data-shards", type=int, help="in one process: read the data as a "
                   "cluster of this many processes would (the same global batches)")
    t.add_argument("--init-timeout", type=int, default=120,
                   help="seconds to wait for the cluster to form (default 120); under torchrun "
                   "its own rendezvous waits first: pass torchrun --rdzv-conf timeout=SECONDS "
                   "(static, --master-addr) or join_timeout=SECONDS (c10d)")
    t.add_argument("--checkpoint-every", type=int, help="updates between backups in "
                   "OUTPUT/backup, mid-epoch (default: the recipe's: 1000 for the ImageNet "
                   "recipes, else 0: at each epoch's end only)")
    t.add_argument("--keep-checkpoints", type=int, default=KEEP_CHECKPOINTS,
                   help=f"backups kept, the newest (default {KEEP_CHECKPOINTS})")
    t.add_argument("--accum-steps", type=int, help="gradient accumulation: each update "
                   "averages K micro-batches of batch-size / K (the recipe's batch on a "
                   "smaller slice; default the recipe's, 1)")
    t.add_argument("--steps-per-execution", type=int, metavar="K",
                   help="steps per call of Keras' compiled step (JAX, TensorFlow): the host "
                   "waits for the device, the callbacks run and a cluster checks for a stop "
                   "once every K steps, not every step; K divides the epoch's steps (default 1)")
    t.add_argument("--ema", *train_flags.also("--ema"), type=float, metavar="DECAY",
                   help="keep timm's EMA of the weights with this decay (DeiT: 0.99996), "
                   "evaluated beside the trained weights each epoch; model.keras and the export "
                   "then hold the EMA (default the recipe's: off; 0: off)")
    t.add_argument("--auto-augment", *train_flags.also("--auto-augment"), metavar="NAME",
                   help="timm's automatic augmentation by name, e.g. rand-m9-mstd0.5-inc1 "
                   "(DeiT's RandAugment), augmix-m3-w3-d-1 or original-mstd0.5 (AutoAugment), "
                   "instead of the recipe's (none: off)")
    t.add_argument("--aug-repeats", type=int, metavar="N",
                   help="DeiT's repeated augmentation: each epoch a new random 1/N of the "
                   "images, each N times with its own draws, in as many steps (DeiT: 3; default "
                   "the recipe's; 1: off)")
    t.add_argument("--no-model-ema", dest="ema", action="store_const", const=0.0,
                   help="DeiT's: no EMA of the weights (--ema 0)")
    t.add_argument("--model-ema", action="store_true", help="timm's / DeiT's switch: the "
                   f"weights' EMA at the recipe's decay, or timm's {train_flags.TIMM_EMA} where the recipe "
                   "has none (--ema DECAY / --model-ema-decay set another)")
    train_flags.add_to(t)
    t.add_argument("--no-export", action="store_true", help="skip the SavedModel")
    t.add_argument("--quiet", action="store_true", help="one line per epoch")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="evaluate a model on a tfds split or a folder of images",
                       description="Evaluates a model. Given a run directory of `keras-reluvit "
                       "train` (or a file in one), its data set, split, seed, val_fraction and "
                       "recipe (loss) are the run's: the images it held out.")
    e.add_argument("model", help="a run directory (runs/x/: its model.keras), a .keras file, "
                   "a checkpoint or an hf:// handle")
    e.add_argument("--dataset", help="tfds name or a folder of images (its val/ or test/ "
                   "split, or the held-out --val-fraction); default: the run's")
    e.add_argument("--val-fraction", type=float, help="a folder without val/: the share held "
                   "out (default: the run's, else 0.1)")
    e.add_argument("--seed", type=int, help="a folder without val/: the seed of the held-out "
                   "share (default: the run's, else 0)")
    e.add_argument("--recipe", help="the loss to report (default: the run's recipe's, else "
                   "softmax cross-entropy)")
    e.add_argument("--split", default=None, help="default: the validation (or test) split")
    e.add_argument("--manual-dir", help="archives to prepare the data set from "
                   "(default: DATA_DIR/downloads/manual)")
    e.add_argument("--data-dir")
    e.add_argument("--batch-size", type=int, default=256)
    e.set_defaults(func=_eval)

    pd = sub.add_parser("predict", help="top-5 classes of photographs, with the model's own "
                        "preprocessing")
    pd.add_argument("model", help="a .keras file, a preset / timm / transformers / keras-hub "
                    "directory, a checkpoint file or an hf://org/name handle")
    pd.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF, BMP, WebP) or "
                    "folders (every image inside: one line, or JSON record, per image)")
    pd.add_argument("--batch-size", type=int, default=32, help="images per batch (folders)")
    pd.add_argument("--top", type=int, default=5)
    pd.add_argument("--activation", choices=["softmax", "sigmoid"], default="softmax",
                    help="logits to probabilities (sigmoid for sigmoid-loss models)")
    pd.add_argument("--json", action="store_true", help="print JSON")
    pd.set_defaults(func=_predict)

    x = sub.add_parser("export", help="export a .keras model as a TF SavedModel (or ONNX)")
    x.add_argument("model")
    x.add_argument("path")
    x.add_argument("--format", choices=["saved_model", "onnx"], default="saved_model")
    x.set_defaults(func=_export)

    b = sub.add_parser("bench", help="images/s of the train pipeline (and a model)")
    b.add_argument("--dataset", default="sklearn_digits")
    b.add_argument("--manual-dir", help="archives to prepare the data set from "
                   "(default: DATA_DIR/downloads/manual)")
    b.add_argument("--data-dir")
    b.add_argument("--batch-size", type=int, default=256)
    b.add_argument("--image-size", type=int, default=224)
    b.add_argument("--steps", type=int, default=20)
    b.add_argument("--model", help="also time inference of this model, e.g. vit_s16")
    b.set_defaults(func=_bench)

    c = sub.add_parser(
        "convert", help="convert a timm / big_vision / keras-hub / Hugging Face checkpoint",
        description="Reads SRC (timm .safetensors/.pth/.bin, big_vision or AugReg .npz, "
        "a transformers ViT / DeiT / DINOv2 / CLIP directory, a keras-hub or keras_reluvit "
        "preset directory, a .keras file; the format is detected) and writes OUT: a .keras "
        "file, a preset directory (or with --to hf a transformers ViT directory), or timm "
        "(.safetensors/.pth) / big_vision (.npz) layouts.")
    c.add_argument("source")
    c.add_argument("output")
    c.add_argument("--attention", help="attention of the result (default: the "
                   "checkpoint's, softmax for timm/big_vision/keras-hub)")
    c.add_argument("--image-size", type=int, help="resample the position embedding")
    c.add_argument("--posemb-resampling", choices=["bilinear", "bicubic", "bicubic_antialias"],
                   help="how (default: the format's; bilinear, transformers' DINOv2 its own)")
    c.add_argument("--num-classes", type=int, help="new head size (0: features only)")
    c.add_argument("--num-heads", type=int, help="heads, where the checkpoint has no count")
    c.add_argument("--architecture", help="a bare timm state dict's timm name, e.g. "
                   "vit_base_patch16_clip_224.openai (CLIP eps, quick GELU, preprocessing)")
    c.add_argument("--mlp-activation", choices=["gelu", "gelu_tanh", "quick_gelu"])
    c.add_argument("--to", choices=["preset", "hf"], default="preset",
                   help="what a directory OUT becomes (default: a keras_reluvit preset)")
    c.set_defaults(func=_convert)

    pr = sub.add_parser("prepare", help="build a tfds data set (ImageNet from its archives); "
                        "with --out, write a compact copy of it or of a folder of images")
    pr.add_argument("name", help="tfds name, e.g. imagenet2012 (or, with --out, a folder of "
                    "images)")
    pr.add_argument("--data-dir", help="tfds data_dir (default ~/tensorflow_datasets)")
    pr.add_argument("--manual-dir", help="the archives (default: DATA_DIR/downloads/manual)")
    pr.add_argument("--out", help="write a compact copy there (a folder of JPEGs that `train "
                    "--dataset OUT` reads; rerun the same command to resume it)")
    pr.add_argument("--short-side", type=int, help="the copy's bound on each image's shorter "
                    f"side, 16-4096 px (default {COPY_SHORT_SIDE}; larger images are "
                    "resized, smaller ones kept)")
    pr.add_argument("--jpeg-quality", type=int, help="the quality of the JPEGs the copy "
                    f"encodes, 1-100 (default {COPY_JPEG_QUALITY})")
    pr.add_argument("--workers", type=int, help="threads decoding and encoding, 1-1024 "
                    "(default: the cores)")
    pr.add_argument("--quiet", action="store_true", help="no progress bar")
    pr.set_defaults(func=_prepare)

    r = sub.add_parser("recipes", help="print the training recipes")
    r.add_argument("name", nargs="?")
    r.set_defaults(func=_recipes)

    s = sub.add_parser("attention", help="list the attention kinds (attention=...)")
    s.set_defaults(func=_attention)
    s = sub.add_parser("presets", help="deprecated name of `attention`")
    s.set_defaults(func=_attention)
    return p


# A missing third-party module -> the extra of pyproject.toml that installs it.
EXTRA_OF = {
    "tensorflow": "train", "tensorflow_datasets": "train", "sklearn": "train",
    "matplotlib": "train", "tensorboard": "train", "importlib_resources": "train",
    "tf2onnx": "onnx", "onnx": "onnx", "onnxruntime": "onnx",
    "jax": "jax", "orbax": "jax", "torch": "torch", "triton": "cuda", "huggingface_hub": "hub",
    "skimage": "samples", "PIL": "samples",
}


def main(argv=None, noted=(), exiting=False):
    """`keras-reluvit ARGS` (`argv`: default the command line); the exit code.

    SIGTERM and SIGINT are noted from the first line (and `noted`: the ones
    the console script's door, `keras_reluvit_cli`, noted while the package
    was imported): `train` then stops cleanly (before its first step, or
    saved at the next step boundary; exit 0, said); any other command, or
    `--help`, gets them back as they came (a Ctrl-C interrupts it).
    `exiting` (the command's own process, as its doors call it): once
    `train` returns, SIGTERM / SIGINT stay noted while the process exits --
    a launcher's late copies do not kill a worker that saved, a second
    Ctrl-C still interrupts; any other command gets the process's default
    handlers (the door's noting one replaced)."""
    stop = None
    with signals.signals_noted() as way_out:  # on the way out: what no run took, raised again
        signals.note(*noted)
        if exiting:  # the door's handler was in place before ours: the process's own after
            way_out.restore = {signal.SIGTERM: signal.SIG_DFL,
                               signal.SIGINT: signal.default_int_handler}
        try:
            args = parser().parse_args(argv)
        except SystemExit as e:  # --help, --version, a usage error
            stop = e
        else:
            if args.command == "train":
                code = _run(args)
                way_out.keep = exiting
                return code
    if stop is not None:
        raise stop
    return _run(args)


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # keras_reluvit/


def _raised_here(error):
    """Whether `error` was raised in keras-reluvit's own code (its innermost
    Python frame is in the package: our checks' messages, but also a
    built-in's error there, e.g. int() of a bad string), not inside Keras,
    a backend or another library."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(
        PACKAGE + os.sep)


def _line_start(stream, args):
    """A newline where `stream` is a terminal and the run shows Keras'
    progress bar, which leaves its line open there (a stop's line would be
    glued to it)."""
    shown = not getattr(args, "quiet", False)
    return "\n" if shown and getattr(stream, "isatty", lambda: False)() else ""


def _run(args):
    try:
        args.func(args)
    except signals.Preempted as e:  # saved: a rerun continues (exit 0, as a preemptible job expects)
        print(f"{_line_start(sys.stdout, args)}keras-reluvit: {e}", flush=True)
        return 0
    except KeyboardInterrupt:  # a second Ctrl-C: at once, where the run was
        if args.command != "train":
            raise
        print(f"{_line_start(sys.stderr, args)}keras-reluvit: interrupted by a second Ctrl-C: "
              "the run stopped where it was, unsaved since its last backup; rerun the same "
              "command to continue from that backup.", file=sys.stderr, flush=True)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, FloatingPointError) as e:
        # Ours: the message alone. Raised inside Keras, a backend or a library: its
        # traceback first (where it came from), then the same one line.
        if not _raised_here(e):
            traceback.print_exception(e, file=sys.stderr)
        print(f"keras-reluvit: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in EXTRA_OF:
            raise
        print(f"keras-reluvit: error: `keras-reluvit {args.command}` needs {top}, which is not "
              f"installed: pip install \"keras-reluvit[{EXTRA_OF[top]}]\"", file=sys.stderr)
        return 2
    return 0

