"""Train a ViT on ImageNet-1k with a big_vision, DeiT or DeiT III recipe — any backend, optional mesh.

    # once: build tfds imagenet2012 from the two official archives in MANUAL
    python examples/train_imagenet.py --data-dir ~/tensorflow_datasets --manual-dir MANUAL --prepare-only
    # ReLU/L ViT-S/16, "Better plain ViT baselines" (90 epochs, batch 1024)
    KERAS_BACKEND=jax python examples/train_imagenet.py --data-dir ~/tensorflow_datasets \\
        --model S/16 --attention relu --recipe s16_i1k_90ep --output runs/s16_relu
    # DeiT-S/16 with ReLU/L (timm's augmentations, the weights' EMA; DeiT III: deit3_s16_400ep)
    KERAS_BACKEND=jax python examples/train_imagenet.py --data-dir ~/tensorflow_datasets \\
        --attention relu --recipe deit_s16_300ep --output runs/deit_s16_relu
    # the same on 8 accelerators, sharded (JAX): fsdp over "batch", or data / tensor
    KERAS_BACKEND=jax python examples/train_imagenet.py ... --mesh batch=8 --sharding fsdp
    # several hosts (JAX): the same command on each, its own --process-id
    KERAS_BACKEND=jax python examples/train_imagenet.py ... --mesh batch=16 \\
        --coordinator 10.0.0.1:12345 --num-processes 2 --process-id 0

A smaller `--batch-size` scales the recipe's learning rate linearly and keeps
its warmup in examples (see `keras_reluvit.recipes`). The run is backed up
every `--checkpoint-every` steps (the recipe's: 1000) and at each epoch's
end; SIGTERM (a preemption notice) saves at the next step and exits 0.
Rerunning the command resumes at the step saved, on the same data stream
(`kr.backup.fit`).
"""

import argparse
import json
import os

import keras

import keras_reluvit as kr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="tfds data_dir holding imagenet2012")
    p.add_argument("--manual-dir", help="folder with ILSVRC2012_img_{train,val}.tar (first run)")
    p.add_argument("--prepare-only", action="store_true", help="build the tfds data set and exit")
    p.add_argument("--model", help="ViT variant, e.g. S/16, B/16, L/16 (default: the recipe's)")
    p.add_argument("--attention", default="relu", help="attention kind, e.g. relu, softmax")
    p.add_argument("--recipe", default="s16_i1k_90ep",
                   choices=["s16_i1k_90ep", "augreg_i1k", "deit_ti16_300ep", "deit_s16_300ep",
                            "deit_b16_300ep", "deit3_s16_400ep", "deit3_b16_400ep"])
    p.add_argument("--batch-size", type=int, help="global batch (default: the recipe's)")
    p.add_argument("--epochs", type=int, help="default: the recipe's")
    p.add_argument("--image-size", type=int, help="default: the recipe's (224)")
    p.add_argument("--output", default="runs/imagenet")
    p.add_argument("--checkpoint-every", type=int, help="steps between backups (default: the "
                   "recipe's, 1000; 0: each epoch's end only)")
    p.add_argument("--mesh", help="device mesh (JAX), e.g. batch=8 or batch=2,model=4")
    p.add_argument("--sharding", default="fsdp", choices=["data", "fsdp", "tensor"])
    p.add_argument("--coordinator", help="multi-host (JAX): HOST:PORT of process 0")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--distributed", action="store_true",
                   help="join the cluster the environment describes (TPU pods)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cluster = (args.coordinator, args.num_processes, args.process_id)
    if args.distributed or any(v is not None for v in cluster):
        kr.distribution.initialize(*cluster)  # no arguments: from the environment
    index, count = kr.distribution.process_index(), kr.distribution.process_count()
    if args.manual_dir and index == 0:
        kr.data.prepare("imagenet2012", data_dir=args.data_dir, manual_dir=args.manual_dir)
    kr.distribution.barrier("prepared")
    if args.prepare_only:
        return
    recipe = kr.recipes.get(args.recipe, args.model)
    variant = args.model or recipe["model"]["variant"]
    batch_size = args.batch_size or recipe["batch_size"]
    epochs = args.epochs or recipe["epochs"]
    image_size = args.image_size or recipe["image_size"]
    if args.mesh or count > 1:  # e.g. batch=2,model=4 over all processes' devices
        mesh = kr.distribution.mesh_from_spec(
            args.mesh or f"batch={len(keras.distribution.list_devices())}")
        keras.distribution.set_distribution(kr.distribution.model_parallel(mesh, args.sharding))

    # each process reads its own shard, in batches of batch_size / processes
    train, val, info = kr.data.imagenet(batch_size, data_dir=args.data_dir, image_size=image_size,
                                        augment=kr.data.Augment(**recipe["augment"]),
                                        process_index=index, process_count=count)
    model = kr.ViT(**dict(recipe["model"], variant=variant), attention=args.attention,
                   image_size=image_size, num_classes=info.num_classes,
                   head_bias_init=recipe["head_bias_init"])
    kr.recipes.compile(model, recipe, steps_per_epoch=len(train), batch_size=batch_size,
                       epochs=epochs)
    print(f"{model.name}: {model.count_params():,} parameters, {len(train)} steps per epoch, "
          f"backend {keras.backend.backend()}")

    probe = next(iter(val))[0][:16]
    every = recipe.checkpoint_every if args.checkpoint_every is None else args.checkpoint_every
    # The weights' EMA (DeiT's recipes) is scored beside the trained weights each epoch.
    ema = [kr.callbacks.EMAEvaluation(val)] if recipe["ema"] else []
    callbacks = (ema + [kr.callbacks.AttentionStats(probe, every=5)]
                 + kr.callbacks.default(args.output, process=(index, count), every=every or None))
    # One pass per epoch; a rerun resumes at the step backed up, on the same data stream.
    try:
        kr.backup.fit(model, train, epochs, validation_data=val, callbacks=callbacks,
                      verbose=2 if index == 0 else 0)
    except kr.backup.Preempted as e:
        print(f"train_imagenet: {e}")
        return
    if recipe["ema"]:  # DeiT's: the EMA is the model scored, saved and exported
        kr.recipes.swap_ema(model)
        print(f"train_imagenet: the weights' EMA (decay {recipe['ema']}) is the model saved")
    final = model.evaluate(val, return_dict=True, verbose=0)
    with kr.distribution.chief_writes(model) as chief:  # process 0 writes
        if chief:
            model.save(os.path.join(args.output, "model.keras"))
            with open(os.path.join(args.output, "metrics.json"), "w") as f:
                json.dump({k: float(v) for k, v in final.items()}, f, indent=2)
            kr.export.saved_model(model, os.path.join(args.output, "saved_model", "1"),
                                  label_names=info.label_names,
                                  activation=kr.recipes.probability(recipe))
    print(json.dumps({"output": args.output, **{k: float(v) for k, v in final.items()}}))


if __name__ == "__main__":
    main()
