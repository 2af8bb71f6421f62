"""Fine-tune a pretrained ViT on your own folder of images, end to end.

    python examples/finetune_folder.py --init CHECKPOINT --data my_images/ --out runs/mine

`my_images/` holds one sub-folder per class (optionally `train/` and `val/`
splits); CHECKPOINT is anything `keras_reluvit.load_checkpoint` reads (a timm
`.safetensors`, a big_vision `.npz`, a transformers / keras-hub / preset
directory, a `.keras` file, `hf://org/name`). The steps:

1. read the folder (`kr.data.load`: class names from the folders, a held-out
   validation split where there is no `val/`);
2. load the checkpoint with a fresh zero-initialised head for your classes;
3. fine-tune: `--mode full` (every weight), `linear` (the head only) or `lora`
   (`model.enable_lora(rank)` + the head), with big_vision's transfer recipe
   (`bv_transfer`) or `--recipe adamw_finetune` (AdamW + layer decay);
4. evaluate, and predict the validation folder with `decode_predictions`;
5. export a SavedModel (uint8 photos or JPEG bytes in, class names out) and
   check that it serves what the model predicts.

With no `--init` / `--data` (what CI runs), it makes both: a folder of real
photographs (`kr.image_folder.sample_folder`: crops of scikit-image's
samples, three classes) and a small random "pretrained" ViT of 10 classes.
"""

import argparse
import glob
import os

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", help="pretrained checkpoint (default: a small demo ViT)")
    p.add_argument("--data", help="folder of images (default: a generated photo folder)")
    p.add_argument("--out", default="runs/finetune_folder")
    p.add_argument("--mode", choices=["full", "linear", "lora"], default="full")
    p.add_argument("--recipe", default="bv_transfer")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=9)
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--image-size", type=int, help="default: the checkpoint's")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    import keras
    import tensorflow as tf

    import keras_reluvit as kr

    os.makedirs(args.out, exist_ok=True)
    if args.data is None:  # a demo folder of real photographs (scikit-image's samples)
        args.data = kr.image_folder.sample_folder(os.path.join(args.out, "images"),
                                                  per_class=32, split=True)
    if args.init is None:  # a demo "pretrained" checkpoint: 10 classes, another task
        keras.utils.set_random_seed(0)
        demo = kr.ViT("Ti/8", width=64, depth=2, num_heads=2, mlp_dim=128, image_size=32,
                      num_classes=10)
        rng = np.random.default_rng(0)
        for v in demo.weights:
            v.assign(keras.ops.convert_to_numpy(v) + rng.normal(0, 0.02, v.shape))
        args.init = os.path.join(args.out, "pretrained.keras")
        demo.save(args.init)

    # 1. The folder: class names from its sub-folders.
    probe = kr.load_checkpoint(args.init)
    size = args.image_size or probe.image_size
    train, val, info = kr.data.load(args.data, batch_size=args.batch_size, image_size=size,
                                    preprocessing=probe.preprocessing)
    print(f"{args.data}: classes {info.label_names}, {len(train)} steps per epoch")

    # 2. The checkpoint with a fresh head for these classes (said in one line).
    model = kr.load_checkpoint(args.init, num_classes=info.num_classes, image_size=size,
                               label_names=info.label_names)

    # 3. What trains, then the recipe.
    trainable = {"full": "all", "linear": "head", "lora": "lora"}[args.mode]
    kr.finetune.set_trainable(model, trainable, lora_rank=8)
    print(f"mode {args.mode}: {kr.finetune.describe_trainable(model)}")
    kr.recipes.compile(model, args.recipe, steps_per_epoch=len(train),
                       batch_size=args.batch_size, epochs=args.epochs, lr=args.lr)
    model.fit(train.repeat(), steps_per_epoch=len(train), epochs=args.epochs,
              validation_data=val, verbose=2)

    # 4. Evaluate; predict the validation images by name.
    accuracy = model.evaluate(val, return_dict=True, verbose=0)["accuracy"]
    images, labels = next(iter(val))
    top = kr.decode_predictions(model.predict(images, verbose=0), model, from_logits=True,
                                top=1)
    truth = [info.label_names[i] for i in np.argmax(labels, -1)]
    for (name, p), want in list(zip((t[0] for t in top), truth))[:3]:
        print(f"  predicted {name} ({p:.2f}), labelled {want}")

    # 5. Export and serve (any backend writes it; class names inside).
    export_dir = os.path.join(args.out, "saved_model", "1")  # TF Serving's version folder
    model.export(export_dir, format="tf_saved_model")
    served = tf.saved_model.load(export_dir)
    logits = served.serve(images)
    agree = float(np.mean(np.argmax(np.asarray(logits), -1)
                          == np.argmax(keras.ops.convert_to_numpy(model(images)), -1)))
    photo = sorted(glob.glob(os.path.join(args.data, "**", "*.jpg"), recursive=True))[-1:]
    if photo:  # a JPEG file in, the class names out
        named = served.signatures["serve_bytes"](
            image_bytes=tf.reshape(tf.io.read_file(photo[0]), [1]))
        print(f"the SavedModel serves the class names "
              f"{[n.decode() for n in named['top_k_labels'].numpy()[0]]} for {photo[0]}")
    print(f"validation accuracy {accuracy:.3f} on {keras.backend.backend()}; "
          f"the SavedModel agrees with model.predict on {agree:.0%} of a batch")
    return accuracy


if __name__ == "__main__":
    main()
