"""Shared test helpers: per-backend autodiff, deterministic seeds."""

import os

import keras
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    yield


def backend_name():
    return keras.backend.backend()


def grads(fn, variables, inputs):
    """Gradients of scalar `fn(*inputs)` w.r.t. `inputs` (numpy arrays) and
    the Keras `variables`, computed by the current backend's autodiff.

    Returns (input_grads, variable_grads) as float64 numpy arrays.
    """
    b = backend_name()
    if b == "jax":
        import jax

        def f(values, xs):
            # Rebinding the variables' values makes them traced inputs.
            mapping = list(zip(variables, values))
            with keras.StatelessScope(state_mapping=mapping):
                return fn(*xs)

        values = [v.value for v in variables]
        gv, gx = jax.grad(f, argnums=(0, 1))(values, [np.asarray(x) for x in inputs])
    elif b == "tensorflow":
        import tensorflow as tf

        xs = [tf.convert_to_tensor(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            loss = fn(*xs)
        g = tape.gradient(loss, xs + [v.value for v in variables])
        gx, gv = g[: len(xs)], g[len(xs):]
    elif b == "torch":
        import torch

        xs = [torch.tensor(x, requires_grad=True) for x in inputs]
        for v in variables:
            v.value.grad = None
        loss = fn(*xs)
        loss.backward()
        gx = [x.grad for x in xs]
        gv = [v.value.grad for v in variables]
    else:  # pragma: no cover
        raise RuntimeError(b)
    to_np = lambda t: np.zeros(()) if t is None else np.asarray(
        keras.ops.convert_to_numpy(t), dtype="float64")
    return [to_np(t) for t in gx], [to_np(t) for t in gv]


def subprocess_env(backend):
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env
