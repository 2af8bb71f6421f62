"""The one seam between keras-reluvit and Keras' private code.

Everything the package uses of Keras that is not public API is called
through a function here, or -- where the package subclasses a Keras class
and overrides one of its protected methods -- declared in `OVERRIDDEN`.
`PRIVATE` lists each with where it is used; `check()` verifies every one
against the installed Keras on real objects (tests/test_keras_compat.py
runs it, so a Keras release that renames or removes one fails CI naming
it, instead of a training run failing later). `pyproject.toml` allows the
Keras versions in `CHECKED_ON`'s range.
"""

import keras

# The Keras releases `check()` passed on (CI: the pinned release;
# scripts/test-newest.sh: keras-nightly).
CHECKED_ON = ("3.15.1", "3.16.0.dev2026102704")

# name -> (what it is, where keras-reluvit uses it)
PRIVATE = {
    "Layer._flatten_layers": (
        "every sub-layer of a model, recursively", "export, vit, finetune"),
    "Variable._value": (
        "a variable's backing array, swapped for a gathered copy (JAX)",
        "distribution.cluster.chief_writes"),
    "Trainer._symbolic_build / _maybe_symbolic_build": (
        "builds a model's metrics and optimizer state from a data spec",
        "distribution.tf_multi_worker.multi_worker, backup.fit (a resumed epoch's metrics)"),
    "Trainer._compute_loss / _loss_tracker / _call_has_training_arg": (
        "what Keras' torch train_step calls", "distribution.torch_ddp (DDP's train step)"),
    "backend.tensorflow.trainer.reduce_per_replica / _collective_all_reduce_multi_worker": (
        "how Keras' TensorFlow trainer averages logs over replicas",
        "distribution.tf_multi_worker (tensorflow/tensorflow#72388)"),
    "Optimizer._all_reduce_sum_gradients / _clip_gradients": (
        "TensorFlow's optimizer: the all-reduce and the clipping",
        "distribution.tf_multi_worker.clip_after_all_reduce"),
    "Trainer._initial_epoch": (
        "the epoch `fit` starts at, set by a callback's `on_train_begin` (as Keras' "
        "BackupAndRestore does)", "backup.StepBackup, callbacks.ResumeDataStream"),
    "RandAugment._AUGMENT_LAYERS": (
        "the names of RandAugment's sub-layers", "data.augment.switch_randaugment"),
    "BaseImagePreprocessingLayer.backend.set_backend": (
        "the ops a preprocessing layer computes with (TensorFlow inside tf.data)",
        "data.augment.switch_randaugment"),
    "Equalization._custom_histogram_fixed_width": (
        "Equalization's histogram (bound per instance)", "data.augment"),
    "SeedGenerator.next": (
        "the draw Keras' random layers ask a seed generator for", "data.augment._keyed"),
    "Optimizer._model_variables_moving_average / _iterations": (
        "the EMA of the weights an optimizer built with `use_ema` keeps; its step count in "
        "micro-steps (`iterations` counts updates under gradient accumulation)",
        "recipes (RecipeAdamW / RecipeSGD, swap_ema)"),
    "MultiHeadAttention private attributes": (
        "_query_dense, _key_dense, _value_dense, _output_dense, _num_heads, _key_dim, "
        "_value_dim, _use_bias, _dropout, _attention_axes, _output_shape",
        "kernels.torch_fast (the fused projections)"),
}

# Protected methods keras-reluvit's subclasses override: class -> methods.
OVERRIDDEN = {
    "keras.layers.MultiHeadAttention": ("_compute_attention", "_make_output_dense"),
    "keras.optimizers.Optimizer": ("_get_current_learning_rate", "_apply_weight_decay",
                                   "_backend_update_step",
                                   "_update_model_variables_moving_average"),
}


# --- the accessors -----------------------------------------------------------------
def flatten_layers(model, include_self=True):
    """Every layer of `model`, nested ones included (Keras' own walk)."""
    return model._flatten_layers(include_self=include_self)


def variable_value(variable):
    """A variable's backing array, without Keras' conversion."""
    return variable._value


def set_variable_value(variable, value):
    """Replaces a variable's backing array in place (no assign, no cast)."""
    variable._value = value


def symbolic_build(model, data_spec):
    """Builds `model`'s metrics and optimizer state from a data spec, and
    stops `fit` from building them again from a batch."""
    model._symbolic_build(data_batch=data_spec)
    model._maybe_symbolic_build = lambda *args, **kwargs: None


def build_metrics(model, data_spec):
    """Builds the compiled metrics' state now (Keras' TensorFlow trainer
    otherwise builds it while tracing the first step), so that a resumed
    epoch's running means can be restored before its first step. (TensorFlow
    only: on JAX a symbolic build before `fit` changed the resumed run's
    numbers; the JAX and torch trainers build the metrics before
    `on_train_begin` anyway.)"""
    if not all(getattr(m, "built", True) for m in model.metrics):
        model._symbolic_build(data_batch=data_spec)


def compute_loss(model, x, y, y_pred, sample_weight):
    """The loss as Keras' own train step computes it (losses of layers and
    regularisers included)."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                               training=True)


def loss_tracker(model):
    """The metric that averages the logged loss."""
    return model._loss_tracker


def call_has_training_arg(model):
    """Whether `model.call` takes `training`."""
    return model._call_has_training_arg


def tf_trainer():
    """Keras' TensorFlow trainer module."""
    from keras.src.backend.tensorflow import trainer

    return trainer


def tf_is_multi_worker(strategy):
    """Whether `strategy` all-reduces over several workers (Keras' test)."""
    return tf_trainer()._collective_all_reduce_multi_worker(strategy)


def tf_all_reduce_and_clip(optimizer):
    """The TensorFlow optimizer's (all-reduce, clip) pair of methods."""
    return optimizer._all_reduce_sum_gradients, optimizer._clip_gradients


def tf_set_all_reduce(optimizer, fn):
    optimizer._all_reduce_sum_gradients = fn


def randaugment_layers(layer):
    """The names of a `keras.layers.RandAugment`'s sub-layers."""
    return list(layer._AUGMENT_LAYERS)


def compute_with(layer, backend):
    """Makes a Keras preprocessing layer compute with `backend`'s ops."""
    layer.backend.set_backend(backend)


def histogram_hook(layer):
    """Whether `layer` (Equalization) has a histogram function to replace."""
    return hasattr(layer, "_custom_histogram_fixed_width")


def set_histogram(layer, fn):
    layer._custom_histogram_fixed_width = fn


def ema_averages(optimizer):
    """The EMA variables of an optimizer built with `use_ema` (one per
    trainable variable, in their order)."""
    return optimizer._model_variables_moving_average


def micro_steps(optimizer):
    """The steps an optimizer has taken, each micro-step of gradient
    accumulation counted (`iterations` counts the updates)."""
    return optimizer._iterations


def initial_epoch(model):
    return int(getattr(model, "_initial_epoch", None) or 0)


def set_initial_epoch(model, epoch):
    model._initial_epoch = None if epoch is None else int(epoch)


def histogram_is_set(layer):
    return "_custom_histogram_fixed_width" in vars(layer)


# --- the guard -------------------------------------------------------------------------
def _checks():
    import numpy as np

    layers = keras.layers

    def model():
        m = keras.Sequential([keras.Input((2,)), layers.Dense(1)])
        m.compile("sgd", "mse")
        return m

    def flatten():
        m = model()
        names = [type(x).__name__ for x in flatten_layers(m, include_self=False)]
        assert names[-1] == "Dense" and "Sequential" not in names, names
        assert type(flatten_layers(m)[0]).__name__ == "Sequential"

    def value():
        v = keras.Variable(np.zeros(2, "float32"))
        set_variable_value(v, variable_value(v))
        assert np.asarray(keras.ops.convert_to_numpy(v)).shape == (2,)

    def trainer():
        m = model()
        for name in ("_symbolic_build", "_compute_loss"):
            assert callable(getattr(m, name)), name
        m(np.zeros((1, 2), "float32"))
        assert loss_tracker(m) is not None and call_has_training_arg(m) in (True, False)

    def initial():
        import inspect

        m = model()
        set_initial_epoch(m, 2)
        assert initial_epoch(m) == 2
        fit = inspect.getsource(type(m).fit)  # the backend trainer's fit reads it
        assert "self._initial_epoch or initial_epoch" in fit, "fit no longer reads _initial_epoch"

    def tensorflow():
        if keras.backend.backend() != "tensorflow":
            return
        assert callable(model()._maybe_symbolic_build)
        assert callable(tf_trainer().reduce_per_replica)
        assert callable(tf_trainer()._collective_all_reduce_multi_worker)
        assert all(map(callable, tf_all_reduce_and_clip(keras.optimizers.SGD())))

    def augment():
        r = layers.RandAugment(value_range=(0, 255))
        names = randaugment_layers(r)
        assert "equalization" in names and all(hasattr(r, n) for n in names), names
        eq = getattr(r, "equalization")
        assert hasattr(eq.backend, "set_backend") and histogram_hook(eq)
        assert callable(keras.random.SeedGenerator(0).next)

    def attention():
        mha = layers.MultiHeadAttention(2, 4)
        mha(np.zeros((1, 3, 8), "float32"), np.zeros((1, 3, 8), "float32"))
        for name in ("_query_dense", "_key_dense", "_value_dense", "_output_dense",
                     "_num_heads", "_key_dim", "_value_dim", "_use_bias", "_dropout",
                     "_attention_axes", "_output_shape"):
            assert hasattr(mha, name), name

    def ema():
        v = keras.Variable(np.ones(2, "float32"))
        optimizer = keras.optimizers.SGD(use_ema=True)
        optimizer.build([v])
        assert len(ema_averages(optimizer)) == 1
        assert tuple(ema_averages(optimizer)[0].shape) == (2,)
        accumulating = keras.optimizers.SGD(gradient_accumulation_steps=2)
        accumulating.build([v])
        accumulating.apply([keras.ops.ones(2)], [v])
        assert int(keras.ops.convert_to_numpy(micro_steps(accumulating))) == 1
        assert int(keras.ops.convert_to_numpy(accumulating.iterations)) == 0

    def overridden():
        classes = {"keras.layers.MultiHeadAttention": layers.MultiHeadAttention,
                   "keras.optimizers.Optimizer": keras.optimizers.Optimizer}
        for cls, methods in OVERRIDDEN.items():
            for m in methods:
                assert callable(getattr(classes[cls], m, None)), f"{cls}.{m}"

    return dict(flatten_layers=flatten, variable_value=value, trainer=trainer,
                initial_epoch=initial, ema_averages=ema,
                tensorflow=tensorflow, augment=augment, attention=attention,
                overridden=overridden)


def check():
    """{check name: error} for every private API the installed Keras lacks or
    changed (empty when all hold)."""
    failed = {}
    for name, fn in _checks().items():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - each check reports what broke
            failed[name] = f"{type(e).__name__}: {e}"
    return failed
