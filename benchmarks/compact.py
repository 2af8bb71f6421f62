"""The compact copy (`keras-reluvit prepare --out`) against the originals:
its size, the difference of what a model sees, and the training pipelines'
images/s on each, ours beside big_vision's and timm's, in one run.

    python -m benchmarks.compact --out benchmarks/results

The originals: `benchmarks.pipeline_peers`' generated set (`--images` JPEGs
of 500x375 / 375x500, quality 95 with pixel noise, ~100 KB: ImageNet's
typical size). The copies: `kr.data.compact_copy` at each `--short-sides`
bound and `--jpeg-quality` (their writing's images/s on `--workers`
threads).

- difference: per image, `--crops` random crops (area 8-100 %, aspect
  3/4-4/3, the same relative box in the original and in the copy) resized to
  224 (bilinear, antialiased), and the evaluation's view (shorter side to
  256 by area, central 224): mean and 99th percentile of the absolute
  difference, in levels (0-255), over all values;
- images/s (median of `--rounds` alternating rounds of `--steps` batches of
  `--batch`, 224 px): crop + flip (ours: `kr.data.pipeline`, on the
  originals as tfds examples and on the copy as `train --dataset COPY`
  reads it; big_vision's chain on the originals, `pipeline_peers`; timm's
  DataLoader on both) and DeiT's chain (`deit_s16_300ep`'s augmentation,
  `pipeline_deit`; timm's DataLoader with DeiT's transform and Mixup on
  both);
- stages on one thread (ms / image): the crop window decoded, then resized
  to 224, on the originals and on each copy.
"""

import gc
import os
import statistics
import time

import numpy as np

from benchmarks import pipeline_deit
from benchmarks import pipeline_peers
from benchmarks.pipeline_peers import PHOTOS
from benchmarks.pipeline_peers import images_per_second
from benchmarks.pipeline_peers import ms_per_image


def copies(args, files):
    """{short side: (folder, manifest, images/s of its writing)}."""
    from keras_reluvit.data import compact

    out = {}
    for side in args.short_sides:
        folder = os.path.join(args.cache, f"compact-{args.images}-{side}-q{args.jpeg_quality}")
        fresh = not os.path.exists(os.path.join(folder, compact.MANIFEST))
        start = time.perf_counter()
        manifest = compact.compact_copy(files, folder, short_side=side,
                                        jpeg_quality=args.jpeg_quality, workers=args.workers,
                                        progress=False)
        rate = args.images / (time.perf_counter() - start) if fresh else None
        out[side] = (folder, manifest, rate)
    return out


def folder_bytes(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs
               if not f.startswith("."))


def differences(files, folder, crops, seed=0):
    """{"crops": (mean, p99), "eval": (mean, p99)}: levels between what the
    originals and the copy give (the module docstring)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    diffs = {"crops": [], "eval": []}
    for d, _, fs in sorted(os.walk(files)):
        for name in sorted(fs):
            a = tf.io.decode_jpeg(tf.io.read_file(os.path.join(d, name)), channels=3)
            rel = os.path.relpath(os.path.join(d, name), files)
            b = tf.io.decode_jpeg(tf.io.read_file(os.path.join(folder, rel)), channels=3)
            (ha, wa), (hb, wb) = a.shape[:2], b.shape[:2]
            for _ in range(crops):
                area = rng.uniform(0.08, 1.0)
                aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
                h = min(1.0, np.sqrt(area / aspect) * np.sqrt(wa / ha))
                w = min(1.0, area / h)
                y, x = rng.uniform(0, 1 - h), rng.uniform(0, 1 - w)
                views = [tf.image.resize(
                    im[round(y * hh):max(round((y + h) * hh), round(y * hh) + 1),
                       round(x * ww):max(round((x + w) * ww), round(x * ww) + 1)],
                    (224, 224), "bilinear", antialias=True) for im, hh, ww in ((a, ha, wa),
                                                                               (b, hb, wb))]
                diffs["crops"].append(np.abs(np.round(views[0]) - np.round(views[1])).ravel())
            views = []
            for im, hh, ww in ((a, ha, wa), (b, hb, wb)):
                s = 256 / min(hh, ww)
                r = tf.image.resize(im, (round(hh * s), round(ww * s)), "area")
                top, left = (r.shape[0] - 224) // 2, (r.shape[1] - 224) // 2
                views.append(np.round(r[top:top + 224, left:left + 224]))
            diffs["eval"].append(np.abs(views[0] - views[1]).ravel())
    return {k: (float(np.mean(np.concatenate(v))), float(np.percentile(np.concatenate(v), 99)))
            for k, v in diffs.items()}


def ours_on(folder, batch, augment=None):
    """`kr.data.pipeline` on the copy as `train --dataset COPY` reads it (its
    file names, shuffled whole), repeated as `pipeline_peers.ours_pipeline`."""
    from keras_reluvit import data

    raw = data.sources._FolderSource(folder, 0.0, 0).read(("train", 0, 1), True, 0)
    return data.pipeline(raw.repeat(), len(PHOTOS), 224, batch, True, augment,
                         shuffle_buffer=10_000)


def deit_augment():
    from keras_reluvit import data
    from keras_reluvit import recipes

    return data.Augment(**dict(recipes.get(pipeline_deit.RECIPES["DeiT"])["augment"],
                               aug_repeats=1))


def throughput(args, b, files, made):
    """{chain: {pipeline: images/s, median of the rounds}}."""
    bv = lambda: iter(pipeline_peers.bv_pipeline(b, args.batch))  # noqa: E731
    chains = {"crop + flip": {
        "ours, originals": lambda: iter(pipeline_peers.ours_pipeline(b, args.batch,
                                                                      cache=args.cache)),
        "big_vision, originals": bv,
        "timm, originals": lambda: pipeline_peers.timm_round(files, args.batch, args.workers,
                                                             args.steps)}}
    chains["DeiT"] = {
        "ours, originals": lambda: iter(pipeline_deit.ours_pipeline(args.cache, args.batch,
                                                                    "DeiT")),
        "timm, originals": lambda: pipeline_deit.timm_round(files, args.batch, args.workers,
                                                            args.steps, "DeiT")}
    for side, (folder, _, _) in made.items():
        chains["crop + flip"][f"ours, copy {side}"] = (
            lambda f=folder: iter(ours_on(f, args.batch)))
        chains["crop + flip"][f"timm, copy {side}"] = (
            lambda f=folder: pipeline_peers.timm_round(f, args.batch, args.workers, args.steps))
        chains["DeiT"][f"ours, copy {side}"] = (
            lambda f=folder: iter(ours_on(f, args.batch, deit_augment())))
        chains["DeiT"][f"timm, copy {side}"] = (
            lambda f=folder: pipeline_deit.timm_round(f, args.batch, args.workers, args.steps,
                                                      "DeiT"))
    results = {}
    for chain, makers in chains.items():
        rounds = {k: [] for k in makers}
        for r in range(args.rounds):
            for k, make in makers.items():
                it = make()
                rate = it if isinstance(it, float) else images_per_second(it, args.steps,
                                                                          args.batch)
                rounds[k].append(rate)
                del it
                gc.collect()
            print(chain, r, {k: round(v[-1]) for k, v in rounds.items()}, flush=True)
        results[chain] = {k: statistics.median(v) for k, v in rounds.items()}
    return results


def stage_costs(b, made, reps=2):
    """ms per image on one thread: the crop window decoded, + resized to 224."""
    import tensorflow_datasets as tfds

    from keras_reluvit import data

    raw = b.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})
    sets = {"originals": [ex["image"].numpy() for ex in raw]}
    for side, (folder, _, _) in made.items():
        sets[f"copy {side}"] = [open(os.path.join(d, f), "rb").read()
                                for d, _, fs in sorted(os.walk(folder)) for f in sorted(fs)
                                if not f.startswith(".")]

    def window(x, key):
        return data.decode_random_crop(x, (0.08, 1.0), (3 / 4, 4 / 3), key)

    def resized(x, key):
        return data.decode_inception_crop(x, (224, 224), (0.08, 1.0), (3 / 4, 4 / 3), key)

    out = {}
    for name, encoded in sets.items():
        for stage, fn in (("decode the crop window", window), ("+ resize to 224", resized)):
            out[f"{name}: {stage}"] = ms_per_image(encoded, fn, reps)
            print(f"{name}: {stage}: {out[f'{name}: {stage}']:.2f} ms", flush=True)
    return out


def table(args, files, made, diffs, results, stages):
    original = folder_bytes(files)
    lines = [f"Command: python -m benchmarks.compact --images {args.images} --short-sides "
             f"{' '.join(map(str, args.short_sides))} --jpeg-quality {args.jpeg_quality} "
             f"--batch {args.batch} --steps {args.steps} --rounds {args.rounds} --workers "
             f"{args.workers} --crops {args.crops}", "",
             f"{args.images} JPEGs (500x375 / 375x500, quality 95 + pixel noise, "
             f"{original / args.images / 1024:.0f} KB on average) and their compact copies "
             f"(`keras-reluvit prepare DIR --out COPY --short-side N --jpeg-quality "
             f"{args.jpeg_quality}`); {os.cpu_count()} cores, timm's DataLoader with "
             f"{args.workers} workers.", "",
             "| set | size on disk | per image | written at | crops' difference (mean / p99 "
             "levels) | evaluation view's (mean / p99) |", "|---|---|---|---|---|---|",
             f"| originals | {original / 1e6:.1f} MB | {original / args.images / 1024:.0f} KB "
             "| - | - | - |"]
    for side, (folder, _, rate) in made.items():
        size = folder_bytes(folder)
        crops, view = diffs[side]["crops"], diffs[side]["eval"]
        lines.append(f"| copy, shorter side {side} | {size / 1e6:.1f} MB "
                     f"({size / original:.2f}x) | {size / args.images / 1024:.0f} KB | "
                     + (f"{rate:,.0f} images/s" if rate else "(written before)")
                     + f" | {crops[0]:.2f} / {crops[1]:.0f} | {view[0]:.2f} / {view[1]:.0f} |")
    if results:
        names = list(results["crop + flip"])
        lines += ["", f"images/s at 224 px, batch {args.batch}, median of {args.rounds} "
                  f"alternating rounds of {args.steps} batches:", "",
                  "| pipeline | crop + flip | DeiT's chain |", "|---|---|---|"]
        for k in names:
            cells = [results[c].get(k) for c in ("crop + flip", "DeiT")]
            lines.append(f"| {k} | " + " | ".join("-" if c is None else f"{c:,.0f}"
                                                  for c in cells) + " |")
        for side in made:
            cf, deit = results["crop + flip"], results["DeiT"]
            lines.append(f"| ours on copy {side} / big_vision on originals | "
                         f"{cf[f'ours, copy {side}'] / cf['big_vision, originals']:.2f}x | - |")
            lines.append(f"| ours on copy {side} / timm on originals | "
                         f"{cf[f'ours, copy {side}'] / cf['timm, originals']:.2f}x | "
                         f"{deit[f'ours, copy {side}'] / deit['timm, originals']:.2f}x |")
            lines.append(f"| timm on copy {side} / timm on originals (the format's gain) | "
                         f"{cf[f'timm, copy {side}'] / cf['timm, originals']:.2f}x | "
                         f"{deit[f'timm, copy {side}'] / deit['timm, originals']:.2f}x |")
    if stages:
        lines += ["", "Per image on one thread (tf.data, encoded images in memory):", "",
                  "| set: stage | ms / image |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in stages.items()]
    return "\n".join(lines) + "\n"


def parser():
    p = pipeline_peers.jpeg_set_parser(__doc__, steps=10, rounds=3)
    p.add_argument("--short-sides", type=int, nargs="+", default=[256, 320])
    p.add_argument("--jpeg-quality", type=int, default=90)
    p.add_argument("--crops", type=int, default=4, help="random crops per image (difference)")
    p.add_argument("--skip", default="", help="comma list of: throughput, stages, difference")
    p.add_argument("--out", help="directory for compact.md / .json")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    skip, b, files = pipeline_peers.jpeg_set(args)
    made = copies(args, files)
    diffs = ({side: differences(files, folder, args.crops) for side, (folder, _, _) in
              made.items()} if "difference" not in skip else
             {side: {"crops": (np.nan, np.nan), "eval": (np.nan, np.nan)} for side in made})
    results = throughput(args, b, files, made) if "throughput" not in skip else {}
    stages = stage_costs(b, made) if "stages" not in skip else None
    text = table(args, files, made, diffs, results, stages)
    print(text)
    if args.out:
        from benchmarks import common

        common.write(args.out, "compact", text, dict(
            throughput=results, stages=stages, differences=diffs,
            copies={side: dict(bytes=folder_bytes(f), written_per_s=rate)
                    for side, (f, _, rate) in made.items()}))


if __name__ == "__main__":
    main()
