"""DeiT's and DeiT III's training input pipelines beside timm's DataLoader
(no model), on the same generated ImageNet-sized JPEGs as
`benchmarks.pipeline_peers`.

    source benchmarks/env-peers.sh      # TensorFlow + timm in one venv (~6 GB, once)
    python -m benchmarks.pipeline_deit --out benchmarks/results
    python -m benchmarks.pipeline_deit --skip throughput   # the per-image costs only

The same per-image work at 224 px, batch `--batch` (128), one pass of
`--images` (600) JPEGs repeated:
- DeiT: crop 8-100 %, flip, `rand-m9-mstd0.5-inc1`, random erasing 0.25
  (pixel mode), MixUp 0.8 / CutMix 1.0 (switch 0.5, smoothing 0.1) on each
  batch, bicubic (Pillow's) resize and sampling;
- DeiT III: crop 8-100 %, flip, 3-Augment (one of grayscale, solarize, blur),
  colour jitter 0.3, MixUp / CutMix, bicubic.
Ours: `kr.data.pipeline` with the recipe's `Augment` (`deit_s16_300ep`,
`deit3_s16_400ep`; repeated augmentation off: timm's DataLoader has no
RASampler here) on the split as `kr.data.load` reads it. timm:
`create_transform` with DeiT's `build_transform` arguments (DeiT III: timm's
`auto_augment="3a"` with colour jitter 0.3, its rendering of 3-Augment) on
torchvision's `ImageFolder`, a `DataLoader` of `--workers` (= cores)
processes, and timm's `Mixup` on each batch in the main process, as DeiT's
`train_one_epoch` calls it; in a process of its own per round. (timm 1.0.31's
`PosterizeIncreasing` asks Pillow 13 for 0 bits at M10 and raises: clamped
to 1 bit there.)

`--rounds` (3) alternating rounds of `--steps` batches each (a fresh
iterator warmed up by one batch); images/s: the median and the spread (min
-max). Then (`stages`) the per-image cost on one thread of each stage of our
DeiT chain and of each RandAugment operation at M9, from the encoded images
in memory.
"""

import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys

from benchmarks.pipeline_peers import NAME
from benchmarks.pipeline_peers import PHOTOS
from benchmarks.pipeline_peers import TIMED
from benchmarks.pipeline_peers import images_per_second
from benchmarks.pipeline_peers import jpeg_set
from benchmarks.pipeline_peers import jpeg_set_parser
from benchmarks.pipeline_peers import ms_per_image

RECIPES = {"DeiT": "deit_s16_300ep", "DeiT III": "deit3_s16_400ep"}

TIMM_CHILD = r"""
import json, sys, time
import torch
import timm.data.auto_augment as aa
from timm.data import Mixup, create_transform
from torchvision.datasets import ImageFolder
files, batch, workers, steps, kind = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
increasing = aa.LEVEL_TO_ARG["PosterizeIncreasing"]  # 0 bits at M10: Pillow 13 raises
aa.LEVEL_TO_ARG["PosterizeIncreasing"] = lambda level, h: (max(1, increasing(level, h)[0]),)
common = dict(is_training=True, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5,
              interpolation="bicubic")
if kind == "DeiT":  # DeiT's build_transform (its color_jitter 0.4 is off with RandAugment)
    transform = create_transform(224, color_jitter=0.4, auto_augment="rand-m9-mstd0.5-inc1",
                                 re_prob=0.25, re_mode="pixel", re_count=1, **common)
    smoothing = 0.1
else:  # DeiT III: timm's 3-Augment ("3a") and its colour jitter
    transform = create_transform(224, color_jitter=0.3, auto_augment="3a", re_prob=0.0, **common)
    smoothing = 0.0
dataset = ImageFolder(files, transform)
mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode="batch",
              label_smoothing=smoothing, num_classes=len(dataset.classes))
loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                     num_workers=workers, drop_last=True, persistent_workers=True)
def forever():
    while True:
        for x, y in loader:
            yield mixup(x, y)
""" + TIMED


def ours_pipeline(cache, batch, kind):
    from keras_reluvit import data
    from keras_reluvit import recipes

    aug = dict(recipes.get(RECIPES[kind])["augment"], aug_repeats=1)
    raw = data.sources._TfdsSource(NAME, os.path.join(cache, "tfds"), None).read("train", True, 0)
    return data.pipeline(raw.repeat(), len(PHOTOS), 224, batch, True, data.Augment(**aug))


def timm_round(files, batch, workers, steps, kind):
    out = subprocess.run([sys.executable, "-c", TIMM_CHILD, files, str(batch), str(workers),
                          str(steps), kind], capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(args, files):
    timm = importlib.util.find_spec("timm") is not None
    if not timm:
        print("timm is not installed here: its rows are left out (source benchmarks/env-peers.sh)")
    results = {}
    for kind in RECIPES:
        rounds = {"ours": []} | ({"timm": []} if timm else {})
        for r in range(args.rounds):
            it = iter(ours_pipeline(args.cache, args.batch, kind))
            rounds["ours"].append(images_per_second(it, args.steps, args.batch))
            del it
            gc.collect()
            if timm:
                rounds["timm"].append(timm_round(files, args.batch, args.workers, args.steps, kind))
            print(kind, r, {k: round(v[-1]) for k, v in rounds.items()}, flush=True)
        results[kind] = {k: dict(median=statistics.median(v), min=min(v), max=max(v), rounds=v)
                         for k, v in rounds.items()}
    return results


def stage_costs(b, reps=2):
    """ms per image on one thread: cumulative stages of our DeiT chain, then
    each RandAugment operation of timm's increasing set at M9 alone (on the
    resized crop)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_reluvit import data
    from keras_reluvit.data import pillow_graph
    from keras_reluvit.data import timm_augment as A

    raw = b.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})
    encoded = [ex["image"] for ex in raw]
    crop = dict(area=(0.08, 1.0), aspect=(3 / 4, 4 / 3))

    def window(x, k):
        return data.decode_random_crop(x, crop["area"], crop["aspect"], k)

    def resized(interpolation):
        return lambda x, k: tf.ensure_shape(data.decode_inception_crop(
            x, (224, 224), crop["area"], crop["aspect"], k, interpolation=interpolation),
            (224, 224, 3))

    def flipped(x, k):
        return pillow_graph.pillow_levels(tf.image.stateless_random_flip_left_right(
            resized("bicubic")(x, k), k))

    def randaug(x, k):
        return A.by_name(flipped(x, k), "rand-m9-mstd0.5-inc1", k, "bicubic")

    def fused(x, k):  # the pipeline's: one Pillow call for the resize, flip and operations
        flip = tf.random.stateless_uniform([], k, 0, 1.0) < 0.5
        return tf.ensure_shape(A.by_name(window(x, k), "rand-m9-mstd0.5-inc1", k, "bicubic",
                                         first=((224, 224), flip)), (224, 224, 3))

    def erased(x, k):
        return A.random_erasing((fused(x, k) - 127.5) / 127.5, 0.25, k)

    chains = {"decode the crop window": window,
              "+ resize to 224, bilinear (TensorFlow's)": resized("bilinear"),
              "+ resize to 224, bicubic (Pillow's), instead": resized("bicubic"),
              "+ flip, levels": flipped,
              "+ rand-m9-mstd0.5-inc1 (a Pillow call of its own)": randaug,
              "decode; resize, flip and rand-m9-mstd0.5-inc1 in one Pillow call (the pipeline's)":
                  fused,
              "+ normalise, random erasing 0.25": erased}
    m, s = tf.constant(9.0), tf.constant(1.0)
    for name in A.RAND_INCREASING_OPS:
        chains[f"{name} at M9 alone (after the flip)"] = (
            lambda x, k, name=name: A.apply_op(name, flipped(x, k), m, s, "bicubic"))
    out = {}
    base = None
    for name, fn in chains.items():
        out[name] = ms_per_image(encoded, fn, reps)
        if name == "+ flip, levels":
            base = out[name]
        shown = out[name] - base if "alone" in name else out[name]
        print(f"{name}: {shown:.2f} ms", flush=True)
    return {k: (v - base if "alone" in k else v) for k, v in out.items()}


def table(args, results, stages):
    lines = [f"Command: python -m benchmarks.pipeline_deit --images {args.images} --batch "
             f"{args.batch} --steps {args.steps} --rounds {args.rounds} --workers {args.workers}",
             "", f"{args.images} JPEGs (500x375 / 375x500, {args.jpeg_kb:.0f} KB on average), "
             f"224 px, batch {args.batch}; images/s, median (min-max) of {args.rounds} "
             f"alternating rounds of {args.steps} batches; timm's DataLoader with "
             f"{args.workers} workers on {os.cpu_count()} cores.", ""]
    if results:
        lines += ["| chain | ours | timm's DataLoader | ours / timm |", "|---|---|---|---|"]
        for kind, r in results.items():
            cells = [f"{r[k]['median']:,.0f} ({r[k]['min']:,.0f}-{r[k]['max']:,.0f})"
                     if k in r else "-" for k in ("ours", "timm")]
            ratio = f"{r['ours']['median'] / r['timm']['median']:.2f}x" if "timm" in r else "-"
            lines.append(f"| {kind} | {cells[0]} | {cells[1]} | {ratio} |")
    if stages:
        lines += ["", "Per image on one thread, ours (cumulative stages; each operation alone "
                  "is its cost over the flipped crop's):", "", "| stage | ms / image |",
                  "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in stages.items()]
    return "\n".join(lines) + "\n"


def parser():
    p = jpeg_set_parser(__doc__, steps=10, rounds=3)
    p.add_argument("--skip", default="", help="comma list of: throughput, stages")
    p.add_argument("--out", help="directory for pipeline_deit.md / .json")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    skip, b, files = jpeg_set(args)
    results = throughput(args, files) if "throughput" not in skip else {}
    stages = stage_costs(b) if "stages" not in skip else None
    text = table(args, results, stages)
    print(text)
    if args.out:
        from benchmarks import common

        common.write(args.out, "pipeline_deit", text, dict(throughput=results, stages=stages))


if __name__ == "__main__":
    main()
