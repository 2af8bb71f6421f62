"""Throughput of the SavedModel's `serve_bytes` path (decode + preprocess +
model) with each checkpoint's own preprocessing, against the path it
replaced (TensorFlow's default fast-DCT JPEG decode, area resize of the
shorter side to 256/224 of the size, [-1, 1]), in one TensorFlow process,
the same model, the same JPEG photographs (scikit-image's samples).

    KERAS_BACKEND=tensorflow python -m benchmarks.serving

Prints img/s (median of rounds) and the ratio to the old path.
"""

import argparse
import io
import time

import numpy as np


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="S/16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="batches per round")
    return ap


def old_preprocess(tf, data, size):
    """The serve_bytes preprocessing before recipes travelled with models."""
    image = tf.cast(tf.io.decode_image(data, channels=3, expand_animations=False), tf.float32)
    h, w = size
    small = tf.cast(tf.round(min(h, w) * 256 / 224), tf.float32)
    shape = tf.cast(tf.shape(image)[-3:-1], tf.float32)
    new = tf.maximum(tf.cast(tf.round(shape * small / tf.reduce_min(shape)), tf.int32), [h, w])
    image = tf.image.resize(image, new, method="area")
    top, left = (new[0] - h) // 2, (new[1] - w) // 2
    return tf.clip_by_value(image[top:top + h, left:left + w], 0.0, 255.0) / 127.5 - 1.0


def main():
    args = parser().parse_args()
    import keras
    import skimage.data
    import tensorflow as tf
    from PIL import Image

    import keras_reluvit as kr
    from keras_reluvit import preprocessing as P

    assert keras.backend.backend() == "tensorflow", "run with KERAS_BACKEND=tensorflow"
    photos = []
    for name in ("astronaut", "coffee", "chelsea", "rocket"):
        buf = io.BytesIO()
        Image.fromarray(getattr(skimage.data, name)()).save(buf, format="JPEG", quality=90)
        photos.append(buf.getvalue())
    batch = tf.constant([photos[i % len(photos)] for i in range(args.batch)])
    model = kr.ViT(args.variant, attention="relu", num_classes=1000)
    size = model.image_size
    timm = dict(resize="shorter", crop_pct=0.9, interpolation="bicubic", round_uint8=True,
                crop_offset="round", resize_rounding="floor", mean=P.IMAGENET_MEAN,
                std=P.IMAGENET_STD)
    dinov2 = dict(timm, crop_pct=224 / 256, crop_offset="floor", alpha="white")
    paths = {
        "before: fast DCT, area, [-1, 1]": lambda d: old_preprocess(tf, d, size),
        "ours / big_vision recipe (area)": lambda d: P.tf_preprocess(
            P.decode_image(d), size, P.check_preprocessing(None)),
        "timm recipe (bicubic, PIL rounding)": lambda d: P.tf_preprocess(
            P.decode_image(d), size, P.check_preprocessing(timm)),
        "timm recipe, Pillow 12 pass order": lambda d: P.tf_preprocess(
            P.decode_image(d), size, P.check_preprocessing(dict(timm, pass_order="horizontal"))),
        "DINOv2 recipe, alpha dropped": lambda d: P.tf_preprocess(
            P.decode_image(d), size, P.check_preprocessing(dict(dinov2, alpha="drop"))),
        "DINOv2 recipe (alpha onto white)": lambda d: P.tf_preprocess(
            P.decode_image(d, alpha="white"), size, P.check_preprocessing(dinov2)),
    }
    fns = {}
    for label, pre in paths.items():
        def serve(data, pre=pre):
            x = tf.map_fn(pre, data, fn_output_signature=tf.TensorSpec((*size, 3), tf.float32))
            return tf.nn.softmax(model(x, training=False))
        fns[label] = tf.function(serve)
        fns[label](batch)  # trace + warm up
    rates = {label: [] for label in fns}
    for _ in range(args.rounds):  # interleaved, so drift hits every path alike
        for label, fn in fns.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                fn(batch).numpy()
            rates[label].append(args.steps * args.batch / (time.perf_counter() - start))
    base = float(np.median(rates[next(iter(rates))]))
    print(f"serve_bytes, ViT-{args.variant} relu, batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} batches")
    print(f"{'preprocessing':40s} {'img/s':>8s} {'ratio':>7s}")
    for label, r in rates.items():
        med = float(np.median(r))
        print(f"{label:40s} {med:8.2f} {med / base:7.3f}")


if __name__ == "__main__":
    main()
