"""TensorFlow: data-parallel training through `MultiWorkerMirroredStrategy`
inside `model.fit`, and the optimizer's clipping moved after the
all-reduce."""

import keras

from keras_reluvit import _keras_compat as compat
from keras_reluvit.distribution.cluster import tf_strategy
from keras_reluvit.models import extensions


def multi_worker(model, train, val=None):
    """Distributes this worker's data for `model.fit` under the
    `MultiWorkerMirroredStrategy` of `initialize()` (TF_CONFIG).

    Each worker reads its own shard of the training data (`kr.data.load(...,
    process_index=i, process_count=n)`: batches of `batch_size / n`), handed
    to the strategy as is with `distribute_datasets_from_function` (no
    re-batching, no auto-sharding); the gradients are all-reduced across
    the workers by the strategy, and the metrics are the global batch's.
    `val` is read by every worker as given (the whole validation set: the
    metrics are then those of one process). On CPUs the steps run without
    XLA (`jit_compile=False`: XLA has no CPU collectives).

    Build and compile the model inside `kr.distribution.strategy().scope()`
    first. This also works around three failures of Keras 3.15's `fit` under
    this strategy: it reduces a nested `(x, y)` batch with `strategy.reduce`
    to build the model (the state is built here from the data's element
    spec instead); it averages the scalar logs over the workers along an
    axis they do not have ("Invalid reduction dimension 0",
    tensorflow/tensorflow#72388; averaged here with `axis=None`); and its
    optimizer clips each worker's *local* gradients (`global_clipnorm`,
    `clipnorm`, `clipvalue`) before summing them, which is not the clipping
    of the global gradient (here the optimizer clips after the all-reduce).

    Returns:
        `(train, val)`: the distributed data sets for `model.fit`.

    Example (every worker with its TF_CONFIG):

    ```python
    strategy = kr.distribution.initialize()       # MultiWorkerMirroredStrategy
    i, n = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=i, process_count=n)
    with strategy.scope():
        model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
        model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    dtrain, dval = kr.distribution.multi_worker(model, train.repeat(), val)
    model.fit(dtrain, steps_per_epoch=len(train), validation_data=dval, epochs=5)
    ```
    """
    s = tf_strategy()
    if s is None:
        raise RuntimeError("No TensorFlow cluster: call kr.distribution.initialize() with "
                           "TF_CONFIG set (KERAS_BACKEND=tensorflow) first.")
    if compat.distribute_strategy(model) is not s:
        raise ValueError("Create (and compile) the model inside "
                         "`kr.distribution.strategy().scope()`: its variables must be the "
                         "strategy's.")
    import tensorflow as tf

    if model.jit_compile and not tf.config.list_logical_devices("GPU"):
        model.jit_compile = False  # XLA has no CPU collectives (TensorFlow 2.21)
    with s.scope():
        compat.symbolic_build(model, train.element_spec)
    _patch_keras_multi_worker_logs()
    clip_after_all_reduce(model)  # a kr.ViT does it before training; other models need it

    def distribute(ds):
        return s.distribute_datasets_from_function(lambda _: ds)

    return distribute(train), (None if val is None else distribute(val))


def _patch_keras_multi_worker_logs():
    """Keras 3.15's TensorFlow trainer averages each step's logs over a
    multi-worker strategy's replicas with `strategy.reduce("MEAN", v,
    axis=0)`, which fails for the scalar loss and metrics
    (tensorflow/tensorflow#72388): average them with `axis=None` (over the
    replicas, as Keras means to), leaving every other case to Keras."""
    tf_trainer = compat.tf_trainer()
    original = tf_trainer.reduce_per_replica
    if getattr(original, "_keras_reluvit", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and compat.tf_is_multi_worker(strategy):
            return keras.tree.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica._keras_reluvit = True
    tf_trainer.reduce_per_replica = reduce_per_replica


CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")


def clip_after_all_reduce(model):
    """Makes `model`'s optimizer clip the all-reduced gradient when the
    model was built and compiled under a TensorFlow `tf.distribute`
    strategy of several replicas (one host's `MirroredStrategy` or a
    cluster's `MultiWorkerMirroredStrategy`): Keras 3.15 clips each
    replica's own gradient (`global_clipnorm`, `clipnorm`, `clipvalue`)
    before summing them, not the gradient one device would clip. A `kr.ViT`
    calls it before training (`make_train_function`); call it after
    compiling another model. Does nothing on other backends, without a
    strategy or clipping, or twice."""
    if keras.backend.backend() != "tensorflow" or getattr(model, "optimizer", None) is None:
        return
    strategy = compat.distribute_strategy(model)
    if strategy is None or strategy.num_replicas_in_sync <= 1:
        return
    optimizer = model.optimizer
    # a LossScaleOptimizer applies its inner optimizer, which clips and reduces
    _clip_after_all_reduce(getattr(optimizer, "inner_optimizer", optimizer))


def _clip_after_all_reduce(optimizer):
    """Keras 3.15's TensorFlow optimizer clips the gradients in each replica,
    then all-reduces them: under a multi-worker strategy the global-norm
    clip then sees each worker's half-batch gradient, not the global one
    (a different update whenever the clip is active). Move the clipping
    after the all-reduce, where it sees what one process would."""
    clipping = {name: getattr(optimizer, name, None) for name in CLIPPING}
    if not any(clipping.values()):  # no clipping, or moved already (all unset then)
        return
    for name in CLIPPING:
        setattr(optimizer, name, None)
    reduce, clip = compat.tf_all_reduce_and_clip(optimizer)

    def reduce_then_clip(grads_and_vars):
        grads_and_vars = list(reduce(grads_and_vars))
        for name, value in clipping.items():
            setattr(optimizer, name, value)
        try:
            grads = clip([g for g, _ in grads_and_vars])
        finally:
            for name in CLIPPING:
                setattr(optimizer, name, None)
        return list(zip(grads, [v for _, v in grads_and_vars]))

    compat.tf_set_all_reduce(optimizer, reduce_then_clip)


# A `kr.ViT` clips after the all-reduce before Keras makes its train function.
extensions.on_train_function(clip_after_all_reduce)
