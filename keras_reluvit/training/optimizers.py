"""The recipe optimizers: Keras' AdamW, SGD and LAMB with what the recipes
add -- per-layer learning rates (layer decay), timm's EMA of the weights
with its warm-up, and timm's / apex's LAMB -- saved with the model."""

import contextlib

import keras

from keras_reluvit import _keras_compat as compat


def _eager_on_tensorflow():
    """TensorFlow's `init_scope` (eager inside a traced function); elsewhere
    nothing."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.init_scope()
    return contextlib.nullcontext()


class _RecipeOptimizer:
    """A Keras optimizer with what the recipes add to it.

    Layer-wise learning rates: the learning rate is multiplied per variable
    by `layer_scales[variable.path]` (1.0 where absent); the update step and
    the decoupled weight decay of each group of equal scales run through the
    optimizer's own code (every backend's, tf.distribute's included) with
    `learning_rate` scaled for that group.

    The weights' EMA as timm keeps it (`use_ema=True`, `ema_momentum` the
    decay d): the average starts as the initial weights and after update t
    (1, 2, ...) becomes `d_t * average + (1 - d_t) * weights`, `d_t = d`, or
    with `ema_warmup` timm's `ModelEmaV3` warm-up `min(d, 1 - t^(-2/3))` at update t (1
    at the first: the average starts as the trained weights; timm's train.py passes
    `step=num_updates`);
    micro-steps of gradient accumulation leave it. Keras' own EMA copies the
    weights at the first step and has no warm-up. The averages live in the
    optimizer's variables (a backup keeps them); `fit` does not swap them into
    the model at its end (a resumed run fits twice): `swap_ema(model)` does.
    """

    def __init__(self, *args, layer_scales=None, ema_warmup=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_scales = {str(k): float(v) for k, v in (layer_scales or {}).items()}
        self.ema_warmup = bool(ema_warmup)
        self._group_scale = 1.0

    def build(self, variables):
        super().build(variables)
        if self.use_ema:  # timm: the average starts as the model
            # TensorFlow's fit builds the optimizer while it traces the train
            # step: the copy runs now, eagerly (traced, the averages began at 0).
            with _eager_on_tensorflow():
                for v, average in zip(variables, compat.ema_averages(self)):
                    if average is not None:
                        average.assign(keras.ops.copy(v))  # its own buffer (JAX donates both)

    def _update_model_variables_moving_average(self, trainable_variables):
        if not self.use_ema:
            return
        ops = keras.ops
        steps = self.gradient_accumulation_steps or 1
        after = ops.cast(compat.micro_steps(self) + 1, "float32")  # micro-steps, this one too
        t = ops.floor(after / steps)  # updates so far, this one included
        decay = ops.cast(self.ema_momentum, "float32")
        if self.ema_warmup:  # ModelEmaV3.get_decay(step=t), as timm's train.py passes t
            decay = ops.minimum(decay, 1.0 - ops.power(ops.maximum(t, 1.0), -2.0 / 3.0))
        if steps > 1:  # a micro-step that updates nothing leaves the average
            decay = ops.where(ops.equal(ops.mod(after, steps), 0), decay, 1.0)
        for var, average in zip(trainable_variables, compat.ema_averages(self)):
            if average is not None:
                d = ops.cast(decay, var.dtype)
                average.assign(d * average + (1.0 - d) * var)

    def finalize_variable_values(self, var_list):
        """Keeps the trained weights (see the class docstring)."""

    def _get_current_learning_rate(self):
        lr = super()._get_current_learning_rate()
        return lr if self._group_scale == 1.0 else lr * self._group_scale

    def _groups(self, variables, grads=None):
        groups = {}
        for i, v in enumerate(variables):
            scale = self.layer_scales.get(getattr(v, "path", None), 1.0)
            g = groups.setdefault(scale, ([], []))
            g[0].append(v)
            g[1].append(None if grads is None else grads[i])
        return groups.items()

    def _apply_weight_decay(self, variables):
        for scale, (vs, _) in self._groups(variables):
            self._group_scale = scale
            try:
                super()._apply_weight_decay(vs)
            finally:
                self._group_scale = 1.0

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        for scale, (vs, gs) in self._groups(trainable_variables, grads):
            self._group_scale = scale
            try:
                super()._backend_update_step(gs, vs, self.learning_rate)
            finally:
                self._group_scale = 1.0

    def get_config(self):
        return {**super().get_config(), "layer_scales": self.layer_scales,
                "ema_warmup": self.ema_warmup}


@keras.saving.register_keras_serializable(package="keras_reluvit")
class RecipeAdamW(_RecipeOptimizer, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with per-variable learning-rate multipliers
    (`layer_scales`, e.g. `finetune.layer_decay_scales`) and timm's EMA of
    the weights (`use_ema`, `ema_momentum`, `ema_warmup`)."""


@keras.saving.register_keras_serializable(package="keras_reluvit")
class RecipeSGD(_RecipeOptimizer, keras.optimizers.SGD):
    """`keras.optimizers.SGD`, with the same additions as `RecipeAdamW`."""


@keras.saving.register_keras_serializable(package="keras_reluvit")
class RecipeLamb(_RecipeOptimizer, keras.optimizers.Lamb):
    """LAMB as timm's `Lamb` and apex's `FusedLAMB` (DeiT III's
    `--opt fusedlamb`) compute it, with the additions of `RecipeAdamW`.

    Per variable: Adam's bias-corrected step `m / (sqrt(v) + epsilon)` plus,
    for a variable that decays, `weight_decay * variable` (the decay inside
    the step, as theirs); that step is scaled by the trust ratio
    `||variable|| / ||step||` (1 where either norm is 0) for the decaying
    variables only -- the rest (biases, norms, LayerScale, embeddings) take
    Adam's step (apex's `use_nvlamb=False`, timm's `always_adapt=False`).
    `keras.optimizers.Lamb` decays apart from the step and scales every
    variable. Their built-in clipping of the global norm at 1.0 is
    `global_clipnorm` here (the recipes' `grad_clip`)."""

    def __init__(self, *args, epsilon=1e-6, **kwargs):
        super().__init__(*args, epsilon=epsilon, **kwargs)

    def _apply_weight_decay(self, variables):
        """Part of the step (`update_step`)."""

    def update_step(self, gradient, variable, learning_rate):
        ops = keras.ops
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        t = ops.cast(self.iterations + 1, variable.dtype)
        m, v = compat.adam_slots(self, variable)
        self.assign_add(m, (gradient - m) * (1.0 - self.beta_1))
        self.assign_add(v, (ops.square(gradient) - v) * (1.0 - self.beta_2))
        m_hat = m / (1.0 - ops.power(ops.cast(self.beta_1, variable.dtype), t))
        v_hat = v / (1.0 - ops.power(ops.cast(self.beta_2, variable.dtype), t))
        step = m_hat / (ops.sqrt(v_hat) + self.epsilon)
        if self.weight_decay and compat.uses_weight_decay(self, variable):
            step = step + ops.cast(self.weight_decay, variable.dtype) * variable
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            s_norm = ops.sqrt(ops.sum(ops.square(step)))
            ratio = ops.where((w_norm > 0) & (s_norm > 0), w_norm / s_norm, 1.0)
            step = ratio * step
        self.assign_sub(variable, lr * step)


@keras.saving.register_keras_serializable(package="keras_reluvit")
class LayerDecayAdamW(RecipeAdamW):
    """`RecipeAdamW` by its name in models saved before 0.2."""


@keras.saving.register_keras_serializable(package="keras_reluvit")
class LayerDecaySGD(RecipeSGD):
    """`RecipeSGD` by its name in models saved before 0.2."""


def swap_ema(model):
    """Swaps the weights' EMA (kept by a recipe optimizer with `use_ema`)
    and the model's trainable weights: call it once to evaluate, save or
    export the EMA, again to swap back."""
    optimizer = model.optimizer
    if optimizer is None or not getattr(optimizer, "use_ema", False):
        raise ValueError("The model's optimizer keeps no EMA of the weights (compile it with a "
                         "recipe and ema=, keras-reluvit train --ema DECAY).")
    for v, average in zip(model.trainable_variables, compat.ema_averages(optimizer)):
        if average is not None:
            value = keras.ops.copy(v.value)  # not a view: torch and TF assign in place
            v.assign(average)
            average.assign(value)
