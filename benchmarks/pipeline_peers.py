"""The training input pipeline beside big_vision's and timm's (no model), on
the same generated set of ImageNet-sized JPEGs.

    source benchmarks/env-peers.sh      # TensorFlow + timm in one venv (~6 GB, once)
    python -m benchmarks.pipeline_peers --out benchmarks/results
    python -m benchmarks.pipeline_peers --big-vision ~/src/big_vision   # + its own RandAugment

The images: `--images` (600) JPEGs of 500x375 / 375x500 pixels (ImageNet's
typical sizes and ~100 KB: quality 95, with pixel noise) cut from scikit-image's photographs,
written once under `--cache` as files (`class_k/*.jpg`, what timm's
`ImageFolder` reads) and as one tfds data set of the same bytes (what both
TensorFlow pipelines read).

The pipelines, 224 px, batch `--batch` (128), crop + flip and + RandAugment(2, 10):
- ours: `keras_reluvit.data.pipeline` on the split as `kr.data.load` reads
  it (tfds with its decoding skipped: the encoded examples are shuffled, the
  crop window decoded, ...), the split repeated before the pipeline as
  big_vision repeats it;
- big_vision: its pp chain `decode_jpeg_and_inception_crop(224) | flip_lr |
  [randaug(2, 10)] | value_range(-1, 1)` over the encoded examples, as its
  input pipeline runs it. The three ops are re-implemented here from
  big_vision's `pp/ops_image.py` and `pp/ops_general.py` (they are a few TF
  calls; importing them needs big_vision's JAX/Flax stack); RandAugment is
  big_vision's own `pp/autoaugment.py`, loaded from a checkout given with
  `--big-vision` (it imports `tensorflow_addons.image`, which no longer
  installs: `rotate`, `translate` and `transform` are supplied from the
  same TensorFlow op when it is missing). Without a checkout that row is
  left out;
- timm: `create_transform(224, is_training=True, scale=(0.05, 1),
  interpolation="bilinear", [auto_augment="rand-m10-n2-mstd0"])` on
  torchvision's `ImageFolder` with a `DataLoader` of `--workers` (= cores)
  processes, when timm is installed (the peers venv), in a process of its
  own per round (torch and TensorFlow cannot share one).

Each round times `--steps` batches of every pipeline, one after the other
(a fresh iterator, warmed up by one batch before its timing, deleted after
it: an idle iterator keeps prefetching), for
`--rounds` rounds; images/s are the medians. Then the per-image cost of
each stage on one thread (tf.data with a one-thread pool, encoded images in
memory, cumulative stage chains) and the peak RSS of our training pipeline
at its default shuffle buffer (10,000 examples: the set read repeatedly),
beside the same pipeline shuffling decoded images (the order tfds'
default decoding gives).

A third TensorFlow row, crop + flip only, is the ceiling both TensorFlow
pipelines share: the JPEG decoder alone (`ceiling_pipeline`: each image's
crop window decoded and resized, from memory, in the same parallel map).
"""

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

NAME = "krv_bench_jpegs"
SIZES = ((375, 500), (500, 375))
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
          "retina", "camera", "colorwheel", "stereo_motorcycle")  # bundled (camera: grey)


def make_jpegs(root, n, seed=0, quality=95, noise=8.0):
    """`n` JPEGs under `root/class_k/`: random crops (40-100 % of the
    side) of scikit-image's photographs, resized to 500x375 or 375x500,
    flipped at random, with Gaussian pixel noise (`noise`, a camera's
    grain: the resized photographs alone compress to ~45 KB, ImageNet's
    JPEGs average ~110 KB); the class is the photograph."""
    from PIL import Image
    from skimage import data as skdata

    rng = np.random.default_rng(seed)
    photos = []
    for name in PHOTOS:
        img = getattr(skdata, name)()
        img = img[0] if isinstance(img, tuple) else img
        photos.append(np.asarray(Image.fromarray(img if img.ndim == 2 else img[..., :3]).convert("RGB")))
    paths = []
    for i in range(n):
        k = i % len(photos)
        img = photos[k]
        h, w = SIZES[rng.integers(2)]
        side = rng.uniform(0.4, 1.0)
        ch = max(8, int(img.shape[0] * side))
        cw = max(8, min(img.shape[1], int(ch * w / h)))
        top = rng.integers(0, img.shape[0] - ch + 1)
        left = rng.integers(0, img.shape[1] - cw + 1)
        out = Image.fromarray(img[top:top + ch, left:left + cw]).resize((w, h), Image.BICUBIC)
        grain = rng.normal(0.0, noise, (h, w, 3))
        out = Image.fromarray(np.clip(np.asarray(out) + grain, 0, 255).astype("uint8"))
        if rng.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        path = os.path.join(root, f"class_{k}", f"{i:05d}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out.save(path, quality=quality)
        paths.append((path, k))
    return paths


def builder(cache, n):
    """The tfds data set of the JPEGs (their bytes, not re-encoded)."""
    import tensorflow_datasets as tfds

    files = os.path.join(cache, f"jpegs-{n}-v3")
    if not os.path.isdir(files):
        make_jpegs(files + ".tmp", n)
        os.rename(files + ".tmp", files)

    class KrvBenchJpegs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version(f"3.0.{n}")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(num_classes=len(PHOTOS))}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for k in range(len(PHOTOS)):
                folder = os.path.join(files, f"class_{k}")
                for f in sorted(os.listdir(folder)):
                    yield f"{k}/{f}", {"image": os.path.join(folder, f), "label": k}

    b = KrvBenchJpegs(data_dir=os.path.join(cache, "tfds"))
    b.download_and_prepare()
    return b, files


def bv_randaug(checkout):
    """big_vision's own `distort_image_with_randaugment` from a checkout."""
    import importlib.util
    import types

    import tensorflow as tf

    try:
        import tensorflow_addons  # noqa: F401
    except ImportError:  # defunct: its three image transforms, from the same TF op
        def transform(images, transforms, fill_value=0.0):
            images = tf.convert_to_tensor(images)
            t = tf.cast(tf.reshape(transforms, [-1, 8]), tf.float32)
            out = tf.raw_ops.ImageProjectiveTransformV3(
                images=images[None], transforms=t, output_shape=tf.shape(images)[:2],
                fill_value=fill_value, interpolation="NEAREST", fill_mode="CONSTANT")
            return out[0]

        def translate(images, translations):
            dx, dy = tf.unstack(tf.cast(translations, tf.float32))
            return transform(images, [1.0, 0.0, -dx, 0.0, 1.0, -dy, 0.0, 0.0])

        def rotate(images, angles):
            h = tf.cast(tf.shape(images)[0], tf.float32)
            w = tf.cast(tf.shape(images)[1], tf.float32)
            c, s = tf.cos(angles), tf.sin(angles)
            x = ((w - 1) - (c * (w - 1) - s * (h - 1))) / 2.0
            y = ((h - 1) - (s * (w - 1) + c * (h - 1))) / 2.0
            return transform(images, tf.stack([c, -s, x, s, c, y, 0.0, 0.0]))

        image = types.ModuleType("tensorflow_addons.image")
        image.transform, image.translate, image.rotate = transform, translate, rotate
        tfa = types.ModuleType("tensorflow_addons")
        tfa.image = image
        sys.modules.update({"tensorflow_addons": tfa, "tensorflow_addons.image": image})
    path = os.path.join(os.path.expanduser(checkout), "big_vision", "pp", "autoaugment.py")
    spec = importlib.util.spec_from_file_location("bv_autoaugment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.distort_image_with_randaugment


# big_vision's ops (pp/ops_image.py, pp/ops_general.py), re-implemented.
def bv_decode_jpeg_and_inception_crop(data, size=224):
    import tensorflow as tf

    begin, crop, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(data), tf.zeros([0, 0, 4], tf.float32),
        area_range=(0.05, 1.0), aspect_ratio_range=(0.75, 1.33), min_object_covered=0,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
    image = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    image = tf.image.resize(image, (size, size), method="bilinear")
    return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)


def bv_flip_lr(image):
    import tensorflow as tf

    return tf.image.random_flip_left_right(image)


def bv_value_range(image, vmin=-1.0, vmax=1.0):
    import tensorflow as tf

    image = (tf.cast(image, tf.float32) - 0.0) / (255.0 - 0.0)
    return vmin + image * (vmax - vmin)


def bv_chain(randaug=None):
    def pp(data):
        image = bv_flip_lr(bv_decode_jpeg_and_inception_crop(data))
        if randaug is not None:
            image = randaug(image, 2, 10)
        return bv_value_range(image)
    return pp


def bv_pipeline(b, batch, randaug=None, num_classes=len(PHOTOS)):
    """big_vision's input pipeline shape: encoded examples shuffled, the pp
    chain mapped in parallel, batched, prefetched."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    ds = b.as_dataset(split="train", shuffle_files=True,
                      decoders={"image": tfds.decode.SkipDecoding()})
    pp = bv_chain(randaug)
    ds = ds.repeat().shuffle(10_000)
    ds = ds.map(lambda ex: (pp(ex["image"]), tf.one_hot(ex["label"], num_classes)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def ours_pipeline(b, batch, randaug=False, cache=None):
    """`kr.data.pipeline` on the split as `kr.data.load` reads it, repeated
    before the pipeline: the steady state inside an ImageNet epoch (a
    600-image epoch would otherwise restart the pipeline every 5 batches)."""
    from keras_reluvit import data

    aug = data.Augment(randaug=(2, 10) if randaug else None)
    raw = data.sources._TfdsSource(NAME, os.path.join(cache, "tfds"), None).read("train", True, 0)
    return data.pipeline(raw.repeat(), len(PHOTOS), 224, batch, True, aug)


CEILING = "decoder alone (crop window + resize, from memory)"


def ceiling_pipeline(b, batch):
    """The decoder alone, the ceiling of both TensorFlow pipelines: the
    encoded JPEGs from memory (no reading, no shuffle), each one's random
    crop window decoded (`decode_and_crop_jpeg`) and resized to 224 in a
    parallel map, batched -- no flip, no normalisation, no labels."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_reluvit import data

    raw = b.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})
    blobs = [ex["image"].numpy() for ex in raw]
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(blobs).repeat(),
                              tf.data.Dataset.range(2**62)))

    def decode(d, i):
        seed = tf.stack([i, tf.constant(0, tf.int64)])
        return tf.ensure_shape(data.decode_inception_crop(d, (224, 224), (0.05, 1.0), (0.75, 1.33), seed),
                               (224, 224, 3))

    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


TIMM_CHILD = r"""
import json, sys, time
import torch
from timm.data import create_transform
from torchvision.datasets import ImageFolder
files, batch, workers, steps, randaug = sys.argv[1], *map(int, sys.argv[2:6])
transform = create_transform(224, is_training=True, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3),
                             hflip=0.5, interpolation="bilinear", color_jitter=None,
                             auto_augment="rand-m10-n2-mstd0" if randaug else None,
                             mean=(0.5,) * 3, std=(0.5,) * 3)
loader = torch.utils.data.DataLoader(ImageFolder(files, transform), batch_size=batch, shuffle=True,
                                     num_workers=workers, drop_last=True, persistent_workers=True)
def forever():
    while True:
        yield from loader
""" + r"""
it = forever()
next(it)  # warm-up: the workers
start = time.perf_counter()
for _ in range(steps):
    next(it)
print(json.dumps(steps * batch / (time.perf_counter() - start)))
"""
TIMED = TIMM_CHILD[TIMM_CHILD.index("\nit = forever()"):]  # the timed loop over `forever()`


def timm_round(files, batch, workers, steps, randaug=False):
    """One timed round of timm's DataLoader + transform, in its own process
    (torch and TensorFlow abort when both load LLVM into one process)."""
    out = subprocess.run([sys.executable, "-c", TIMM_CHILD, files, str(batch), str(workers), str(steps),
                          str(int(randaug))], capture_output=True, text=True, check=True, timeout=1200)
    return json.loads(out.stdout.strip().splitlines()[-1])


def images_per_second(it, steps, batch):
    next(it)  # warm-up: the shuffle buffer, the workers
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch / (time.perf_counter() - start)


def throughput(args, b, files):
    makers = {"ours": lambda ra: iter(ours_pipeline(b, args.batch, ra, args.cache))}
    randaug = bv_randaug(args.big_vision) if args.big_vision else None
    makers["big_vision"] = lambda ra: iter(bv_pipeline(b, args.batch, randaug if ra else None))
    makers[CEILING] = lambda ra: iter(ceiling_pipeline(b, args.batch))
    timm = importlib.util.find_spec("timm") is not None
    if not timm:
        print("timm is not installed here: its rows are left out (source benchmarks/env-peers.sh)")
    results = {}
    for ra in (False, True):
        label = "+ RandAugment(2, 10)" if ra else "crop + flip"
        names = [k for k in makers if not (ra and (k == CEILING or k == "big_vision" and randaug is None))]
        rounds = {k: [] for k in names + (["timm"] if timm else [])}
        for r in range(args.rounds):
            for k in names:  # a fresh iterator each time: an idle one would prefetch meanwhile
                it = makers[k](ra)
                rounds[k].append(images_per_second(it, args.steps, args.batch))
                del it
                gc.collect()
            if timm:
                rounds["timm"].append(timm_round(files, args.batch, args.workers, args.steps, ra))
            print(label, r, {k: round(v[-1]) for k, v in rounds.items()}, flush=True)
        results[label] = {k: statistics.median(v) for k, v in rounds.items()}
    return results


def ms_per_image(encoded, fn, reps=1):
    """ms per image of `fn(encoded image, its own stateless key)` on one
    thread (tf.data with a one-thread pool), from the encoded images in
    memory; the best of `reps` passes after a warm-up."""
    import tensorflow as tf

    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1
    opts.threading.max_intra_op_parallelism = 1
    keys = tf.data.Dataset.range(len(encoded)).map(lambda i: tf.stack([i, tf.constant(7, tf.int64)]))
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(encoded), keys)).with_options(opts)
    ds = ds.map(tf.autograph.experimental.do_not_convert(fn))
    ds = ds.map(lambda y: tf.reduce_sum(tf.cast(y[:1, :1], tf.float32)))
    for _ in ds.take(8):  # trace and warm up
        pass
    times = []
    for _ in range(max(reps, 1)):
        start = time.perf_counter()
        for _ in ds:
            pass
        times.append((time.perf_counter() - start) / len(encoded) * 1e3)
    return min(times)


def stage_costs(b, reps=1, randaug=None):
    """ms per image of cumulative stage chains on one thread."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_reluvit import data
    from keras_reluvit import preprocessing as P

    raw = b.as_dataset(split="train", decoders={"image": tfds.decode.SkipDecoding()})
    encoded = [ex["image"] for ex in raw]
    recipe = P.check_preprocessing(None)
    layer = __import__("keras").layers.RandAugment(value_range=(0, 255), num_ops=2, factor=1.0,
                                                   interpolation="nearest")  # as kr.data.pipeline

    # Every chain takes (encoded image, its own stateless key).
    def ours_crop(x, key):
        return data.decode_random_crop(x, (0.05, 1.0), (3 / 4, 4 / 3), key)

    def ours_resize(x, key):
        return tf.ensure_shape(data.decode_inception_crop(x, (224, 224), (0.05, 1.0), (3 / 4, 4 / 3), key),
                               (224, 224, 3))

    def ours_flip(x, key):
        return tf.image.stateless_random_flip_left_right(ours_resize(x, key), key)

    chains = {
        "decode the whole JPEG (tfds' decoding)": lambda x, k: tf.io.decode_jpeg(x, channels=3),
        "ours: decode the crop window": ours_crop,
        "ours: + resize to 224 (from uint8)": ours_resize,
        "ours: + flip": ours_flip,
        "ours: + normalise": lambda x, k: P.normalise(ours_flip(x, k), recipe),
        "ours: + RandAugment(2, 10) (Keras' ops via switch_randaugment)": lambda x, k: P.normalise(
            data.switch_randaugment(layer, ours_flip(x, k), k), recipe),
        "big_vision: decode_jpeg_and_inception_crop(224)": lambda x, k: bv_decode_jpeg_and_inception_crop(x),
        "big_vision: + flip_lr": lambda x, k: bv_flip_lr(bv_decode_jpeg_and_inception_crop(x)),
        "big_vision: + value_range(-1, 1)": lambda x, k: bv_chain(None)(x),
    }
    if randaug is not None:
        chains["big_vision: + randaug(2, 10) (its own ops)"] = lambda x, k: bv_chain(randaug)(x)
    out = {}
    for name, fn in chains.items():
        out[name] = ms_per_image(encoded, fn, reps)
        print(f"{name}: {out[name]:.2f} ms", flush=True)
    return out


RSS_CHILD = r"""
import json, os, resource, sys
sys.path.insert(0, os.getcwd())
from benchmarks import pipeline_peers as B
from keras_reluvit import data
import tensorflow as tf, tensorflow_datasets as tfds
cache, n, decoded = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
b, _ = B.builder(cache, n)
decoders = None if decoded else {"image": tfds.decode.SkipDecoding()}
# Without tfds' in-memory cache of small data sets (ImageNet is never cached):
# every pass reads (and decodes) the records anew, as distinct examples would be.
raw = b.as_dataset(split="train", decoders=decoders, read_config=tfds.ReadConfig(try_autocache=False))
raw = raw.repeat(10_000 // n + 2)
ds = data.pipeline(raw, len(B.PHOTOS), 224, 128, True)  # the default shuffle buffer
# Resident now (Linux), then the peak while the shuffle buffer fills.
before = int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
for _ in ds.take(8):
    pass
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_mb": before / 1024, "peak_mb": after / 1024}))
"""


def peak_rss(cache, n, decoded):
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, cache, str(n), "1" if decoded else "0"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(args, results, stages, rss):
    lines = [f"Command: python -m benchmarks.pipeline_peers --images {args.images} --batch {args.batch} "
             f"--steps {args.steps} --rounds {args.rounds}" + (" --big-vision DIR" if args.big_vision else ""),
             "", f"{args.images} JPEGs (500x375 / 375x500, {args.jpeg_kb:.0f} KB on average: quality 95 + pixel "
             "noise, scikit-image photographs), 224 px, "
             f"batch {args.batch}; images/s, median of {args.rounds} alternating rounds "
             f"of {args.steps} batches.", "",
             "| pipeline | crop + flip | + RandAugment(2, 10) |", "|---|---|---|"]
    names = list(results["crop + flip"])
    for k in names:
        cells = [results[label].get(k) for label in ("crop + flip", "+ RandAugment(2, 10)")]
        lines.append(f"| {k} | " + " | ".join("-" if c is None else f"{c:,.0f}" for c in cells) + " |")
    for peer in ("big_vision", "timm", CEILING):
        if peer in names:
            cells = [results[label]["ours"] / results[label][peer] if peer in results[label] else None
                     for label in ("crop + flip", "+ RandAugment(2, 10)")]
            cells = ["-" if c is None else f"{c:.2f}x" for c in cells]
            lines.append(f"| ours / {peer.split(' (')[0]} | " + " | ".join(cells) + " |")
    if stages:
        lines += ["", "Per image on one thread (cumulative chains; a stage's cost is the "
                  "difference to the line above):", "", "| stages | ms / image |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in stages.items()]
    if rss:
        lines += ["", "Peak RSS of the training pipeline (batch 128, crop + flip), default shuffle "
                  f"buffer (10,000 examples; 10,000 of these JPEGs are {10_000 * args.jpeg_kb / 1024**2:.2f} GB):",
                  "", "| the shuffle holds | RSS before | peak | growth |", "|---|---|---|---|"]
        for k, v in rss.items():
            lines.append(f"| {k} | {v['before_mb']:,.0f} MB | {v['peak_mb']:,.0f} MB | "
                         f"{(v['peak_mb'] - v['before_mb']) / 1024:.2f} GB |")
    return "\n".join(lines) + "\n"


def jpeg_set_parser(doc, steps, rounds):
    """The options of every benchmark on the generated JPEG set (`jpeg_set`)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/keras-reluvit/bench-jpegs"))
    return p


def parser():
    p = jpeg_set_parser(__doc__, steps=20, rounds=5)
    p.add_argument("--big-vision", help="a big_vision checkout, for its own RandAugment")
    p.add_argument("--skip", default="", help="comma list of: throughput, stages, rss, rss-decoded")
    p.add_argument("--out", help="directory for pipeline_peers.md / .json")
    return p


def jpeg_set(args):
    """The parsed `args`' JPEG set (built once under `--cache`): `(skip, the tfds
    builder, the folder)`, `args.jpeg_kb` set to the JPEGs' mean size."""
    b, files = builder(args.cache, args.images)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(files) for f in fs]
    args.jpeg_kb = sum(sizes) / len(sizes) / 1024
    return set(filter(None, args.skip.split(","))), b, files


def main(argv=None):
    args = parser().parse_args(argv)
    skip, b, files = jpeg_set(args)
    results = throughput(args, b, files) if "throughput" not in skip else {"crop + flip": {}}
    randaug = bv_randaug(args.big_vision) if args.big_vision else None
    stages = stage_costs(b, 2, randaug) if "stages" not in skip else None
    rss = {}
    if "rss" not in skip:
        rss["encoded (ours)"] = peak_rss(args.cache, args.images, False)
    if "rss" not in skip and "rss-decoded" not in skip:
        rss["decoded (tfds' default decoding, then the shuffle)"] = peak_rss(args.cache, args.images, True)
    text = table(args, results, stages, rss)
    print(text)
    if args.out:
        from benchmarks import common

        common.write(args.out, "pipeline_peers", text, dict(throughput=results, stages=stages, rss=rss))


if __name__ == "__main__":
    main()
