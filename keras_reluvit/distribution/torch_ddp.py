"""PyTorch: data-parallel training through `DistributedDataParallel`
inside `model.fit`."""

import keras

from keras_reluvit.distribution.cluster import shard
from keras_reluvit.distribution.parallel_model import DataParallelModel


def ddp(model, dataset=None, **ddp_options):
    """Trains `model` data parallel with PyTorch's `DistributedDataParallel`
    through `model.fit` (the Keras guide "Multi-GPU distributed training with
    PyTorch", without a loop of your own). Run under `torchrun` after
    `kr.distribution.initialize()`.

    A shorthand for `DataParallelModel(model)` on the torch backend (see
    it): the wrapper's forward pass calls the DDP module, so each backward pass
    all-reduces the gradients (averaged over the processes, bucketed and
    overlapped with the backward pass, by DDP's reducer) before the Keras
    optimizer applies them; the weights start equal (DDP broadcasts process
    0's). Metric states (the loss tracker's and `compile`'s metrics) are
    summed over the processes whenever they are read, as tf.distribute
    does, so the logged loss and accuracy are the global batch's.

    With `dataset`, also returns this process' shard of it: a
    `tf.data.Dataset` (`shard`, every process the same number of
    elements), a tuple / list of arrays (rows `rank::world`, cut to equal
    lengths) or a `torch.utils.data.Dataset` (a `Subset`). Shard the
    *training* data (for a batched data set: global batch = processes x its
    batch size); give every process the whole validation set, or shards with
    equal numbers of batches (each evaluation step reads the metrics, a
    collective).

    Args:
        model: a built and compiled Keras model on the torch backend
            (variables created: call it on a batch first).
        dataset: optional training data to shard.
        **ddp_options: passed to `DistributedDataParallel`
            (e.g. `find_unused_parameters=True`).

    Returns:
        the `DataParallelModel` to train (its `save` writes `model`'s
        file), or `(wrapper, shard)` with `dataset`.

    Example (`torchrun --nproc_per_node 2 train.py`), each process its shard
    of an unsharded data set (`DataParallelModel`'s example reads shards
    with `kr.data.load(..., process_index=, process_count=)` instead):

    ```python
    kr.distribution.initialize()                 # torchrun's cluster
    rank = kr.distribution.process_index()
    train, val, info = kr.data.load("sklearn_digits", 64, image_size=32)
    model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
    model(np.zeros((1, 32, 32, 3), "float32"))   # build
    model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    parallel, train = kr.distribution.ddp(model, train)  # every 2nd batch each
    parallel.fit(train, validation_data=val, epochs=5, verbose=int(rank == 0))
    ```
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"ddp() wraps a model in torch's DistributedDataParallel: it needs "
                           f"KERAS_BACKEND=torch (this is {keras.backend.backend()}).")
    parallel = DataParallelModel(model, **ddp_options)
    if dataset is None:
        return parallel
    return parallel, shard(dataset)
