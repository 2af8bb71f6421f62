"""`ImagePreprocessor`: the recipe as a Keras layer, on every backend and
inside TensorFlow graphs."""

import keras
import numpy as np

from keras_reluvit.preprocessing.keras_ops import generic
from keras_reluvit.preprocessing.recipe import check_preprocessing
from keras_reluvit.preprocessing.tf_ops import in_tf_graph
from keras_reluvit.preprocessing.tf_ops import tf_preprocess


@keras.saving.register_keras_serializable(package="keras_reluvit")
class ImagePreprocessor(keras.layers.Layer):
    """Prepares images for a model as its checkpoint expects them.

    Takes pixel images (uint8, or floats holding 0-255 values; [0, 1]
    floats for an `input_scale=1` recipe) of any size: one `[H, W, 3]`
    array, a batch `[N, H, W, 3]`, or a list of arrays of different sizes;
    RGBA (`[..., 4]`) images lose their alpha channel by the recipe's
    `alpha` rule. Returns the float32 model inputs `[N, *image_size, 3]`.
    Runs on every backend (`keras.ops`), and in TensorFlow graphs with
    dynamic sizes (tf.data, SavedModels) through TensorFlow's own resize,
    which computes the same thing.

    Args:
        image_size: `(height, width)` the model takes.
        **recipe: the keys of `keras_reluvit.preprocessing` (`resize`,
            `crop_pct`, `interpolation`, `antialias`, `round_uint8`,
            `pass_order`, `clip`, `alpha`, `input_scale`, `crop_offset`,
            `resize_rounding`, `mean`, `std`); missing ones take our
            default.

    Example:

    >>> import numpy as np, keras_reluvit
    >>> pre = keras_reluvit.ImagePreprocessor((32, 32), interpolation="bicubic")
    >>> photo = np.random.randint(0, 256, (48, 64, 3), dtype="uint8")
    >>> tuple(pre(photo).shape)
    (1, 32, 32, 3)
    """

    def __init__(self, image_size=(224, 224), name=None, dtype=None, **recipe):
        kwargs = {k: recipe.pop(k) for k in ("trainable",) if k in recipe}
        super().__init__(name=name, dtype=dtype, **kwargs)
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = tuple(int(s) for s in image_size)
        self.recipe = check_preprocessing(recipe)

    def __call__(self, images, *args, **kwargs):
        # Inside tf.data (a TensorFlow graph) under JAX or PyTorch, Keras'
        # Layer.__call__ would convert the symbolic tf.Tensor to the backend's
        # arrays and fail; the TensorFlow path computes the same thing, as
        # Keras' own preprocessing layers do in tf.data.
        if keras.backend.backend() != "tensorflow" and in_tf_graph():
            return self.call(images)
        return super().__call__(images, *args, **kwargs)

    def call(self, images):
        if isinstance(images, (list, tuple)):
            return keras.ops.concatenate([self.call(image) for image in images], axis=0)
        if len(images.shape) == 3:
            images = images[None]
        if len(images.shape) != 4 or images.shape[-1] not in (1, 2, 3, 4, None):
            raise ValueError(f"ImagePreprocessor takes images [H, W, C] or [N, H, W, C] of "
                             f"1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA) channels, got "
                             f"shape {tuple(images.shape)}.")
        graph = keras.backend.backend() == "tensorflow" or in_tf_graph()
        images = self._pixels(images, graph)
        if graph:
            return tf_preprocess(images, self.image_size, self.recipe)
        return generic(images, self.image_size, self.recipe)

    def _pixels(self, images, graph):
        """0-255 pixel values: float images of an `input_scale=1` recipe are
        [0, 1] values (refused above 1 where the values can be seen),
        times 255 -- rounded to whole pixels where the source resamples
        uint8 images (Pillow)."""
        if self.recipe["input_scale"] == 255.0:
            return images
        dtype = keras.backend.standardize_dtype(images.dtype)
        if "float" not in dtype:
            return images
        if graph:
            import tensorflow as tf

            x = tf.cast(images, tf.float32)
            if tf.executing_eagerly() and int(tf.size(x)):
                self._check_unit_range(float(tf.reduce_max(x)))
            x = x * 255.0
            return tf.round(x) if self.recipe["round_uint8"] else x
        ops = keras.ops
        x = ops.cast(images, "float32")
        if int(np.prod(x.shape)):
            self._check_unit_range(float(ops.convert_to_numpy(ops.max(x))))
        x = x * 255.0
        return ops.round(x) if self.recipe["round_uint8"] else x

    @staticmethod
    def _check_unit_range(top):
        if top > 1.0:
            raise ValueError(
                f"This model's preprocessing takes float images in [0, 1] (input_scale=1: its "
                f"source's processor has do_rescale=False), got values up to {top:g}. Pass "
                "uint8 pixels, or floats divided by 255.")

    def compute_output_spec(self, images):
        n = None if isinstance(images, (list, tuple)) else (
            images.shape[0] if len(images.shape) == 4 else 1)
        return keras.KerasTensor((n, *self.image_size, 3), "float32")

    def get_config(self):
        config = super().get_config()
        config.update(image_size=self.image_size, **self.recipe)
        return config


def preprocess(model, images):
    """`model.preprocessor(images)`: pixel images of any size (uint8 or 0-255
    floats; one image, a batch or a list) -> the model's inputs."""
    return model.preprocessor(images)
