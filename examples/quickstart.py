"""Quickstart: a small ReLU/L ViT trained with model.fit on scikit-learn's
bundled handwritten digits (8x8, upscaled to 32x32; no download).

    KERAS_BACKEND=jax python examples/quickstart.py   # or tensorflow / torch
"""

import time

import keras
import numpy as np
from sklearn.datasets import load_digits

import keras_reluvit as kr

EPOCHS = 30


def digits(size=32):
    data = load_digits()
    x = data.images.astype("float32") / 16.0 * 2.0 - 1.0          # [-1, 1]
    x = np.repeat(np.repeat(x, size // 8, axis=1), size // 8, axis=2)  # upscale
    x = np.repeat(x[..., None], 3, axis=-1)                          # RGB
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], data.target[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def main():
    keras.utils.set_random_seed(0)
    print(f"backend: {keras.backend.backend()}")
    print("attention kinds:")
    for name, doc in kr.attention_kinds().items():
        print(f"  {name:13s} {doc}")
    (x_train, y_train), (x_test, y_test) = digits()
    model = kr.ViT("Ti/8", attention="relu", image_size=32, num_classes=10,
                   depth=4, width=96, num_heads=3, mlp_dim=192)
    print(f"{model.name}: {model.count_params():,} parameters, "
          f"{model.grid_size[0] * model.grid_size[1]} tokens")
    steps = EPOCHS * len(x_train) // 64
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, steps, warmup_target=2e-3, warmup_steps=steps // 10)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.05, global_clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    start = time.time()
    model.fit(x_train, y_train, batch_size=64, epochs=EPOCHS, verbose=2)
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy {acc:.3f} after {time.time() - start:.0f} s")
    maps = model.intermediates(x_test[:2])["attention_03"]
    print(f"last-layer attention weights {tuple(maps.shape)}, "
          f"fraction of exact zeros {float(np.mean(keras.ops.convert_to_numpy(maps) == 0)):.2f}")


if __name__ == "__main__":
    main()
