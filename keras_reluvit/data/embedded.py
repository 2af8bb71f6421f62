"""The embedded default data set, registered with tfds as `sklearn_digits`.

scikit-learn's bundled handwritten digits (1,797 8x8 grey images, 10
classes; no download), upscaled 4x (nearest) to 32x32 RGB uint8 so that the
same tfds -> tf.data -> model.fit path as ImageNet is exercised. Splits:
`train` (first 1,437 in a fixed shuffle) and `test` (360).
"""

import numpy as np
import tensorflow_datasets as tfds

UPSCALE = 4
TRAIN_EXAMPLES = 1437


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's handwritten digits, 32x32 RGB."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "sklearn.datasets.load_digits, 4x nearest upscale."}

    def _info(self):
        size = 8 * UPSCALE
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(size, size, 3)),
                    "label": tfds.features.ClassLabel(names=[str(i) for i in range(10)]),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html",
        )

    def _split_generators(self, dl_manager):
        from sklearn.datasets import load_digits

        data = load_digits()
        images = np.round(data.images * (255.0 / 16.0)).astype("uint8")
        images = np.kron(images, np.ones((UPSCALE, UPSCALE), "uint8"))
        images = np.repeat(images[..., None], 3, axis=-1)
        order = np.random.default_rng(0).permutation(len(images))
        images, labels = images[order], data.target[order]
        return {
            "train": self._generate_examples(images[:TRAIN_EXAMPLES], labels[:TRAIN_EXAMPLES], 0),
            "test": self._generate_examples(images[TRAIN_EXAMPLES:], labels[TRAIN_EXAMPLES:], TRAIN_EXAMPLES),
        }

    def _generate_examples(self, images, labels, offset):
        for i, (image, label) in enumerate(zip(images, labels)):
            yield offset + i, {"image": image, "label": int(label)}
