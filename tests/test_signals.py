"""A run stopped at every moment, on the current backend: SIGTERM before the
first step (while the data and the model are prepared), during the last
epoch's validation, and while the final scores and artefacts are written --
each a clean stop (`Preempted`: saved, said), and the rerun ends the run.
And reruns: the same settings continue (said), others are an error naming
them unless restarted or overridden; `train_seconds` covers the whole run."""

import dataclasses
import json
import os
import signal
import sys
import time
import types

import keras
import numpy as np
import pytest

from keras_reluvit import backup as B
from keras_reluvit.training import run as T
from keras_reluvit.training import signals


def tiny(digits_dir, epochs=2, **kwargs):
    cfg = T.build_config(recipe="digits", epochs=epochs, data_dir=str(digits_dir),
                         **dict(dict(batch_size=256), **kwargs))
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, width=16, depth=1, num_heads=1, mlp_dim=16))
    return cfg


def kill_self():
    os.kill(os.getpid(), signal.SIGTERM)


class SignalInValidation(keras.callbacks.Callback):
    """SIGTERM as the validation of epoch `epoch` begins."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.current, self.sent, self.batches = epoch, None, None, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_test_begin(self, logs=None):
        if self.current == self.epoch and self.sent is None:
            self.sent = time.time()
            kill_self()

    def on_test_batch_end(self, batch, logs=None):
        if self.sent is not None and self.current == self.epoch:
            self.batches += 1


@pytest.mark.full_only(
    "A SIGTERM during validation on JAX and TensorFlow (~30-60 s each case): the stop is "
    "StepBackup's backend-free callback code (Keras' public stop_evaluating), run on PyTorch; "
    "TensorFlow's cluster stops mid-epoch and resumes in test_engines, JAX's mid-epoch in "
    "test_backup and its cluster in test_multihost.", backends=("jax", "tensorflow"))
@pytest.mark.parametrize("cut, ema", [(1, None), (0, 0.9)])
def test_sigterm_in_a_validation_stops_at_the_next_batch_and_the_rerun_finishes(
        cut, ema, tmp_path, digits_dir):
    """Was: the run went on scoring and exporting and exited 0 without a
    word; then it waited for the whole validation (12 s on 6,000 16-px
    images). Now the validation stops at the batch after the signal, the
    epoch is saved (its validation's numbers NaN: the EMA's, skipped, too),
    and the rerun ends as the uninterrupted run: the same steps and losses,
    the same history but for the cut validation."""
    cfg = tiny(digits_dir, batch_size=32, ema=ema)
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    sent = SignalInValidation(cut)
    with pytest.raises(B.Preempted, match=rf"stopped by SIGTERM at the end of epoch {cut + 1} "
                       r"\(step \d+ of the run\), its validation cut short \(NaN in the "
                       r"history\), saved in .*: rerun"):
        T.train(cfg, out, export=False, verbose=0, extra_callbacks=[sent])
    stopped = time.time() - sent.sent
    assert sent.batches == 1  # of the validation's 12 (all 12 without the stop: tried)
    assert signal.getsignal(signal.SIGTERM) is before
    assert not (out / "model.keras").exists() and not (out / "metrics.json").exists()
    record = B.StepBackup(out / "backup").latest()
    assert (record["epoch"], record["done"]) == (cut + 1, 0)  # the epoch whole: 0 steps lost
    assert record["validation_cut"] == cut
    assert stopped < 30, stopped  # a spot machine's notice
    first = record["train_seconds"]
    assert first > 0
    rerun_started = time.time()
    _, metrics = T.train(cfg, out, export=False, verbose=0)  # writes what was left
    _, whole = T.train(cfg, tmp_path / "whole", export=False, verbose=0)
    assert metrics["optimizer_steps"] == whole["optimizer_steps"] >= record["step"]
    assert metrics["step_loss"] == whole["step_loss"] and metrics["final"] == whole["final"]
    validated = [k for k in whole["history"] if k.startswith(("val_", "ema_val_"))]
    assert validated and ("ema_val_loss" in validated) == bool(ema)
    for k, values in whole["history"].items():
        got = metrics["history"][k]
        if k in validated:
            assert np.isnan(got[cut]) and got[:cut] + got[cut + 1:] == values[:cut] + values[cut + 1:]
        else:
            assert got == values, k
    # The whole run's, not this launch's (nor the wall time since the first).
    assert first <= metrics["train_seconds"] <= first + (time.time() - rerun_started)
    assert (out / "model.keras").exists()


class SignalAtStep(keras.callbacks.Callback):
    """SIGTERM at the end of step `step` (0-based) of the run."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.step:
            kill_self()
        self.seen += 1


@pytest.mark.backend_independent  # the backup's Python, not the backend's: run once
def test_an_epochs_last_step_is_never_a_backup_that_cannot_resume(tmp_path, digits_dir, capsys):
    """Was: a backup every N updates where N divides the epoch's steps, or a
    SIGTERM in an epoch's last step, saved 'step 5 of an epoch of 5 steps',
    and every rerun (of a complete run too) failed with 'was it written by
    another run'. Now the epoch's end saves it (a signal then stops there,
    the validation cut at once), and the reruns go on."""
    steps = tiny(digits_dir)  # 5 steps per epoch at batch 256
    _, first = T.train(tiny(digits_dir, checkpoint_every=5), tmp_path / "every", export=False,
                       verbose=0)
    assert first["optimizer_steps"] == 10
    record = B.StepBackup(tmp_path / "every" / "backup").latest()
    assert (record["epoch"], record["done"], record["step"]) == (2, 0, 10)
    T.train(tiny(digits_dir, checkpoint_every=5), tmp_path / "every", export=False, verbose=0)
    assert "holds a complete run of 2 epochs" in capsys.readouterr().err
    out = tmp_path / "signal"
    with pytest.raises(B.Preempted, match=r"at the end of epoch 1 \(step 5 of the run\)"):
        T.train(steps, out, export=False, verbose=0, extra_callbacks=[SignalAtStep(4)])
    _, resumed = T.train(steps, out, export=False, verbose=0)
    _, whole = T.train(steps, tmp_path / "whole", export=False, verbose=0)
    assert resumed["step_loss"] == whole["step_loss"]


@pytest.mark.backend_independent  # the backup's Python, not the backend's: run once
def test_sigterm_before_the_first_step_stops_cleanly(tmp_path, digits_dir, monkeypatch):
    """Was: killed (exit 143), nothing said. Now noted while the data load,
    a clean stop as training begins; nothing trained, nothing saved."""
    load = T.kr_data.load

    def load_then_signal(*args, **kwargs):
        kill_self()
        return load(*args, **kwargs)

    monkeypatch.setattr(T.kr_data, "load", load_then_signal)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(B.Preempted, match="stopped by SIGTERM once the data and the model were "
                       "ready, before the first step: nothing was trained since; rerun"):
        T.train(tiny(digits_dir), tmp_path / "run", export=False, verbose=0)
    assert signal.getsignal(signal.SIGTERM) is before
    assert B.StepBackup(tmp_path / "run" / "backup").latest() is None
    assert signals.NOTED == []


@pytest.mark.backend_independent  # train()'s Python, not the backend's: run once
def test_sigterm_while_the_artefacts_are_written_stops_before_the_next(tmp_path, digits_dir,
                                                                      monkeypatch):
    """The final scoring and export take longer than a preemption notice:
    a signal during a write stops the run before the next one (the training
    is in the backup; nothing raises inside the write); the rerun writes
    them, no step trained again."""
    cfg = tiny(digits_dir, epochs=1)
    write = T._write_atomically

    def signal_after_the_model(path, how):
        write(path, how)
        if path.endswith("model.keras"):
            kill_self()

    monkeypatch.setattr(T, "_write_atomically", signal_after_the_model)
    with pytest.raises(B.Preempted, match=r"stopped by SIGTERM while scoring and writing the "
                       r"run's artefacts \(the training is complete, saved in .*backup\): rerun"):
        T.train(cfg, tmp_path / "run", export=False, verbose=0)
    run = tmp_path / "run"
    assert (run / "model.keras").exists() and not (run / "metrics.json").exists()
    assert not (run / "curves.png").exists() and not list(run.glob("*.partial*"))
    assert signals.NOTED == []
    monkeypatch.setattr(T, "_write_atomically", write)
    steps = B.StepBackup(run / "backup").latest()["step"]
    _, metrics = T.train(cfg, run, export=False, verbose=0)
    assert metrics["optimizer_steps"] == steps == len(metrics["step_loss"])
    assert (run / "curves.png").exists() and (run / "metrics.json").exists()


@pytest.mark.backend_independent  # train()'s Python: run once
def test_a_signal_during_the_last_write_finds_the_run_complete(tmp_path, digits_dir,
                                                               monkeypatch, capsys):
    """Was: the run stopped after its last artefact was written, saying
    "rerun the same command to finish" where nothing was left to write."""
    plot = T.plot_curves

    def plot_then_signal(*args):
        plot(*args)
        kill_self()

    monkeypatch.setattr(T, "plot_curves", plot_then_signal)  # the last write without export
    _, metrics = T.train(tiny(digits_dir, epochs=1), tmp_path / "run", export=False, verbose=0)
    assert "SIGTERM came as the last artefact was written: the run is complete." in (
        capsys.readouterr().err)
    assert (tmp_path / "run" / "curves.png").exists() and metrics["optimizer_steps"] > 0
    assert signals.NOTED == []


@pytest.mark.backend_independent  # train()'s Python: run once
def test_a_backup_whose_config_json_is_torn_is_not_resumed_unchecked(tmp_path, digits_dir,
                                                                     capsys, monkeypatch):
    """Was: config.json was written in place, and one that could not be read
    beside a backup turned the rerun's check off: another model, batch and
    lr resumed the run without a word (the third maintainer read)."""
    out = tmp_path / "run"
    cfg = tiny(digits_dir, epochs=1)
    written, write = [], T._write_atomically
    monkeypatch.setattr(T, "_write_atomically",
                        lambda path, how: written.append(os.path.basename(path)) or write(path,
                                                                                          how))
    T.train(cfg, out, export=False, verbose=0)
    assert written[0] == "config.json" and not list(out.glob("*.partial*"))  # beside, renamed
    monkeypatch.undo()
    text = (out / "config.json").read_text()
    (out / "config.json").write_text(text[:len(text) // 2])  # torn
    other = tiny(digits_dir, epochs=1, lr=0.5)
    with pytest.raises(ValueError, match=r"holds a backup, but its config.json cannot be read "
                       r"\(.*\): the settings it trained with are unknown\. --restart"):
        T.train(other, out, export=False, verbose=0)
    assert (out / "config.json").read_text() == text[:len(text) // 2]  # nothing touched
    capsys.readouterr()
    T.train(other, out, export=False, verbose=0, rerun="override")
    assert "config.json cannot be read" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["settings"]["lr"] == 0.5


class SignalAsTrainingEnds(keras.callbacks.Callback):
    def on_train_end(self, logs=None):  # after the backup's last check
        kill_self()


@pytest.mark.backend_independent  # train()'s Python and Keras' stop_evaluating: run once
def test_sigterm_in_the_final_evaluation_stops_at_its_next_batch(tmp_path, digits_dir,
                                                                 monkeypatch):
    """Was: the signal raised `Preempted` from inside Keras' evaluate (in a
    cluster, one process leaving its peers in the collective). Now noted:
    the evaluation ends at the next batch, then the run stops, saved; the
    rerun scores it whole."""
    cfg = tiny(digits_dir, epochs=1, batch_size=64)
    batches = []
    seen = B.EvaluationStop.on_test_batch_end

    def signal_at_first(self, batch, logs=None):
        batches.append(batch)
        if len(batches) == 1:
            kill_self()
        seen(self, batch, logs)

    monkeypatch.setattr(B.EvaluationStop, "on_test_batch_end", signal_at_first)
    with pytest.raises(B.Preempted, match=r"stopped by SIGTERM while scoring and writing the "
                       r"run's artefacts \(the training is complete, saved in .*backup\): rerun "
                       "the same command to finish"):
        T.train(cfg, tmp_path / "run", export=False, verbose=0)
    assert batches == [0]  # of the validation's 6 batches
    assert not (tmp_path / "run" / "model.keras").exists()
    monkeypatch.setattr(B.EvaluationStop, "on_test_batch_end",
                        lambda self, batch, logs=None: batches.append(batch))
    with pytest.raises(B.Preempted, match="stopped by SIGTERM while scoring"):
        T.train(cfg, tmp_path / "late", export=False, verbose=0,
                extra_callbacks=[SignalAsTrainingEnds()])
    assert batches == [0]  # a signal as training ended: no evaluation batch
    monkeypatch.setattr(B.EvaluationStop, "on_test_batch_end", seen)
    _, metrics = T.train(cfg, tmp_path / "run", export=False, verbose=0)
    _, whole = T.train(cfg, tmp_path / "whole", export=False, verbose=0)
    assert metrics["final"] == whole["final"]


@pytest.mark.backend_independent  # the stop's Python: run once
def test_a_clusters_stop_point_is_a_collective_on_every_process(monkeypatch):
    """Every process of a cluster calls the agreement at each stop point,
    a signal or not (one calling it only when noted would wait alone), and
    all stop when any got one; nothing raises where the signal lands."""
    from keras_reluvit import distribution

    asked = []
    monkeypatch.setattr(distribution, "any_process", lambda flag: asked.append(flag) or any(
        asked[-1:]) or peer[0])
    peer = [False]
    with signals.signals_noted():
        signals.stop_point("while x", (1, 2))  # nothing anywhere: goes on
        kill_self()  # noted, not raised here
        assert signals.NOTED == [signal.SIGTERM]
        with pytest.raises(B.Preempted, match="stopped by SIGTERM while x: rerun"):
            signals.stop_point("while x", (1, 2))
        peer[0] = True  # another process got one
        with pytest.raises(B.Preempted, match="stopped by a signal to another process while x"):
            signals.stop_point("while x", (1, 2))
        peer[0] = False
        kill_self()
        kill_self()  # two: a stop takes one, the next stops again
        with pytest.raises(B.Preempted, match="SIGTERM"):
            signals.stop_point("while x", (1, 2))
        assert signals.NOTED == [signal.SIGTERM]
        with pytest.raises(B.Preempted, match="SIGTERM"):
            signals.stop_point("while x", (1, 2))
        assert signals.NOTED == []
        # The final evaluation's callback agrees every `every` batches, by the batch
        # index (the same on every process), a signal or not.
        model = types.SimpleNamespace(stop_evaluating=False)
        stop = B.EvaluationStop((1, 2), every=2)
        stop.set_model(model)
        del asked[:]
        stop.on_test_batch_end(0)
        stop.on_test_batch_end(1)
        assert asked == [False] and not model.stop_evaluating
        peer[0] = True
        stop.on_test_batch_end(2)
        assert asked == [False] and not model.stop_evaluating
        stop.on_test_batch_end(3)
        assert asked == [False, False] and model.stop_evaluating
    assert asked == [False, False]


@pytest.mark.backend_independent
def test_a_rerun_with_other_settings_is_named_then_restarted_or_overridden(tmp_path,
                                                                           digits_dir, capsys):
    """Was: `--epochs 3 --lr 5e-3` into a 2-epoch run's folder resumed it under
    the new settings without a word and rewrote config.json."""
    out = tmp_path / "run"
    cfg = tiny(digits_dir, epochs=1)
    _, first = T.train(cfg, out, export=False, verbose=0)
    steps = first["optimizer_steps"]
    _, same = T.train(cfg, out, export=False, verbose=0)  # a finished run, rerun: said
    assert (f"{out} holds a complete run of 1 epoch ({steps} steps): writing its artefacts "
            "again." in capsys.readouterr().err)
    assert same["optimizer_steps"] == steps
    assert same["train_seconds"] == first["train_seconds"]  # nothing trained: the run's own
    longer = tiny(digits_dir, epochs=2, lr=5e-3, checkpoint_every=3)  # the cadence is free
    with pytest.raises(ValueError, match=r"holds a complete run of 1 epoch \(\d+ steps\), "
                       r"trained with other settings: epochs 1 -> 2, lr the recipe's -> 0.005\. "
                       r"Rerun with its settings .* --restart .* --override"):
        T.train(longer, out, export=False, verbose=0)
    with pytest.raises(ValueError, match="rerun must be one of"):
        T.train(longer, out, export=False, verbose=0, rerun="continue")
    _, over = T.train(longer, out, export=False, verbose=0, rerun="override")
    assert "with settings changed (--override): epochs 1 -> 2" in capsys.readouterr().err
    assert over["optimizer_steps"] == 2 * steps and len(over["step_loss"]) == 2 * steps
    config = json.loads((out / "config.json").read_text())
    assert config["epochs"] == 2 and config["settings"]["lr"] == 5e-3
    assert [bool(launch["resumed"]) for launch in config["launches"]] == [False, True, True]
    changed = config["launches"][2]["changed"]  # the free ones recorded too
    assert changed["epochs"] == [1, 2] and changed["lr"] == [None, 0.005]
    assert changed["checkpoint_every"][1] == 3 and set(changed) == {"epochs", "lr",
                                                                    "checkpoint_every"}
    assert over["train_seconds"] > first["train_seconds"]
    (out / "tensorboard" / "stale").write_text("an earlier run's")
    _, anew = T.train(cfg, out, export=False, verbose=0, rerun="restart")
    assert "restart: the backups and artefacts of the run in" in capsys.readouterr().err
    assert anew["optimizer_steps"] == steps and len(anew["step_loss"]) == steps
    assert not (out / "tensorboard" / "stale").exists()
    assert len(json.loads((out / "config.json").read_text())["launches"]) == 1


@pytest.mark.backend_independent
def test_every_n_steps_with_a_plain_fit_is_an_error_at_once(tmp_path):
    """Was: accepted; SIGTERM then killed without a save and the rerun failed."""
    import numpy as np

    import keras_reluvit as kr

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x = np.zeros((8, 2), "float32")
    with pytest.raises(ValueError, match=r"every=5 backs up mid-epoch, and a plain model.fit "
                       r"can neither resume there nor save on SIGTERM: train with kr.backup.fit"):
        model.fit(x, x, epochs=1, verbose=0,
                  callbacks=kr.callbacks.default(str(tmp_path), every=5))
    model.fit(x, x, epochs=1, verbose=0, callbacks=kr.callbacks.default(str(tmp_path / "b")))


@pytest.mark.backend_independent
@pytest.mark.parametrize("setting, value, named", [
    ("accum_steps", 0, r"accum_steps \(train --accum-steps\) must be a whole number in \[1,"),
    ("ema", 1.5, r"ema \(train --ema\) must be a number in \[0, 1\)"),
    ("ema", 1.0, r"ema \(train --ema\) must be a number in \[0, 1\)"),  # frozen: refused
    ("checkpoint_every", -1, r"checkpoint_every \(train --checkpoint-every\) must be"),
    ("keep_checkpoints", 0, r"keep_checkpoints \(train --keep-checkpoints\) must be"),
    ("steps_per_execution", 0, r"steps_per_execution \(train --steps-per-execution\) must be"),
    ("steps_per_execution", 1.5, r"steps_per_execution \(train --steps-per-execution\) must"),
])
def test_bad_run_numbers_name_the_flag(setting, value, named):
    """Was: --accum-steps 0 ran the recipe's 1; the others failed later under
    Keras' or a callback's argument name."""
    with pytest.raises(ValueError, match=named):
        T.build_config(recipe="digits", batch_size=64, **{setting: value})
    fine = {"accum_steps": 1, "ema": 0.0, "checkpoint_every": 0, "keep_checkpoints": 1,
            "steps_per_execution": 1}[setting]
    T.build_config(recipe="digits", batch_size=64, **{setting: fine})  # the boundary is allowed


@pytest.mark.backend_independent
def test_aa_replaces_three_augment_on_the_deit3_recipes(capsys):
    """Was: `--aa` ran timm's RandAugment on top of DeiT III's 3-Augment."""
    r = T.build_config(recipe="deit3_s16_400ep", batch_size=8)
    assert r["augment"]["three_augment"] and not r["augment"].get("auto_augment")
    aa = T.build_config(recipe="deit3_s16_400ep", batch_size=8,
                        auto_augment="rand-m9-mstd0.5-inc1")
    assert not aa["augment"]["three_augment"]
    assert aa["augment"]["auto_augment"] == "rand-m9-mstd0.5-inc1"
    assert "--aa 'rand-m9-mstd0.5-inc1' replaces the recipe's 3-Augment" in capsys.readouterr().err


@pytest.mark.backend_independent
def test_an_augmix_name_error_quotes_the_name_as_written():
    """Was: the name quoted with timm's 'd-1' rewritten as 'd0'."""
    from keras_reluvit.data.timm_augment import parse

    with pytest.raises(ValueError, match=r"Unknown AugMix section 'x5' in 'augmix-m3-x5-d-1'"):
        parse("augmix-m3-x5-d-1")


@pytest.mark.backend_independent
def test_a_write_killed_midway_leaves_the_earlier_file_under_its_name(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("earlier")

    def half(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise B.Preempted("stopped")

    with pytest.raises(B.Preempted):
        T._write_atomically(str(path), half)
    assert path.read_text() == "earlier"
    T._write_atomically(str(path), lambda tmp: open(tmp, "w").write("new"))
    assert path.read_text() == "new"


def signalled_while_parsing(name, then):
    """A process that sends itself signal `name` while `cli.main` builds its
    parser (after main's first line, before any work), then runs `then`
    (code calling `cli.main`): its CompletedProcess."""
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "from keras_reluvit import cli\n"
            "parser = cli.parser\n"
            "def sending():\n"
            # raise_signal: sent to this (the main) thread and handled before it returns;
            # with os.kill the Python handler ran after parsing ended once in a loaded run
            # (the other command then ran as if no signal had come).
            f"    signal.raise_signal(signal.{name})\n"
            "    return parser()\n"
            "cli.parser = sending\n" + then)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, KERAS_BACKEND="jax"))


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_at_the_commands_first_line_stops_the_run_cleanly(name, tmp_path, digits_built):
    """`keras-reluvit train` notes SIGTERM and SIGINT alike from `main`'s
    first line: one sent while the command line is parsed (before any data,
    model or file) stops the run before its first step, exit 0, said, and
    nothing trained (was: noted only by a handler installed at the package's
    import when sys.argv looked like `train`; a Ctrl-C in the first second
    was swallowed inside a JAX callback and the run trained to the end)."""
    out = tmp_path / "run"
    done = signalled_while_parsing(name, (
        f"sys.exit(cli.main(['train', '--data-dir', {str(digits_built)!r}, '--epochs', '1', "
        f"'--output', {str(out)!r}, '--no-export', '--quiet']))\n"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"stopped by {name} as the run began, before the first step" in done.stdout, \
        done.stdout[-2000:]
    assert not (out / "model.keras").exists() and not (out / "metrics.json").exists()
    assert not (out / "config.json").exists() and not (out / "backup").exists()


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_command_imports_keras_stops_the_run_cleanly(name, tmp_path,
                                                                       digits_built):
    """The console script's door (`keras_reluvit_cli`, what `keras-reluvit`
    runs) notes SIGTERM and SIGINT from the process's first line, while
    Keras and the backend are imported (seconds): the run stops before its
    first step, exit 0, said, nothing written. Without it a SIGTERM then
    killed the process (143) and a Ctrl-C was mostly swallowed by JAX's
    garbage-collection callback ('Exception ignored in _xla_gc_callback'),
    and the run trained to the end."""
    import importlib.metadata
    import subprocess
    import sys

    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert scripts["keras-reluvit"].value == "keras_reluvit_cli:main"
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_reluvit_cli", "train", "--data-dir", str(digits_built),
         "--epochs", "1", "--output", str(out), "--no-export", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, KERAS_BACKEND="jax"))
    time.sleep(1.0)  # the door's first line is ~0.1 s in; Keras' import takes seconds
    proc.send_signal(getattr(signal, name))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    assert f"stopped by {name} as the run began, before the first step" in stdout, stdout[-2000:]
    assert not (out / "config.json").exists() and not (out / "model.keras").exists()


@pytest.mark.backend_independent
def test_a_second_ctrl_c_ends_train_in_one_line_and_other_commands_as_python_does(monkeypatch,
                                                                                  capsys):
    """A KeyboardInterrupt (the second Ctrl-C) out of `train`: exit 130 and
    one line saying what stands (was: Python's traceback); out of another
    command: Python's own interruption."""
    from keras_reluvit import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_train_noted", interrupted)
    assert cli.main(["train", "--epochs", "1"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("keras-reluvit: interrupted by a second Ctrl-C") and "rerun" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    monkeypatch.setattr(cli, "_recipes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["recipes", "digits"])
    # On a terminal, where Keras' progress bar leaves its line open, each line
    # starts one of its own (was: glued to the bar's "3/5 ━━━━").
    monkeypatch.setattr(cli, "_train_noted", lambda args: (_ for _ in ()).throw(
        B.Preempted("stopped by SIGTERM after step 3")))
    for stream in ("stdout", "stderr"):
        monkeypatch.setattr(getattr(sys, stream), "isatty", lambda: True, raising=False)
    assert cli.main(["train", "--epochs", "1"]) == 0
    assert capsys.readouterr().out == "\nkeras-reluvit: stopped by SIGTERM after step 3\n"
    monkeypatch.setattr(cli, "_train_noted", interrupted)
    assert cli.main(["train", "--epochs", "1"]) == 130
    assert capsys.readouterr().err.startswith("\nkeras-reluvit: interrupted by a second Ctrl-C")
    assert cli.main(["train", "--epochs", "1", "--quiet"]) == 130  # no bar, no open line
    assert capsys.readouterr().err.startswith("keras-reluvit: interrupted")


@pytest.mark.backend_independent
def test_the_commands_process_notes_signals_once_train_returns(tmp_path, monkeypatch, capsys):
    """The doors (`keras-reluvit`, `python -m keras_reluvit.cli`) run
    `main(exiting=True)`: once `train` returns (here an error, exit 2),
    SIGTERM / SIGINT stay noted while the process exits (a launcher's late
    copies kill no worker that saved; a second Ctrl-C interrupts); another
    command gets the process's defaults. Called in-process without it, the
    handlers from before are back."""
    from keras_reluvit import cli

    (tmp_path / "a_file").write_text("")
    failing = ["train", "--output", str(tmp_path / "a_file")]  # an error, exit 2
    mine = lambda *_: None  # noqa: E731
    before = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli.main(failing) == 2
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
        assert cli.main(["recipes", "digits"], exiting=True) == 0
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert cli.main(failing, exiting=True) == 2
        assert "is a file: a run writes a folder there" in capsys.readouterr().err
        signal.raise_signal(signal.SIGTERM)  # a late copy: noted
        signal.raise_signal(signal.SIGINT)
        assert signals.NOTED == [signal.SIGTERM, signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # a second Ctrl-C
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        signals.NOTED.clear()
        signals._RECEIVED.clear()  # (kept: the exiting process's handler was never put back)
    # Both doors say so.
    import runpy

    import keras_reluvit_cli

    calls = []
    monkeypatch.setattr(cli, "main", lambda argv=None, **kw: calls.append(kw) or 0)
    try:
        assert keras_reluvit_cli.main(["recipes"]) == 0
        with pytest.raises(SystemExit):
            runpy.run_module("keras_reluvit.cli", run_name="__main__")
    finally:
        for s, handler in before.items():  # the door's own, left for cli.main
            signal.signal(s, handler)
    assert [c["exiting"] for c in calls] == [True, True]


@pytest.mark.backend_independent
@pytest.mark.parametrize("name, args", [("SIGINT", ["recipes", "digits"]),
                                        ("SIGTERM", ["recipes", "digits"]),
                                        ("SIGINT", ["--help"]), ("SIGTERM", ["train", "--help"])])
def test_a_signal_while_another_command_parses_has_its_own_effect(name, args):
    """Only `train` stops cleanly on a noted signal; any other command (and
    `--help`) gets it back as it came, before it runs: a Ctrl-C interrupts it
    (KeyboardInterrupt), a SIGTERM ends the process (-15)."""
    done = signalled_while_parsing(name, (f"try:\n    cli.main({args!r})\n"
                                          "except KeyboardInterrupt:\n    print('interrupted')\n"))
    ran = "--help" not in args  # a command that runs prints nothing before the signal
    if name == "SIGINT":
        lines = done.stdout.strip().splitlines()
        assert lines[-1:] == ["interrupted"] and (len(lines) == 1 or not ran), (
            done.stdout[-500:], done.stderr[-1000:])
    else:
        assert done.returncode == -15 and (not done.stdout.strip() or not ran), (
            done.returncode, done.stdout[-500:])


@pytest.mark.backend_independent
def test_the_cli_passes_restart_and_override_and_refuses_both(tmp_path, digits_dir,
                                                              monkeypatch, capsys):
    from keras_reluvit import cli

    asked = []
    monkeypatch.setattr(T, "train", lambda config, out, **kw: asked.append(kw["rerun"]) or (
        None, {"final": {}, "train_seconds": 0.0}))
    base = ["train", "--output", str(tmp_path / "r"), "--data-dir", str(digits_dir),
            "--batch-size", "64"]
    for flags, rerun in (([], "error"), (["--restart"], "restart"), (["--override"], "override")):
        assert cli.main(base + flags) == 0
        assert asked[-1] == rerun
    assert cli.main(base + ["--restart", "--override"]) == 2
    assert "--restart starts the run in --output anew, --override continues it" in (
        capsys.readouterr().err)


@pytest.mark.backend_independent
def test_a_rerun_on_a_folder_that_gained_images_is_named(tmp_path, capsys):
    """Was: resumed onto other batches (18 -> 27 steps an epoch) and another
    held-out split, without a word."""
    from PIL import Image

    rng = np.random.default_rng(0)

    def images(start, count):
        for c in ("a", "b"):
            (tmp_path / "imgs" / c).mkdir(parents=True, exist_ok=True)
            for i in range(start, start + count):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
                    tmp_path / "imgs" / c / f"{i}.png")

    images(0, 20)
    cfg = T.build_config(recipe="digits", epochs=1, dataset=str(tmp_path / "imgs"),
                         batch_size=8, image_size=8)
    cfg = dataclasses.replace(
        cfg, model=dict(cfg.model, width=16, depth=1, num_heads=1, mlp_dim=16, patch_size=4))
    out = tmp_path / "run"
    T.train(cfg, out, export=False, verbose=0)
    images(20, 10)
    with pytest.raises(ValueError, match=r"The data of the run in .* changed since it was "
                       r"trained: steps_per_epoch 4 -> 6, split .* --restart .* --override"):
        T.train(cfg, out, export=False, verbose=0)
    T.train(cfg, out, export=False, verbose=0, rerun="override")
    assert "--override: the data changed (steps_per_epoch 4 -> 6" in capsys.readouterr().err


@pytest.mark.backend_independent
def test_restart_clears_backups_of_another_process_count(tmp_path):
    """`--restart` deletes whatever backups the folder holds, those of a
    run of 2 processes too (without it, resuming them in 1 is an error)."""
    out = tmp_path / "run"
    for i in (0, 1):
        step = out / "backup" / f"process_{i}" / "step_000000003"
        step.mkdir(parents=True)
        (step / "record.json").write_text("{}")
    cfg = T.build_config(recipe="digits", batch_size=64)
    with pytest.raises(ValueError, match="holds the backups of a run of 2 processes"):
        T._launch(cfg, str(out), (0, 1), "error")
    launch, launches, old = T._launch(cfg, str(out), (0, 1), "restart")
    assert launch["restart"] and launches == [] and not (out / "backup").exists()
