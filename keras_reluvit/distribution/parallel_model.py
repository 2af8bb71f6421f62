"""`DataParallelModel`: a Keras model that trains another one data parallel
with `fit` on PyTorch's `DistributedDataParallel` or a TensorFlow
`tf.distribute` strategy, through Keras' public hooks only.

The pattern is Keras' own for changing what `fit` does to a model you did
not write (the distillation example: a `keras.Model` holding the student,
with `call` and `train_step` overridden): the wrapper holds `model`, shares
its variables and optimizer, and overrides `call` (PyTorch: through the DDP
module), `train_step` / `test_step` (TensorFlow: the clipping of the
all-reduced gradient, the logs a multi-worker strategy can average) and
`get_metrics_result` (PyTorch: the metric states summed over the
processes). Its `save`, `save_weights`, `load_weights` and `export` are
`model`'s, so files written by a cluster are the files one process writes.
"""

import keras

from keras_reluvit import _keras_compat as compat
from keras_reluvit.distribution import cluster

CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")


class _Held:
    """Holds an object out of Keras' and torch's attribute tracking (the DDP
    module would otherwise register `model`'s parameters a second time)."""

    def __init__(self, value):
        self.value = value


class DataParallelModel(compat.SymbolicBuildOnce, keras.Model):
    """Trains a built, compiled `model` data parallel through `fit` /
    `evaluate` on the PyTorch or TensorFlow backend.

    - PyTorch (under torchrun, after `kr.distribution.initialize()`): the
      forward pass runs through `torch.nn.parallel.DistributedDataParallel`,
      so each backward pass all-reduces the gradients (averaged, bucketed and
      overlapped with the backward pass by DDP's reducer) before the Keras
      optimizer applies them; the weights start equal (DDP broadcasts
      process 0's). Metric states are summed over the processes whenever they
      are read, as `tf.distribute` does: the logged loss and accuracy are the
      global batch's.
    - TensorFlow (built and compiled inside a strategy's `scope()`:
      `MirroredStrategy`, or the `MultiWorkerMirroredStrategy` of
      `initialize()`): the strategy all-reduces the gradients; the
      optimizer's `global_clipnorm` / `clipnorm` / `clipvalue` clip the
      all-reduced gradient, as one device would (Keras 3.15's optimizer clips
      each replica's own gradient before the sum, a different update
      whenever the clip is active: tensorflow/tensorflow#33929), after its
      loss scaling. The clip costs a second
      all-reduce of the gradients, only while a clip is set.
      The per-step logs of a multi-worker strategy are averaged over the
      workers (Keras 3.15 fails on them: tensorflow/tensorflow#72388,
      keras-team/keras#20585).

    Train the wrapper (the model's own `fit` under the strategy is Keras',
    each replica's gradient clipped); everything else is `model`'s: the same
    variables and optimizer (`model.compile` first; the wrapper compiles
    itself with the same optimizer, loss and metrics, and refuses another
    `compile`), and `save` / `save_weights` / `load_weights` / `export`
    write and read `model`'s files.

    Args:
        model: a built and compiled Keras model (variables created: call it
            on a batch first).
        **ddp_options: PyTorch only, passed to `DistributedDataParallel`
            (e.g. `find_unused_parameters=True`).

    Example (`KERAS_BACKEND=torch torchrun --nproc_per_node 2 train.py`):

    ```python
    kr.distribution.initialize()                 # torchrun's cluster
    rank, world = kr.distribution.process_index(), kr.distribution.process_count()
    train, val, info = kr.data.load("sklearn_digits", 128, image_size=32,
                                    process_index=rank, process_count=world)
    model = kr.ViT(variant="Ti/16", image_size=32, num_classes=info.num_classes)
    model(np.zeros((1, 32, 32, 3), "float32"))   # build
    model.compile("adamw", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    parallel = kr.distribution.DataParallelModel(model)
    parallel.fit(train, validation_data=val, epochs=5, verbose=int(rank == 0))
    model.save("vit.keras")                      # or parallel.save: the same file
    ```
    """

    def __init__(self, model, **ddp_options):
        backend = keras.backend.backend()
        if backend not in ("torch", "tensorflow"):
            raise ValueError(f"DataParallelModel trains on PyTorch's DistributedDataParallel or "
                             f"a TensorFlow strategy; on {backend} lay the model out with "
                             "keras.distribution instead (kr.distribution.data_parallel).")
        if backend == "torch" and cluster.torch_distributed() is None:
            raise RuntimeError("torch.distributed is not initialized: call "
                               "kr.distribution.initialize() first (under torchrun).")
        if not model.built or not model.variables:
            raise ValueError("Build the model before DataParallelModel (call it on a batch, or "
                             "model.build): DDP and the strategy take the variables that exist.")
        if getattr(model, "optimizer", None) is None:
            raise ValueError("Compile the model before DataParallelModel: the wrapper trains with "
                             "its optimizer, loss and metrics.")
        if isinstance(model, DataParallelModel):
            raise TypeError("The model is a DataParallelModel already: train it as it is.")
        if ddp_options and backend != "torch":
            raise ValueError(f"DistributedDataParallel options {sorted(ddp_options)} apply to the "
                             f"torch backend only (this is {backend}).")
        super().__init__(name=f"{model.name}_data_parallel")
        self.model = model
        self._ddp = None
        if backend == "torch":
            self._ddp = _Held(_ddp_module(model, ddp_options))
        else:
            self._check_strategy(model)
        self.built = True
        config = model.get_compile_config() or {}
        metrics = keras.saving.deserialize_keras_object(config.get("metrics"))
        weighted = keras.saving.deserialize_keras_object(config.get("weighted_metrics"))
        self.compile(optimizer=model.optimizer, loss=model.loss, metrics=metrics,
                     weighted_metrics=weighted, loss_weights=config.get("loss_weights"),
                     run_eagerly=model.run_eagerly, jit_compile=self._jit(model),
                     steps_per_execution=model.steps_per_execution)
        if self.optimizer is not model.optimizer:
            raise RuntimeError("DataParallelModel's compile did not keep the model's optimizer "
                               "(is keras.Model.compile replaced?): the model would not train.")

    def compile(self, *args, **kwargs):
        """Compiled once, from the model's own compile: another optimizer
        here would train the weights while the model's optimizer (the one
        its files save) never steps."""
        if getattr(self, "compiled", False):
            raise ValueError("A DataParallelModel compiles itself from its model: compile the "
                             "model (model.compile(...)) and wrap it again.")
        return super().compile(*args, **kwargs)

    # --- the forward pass ----------------------------------------------------------------
    def call(self, inputs, training=None):
        if self._ddp is not None:
            return self._ddp.value(inputs, training=training)
        return self.model(inputs, training=training)

    # --- TensorFlow: the all-reduced gradient clipped, the logs averaged -------------------
    def train_step(self, data):
        if self._ddp is not None:  # DDP's reducer all-reduces inside Keras' own step
            return super().train_step(data)
        clipping = self._clipping()
        if clipping is None:
            return self._per_worker(super().train_step(data))
        import tensorflow as tf

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                     training=True)
            self._track_loss(loss, x)
            loss = self.optimizer.scale_loss(loss)
        weights = self.trainable_weights
        gradients = tape.gradient(loss, weights)
        # Every replica gets the all-reduced gradient G / replicas, and the optimizer
        # clips it at clip / replicas (the same clip of G: the three clips scale), after
        # its loss scaling and gradient accumulation, as one device clips; its own
        # all-reduce then sums the replicas' shares back to G. The thresholds are set
        # while the step is traced (the graph keeps them), then put back.
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        kept = [i for i, g in enumerate(gradients) if g is not None]
        summed = context.all_reduce("sum", [gradients[i] for i in kept])
        for i, g in zip(kept, summed):
            gradients[i] = g / replicas
        optimizer, clip = clipping
        for name, value in clip.items():
            setattr(optimizer, name, value / replicas)
        try:
            self.optimizer.apply(gradients, weights)
        finally:
            for name, value in clip.items():
                setattr(optimizer, name, value)
        return self._per_worker(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def test_step(self, data):
        if self._ddp is not None:
            return super().test_step(data)
        return self._per_worker(super().test_step(data))

    def _clipping(self):
        """(the optimizer that clips, {its clip settings}) when a clip is set
        and the strategy has several replicas; else None (Keras' own step)."""
        import tensorflow as tf

        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)  # loss scaling
        clip = {name: getattr(optimizer, name, None) for name in CLIPPING}
        clip = {name: value for name, value in clip.items() if value}
        if not clip or tf.distribute.get_strategy().num_replicas_in_sync <= 1:
            return None
        return optimizer, clip

    def _track_loss(self, loss, x):
        """The logged loss (Keras' loss tracker, the metric named "loss"),
        with the replica's 1/replicas share of the loss undone."""
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        batch = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
        tracker = next(m for m in self.metrics if m.name == "loss")
        tracker.update_state(loss * keras.ops.cast(replicas, loss.dtype), sample_weight=batch)

    def _per_worker(self, logs):
        """Scalar logs as shape (1,) under a multi-worker strategy, which
        Keras 3.15 averages over the workers along axis 0."""
        if cluster.tf_strategy() is None or cluster.process_count() <= 1:
            return logs
        return {k: keras.ops.reshape(v, (1,)) if len(keras.ops.shape(v)) == 0 else v
                for k, v in logs.items()}

    # --- PyTorch: the metric states of every process --------------------------------------
    def get_metrics_result(self):
        """The metrics' results over every process: their states (totals and
        counts) summed over the processes for the reading, then restored."""
        if self._ddp is None:
            return super().get_metrics_result()
        import torch
        import torch.distributed as dist

        variables = list(self.metrics_variables)
        local = [v.value.detach().clone() for v in variables]
        if local:
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in local])
            dist.all_reduce(flat)  # SUM: totals and counts of every process
            for v, t, part in zip(variables, local, flat.split([t.numel() for t in local])):
                v.assign(part.reshape(t.shape).to(t.dtype))
        try:
            return super().get_metrics_result()
        finally:
            for v, t in zip(variables, local):
                v.assign(t)

    # --- the files are the model's -------------------------------------------------------
    def save(self, filepath, overwrite=True, **kwargs):
        """`model.save`: the wrapped model's `.keras` file."""
        return self.model.save(filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath, overwrite=True, **kwargs):
        """`model.save_weights`: the wrapped model's weights file."""
        return self.model.save_weights(filepath, overwrite=overwrite, **kwargs)

    def load_weights(self, filepath, **kwargs):
        """`model.load_weights`."""
        return self.model.load_weights(filepath, **kwargs)

    def export(self, filepath, *args, **kwargs):
        """`model.export`: the wrapped model's serving artefact."""
        return self.model.export(filepath, *args, **kwargs)

    def get_config(self):
        raise NotImplementedError("A DataParallelModel is not saved as such: save its `model` "
                                  "(`save` already does).")

    # --- construction checks -------------------------------------------------------------
    @staticmethod
    def _check_strategy(model):
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
        if not tf.distribute.has_strategy() or \
                not strategy.extended.variable_created_in_scope(model.variables[0].value):
            raise ValueError("Create, compile and wrap the model inside the strategy's scope "
                             "(`with kr.distribution.tf_strategy().scope():`, or a "
                             "MirroredStrategy's): its variables must be the strategy's.")
        optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        if optimizer.gradient_accumulation_steps and strategy.num_replicas_in_sync > 1:
            raise ValueError(
                f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps} under a "
                f"TensorFlow strategy of {strategy.num_replicas_in_sync} replicas: Keras 3.15's "
                "accumulation all-reduces inside a conditional, which tf.distribute cannot run "
                "(merge_call in a cond). Use a larger global batch over the replicas instead, or "
                "accumulate on JAX or PyTorch.")

    @staticmethod
    def _jit(model):
        """The model's `jit_compile`, off on a TensorFlow strategy over CPUs
        (XLA has no CPU collectives in TensorFlow 2.21)."""
        if keras.backend.backend() == "tensorflow" and model.jit_compile:
            import tensorflow as tf

            if not tf.config.list_logical_devices("GPU"):
                return False
        return model.jit_compile


def unwrapped(model):
    """The model a `DataParallelModel` trains, or `model` itself: what a
    callback reads the ViT's own methods from (`intermediates`, `blocks`)."""
    return model.model if isinstance(model, DataParallelModel) else model


def _ddp_module(model, options):
    import torch

    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **options)

