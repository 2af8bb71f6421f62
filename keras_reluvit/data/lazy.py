"""TensorFlow and TensorFlow Datasets, imported where a data module first
uses them: `import keras_reluvit` imports neither (seconds saved on JAX
and PyTorch until a tf.data pipeline is built)."""


def tensorflow():
    """The `tensorflow` module."""
    import tensorflow as tf

    return tf


def tensorflow_datasets():
    """The `tensorflow_datasets` module, with the embedded data set
    (`keras_reluvit.data.embedded`) registered."""
    import tensorflow_datasets as tfds

    from keras_reluvit.data import embedded  # noqa: F401 - registers the builder

    return tfds
