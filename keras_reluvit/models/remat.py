"""Activation rematerialisation of the encoder blocks: `ViT(remat=...)`.

With `remat` on, each encoder block keeps only its input for the backward
pass and recomputes what it needs inside (the attention weights, the MLP's
hidden activations): the activation memory of a training step falls from
every block's intermediates to one block's, for about one more forward pass
of compute. big_vision's `remat_policy`, timm's `set_grad_checkpointing`.

Values:

- `None` / `False` / `"none"`: off (the default);
- `True` / `"full"`: recompute the whole block (JAX's `nothing_saveable`);
- a name of `jax.checkpoint_policies` (`"dots_saveable"`,
  `"dots_with_no_batch_dims_saveable"`, `"everything_saveable"`, ...): on
  JAX, what that policy saves is kept; on TensorFlow and PyTorch, which
  have no such policies, the block is recomputed whole (said in one line).

Through Keras' own `keras.remat` on TensorFlow (`tf.recompute_grad`) and
PyTorch (`torch.utils.checkpoint`, non-reentrant); `jax.checkpoint` with the
policy on JAX. The forward values and the gradients are those without remat.
"""

import keras

from keras_reluvit._logging import say

# jax.checkpoint_policies' policies (not the factories that take names).
JAX_POLICIES = (
    "nothing_saveable", "dots_saveable", "checkpoint_dots",
    "dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims",
    "everything_saveable",
)
_said = set()


def check(value):
    """`remat` canonical: None, `"full"` or a JAX policy name; a ValueError
    naming the choices otherwise."""
    if value in (None, False, "none"):
        return None
    if value is True or value in ("full", "nothing_saveable"):
        return "full"
    if isinstance(value, str) and value in JAX_POLICIES:
        return value
    raise ValueError(f"Unknown remat {value!r}: None (off), 'full' (True), or a "
                     f"jax.checkpoint_policies name: {', '.join(JAX_POLICIES)}.")


def rematerialised(fn, policy, layer):
    """`fn` (the call of `layer`: one tensor in, one out) recomputed in the
    backward pass. The recomputation draws the forward pass's random numbers
    (dropout masks): `layer`'s seed-generator states are replayed, not
    advanced again."""
    if policy is None:
        return fn
    seeds = [v for v in layer.variables if v.path.endswith("seed_generator_state")]
    if keras.backend.backend() == "jax":
        return _jax(fn, policy, layer, seeds)
    if policy != "full" and policy not in _said:
        _said.add(policy)
        say(f"remat={policy!r} is a JAX policy; on {keras.backend.backend()} "
            "each block is recomputed whole (remat='full').")

    def replay(x, *snapshot):
        for v, value in zip(seeds, snapshot):
            v.assign(value)
        return fn(x)

    recomputed = keras.remat(replay)

    def call(x):
        return recomputed(x, *[keras.ops.copy(v.value) for v in seeds])

    return call


def _jax(fn, policy, layer, seeds):
    """`jax.checkpoint` of `fn` with the layer's variables as explicit inputs
    and its seed states as outputs: a random draw inside must not leave the
    checkpointed trace as a side effect (a leaked tracer)."""
    import jax

    kept = None if policy == "full" else getattr(jax.checkpoint_policies, policy)
    variables = list(layer.variables)

    def inner(x, values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            y = fn(x)
            return y, [scope.get_current_value(v) for v in seeds]

    checkpointed = jax.checkpoint(inner, policy=kept)

    def call(x):
        y, states = checkpointed(x, [v.value for v in variables])
        for v, value in zip(seeds, states):
            v.assign(value)
        return y

    return call
