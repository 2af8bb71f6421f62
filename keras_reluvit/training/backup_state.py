"""What a step backup holds of the model: its state as lists in variable
order, written and read as one Orbax checkpoint on JAX (each process its
shards; restored onto any mesh), and the metric states (the running means of
the epoch in progress) kept beside the weights elsewhere. `backup.StepBackup`
writes and reads them."""

import os

import keras


def orbax_v1():
    try:
        import orbax.checkpoint
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "The backups of JAX runs are Orbax checkpoints: pip install orbax-checkpoint "
            "(keras-reluvit[jax] installs it).", name="orbax") from e
    return orbax.checkpoint.v1


def state_lists(model, leaf, metrics=False):
    """The model's state as lists in variable order, as `save_weights` keeps
    it (Keras' own state tree is keyed by names that carry a counter per
    process: `adam_w_2`); `metrics`: the metric states alone."""
    if metrics:
        return [leaf(v) for v in model.metrics_variables]
    optimizer = model.optimizer.variables if model.optimizer is not None else []
    return {"variables": [leaf(v) for v in model.variables],
            "optimizer": [leaf(v) for v in optimizer]}


def load_state(model, path, metrics=False):
    """Loads the Orbax checkpoint `path` into `model`, each array placed as
    the model's own variable is (its current mesh, devices and processes);
    returns the metric states it holds (to assign as the resumed epoch
    begins: Keras resets them then) when `metrics`, else None."""
    import jax

    ocp = orbax_v1()

    def abstract(v):
        return jax.ShapeDtypeStruct(tuple(v.shape), v.value.dtype, sharding=v.value.sharding)

    target = {"pytree": state_lists(model, abstract)}
    if metrics and model.metrics_variables:
        target["running_means"] = state_lists(model, abstract, metrics=True)
    try:
        state = ocp.load_checkpointables(os.path.abspath(path), target)
    except (ValueError, KeyError, TypeError) as e:
        cause = e
        while cause.__cause__ or cause.__context__:
            cause = cause.__cause__ or cause.__context__
        counts = {k: len(v) for k, v in target["pytree"].items()}
        counts["metrics"] = len(model.metrics_variables)
        raise ValueError(f"The backup {path} does not fit this model, whose state holds "
                         f"{counts} arrays (another architecture, optimizer or metrics?): "
                         f"{str(cause)[:400]}") from e
    for k, variables in state_lists(model, lambda v: v).items():
        for v, value in zip(variables, state["pytree"][k]):
            v.assign(value)
    return state.get("running_means") if metrics else None


def metric_states(model):
    """The values of the model's metric states (the running means of the
    epoch in progress) for a TensorFlow or torch backup, or None where they
    are spread over a TensorFlow strategy's workers: not saved there. (JAX
    keeps them in its Orbax checkpoint.)"""
    from keras_reluvit import distribution as kr_distribution

    if keras.backend.backend() == "tensorflow" and kr_distribution.tf_strategy() is not None:
        return None
    return [keras.ops.convert_to_numpy(v.value) for v in model.metrics_variables]
