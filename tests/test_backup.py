"""Long runs on the current backend: step backups (kept, pruned, written
atomically, the newest unreadable one passed over), SIGTERM mid-epoch (saved,
then resumed to the uninterrupted run's end), a loss that turns NaN, and
gradient accumulation (K micro-batches = one batch of K times the size)."""

import dataclasses
import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_reluvit as kr
from keras_reluvit import backup as B
from keras_reluvit.training import run as T


def small_config(digits_dir, epochs, **kwargs):
    cfg = T.build_config(recipe="digits", epochs=epochs, data_dir=str(digits_dir),
                         batch_size=128, **kwargs)
    return dataclasses.replace(  # the data stream's draws matter: mixup, flips
        cfg, model=dict(cfg.model, width=32, depth=1, num_heads=2, mlp_dim=64),
        augment=dict(cfg.augment, mixup=0.2, flip=True))


def weights(model):
    return [keras.ops.convert_to_numpy(v) for v in model.weights]


class SignalAt(keras.callbacks.Callback):
    """Sends `signum` to this process after batch `batch` of epoch `epoch`."""

    def __init__(self, epoch, batch, signum=signal.SIGTERM):
        super().__init__()
        self.at, self.signum, self.epoch = (epoch, batch), signum, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            signal.raise_signal(self.signum)  # handled before it returns (not os.kill)


@pytest.mark.full_only(
    "A SIGTERM mid-epoch and the exact rerun on TensorFlow (~45-65 s): on JAX and PyTorch in "
    "this test; TensorFlow's step backup stops mid-epoch and resumes exactly in the SIGTERM "
    "cluster test of test_engines; test_signals stops it before the first step and while the "
    "artefacts are written; a single process restores the metrics' running means mid-epoch "
    "(compat.build_metrics) in test_a_write_killed_midway_leaves_the_previous_backup (a tiny "
    "model).", backends=('tensorflow',))
def test_sigterm_mid_epoch_saves_and_the_rerun_ends_as_the_uninterrupted_run(tmp_path,
                                                                              digits_dir,
                                                                              capsys):
    """With DeiT's draws and state on (timm's MixUp / CutMix, random erasing,
    repeated augmentation, stochastic depth, the weights' EMA): a run stopped mid-epoch and rerun
    ends as the uninterrupted one, bit for bit."""
    cfg = small_config(digits_dir, epochs=2, ema=0.9)
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, drop_path=0.1),
        augment=dict(cfg.augment, mixup=0.0, erase=0.25, aug_repeats=3,
                     timm_mix={"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1}))
    full_model, full = T.train(cfg, tmp_path / "full", export=False, verbose=0)
    said = capsys.readouterr().err  # no export: none is said to hold the EMA
    assert "model.keras holds the weights' EMA" in said and "the export" not in said
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(B.Preempted, match=r"stopped by SIGTERM after step 4 of epoch 2 \(step "
                       r"15 of the run\), saved in .*step_000000015: rerun"):
        T.train(cfg, tmp_path / "resumed", export=False, verbose=0,
                extra_callbacks=[SignalAt(1, 3)])
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is uninstalled
    assert not (tmp_path / "resumed" / "model.keras").exists()
    record = B.StepBackup(tmp_path / "resumed" / "backup").latest()
    assert (record["epoch"], record["done"], record["step"]) == (1, 4, 15)  # 0 steps lost
    model, resumed = T.train(cfg, tmp_path / "resumed", export=False, verbose=0)
    steps = json.loads((tmp_path / "full" / "config.json").read_text())["steps_per_epoch"]
    assert resumed["optimizer_steps"] == full["optimizer_steps"] == 2 * steps == 22
    # The whole run's record: the history and every step's loss, as uninterrupted.
    assert len(resumed["step_loss"]) == 22 and len(resumed["history"]["loss"]) == 2
    # Bit for bit on every backend (on this CPU; the same holds across processes:
    # tests/once/test_resume.py, tests/once/test_multihost.py).
    np.testing.assert_array_equal(resumed["step_loss"], full["step_loss"])
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "ema_val_loss",
                "ema_val_accuracy"):
        np.testing.assert_array_equal(resumed["history"][key], full["history"][key], err_msg=key)
    # the saved model is the EMA (the trained weights scored apart), the same after the resume
    assert resumed["final"] == full["final"] and resumed["final_trained"] == full["final_trained"]
    assert resumed["final"] != resumed["final_trained"]
    np.testing.assert_allclose(full["final"]["loss"], full["history"]["ema_val_loss"][-1],
                               rtol=1e-6)
    for a, b in zip(weights(model), weights(full_model)):
        np.testing.assert_array_equal(a, b)
    for name in ("config.json", "model.keras", "metrics.json", "curves.png", "last.keras"):
        assert (tmp_path / "full" / name).exists(), name
    assert any((tmp_path / "full" / "tensorboard").rglob("*tfevents*"))
    cfg_back = json.loads((tmp_path / "full" / "config.json").read_text())
    assert cfg_back["distribution"] is None and cfg_back["processes"] == 1  # one device
    rebuilt = kr.ViT(**cfg_back["model"])
    assert rebuilt.count_params() == full_model.count_params()


def test_steps_per_execution_trains_the_run_one_step_per_call_does(tmp_path, digits_dir):
    """`train --steps-per-execution 11` (RunConfig.steps_per_execution): the
    model is compiled with it and the run ends as with one step per call --
    the same steps, losses and weights; one loss per call in the record. A
    count that does not divide the epoch (11 steps), or holds part of an
    update (--accum-steps), is an error naming the flag before anything is
    written; PyTorch allows 1 only (Keras). A complete run reruns with
    another K; one with epochs left does not."""
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match=r"--steps-per-execution 2 .* one step per call on "
                           r"the PyTorch backend"):
            small_config(digits_dir, epochs=1, steps_per_execution=2)
        return
    one_model, one = T.train(small_config(digits_dir, epochs=2), tmp_path / "one", export=False,
                             verbose=0)
    cfg = small_config(digits_dir, epochs=2, steps_per_execution=11)
    model, eleven = T.train(cfg, tmp_path / "eleven", export=False, verbose=0)
    assert model.steps_per_execution == 11
    assert eleven["optimizer_steps"] == one["optimizer_steps"] == 22
    assert eleven["step_loss"] == [one["step_loss"][10], one["step_loss"][21]]
    np.testing.assert_allclose(eleven["history"]["val_loss"], one["history"]["val_loss"],
                               rtol=1e-6)
    for a, b in zip(weights(model), weights(one_model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"--steps-per-execution 4 does not divide the epoch's "
                       r"11 steps"):
        T.train(small_config(digits_dir, epochs=1, steps_per_execution=4), tmp_path / "four",
                export=False, verbose=0)
    assert not (tmp_path / "four" / "config.json").exists()
    with pytest.raises(ValueError, match=r"--steps-per-execution 3 with --accum-steps 2: .* a "
                       r"multiple of 2"):  # a call must end at an update's end
        small_config(digits_dir, epochs=1, steps_per_execution=3, accum_steps=2)
    with pytest.raises(ValueError, match=r"--steps-per-execution 2 with --accum-steps 4"):
        small_config(digits_dir, epochs=1, steps_per_execution=2, accum_steps=4)
    for k in (1, 4):  # one step per call, or whole updates
        assert small_config(digits_dir, epochs=1, steps_per_execution=k, accum_steps=2)[
            "steps_per_execution"] == k
    with pytest.raises(ValueError, match=r"--steps-per-execution 2 does not divide the epoch's "
                       r"11 steps"):  # 11 updates of 1 micro-batch; checked where train runs
        T.train(dict(small_config(digits_dir, epochs=1).to_dict(), steps_per_execution=2),
                tmp_path / "two", export=False, verbose=0)
    # A complete run reruns (its artefacts written again) with any K; mid-run, K is kept.
    T.train(small_config(digits_dir, epochs=2), tmp_path / "eleven", export=False, verbose=0)
    written = (tmp_path / "eleven" / "config.json").read_text()
    with pytest.raises(ValueError, match=r"backed up with --steps-per-execution 11 \(its record "
                       r"holds one loss per call\): it continues with that"):
        T.train(small_config(digits_dir, epochs=3), tmp_path / "eleven", export=False, verbose=0,
                rerun="override")
    assert (tmp_path / "eleven" / "config.json").read_text() == written  # before any file


# ---- the callback alone, on a tiny model ---------------------------------------------------
def tiny(seed=0, steps_per_execution=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-2), "mse", metrics=["mae"],
                  steps_per_execution=steps_per_execution)
    return model


def tiny_data(n=20, batch=4):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
        n, seed=1, reshuffle_each_iteration=True).batch(batch, drop_remainder=True)


def test_backups_every_n_steps_keep_the_newest_and_resume_a_finished_run(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative folder (Orbax, on JAX, takes absolute paths only)
    model, data = tiny(), tiny_data()  # 5 steps per epoch
    backup = B.StepBackup("b", every=2, keep=3)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        B.fit(model, data, 3, backup, verbose=0)
    # the data set's own order: no warning of Keras' (fit's shuffle=True, ignored)
    assert not [w for w in caught if "shuffle" in str(w.message)], caught
    names = sorted(os.listdir(tmp_path / "b"))
    # Saved at steps 2, 4, 5 (epoch end), 6, 8, 10, 12, 14, 15: the newest 3 kept.
    assert names == ["step_000000012", "step_000000014", "step_000000015"], names
    last = backup.latest()
    assert (last["epoch"], last["done"], last["step"]) == (3, 0, 15)
    assert len(last["step_loss"]) == 15 and len(last["history"]["loss"]) == 3
    # A rerun of a finished run trains nothing and has the run's weights and record.
    again = tiny(seed=1)
    history = B.fit(again, data, 3, B.StepBackup("b", every=2), verbose=0)
    assert history == last["history"]
    for a, b in zip(weights(again), weights(model)):
        np.testing.assert_array_equal(a, b)


def test_steps_per_execution_is_counted_in_steps_and_a_stop_resumes_exactly(tmp_path):
    """Compiled for 2 steps per call (Keras then calls back once every 2
    steps, with the index of the call's last batch): the backups count
    optimizer steps, `every` saves once it is passed, and a SIGTERM stops at
    a call's end and resumes to the uninterrupted run's end. A count that
    does not divide the epoch (Keras would run past its data), or a resume
    with another count than the backup's, is an error. (PyTorch: Keras
    allows 1 only.)"""
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="steps_per_execution` must be 1"):
            B.fit(tiny(steps_per_execution=2), tiny_data(24), 1, B.StepBackup(tmp_path / "t"),
                  verbose=0)
        return
    def data():  # 6 steps per epoch; each run its own (each pass of one draws a new order)
        keras.utils.set_random_seed(0)
        return tiny_data(24)

    full_model = tiny(steps_per_execution=2)
    full = B.StepBackup(tmp_path / "full", every=3, keep=10)
    B.fit(full_model, data(), 2, full, verbose=0)
    assert int(keras.ops.convert_to_numpy(full_model.optimizer.iterations)) == full.step == 12
    # every 3 steps, once passed, at the calls' ends (4, 10) and each epoch's end (6, 12)
    assert [s for s, _ in full.backups()] == [12, 10, 6, 4]
    assert len(full.step_loss) == 6  # one loss per call
    B.fit(tiny(), data(), 2, B.StepBackup(tmp_path / "full"), verbose=0)  # finished: any k
    with pytest.raises(B.Preempted, match=r"after step 4 of epoch 2 \(step 10 of the run\)"):
        B.fit(tiny(steps_per_execution=2), data(), 2, B.StepBackup(tmp_path / "r"),
              verbose=0, callbacks=[SignalAt(1, 3)])
    resumed_model, resumed = tiny(seed=1, steps_per_execution=2), B.StepBackup(tmp_path / "r")
    B.fit(resumed_model, data(), 2, resumed, verbose=0)
    assert resumed.step == 12
    np.testing.assert_array_equal(resumed.step_loss, full.step_loss)
    for a, b in zip(weights(resumed_model), weights(full_model)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"steps_per_execution=4 does not divide the epoch's 6 "
                       r"steps: Keras would run 8 steps an epoch"):
        B.fit(tiny(steps_per_execution=4), data(), 1, B.StepBackup(tmp_path / "k4"), verbose=0)
    with pytest.raises(B.Preempted):  # one step per call: stopped after step 3
        B.fit(tiny(), data(), 1, B.StepBackup(tmp_path / "k1"), verbose=0,
              callbacks=[SignalAt(0, 2)])
    with pytest.raises(ValueError, match=r"was taken with steps_per_execution=1 \(its record "
                       r"holds one loss per call\); this model has 2\. Resume with 1"):
        B.fit(tiny(steps_per_execution=2), data(), 1, B.StepBackup(tmp_path / "k1"), verbose=0)


def test_a_write_killed_midway_leaves_the_previous_backup(tmp_path, monkeypatch, capsys):
    model, data = tiny(), tiny_data()
    backup = B.StepBackup(tmp_path / "b", every=2)
    B.fit(model, data, 1, backup, verbose=0)  # steps 2, 4, 5
    good = backup.latest()
    # The next write dies after the weights, before its record (a kill mid-write).
    monkeypatch.setattr(B.json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    backup.step += 1
    with pytest.raises(OSError, match="killed"):
        backup.save()
    monkeypatch.undo()
    assert os.path.isdir(tmp_path / "b" / ".tmp_step_000000006")  # the half-written folder
    assert backup.latest()["path"] == good["path"]  # ... is not a backup
    # A backup whose record cannot be read is passed over for the one before, said.
    with open(os.path.join(good["path"], B.RECORD), "w") as f:
        f.write('{"epoch": 1, "do')
    capsys.readouterr()
    previous = backup.latest()
    assert previous["step"] == 4
    out = capsys.readouterr().err
    assert f"backup {good['path']} cannot be read" in out and out.count("\n") == 1, out
    # A resume reads the newest backup once: said once, restored from step 4;
    # the write that was cut short is named, passed over, then cleared.
    (tmp_path / "b" / ".tmp_step_000000001").mkdir()  # an older cut write
    resumed = B.StepBackup(tmp_path / "b", every=2)
    B.fit(tiny(seed=1), data, 2, resumed, verbose=0)
    out = capsys.readouterr().err
    assert out.count("cannot be read") == 1
    assert (f"{tmp_path / 'b' / '.tmp_step_000000006'} was being written when the run stopped "
            f"(incomplete): passed over, resuming from {tmp_path / 'b' / 'step_000000004'} "
            "(step 4 of the run).") in out, out
    assert resumed.step == 10 and len(resumed.step_loss) == 10
    assert not [n for n in os.listdir(tmp_path / "b") if n.startswith(".tmp")]
    # Cut short before any backup: the rerun says it starts from the first step.
    (tmp_path / "c" / ".tmp_step_000000002").mkdir(parents=True)
    B.fit(tiny(), data, 1, B.StepBackup(tmp_path / "c"), verbose=0)
    assert "(incomplete): passed over, starting from the first step." in capsys.readouterr().err
    # After the backup of step 5 (the 1st epoch's end): a cut write of step 7
    # is named, with the run's step; an older one (3) is not, and is cleared.
    (tmp_path / "c" / ".tmp_step_000000003").mkdir()
    (tmp_path / "c" / ".tmp_step_000000007").mkdir()
    B.fit(tiny(), data, 2, B.StepBackup(tmp_path / "c"), verbose=0)
    out = capsys.readouterr().err
    assert out.count("incomplete") == 1 and ".tmp_step_000000007 was being written" in out
    assert "step_000000005 (step 5 of the run)." in out, out
    assert not [n for n in os.listdir(tmp_path / "c") if n.startswith(".tmp")]


def test_an_epoch_resumed_without_its_running_means_counts_on_from_its_steps(tmp_path,
                                                                              monkeypatch):
    """A backup whose running means are not kept (a TensorFlow cluster's
    distributed metrics) resumes mid-epoch counting on from the steps done:
    stopped again one step later, its record says so (was: the count began
    at 0 there, and a second resume read the wrong batches)."""
    real_load = B.load_state
    monkeypatch.setattr(B, "metric_states", lambda model: None)  # none written ...
    monkeypatch.setattr(B, "load_state", lambda *a, **k: real_load(*a, **k) and None)  # or read
    with pytest.raises(B.Preempted, match=r"after step 3 of epoch 2 \(step 8 "):
        B.fit(tiny(), tiny_data(), 3, B.StepBackup(tmp_path / "b"), verbose=0,
              callbacks=[SignalAt(1, 2)])
    resumed = B.StepBackup(tmp_path / "b")
    with pytest.raises(B.Preempted, match=r"after step 4 of epoch 2 \(step 9 "):
        B.fit(tiny(seed=1), tiny_data(), 3, resumed, verbose=0, callbacks=[SignalAt(1, 0)])
    assert (resumed.latest()["done"], resumed.latest()["step"]) == (4, 9)


def test_a_loss_that_turns_nan_stops_naming_the_step_and_the_last_good_backup(tmp_path):
    model = tiny()
    x = np.ones((24, 3), "float32")
    y = np.ones((24, 2), "float32")
    y[13] = np.nan  # the 4th batch of the 1st epoch (batches of 4, in order)
    bad = tf.data.Dataset.from_tensor_slices((x, y)).take(20).batch(4)
    backup = B.StepBackup(tmp_path / "b", every=3)
    with pytest.raises(FloatingPointError, match=r"loss is nan after step 4 of epoch 1 \(step "
                       r"4 of the run\)\. The last good backup: .*step_000000003 \(epoch 1, "
                       r"step 3\)"):
        B.fit(model, bad, 2, backup, verbose=0)
    assert [s for s, _ in backup.backups()] == [3]  # the NaN state is never saved


def test_plain_model_fit_resumes_an_epoch_backup_and_refuses_a_mid_epoch_one(tmp_path):
    data = tiny_data()
    model = tiny()
    model.fit(data.repeat(), steps_per_epoch=5, epochs=2, verbose=0,
              callbacks=[B.StepBackup(tmp_path / "b")])
    rerun = tiny(seed=1)
    history = rerun.fit(data.repeat(), steps_per_epoch=5, epochs=3, verbose=0,
                        callbacks=[B.StepBackup(tmp_path / "b")])
    assert history.epoch == [2]  # resumed after the 2 epochs backed up
    mid = B.StepBackup(tmp_path / "b", every=3)
    B.fit(tiny(), data, 4, mid, verbose=0, steps_per_epoch=5)  # ends at step 20
    mid.step, mid.epoch, mid.done = 21, 4, 1
    mid.save()
    with pytest.raises(ValueError, match=r"after step 1 of epoch 5: model.fit cannot start "
                       r"mid-epoch\. Resume it with kr.backup.fit"):
        tiny().fit(data.repeat(), steps_per_epoch=5, epochs=6, verbose=0,
                   callbacks=[B.StepBackup(tmp_path / "b")])


def test_a_backup_of_version_0_1_resumes_at_its_epoch(tmp_path, capsys):
    data = tiny_data()
    old = tiny()  # 0.1 backed up with Keras' BackupAndRestore
    old.fit(data.repeat(), steps_per_epoch=5, epochs=2, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(str(tmp_path / "b"), delete_checkpoint=False)])
    rerun = tiny(seed=1)
    B.fit(rerun, data, 3, B.StepBackup(tmp_path / "b"), verbose=0)
    assert "resumed a keras-reluvit 0.1 backup" in capsys.readouterr().err
    assert int(keras.ops.convert_to_numpy(rerun.optimizer.iterations)) == 15  # 10 + 1 epoch
    assert B.StepBackup(tmp_path / "b").latest()["step"] == 15


def test_the_backup_cadence_is_the_recipes_unless_given(tmp_path):
    from keras_reluvit import recipes

    assert recipes.get("s16_i1k_90ep").checkpoint_every == 1000  # ImageNet: mid-epoch
    assert recipes.get("augreg_i21k", "B/16").checkpoint_every == 1000
    assert recipes.get("digits").checkpoint_every is None  # each epoch's end only
    assert T.build_config("digits")["checkpoint_every"] is None
    assert T.build_config("digits", checkpoint_every=50)["checkpoint_every"] == 50
    assert T.build_config("digits", checkpoint_every=0)["checkpoint_every"] is None
    assert T.build_config("digits")["accum_steps"] == 1


def test_backups_of_another_process_count_are_an_error(tmp_path):
    from keras_reluvit import callbacks as C

    for i in range(2):  # a cluster of 2 backed up
        os.makedirs(tmp_path / "run" / "backup" / f"process_{i}" / "step_000000011")
    with pytest.raises(ValueError, match=r"holds the backups of a run of 2 processes; this run "
                       r"has 1\. Resuming onto another process count is not supported"):
        C.default(tmp_path / "run")
    backup = C.default(tmp_path / "run", process=(1, 2))[-1]
    assert backup.directory == str(tmp_path / "run" / "backup" / "process_1")
    os.makedirs(tmp_path / "one" / "backup" / "step_000000005")
    if keras.backend.backend() == "jax":  # one Orbax backup for the cluster: any process count
        for process in [(0, 1), (0, 2), (1, 2)]:
            backup = C.default(tmp_path / "one", process=process)[-1]
            assert backup.directory == str(tmp_path / "one" / "backup")
    else:
        with pytest.raises(ValueError, match="a run of 1 process; this run has 2"):
            C.default(tmp_path / "one", process=(0, 2))


def test_a_jax_run_resumed_on_fewer_processes_reads_its_data_shards_side_by_side(tmp_path,
                                                                                 capsys):
    """The backup records the run's data shards (one per process of its first
    launch); a JAX rerun on a process count dividing them reads shards / count
    each, said in one line; another count is an error naming both. TensorFlow
    and torch keep per-process backups: their layout is the process count."""
    record = tmp_path / "backup" / "step_000000015"
    os.makedirs(record)
    (record / B.RECORD).write_text(json.dumps(dict(
        epoch=1, done=4, step=15, history={}, step_loss=[], processes=2, data_shards=2)))
    assert B.data_layout(str(tmp_path / "backup"), 2, 1, 2, None) == (2, 1)  # the same cluster
    if keras.backend.backend() != "jax":
        assert B.data_layout(str(tmp_path / "backup"), 1, 0, 1, None) == (1, 0)
        return
    assert B.data_layout(str(tmp_path / "backup"), 1, 0, 1, None) == (2, [0, 1])
    assert ("resuming a run of 2 data shards on 1 process: each reads 2 of them"
            in capsys.readouterr().err)
    for args, named in [((3, 0, 3, None), "this run has 3 processes"),
                        ((1, 0, 1, 1), "this run has data_shards=1")]:
        with pytest.raises(ValueError, match=r"a run of 2 data shards \(its data stream split "
                                             r"in 2\); " + named):
            B.data_layout(str(tmp_path / "backup"), *args)
    assert B.data_layout(str(tmp_path / "new"), 1, 0, 1, None) == (1, 0)  # nothing to resume
    (record / B.RECORD).write_text(json.dumps(dict(  # 4 shards resumed on 2 processes
        epoch=1, done=4, step=15, history={}, step_loss=[], processes=4, data_shards=4)))
    assert B.data_layout(str(tmp_path / "backup"), 2, 1, 2, None) == (4, [2, 3])


def test_bad_backup_arguments_are_named():
    with pytest.raises(ValueError, match=r"every \(StepBackup, kr.callbacks.default; train "
                       r"--checkpoint-every\) must be a positive whole number of steps"):
        B.StepBackup("x", every=0)
    with pytest.raises(ValueError, match=r"keep \(the backups kept; train --keep-checkpoints\) "
                       "must be a whole number >= 1"):
        B.StepBackup("x", keep=0)


def test_a_process_stopped_by_anothers_signal_leaves_the_handlers_it_found(tmp_path,
                                                                           monkeypatch):
    """In a cluster, the processes agree as training begins, after every step
    and at each epoch's end; one that stops on a peer's SIGTERM puts back the
    handlers it found -- within `kr.backup.signals_noted()` (what `train`
    runs in) its own late copy (torchrun signals its workers one by one) is
    noted, not fatal, and raised again under the handlers from before on
    the way out; nothing is left installed for good (was: SIG_IGN for the
    rest of the process). A single process: the same."""
    import keras_reluvit.distribution as D

    calls = []
    monkeypatch.setattr(D, "any_process", lambda flag: calls.append(flag) or len(calls) == 4)
    received = []
    before = signal.signal(signal.SIGTERM, lambda *_: received.append(1))
    try:
        with B.signals_noted():
            with pytest.raises(B.Preempted, match="stopped by a signal to another process "
                                                  "after step 3 of epoch 1"):
                B.fit(tiny(), tiny_data(), 2, B.StepBackup(tmp_path / "b", process=(0, 2)),
                      verbose=0)
            # training's start, steps 1-3; this process had no signal of its own
            assert calls == [False] * 4
            os.kill(os.getpid(), signal.SIGTERM)  # its own copy, late: noted
            from keras_reluvit.training import signals as S

            assert S.NOTED == [signal.SIGTERM] and received == []
        assert received == [1]  # not taken: raised again under the handler from before
    finally:
        signal.signal(signal.SIGTERM, before)
    # One process: the handler from before is back at once.
    before = signal.signal(signal.SIGTERM, lambda *_: received.append(2))
    try:
        with pytest.raises(B.Preempted, match="stopped by SIGTERM"):
            B.fit(tiny(), tiny_data(), 2, B.StepBackup(tmp_path / "c"), verbose=0,
                  callbacks=[SignalAt(0, 1)])
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == [1, 2]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_second_ctrl_c_interrupts_at_once_and_one_handler_serves_all(tmp_path):
    """One handler for the whole run: `fit` installs it once (the backup's
    own install is then a no-op) and puts back what it found; a Ctrl-C
    taken by a stop still counts, so a second one interrupts at once."""
    from keras_reluvit.training import signals as S

    installed = []

    class Seen(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            installed.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    B.fit(tiny(), tiny_data(), 1, B.StepBackup(tmp_path / "b"), verbose=0, callbacks=[Seen()])
    assert installed == [S._handler] and signal.getsignal(signal.SIGINT) is before
    with B.signals_noted():
        signal.raise_signal(signal.SIGINT)
        assert S.take() == signal.SIGINT and S.NOTED == []  # taken by a stop
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before and S.NOTED == S._RECEIVED == []
    with B.signals_noted():  # a Ctrl-C the command's door noted during its imports counts
        S.note(signal.SIGINT)
        assert S.take() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_a_plain_fit_with_signals_runs_within_signals_noted_and_none_is_lost(tmp_path):
    """`StepBackup(signals=True)` under a plain `model.fit` installs nothing
    (Keras skips `on_train_end` after an error: a handler installed there
    could stay): without `signals_noted` it is an error naming it; within,
    a SIGTERM stops at the next step. A signal that comes after the run's
    last check is raised again once `kr.backup.fit` puts the handlers back
    (was: dropped)."""
    with pytest.raises(ValueError, match=r"within `with kr.backup.signals_noted\(\):`"):
        tiny().fit(tiny_data(), epochs=1, verbose=0,
                   callbacks=[B.StepBackup(tmp_path / "a", signals=True)])
    with B.signals_noted():
        with pytest.raises(B.Preempted, match=r"stopped by SIGTERM after step 3 of epoch 1"):
            tiny().fit(tiny_data(), epochs=2, verbose=0,
                       callbacks=[SignalAt(0, 2), B.StepBackup(tmp_path / "b", signals=True)])

    class Late(keras.callbacks.Callback):  # after the backup's last check
        def on_train_end(self, logs=None):
            signal.raise_signal(signal.SIGTERM)

    received = []
    before = signal.signal(signal.SIGTERM, lambda *_: received.append(1))
    try:
        B.fit(tiny(), tiny_data(), 1, B.StepBackup(tmp_path / "c"), verbose=0,
              callbacks=[Late()])
        assert received == [1]
    finally:
        signal.signal(signal.SIGTERM, before)


# ---- gradient accumulation ---------------------------------------------------------------
@pytest.mark.full_only(
    "Gradient accumulation on JAX and TensorFlow (~25 s each): the same K=4 check runs on "
    "PyTorch, and Keras' accumulation is one code path (base_optimizer) on every backend.",
    backends=('jax', 'tensorflow'))
def test_accumulation_of_4_micro_batches_equals_one_step_of_the_whole_batch(tmp_path,
                                                                           digits_dir):
    """1 epoch (11 updates of 128 images, MixUp, global-norm clipping at 1.0,
    a warmup over the updates): K=4 micro-batches of 32 per update against
    one batch of 128. `checkpoint_every` counts updates: a backup every 3
    updates is one every 12 micro-steps (plain SGD, where the mean of the
    micro-gradients shows: tests/test_accumulation.py)."""
    one, m1 = T.train(small_config(digits_dir, 1), tmp_path / "one", export=False, verbose=0)
    acc, m4 = T.train(small_config(digits_dir, 1, accum_steps=4, checkpoint_every=3,
                                   keep_checkpoints=100), tmp_path / "acc",
                      export=False, verbose=0)
    # Backups are named by micro-step (Keras' batches): after updates 3, 6, 9 and the
    # epoch's end (update 11), not every 3 micro-steps.
    saved = sorted(s for s, _ in B.StepBackup(tmp_path / "acc" / "backup").backups())
    assert saved == [12, 24, 36, 44], saved
    assert m1["optimizer_steps"] == m4["optimizer_steps"] == 11  # updates, not micro-steps
    assert len(m4["step_loss"]) == 44
    assert json.loads((tmp_path / "acc" / "config.json").read_text())["accum_steps"] == 4
    # the epoch's loss: the mean over the same images
    np.testing.assert_allclose(m4["history"]["loss"], m1["history"]["loss"], rtol=1e-5)
    for v, a, b in zip(one.weights, weights(acc), weights(one)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6, err_msg=v.path)
    with pytest.raises(ValueError, match=r"accum_steps \(train --accum-steps\) 3 must divide "
                       "the batch size 128"):
        small_config(digits_dir, 1, accum_steps=3)
