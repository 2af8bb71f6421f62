"""The one seam between keras-reluvit and Keras' private code.

Everything the package uses of Keras that is not public API is called
through a function here, or -- where the package subclasses a Keras class
and overrides one of its protected methods -- declared in `OVERRIDDEN`.
`PRIVATE` lists each with where it is used; `check()` verifies every one
against the installed Keras on real objects (tests/test_keras_compat.py
runs it, so a Keras release that renames or removes one fails CI naming
it, instead of a training run failing later; it also scans every other
module for a private name Keras' own source defines, so a new use outside
this seam fails too). `pyproject.toml` allows the
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
    "Trainer._symbolic_build": (
        "builds a model's metrics and optimizer state from a data spec",
        "distribution.tf_multi_worker.multi_worker, backup.fit (a resumed epoch's metrics)"),
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
        "the draw Keras' random layers ask a seed generator for (overridden)",
        "data.augment.KeyedSeedGenerator"),
    "Optimizer._model_variables_moving_average / _iterations": (
        "the EMA of the weights an optimizer built with `use_ema` keeps; its step count in "
        "micro-steps (`iterations` counts updates under gradient accumulation)",
        "recipes (RecipeAdamW / RecipeSGD, swap_ema)"),
    "MultiHeadAttention._use_gate / _sliding_window / _output_shape": (
        "the gate, the sliding window and the output shape a MultiHeadAttention was "
        "made with (its other settings are public properties)",
        "kernels.torch_fast.attention_eligible"),
    "MultiHeadAttention._flash_attention / _dropout_layer": (
        "its flash switch (read by `_compute_attention`); its attention-weights dropout",
        "attention.PointwiseAttention"),
    "Dense._kernel / EinsumDense._kernel": (
        "the kernel variable itself (`kernel` computes the LoRA / quantized kernel)",
        "kernels.torch_fast.plain_dense"),
    "tensor._keras_mask": (
        "the Keras mask attached to a (torch / TensorFlow) tensor",
        "kernels.torch_fast.attention_eligible"),
    "Optimizer._momentums / _velocities / _get_variable_index / _use_weight_decay": (
        "Adam's and LAMB's moment slots of a variable; whether the optimizer decays it",
        "recipes.RecipeLamb.update_step"),
}

# Protected methods keras-reluvit's subclasses override: class -> methods.
OVERRIDDEN = {
    # SymbolicBuildOnce (keras-team/keras#20585; TensorFlow's trainer only)
    "keras.Model": ("_maybe_symbolic_build",),
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
    """Builds `model`'s metrics and optimizer state from a data spec (a
    `SymbolicBuildOnce` model then skips Keras' build from a batch)."""
    model._symbolic_build(data_batch=data_spec)


class SymbolicBuildOnce:
    """A Keras model mixin for a bug no public hook reaches: under a
    `MultiWorkerMirroredStrategy` of several workers, Keras 3.15's TensorFlow
    `fit` builds the model from the first batch of already distributed data
    (`distribute_datasets_from_function`), averaging its per-replica values
    with `strategy.reduce`, which fails ("Attempt to convert a value
    (PerReplica ...) with an unsupported type to a Tensor";
    keras-team/keras#20585). A model whose state is built (`symbolic_build`
    from the data's element spec) skips that build; an unbuilt one gets
    Keras' own. tests/once/test_engines.py (the SIGTERM cluster's workers)
    fails once Keras' own build succeeds there, to retire this."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if state_built(self):
            return None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def state_built(model):
    """Whether `model`, its compiled metrics and its optimizer are built."""
    optimizer = getattr(model, "optimizer", None)
    return bool(model.built and all(getattr(m, "built", True) for m in model.metrics)
                and (optimizer is None or optimizer.built))


def build_metrics(model, data_spec):
    """Builds the compiled metrics' state now (Keras' TensorFlow trainer
    otherwise builds it while tracing the first step), so that a resumed
    epoch's running means can be restored before its first step. (TensorFlow
    only: on JAX a symbolic build before `fit` changed the resumed run's
    numbers; the JAX and torch trainers build the metrics before
    `on_train_begin` anyway.)"""
    if not all(getattr(m, "built", True) for m in model.metrics):
        model._symbolic_build(data_batch=data_spec)


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


def adam_slots(optimizer, variable):
    """The (first, second) moment slots an Adam-family optimizer (Adam,
    AdamW, Lamb) keeps for `variable`."""
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def uses_weight_decay(optimizer, variable):
    """Whether `optimizer` decays `variable` (not excluded by
    `exclude_from_weight_decay`)."""
    return optimizer._use_weight_decay(variable)


def dense_kernel(dense):
    """The kernel variable of a `Dense` / `EinsumDense` (None where it has
    none); `dense.kernel` computes the LoRA-merged or dequantized kernel."""
    return getattr(dense, "_kernel", None)


def keras_mask(x):
    """The Keras mask attached to tensor `x` as an attribute (torch,
    TensorFlow), else None."""
    return getattr(x, "_keras_mask", None)


def mha_use_gate(layer):
    """Whether a `MultiHeadAttention` was made with `use_gate=True`."""
    return layer._use_gate


def mha_sliding_window(layer):
    """A `MultiHeadAttention`'s `sliding_window` (None: none)."""
    return getattr(layer, "_sliding_window", None)


def mha_output_shape(layer):
    """A `MultiHeadAttention`'s `output_shape` (None: the query's last axis)."""
    return layer._output_shape


def disable_flash_attention(layer):
    """Turns a `MultiHeadAttention`'s flash attention off (its constructor
    takes Keras' global switch when `flash_attention` is None)."""
    layer._flash_attention = False


def attention_dropout(layer, weights, training):
    """A built `MultiHeadAttention`'s dropout of the attention weights."""
    return layer._dropout_layer(weights, training=training)


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
        assert callable(m._symbolic_build)
        assert not state_built(m)  # the optimizer is built by the first step
        m.fit(np.zeros((2, 2), "float32"), np.zeros((2, 1), "float32"), verbose=0)
        assert state_built(m)

    def initial():
        m = model()
        seen = []

        class Resumes(keras.callbacks.Callback):  # as StepBackup resumes a plain fit
            def on_train_begin(self, logs=None):
                set_initial_epoch(self.model, 2)
                assert initial_epoch(self.model) == 2

            def on_epoch_begin(self, epoch, logs=None):
                seen.append(epoch)

        m.fit(np.zeros((2, 2), "float32"), np.zeros((2, 1), "float32"), epochs=3, verbose=0,
              callbacks=[Resumes()])
        assert seen == [2], f"fit no longer starts at _initial_epoch set in on_train_begin: {seen}"

    def tensorflow():
        if keras.backend.backend() != "tensorflow":
            return
        assert callable(model()._symbolic_build)

    def augment():
        r = layers.RandAugment(value_range=(0, 255))
        names = randaugment_layers(r)
        assert "equalization" in names and all(hasattr(r, n) for n in names), names
        eq = getattr(r, "equalization")
        assert hasattr(eq.backend, "set_backend") and histogram_hook(eq)
        assert callable(keras.random.SeedGenerator(0).next)

    def attention():
        import inspect

        x = np.ones((1, 3, 8), "float32")
        mha = layers.MultiHeadAttention(2, 4, dropout=0.5)
        mha(x, x)
        assert mha_use_gate(mha) is False and mha_output_shape(mha) is None
        assert mha_sliding_window(mha) is None
        weights = keras.ops.ones((1, 2, 3, 3))
        dropped = keras.ops.convert_to_numpy(attention_dropout(mha, weights, training=True))
        assert dropped.shape == (1, 2, 3, 3) and (dropped == 0).any(), "no attention dropout"
        kept = keras.ops.convert_to_numpy(attention_dropout(mha, weights, training=False))
        assert (kept == 1).all()
        sliding = "sliding_window" in inspect.signature(layers.MultiHeadAttention).parameters
        other = layers.MultiHeadAttention(2, 4, use_gate=True, output_shape=5,
                                          **({"sliding_window": 2} if sliding else {}))
        assert mha_use_gate(other) is True and tuple(mha_output_shape(other)) == (5,)
        assert mha_sliding_window(other) == (2 if sliding else None), "sliding_window renamed"
        # The flash switch: with it on, asking for the scores is an error; off, it is not.
        flash = layers.MultiHeadAttention(2, 4, flash_attention=True)
        try:
            flash(x, x, return_attention_scores=True)
        except ValueError:
            pass
        else:
            raise AssertionError("MultiHeadAttention no longer reads `_flash_attention`")
        disable_flash_attention(flash)
        flash(x, x, return_attention_scores=True)

    def dense():
        d = layers.Dense(2)
        d.build((None, 3))
        e = layers.EinsumDense("ab,bc->ac", output_shape=2)
        e.build((None, 3))
        for layer in (d, e):  # a plain float layer's `kernel` is the variable itself
            assert isinstance(dense_kernel(layer), keras.Variable), type(layer).__name__
            assert dense_kernel(layer) is layer.kernel, type(layer).__name__

    def mask():
        out = layers.Masking()(np.ones((1, 2, 3), "float32"))
        if keras.backend.backend() in ("torch", "tensorflow"):  # (JAX keeps it elsewhere)
            assert keras_mask(out) is not None, "no `_keras_mask` on a masked tensor"

    def adam():
        w = keras.Variable(np.ones(2, "float32"), name="w")
        b = keras.Variable(np.ones(1, "float32"), name="bias")
        for cls in (keras.optimizers.Lamb, keras.optimizers.AdamW):
            optimizer = cls(weight_decay=0.1)
            optimizer.exclude_from_weight_decay(var_names=["bias"])
            optimizer.build([w, b])
            optimizer.apply([keras.ops.ones(2), keras.ops.ones(1)], [w, b])
            m, v = adam_slots(optimizer, w)
            assert tuple(m.shape) == tuple(v.shape) == (2,), cls.__name__
            for slot in (m, v, *adam_slots(optimizer, b)):  # the slots the step updated
                assert (keras.ops.convert_to_numpy(slot) > 0).all(), cls.__name__
            assert uses_weight_decay(optimizer, w) and not uses_weight_decay(optimizer, b)

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
        classes = {"keras.Model": keras.Model,
                   "keras.layers.MultiHeadAttention": layers.MultiHeadAttention,
                   "keras.optimizers.Optimizer": keras.optimizers.Optimizer}
        for cls, methods in OVERRIDDEN.items():
            if cls == "keras.Model" and keras.backend.backend() != "tensorflow":
                continue  # (TensorFlow's trainer only)
            for m in methods:
                assert callable(getattr(classes[cls], m, None)), f"{cls}.{m}"

    return dict(flatten_layers=flatten, variable_value=value, trainer=trainer,
                initial_epoch=initial, ema_averages=ema,
                tensorflow=tensorflow, augment=augment, attention=attention,
                dense_kernel=dense, keras_mask=mask,
                adam_slots=adam, overridden=overridden)


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
