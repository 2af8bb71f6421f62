"""Input pipelines: a tfds image-classification data set or a folder of
images into `model.fit`, in tf.data end to end (parallel decode and
augmentation with AUTOTUNE).

- train (big_vision's, by default): the encoded examples shuffled (tfds
  read with `SkipDecoding`, or file names) | inception crop (area 5-100 %,
  aspect 3/4-4/3), only the window decoded for a JPEG, resized (bilinear)
  from uint8 to the model resolution | random left-right flip |
  RandAugment (Keras core layer, per image, see `switch_randaugment`) |
  the recipe's mean / std (big_vision's: [-1, 1]) | one-hot labels | MixUp
  (big_vision semantics). timm's and DeiT's chains (`Augment`'s other
  fields, docs/training.md's table) replace the crop and augmentation:
  timm's Pillow operations run per image through `tf.numpy_function`
  (`pillow_calls`), DeiT III's as TensorFlow ops writing Pillow's levels
  (`pillow_graph`).
- eval: the model's own recipe (`preprocessing=`, see
  `keras_reluvit.preprocessing`; by default ours and big_vision's: the
  shorter side to `round(resolution * 256 / 224)`, area | central crop |
  the recipe's mean / std) | one-hot labels. Deterministic.

Train images are normalised with the recipe's mean/std too, so a checkpoint
fine-tuned here sees the value range it was trained on.

The batches feed `model.fit` on every Keras backend (Keras converts tf.data
batches for JAX and PyTorch).

RandAugment mapping: big_vision's `randaug(num_layers, magnitude)` is Keras'
`RandAugment(num_ops=num_layers, factor=magnitude / 10,
interpolation="nearest")` (nearest, as big_vision's shear, translate and
rotate sample; ~40 % cheaper than bilinear) — Keras' factor is
the magnitude as a fraction of the TF-models maximum level 10 that
big_vision's implementation uses; magnitudes above 10 (big_vision's 15) are
clipped to factor 1.0 (Keras caps the strength of each op at its maximum).

Modules: `tfds` (preparing tfds data sets, their builders and splits),
`embedded` (the digits data set), `folders` (a folder of images as a data
set: classes, splits, the split record), `compact` (a compact copy of
either: JPEGs of a bounded size, fewer bytes to decode); the augmentations, one home per
source (docs/training.md's table): `augment` (the `Augment` vocabulary, the
crops, big_vision's RandAugment and MixUp), `timm_augment` (timm's:
RandAugment and AugMix by name, random erasing, MixUp / CutMix),
`three_augment` (DeiT III's: 3-Augment, colour jitter, the simple crop);
Pillow in two forms: `pillow_calls` (Pillow itself, called from the tf.data
map: timm's operations) and `pillow_graph` (Pillow's arithmetic as TensorFlow
ops: DeiT III's, and any pipeline that must stay a graph); `ops` (a
pipeline's named operations: an `Augment` as a list of them, one line
each); `pipeline` (examples to batches), `sources` (`load`: a tfds name or a folder to
pipelines) and `lazy` (TensorFlow and tfds imported on first use).
"""


from keras_reluvit.data import folders
from keras_reluvit.data import ops
from keras_reluvit.data import pillow_calls
from keras_reluvit.data import pillow_graph
from keras_reluvit.data import three_augment
from keras_reluvit.data import timm_augment
from keras_reluvit.data.augment import Augment
from keras_reluvit.data.augment import crop_window
from keras_reluvit.data.augment import decode_inception_crop
from keras_reluvit.data.augment import decode_random_crop
from keras_reluvit.data.augment import inception_crop
from keras_reluvit.data.augment import mixup
from keras_reluvit.data.augment import random_crop
from keras_reluvit.data.augment import resize_small_central_crop
from keras_reluvit.data.augment import switch_randaugment
from keras_reluvit.data.compact import compact_copy
from keras_reluvit.data.pipeline import for_model
from keras_reluvit.data.pipeline import pipeline
from keras_reluvit.data.sources import Data
from keras_reluvit.data.sources import Info
from keras_reluvit.data.sources import imagenet
from keras_reluvit.data.sources import load
from keras_reluvit.data.tfds import ILSVRC_HELP
from keras_reluvit.data.tfds import MANUAL_FILES
from keras_reluvit.data.tfds import SPLITS
from keras_reluvit.data.tfds import builder
from keras_reluvit.data.tfds import default_manual_dir
from keras_reluvit.data.tfds import prepare
from keras_reluvit.data.three_augment import simple_random_crop
from keras_reluvit.data.timm_augment import random_erasing
from keras_reluvit.data.timm_augment import timm_mix

__all__ = ["Augment", "Data", "ILSVRC_HELP", "Info", "MANUAL_FILES", "SPLITS", "builder",
           "compact_copy", "crop_window", "decode_inception_crop", "decode_random_crop", "default_manual_dir",
           "for_model", "imagenet", "inception_crop", "load", "mixup", "pipeline", "prepare",
           "random_crop", "random_erasing", "resize_small_central_crop", "simple_random_crop",
           "switch_randaugment", "ops", "pillow_calls", "pillow_graph", "three_augment",
           "timm_augment", "timm_mix", "folders"]
