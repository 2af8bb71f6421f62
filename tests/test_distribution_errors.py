"""On backends without keras.distribution the helpers say what to use, and
the torch / TensorFlow cluster helpers check what they are given. (The
clusters themselves run in tests/once/test_engines.py.)"""

import keras
import numpy as np
import pytest

import keras_reluvit as kr

BACKEND = keras.backend.backend()


def test_distribution_helpers_on_this_backend():
    mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], ["cpu:0"])
    if BACKEND == "jax":
        dist = kr.distribution.model_parallel(mesh, "fsdp")
        assert isinstance(dist, keras.distribution.ModelParallel)
        return
    with pytest.raises(RuntimeError) as e:
        kr.distribution.model_parallel(mesh, "fsdp")
    # pointed to this backend's own data-parallel engine
    hints = {"tensorflow": ["MirroredStrategy", "TF_CONFIG", "kr.distribution.multi_worker"],
             "torch": ["DistributedDataParallel", "torchrun", "kr.distribution.ddp"]}[BACKEND]
    for hint in hints:
        assert hint in str(e.value)
    assert "KERAS_BACKEND=jax" in str(e.value)
    with pytest.raises(RuntimeError):
        kr.distribution.data_parallel()


def test_shard_gives_every_process_the_same_number_of_elements():
    import tensorflow as tf

    ds = tf.data.Dataset.range(11)
    shards = [list(kr.distribution.shard(ds, i, 3).as_numpy_iterator()) for i in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 9, 10 dropped: 3 steps each
    x, y = np.arange(10), np.arange(10) * 2
    assert [a.tolist() for a in kr.distribution.shard((x, y), 1, 4)] == [[1, 5], [2, 10]]
    assert kr.distribution.shard(ds, 0, 1) is ds
    with pytest.raises(TypeError, match="Cannot shard a dict"):
        kr.distribution.shard({"x": x}, 0, 2)


def test_cluster_arguments_are_checked():
    if BACKEND == "tensorflow":  # the cluster is TF_CONFIG's
        with pytest.raises(ValueError, match="TF_CONFIG's"):
            kr.distribution.initialize("127.0.0.1:1", num_processes=2, process_id=0)
        return
    with pytest.raises(ValueError, match="all of coordinator"):
        kr.distribution.initialize("127.0.0.1:1", num_processes=2)
    with pytest.raises(ValueError, match="process_id 2 is out of range"):
        kr.distribution.initialize("127.0.0.1:1", num_processes=2, process_id=2)


def test_cli_says_what_a_torch_or_tensorflow_cluster_cannot_do(tmp_path, capsys):
    """keras.distribution layouts are JAX's; FSDP2 cannot shard Keras' torch
    variables; a TensorFlow cluster is TF_CONFIG's."""
    from keras_reluvit import cli

    base = ["train", "--output", str(tmp_path / "x"), "--no-export"]
    if BACKEND == "jax":
        return
    for args, message in [(["--sharding", "fsdp"], f"--sharding fsdp is not available on "
                                                   f"{BACKEND}"),
                          (["--mesh", "batch=2"], "runs on JAX only")]:
        assert cli.main(base + args) == 2
        assert message in capsys.readouterr().err
    if BACKEND == "torch":
        assert cli.main(base + ["--sharding", "fsdp"]) == 2
        assert "FSDP2" in capsys.readouterr().err
        assert cli.main(base + ["--sharding", "tensor"]) == 2
        assert "DistributedDataParallel replicates every weight" in capsys.readouterr().err
    else:
        assert cli.main(base + ["--coordinator", "127.0.0.1:1"]) == 2
        assert "not --coordinator" in capsys.readouterr().err


if BACKEND == "torch":

    def test_torch_needs_torchrun_or_a_coordinator(monkeypatch):
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(k, raising=False)
        with pytest.raises(ValueError, match="No torchrun cluster: RANK, WORLD_SIZE"):
            kr.distribution.initialize()
        with pytest.raises(RuntimeError, match="kr.distribution.initialize\\(\\) first"):
            kr.distribution.ddp(keras.Sequential([keras.layers.Dense(2)]))

    def test_fsdp2_leaves_keras_variables_unsharded(tmp_path):
        """Why `--sharding fsdp` is refused on torch (docs/distribution.md):
        FSDP2's fully_shard registers sharded DTensors on the module, while
        the Keras variables the layers compute with keep the full tensors."""
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])
        model(np.zeros((1, 3), "float32"))
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                                world_size=1, rank=0)
        try:
            fully_shard(model)
            params = list(model.parameters())
            assert params and all(type(p).__name__ == "DTensor" for p in params)
            for v in model.weights:
                assert type(v.value).__name__ == "Parameter"
                assert not any(p is v.value for p in params)
        finally:
            dist.destroy_process_group()

    def test_ddp_step_is_keras_step_in_a_one_process_group(tmp_path):
        """ddp() wraps the model in a DataParallelModel whose forward pass
        runs DistributedDataParallel; in a cluster of one (the all-reduce is
        the identity) it must train exactly as Keras' own torch step, metrics
        included, rebinding nothing of the model, and save the model's own
        file."""
        import torch.distributed as dist

        x = np.random.default_rng(0).normal(size=(64, 16, 16, 3)).astype("float32")
        y = keras.utils.to_categorical(np.arange(64) % 5, 5)

        def run(wrap):
            keras.utils.set_random_seed(1)
            model = kr.ViT(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=4,
                           image_size=16, num_classes=5, head_bias_init=0.1, dropout=0.1)
            model(x[:1])
            data = (x, y)
            model.compile(keras.optimizers.AdamW(1e-3),
                          keras.losses.CategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
            trained = model
            if wrap:  # the notebook form: the wrapper and this process' shard (all of it)
                trained, data = kr.distribution.ddp(model, data)
                assert isinstance(trained, kr.distribution.DataParallelModel)
                assert trained.optimizer is model.optimizer
                with pytest.raises(ValueError, match="compile the model"):
                    trained.compile(keras.optimizers.SGD(0.1), "mse")  # would train apart
                with pytest.raises(TypeError, match="DataParallelModel already"):
                    kr.distribution.ddp(trained)
            history = trained.fit(*data, batch_size=16, epochs=2, shuffle=False, verbose=0)
            assert not {"train_step", "get_metrics_result", "call"} & set(vars(model))
            if wrap:  # the files are the ViT's: read by a ViT
                trained.save(tmp_path / "saved.keras")
                loaded = keras.saving.load_model(tmp_path / "saved.keras")
                assert type(loaded) is kr.ViT
                np.testing.assert_array_equal(loaded.predict(x[:4], verbose=0),
                                              model.predict(x[:4], verbose=0))
                trained.save_weights(tmp_path / "w.weights.h5")
                fresh = kr.ViT(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=4,
                               image_size=16, num_classes=5)
                fresh.load_weights(tmp_path / "w.weights.h5")
                np.testing.assert_array_equal(fresh.predict(x[:4], verbose=0),
                                              model.predict(x[:4], verbose=0))
                # The metric states are summed over the processes when read, then put
                # back: a second process with the same states (all_reduce doubling them)
                # leaves every mean as it is and the local states unchanged.
                import torch
                import torch.distributed as D

                local = [keras.ops.convert_to_numpy(v) for v in trained.metrics_variables]
                alone = {k: float(v) for k, v in trained.get_metrics_result().items()}
                calls, real = [], D.all_reduce

                def twice(t, *args, **kwargs):
                    calls.append(t.dtype)
                    t.mul_(2)

                D.all_reduce = twice
                try:
                    both = {k: float(v) for k, v in trained.get_metrics_result().items()}
                finally:
                    D.all_reduce = real
                assert calls == [torch.float64] and both == pytest.approx(alone, rel=1e-12)
                for v, before in zip(trained.metrics_variables, local):
                    np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), before)
            return model, history.history

        plain, h0 = run(False)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                                world_size=1, rank=0)
        try:
            with pytest.raises(ValueError, match="Build the model"):
                kr.distribution.ddp(keras.Sequential([keras.layers.Dense(2)]))
            built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            with pytest.raises(ValueError, match="Compile the model"):
                kr.distribution.ddp(built)
            built.compile("sgd", "mse")
            compile_ = keras.Model.compile
            try:  # a compile that drops the model's optimizer: the model would not train
                keras.Model.compile = lambda self, **k: compile_(self, **dict(k, optimizer="sgd"))
                with pytest.raises(RuntimeError, match="did not keep the model's optimizer"):
                    kr.distribution.ddp(built)
            finally:
                keras.Model.compile = compile_
            wrapped, h1 = run(True)
            assert kr.distribution.process_count() == 1 and kr.distribution.describe() == {
                "type": "DistributedDataParallel", "processes": 1, "process_group": "gloo"}
        finally:
            dist.destroy_process_group()
        for k in h0:
            np.testing.assert_allclose(h1[k], h0[k], rtol=1e-6, err_msg=k)
        for a, b in zip(wrapped.weights, plain.weights):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(a),
                                       keras.ops.convert_to_numpy(b), rtol=1e-5, atol=1e-7)
        assert h0["loss"][1] < h0["loss"][0]  # it trained

if BACKEND == "tensorflow":

    def test_tensorflow_cluster_comes_from_a_valid_tf_config(monkeypatch):
        monkeypatch.delenv("TF_CONFIG", raising=False)
        with pytest.raises(ValueError, match="TF_CONFIG is not set"):
            kr.distribution.initialize()
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}}')
        with pytest.raises(ValueError, match="TF_CONFIG must be JSON with cluster.worker"):
            kr.distribution.initialize()
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, '
                                        '"task": {"type": "worker", "index": 3}}')
        with pytest.raises(ValueError, match="not one of the 1 workers"):
            kr.distribution.initialize()
        with pytest.raises(RuntimeError, match="No TensorFlow cluster"):
            kr.distribution.multi_worker(keras.Sequential([keras.layers.Dense(2)]), None)


def test_the_engine_holds_the_backend_branches(monkeypatch):
    """`kr.distribution.Engine()`: the backend's engine by name; outside a
    cluster its scope, preparation and data are the plain ones; what it
    cannot do of the command line is refused naming it."""
    engine = kr.distribution.Engine()
    assert engine.backend == BACKEND
    assert engine.name == {"jax": "keras.distribution", "torch": "DistributedDataParallel",
                           "tensorflow": "MultiWorkerMirroredStrategy"}[BACKEND]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert not engine.launched() and engine.join() is False
    train, val = object(), object()
    assert engine.distribute(None, train, val) == (train, val)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with engine.scope():
        model.compile("sgd", "mse")
    assert engine.wrap(model) is model
    assert engine.layout() is None  # no mesh asked for, no cluster
    if BACKEND == "jax":
        engine.check(mesh="batch=1", sharding="fsdp")
    else:
        with pytest.raises(ValueError, match="runs on JAX only"):
            engine.check(mesh="batch=1")
        with pytest.raises(ValueError, match="--sharding fsdp is not available"):
            engine.check(sharding="fsdp")
    if BACKEND == "tensorflow":  # Keras' accumulation cannot run under tf.distribute
        engine.check(accum_steps=4)  # one process: fine
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, '
                                        '"task": {"type": "worker", "index": 0}}')
        with pytest.raises(ValueError, match="--accum-steps 4 in a TensorFlow cluster"):
            engine.check(accum_steps=4)
        engine.check(accum_steps=1)
        monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("WORLD_SIZE", "2")
    if BACKEND != "torch":
        with pytest.raises(ValueError, match="KERAS_BACKEND=torch"):
            engine.check()
    else:
        assert engine.launched()
        engine.check(accum_steps=4)  # Keras' accumulation runs under DDP
