"""A user's module with a registered attention activation (README "How to
add an activation"), imported by the export tests."""

import keras


@keras.saving.register_keras_serializable(package="my_project")
def squareplus(x):
    return 0.5 * (x + keras.ops.sqrt(keras.ops.square(x) + 4.0))
