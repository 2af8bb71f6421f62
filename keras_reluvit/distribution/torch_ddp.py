"""PyTorch: data-parallel training through `DistributedDataParallel`
inside `model.fit`."""

import keras

from keras_reluvit import _keras_compat as compat
from keras_reluvit.distribution.cluster import shard
from keras_reluvit.distribution.cluster import torch_distributed


def ddp(model, dataset=None, **ddp_options):
    """Trains `model` data parallel with PyTorch's `DistributedDataParallel`
    through `model.fit` (the Keras guide "Multi-GPU distributed training with
    PyTorch", without a loop of your own). Run under `torchrun` after
    `kr.distribution.initialize()`.

    The model's training step calls the DDP module, so each backward pass
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
        model: a built Keras model on the torch backend (variables created:
            call it on a batch first), compiled before or after.
        dataset: optional training data to shard.
        **ddp_options: passed to `DistributedDataParallel`
            (e.g. `find_unused_parameters=True`).

    Returns:
        `model` (the same object, now training through DDP), or
        `(model, shard)` with `dataset`.

    Example (`torchrun --nproc_per_node 2 train.py`):

    ```python
    kr.distribution.initialize()                 # torchrun's cluster
    rank, world = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=rank, process_count=world)
    model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
    model(np.zeros((1, 32, 32, 3), "float32"))   # build
    model = kr.distribution.ddp(model)
    model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(train, validation_data=val, epochs=5, verbose=rank == 0)
    ```
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"ddp() wraps a model in torch's DistributedDataParallel: it needs "
                           f"KERAS_BACKEND=torch (this is {keras.backend.backend()}).")
    dist = torch_distributed()
    if dist is None:
        raise RuntimeError("torch.distributed is not initialized: call "
                           "kr.distribution.initialize() first (under torchrun).")
    if not model.built or not model.variables:
        raise ValueError("Build the model before ddp() (call it on a batch, or model.build): "
                         "DDP registers the variables it finds at wrapping time.")
    import torch

    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    module = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                       **ddp_options)
    _route_through(model, module)
    if dataset is None:
        return model
    return model, shard(dataset)


def _route_through(model, module):
    """The model's train step with the forward pass through the DDP
    `module` (its reducer then all-reduces the gradients in the backward
    pass), and metrics summed over the processes when read. The step is
    Keras 3's torch `train_step` with `self(x)` replaced by `module(x)`."""
    import types

    import torch
    import torch.distributed as dist

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = module(x, training=True) if compat.call_has_training_arg(self) else module(x)
        self.zero_grad()
        loss = compat.compute_loss(self, x, y, y_pred, sample_weight)
        batch = next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
        compat.loss_tracker(self).update_state(loss, sample_weight=batch)
        if self.optimizer is not None:
            loss = self.optimizer.scale_loss(loss)
        if self.trainable_weights:
            loss.backward()  # DDP's hooks average the gradients over the processes
            weights = self.trainable_weights[:]
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in weights], weights)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def get_metrics_result(self):
        variables = list(self.metrics_variables)
        local = [v.value.detach().clone() for v in variables]
        if local:
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in local])
            dist.all_reduce(flat)  # SUM: totals and counts of every process
            for v, t, part in zip(variables, local, flat.split([t.numel() for t in local])):
                v.assign(part.reshape(t.shape).to(t.dtype))
        try:
            return type(self).get_metrics_result(self)
        finally:
            for v, t in zip(variables, local):
                v.assign(t)

    model.train_step = types.MethodType(train_step, model)
    model.get_metrics_result = types.MethodType(get_metrics_result, model)
    model.train_function = None  # a compiled model rebuilds its step

