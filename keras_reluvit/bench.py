"""Quick throughput measurements (`keras-reluvit bench`).

- `pipeline_throughput`: images/s of the training input pipeline alone
  (tfds read, decode, inception crop, flip, RandAugment, MixUp, batching).
- `model_throughput`: images/s of ViT inference, ReLU/L and softmax side by
  side in this process.

The full benchmark tables live in `benchmarks/` (see the README).
"""

import time


def pipeline_throughput(name="sklearn_digits", batch_size=256, image_size=224, data_dir=None,
                        steps=20, augment=None):
    """Images per second of `data.load(name).train`, after a warm-up batch."""
    from keras_reluvit import data as kr_data

    augment = augment or kr_data.Augment(randaug=(2, 10), mixup=0.2)
    train = kr_data.load(name, batch_size, image_size, data_dir, augment).train
    it = iter(train.repeat())
    next(it)
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch_size / (time.perf_counter() - start)


def model_throughput(variant="S/16", batch_size=8, image_size=224, reps=3):
    """{attention: images/s} of `predict_on_batch` for relu and softmax."""
    import numpy as np

    from keras_reluvit.models.vit import ViT

    x = np.random.default_rng(0).uniform(-1, 1, (batch_size, image_size, image_size, 3))
    x = x.astype("float32")
    result = {}
    for attention in ("relu", "softmax"):
        model = ViT(variant, attention=attention, image_size=image_size, num_classes=1000)
        model.predict_on_batch(x)
        start = time.perf_counter()
        for _ in range(reps):
            model.predict_on_batch(x)
        result[attention] = reps * batch_size / (time.perf_counter() - start)
    return result
