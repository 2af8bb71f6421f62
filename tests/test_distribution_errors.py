"""On backends without keras.distribution the helpers say what to use."""

import keras
import pytest

import keras_reluvit as kr


def test_distribution_helpers_on_this_backend():
    mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], ["cpu:0"])
    backend = keras.backend.backend()
    if backend == "jax":
        dist = kr.distribution.model_parallel(mesh, "fsdp")
        assert isinstance(dist, keras.distribution.ModelParallel)
        return
    with pytest.raises(RuntimeError) as e:
        kr.distribution.model_parallel(mesh, "fsdp")
    hint = "MirroredStrategy" if backend == "tensorflow" else "DistributedDataParallel"
    assert hint in str(e.value) and "JAX" in str(e.value).upper()
    with pytest.raises(RuntimeError):
        kr.distribution.data_parallel()
