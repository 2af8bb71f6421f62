"""TensorFlow: each worker's shard of the data handed to the
`MultiWorkerMirroredStrategy` of `initialize()` for a `DataParallelModel`'s
`fit`."""

from keras_reluvit import _keras_compat as compat
from keras_reluvit.distribution.cluster import tf_strategy
from keras_reluvit.distribution.parallel_model import DataParallelModel


def multi_worker(parallel, train, val=None):
    """Distributes this worker's data for `parallel.fit` (a
    `DataParallelModel`) under the `MultiWorkerMirroredStrategy` of
    `initialize()` (TF_CONFIG).

    Each worker reads its own shard of the training data (`kr.data.load(...,
    process_index=i, process_count=n)`: batches of `batch_size / n`), handed
    to the strategy as is with `distribute_datasets_from_function` (no
    re-batching, no auto-sharding); the gradients are all-reduced across
    the workers by the strategy, and the metrics are the global batch's.
    `val` is read by every worker as given (the whole validation set: the
    metrics are then those of one process). The wrapper's metrics and
    optimizer state are built here from the data's element spec, so that
    Keras' `fit` does not read a batch to build them
    (`_keras_compat.SymbolicBuildOnce`); on CPUs the steps run without XLA
    (XLA has no CPU collectives).

    Returns:
        `(train, val)`: the distributed data sets for `parallel.fit`.

    Example (every worker with its TF_CONFIG):

    ```python
    strategy = kr.distribution.initialize()       # MultiWorkerMirroredStrategy
    i, n = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=i, process_count=n)
    with strategy.scope():
        model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
        model.build((None, 32, 32, 3))
        model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        parallel = kr.distribution.DataParallelModel(model)
    dtrain, dval = kr.distribution.multi_worker(parallel, train.repeat(), val)
    parallel.fit(dtrain, steps_per_epoch=len(train), validation_data=dval, epochs=5)
    ```
    """

    s = tf_strategy()
    if s is None:
        raise RuntimeError("No TensorFlow cluster: call kr.distribution.initialize() with "
                           "TF_CONFIG set (KERAS_BACKEND=tensorflow) first.")
    if not isinstance(parallel, DataParallelModel):
        raise TypeError(f"multi_worker takes a kr.distribution.DataParallelModel (wrap the "
                        f"compiled model inside the strategy's scope), not "
                        f"{type(parallel).__name__}.")
    if not s.extended.variable_created_in_scope(parallel.variables[0].value):
        raise ValueError("Create (and compile) the model inside "
                         "`kr.distribution.tf_strategy().scope()`: its variables must be the "
                         "strategy's.")
    with s.scope():
        compat.symbolic_build(parallel, train.element_spec)

    def distribute(ds):
        return s.distribute_datasets_from_function(lambda _: ds)

    return distribute(train), (None if val is None else distribute(val))
