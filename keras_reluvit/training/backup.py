"""A run's backup: step checkpoints, preemption, a resumed run's whole record.

`StepBackup` is the callback; `fit` is `model.fit` resumed at the step the
backup holds. Together they make a killed or preempted run, rerun, end
equal to an uninterrupted one:

- every `every` optimizer steps, at each epoch's end and when SIGTERM or
  SIGINT arrives, the callback writes `backup/step_<n>/`: the weights,
  optimizer state and the running means of the epoch in progress (the loss
  and metric states), and `record.json` -- the epoch, the steps done in it,
  the history of the finished epochs and the loss after every step so far;
- on JAX the state is an Orbax checkpoint of the model's and optimizer's
  variables in their order (`state/`): in a cluster every process writes the shards it holds into one
  shared folder (nothing is gathered), and a restore places each array on the
  model's current devices -- another mesh, device count or process count.
  Elsewhere it is `model.save_weights`' file, one folder per process;
- a write goes to a temporary folder renamed into place when complete (a
  kill during a write leaves the previous backup as it was); the newest
  `keep` backups are kept;
- on SIGTERM / SIGINT (a preemptible machine's notice) it saves at the next
  step boundary -- or, during a validation, at the epoch's end that follows
  it -- and raises `Preempted`, whose message says where the run stopped
  (`keras-reluvit train` prints it and exits 0); a second SIGINT
  interrupts at once; in a cluster every process stops at the same step,
  even if only one got the signal. A signal that came before training
  (while the data and the model were prepared, in `signals_noted`) stops
  the run before its first step, and one while the run is scored and its
  artefacts are written stops it at the evaluation's next batch or before
  the next write (`EvaluationStop`, `stop_point`; in a cluster all
  processes together, within 10 batches, and the chief's writes see its own
  signals): the training is saved, a rerun writes them;
- a loss that turns NaN or infinite stops the run with `FloatingPointError`
  naming the step and the last good backup (which is never overwritten by
  the bad state);
- `fit` restores the newest backup and reads the data stream from that exact
  position: the passes before it are fast-forwarded (each pass of a
  `kr.data` training set has its own shuffle order and augmentation draws)
  and the resumed epoch skips the batches already trained on.

Example:

```python
train, val, info = kr.data.load("sklearn_digits", 64, image_size=32)
history = kr.backup.fit(model, train, epochs=30, validation_data=val,
                        callbacks=kr.callbacks.default("runs/x", every=100))
```
"""

import contextlib
import json
import math
import os
import re
import shutil
import signal
import time

import keras
import numpy as np

from keras_reluvit._logging import say
from keras_reluvit.data.pipeline import skip_passes
from keras_reluvit.training import signals as noted_signals
from keras_reluvit.training.backup_state import load_state
from keras_reluvit.training.backup_state import metric_states
from keras_reluvit.training.backup_state import orbax_v1
from keras_reluvit.training.backup_state import state_lists
from keras_reluvit.training.settings import KEEP_CHECKPOINTS
from keras_reluvit.training.settings import check_every
from keras_reluvit.training.signals import Preempted
from keras_reluvit.training.signals import _main_thread
from keras_reluvit.training.signals import signals_noted  # noqa: F401 - kr.backup.signals_noted
from keras_reluvit.training.signals import stop_if_noted  # noqa: F401
from keras_reluvit.training.signals import stop_point  # noqa: F401

STEP_DIR = re.compile(r"^step_(\d+)$")
TORN = re.compile(r"^\.tmp_step_(\d+)$")  # a backup being written (renamed once whole)
RECORD = "record.json"
WEIGHTS = "state.weights.h5"
STATE = "state"  # JAX: an Orbax checkpoint (`state_lists`)
METRICS = "metrics.npz"
LEGACY_RECORD, LEGACY_WEIGHTS = "training_metadata.json", "latest.weights.h5"  # 0.1


class StepBackup(keras.callbacks.Callback):
    """Backs up a run every `every` steps, at each epoch's end and on
    SIGTERM / SIGINT, in `directory/step_<n>/` (see the module docstring).

    Args:
        directory: the backup folder (one run's only).
        every: optimizer steps (batches) between backups (taken at the
            first callback once they are passed: with `steps_per_execution`
            k, at the end of a call); None: at each epoch's end only.
        keep: how many of the newest backups to keep (>= 1).
        signals: save and stop on SIGTERM and SIGINT, noted by the one
            handler of `training.signals`: `kr.backup.fit` installs it; a
            plain `model.fit` runs within `kr.backup.signals_noted()` (an
            error otherwise). Default: when driven by `kr.backup.fit` (a
            plain `model.fit` cannot resume mid-epoch).
        process: `(index, count)` of this process in a cluster: on JAX all
            write one backup (`directory` is shared; process 0 writes the
            record), elsewhere each keeps its own; after every step (every
            callback) they agree whether any got a signal (a collective), so
            that all save at the same step and stop. Once stopped, the
            handlers from before `fit` are back: `keras-reluvit train` notes
            a launcher's late copies of the signal until its process exits;
            a script of your own that runs a cluster exits within
            `kr.backup.signals_noted()` to do the same.
        dataset: with a plain `model.fit(dataset.repeat(),
            steps_per_epoch=len(dataset))`: the one-epoch training set, whose
            passes before the resumed epoch are fast-forwarded (as
            `kr.backup.fit` does; `kr.callbacks.ResumeDataStream` is the same
            fast-forward, `data.pipeline.skip_passes`, for Keras'
            `BackupAndRestore`, whose epoch it reads).
        info: a dict saved in every record (how the run's data are laid out:
            `keras-reluvit train` keeps its data shards there).

    A plain `model.fit` resumes a backup taken at an epoch's end (its
    `initial_epoch` is set); one taken mid-epoch is an error naming
    `kr.backup.fit`, which resumes it.

    Attributes:
        history: the whole run's per-epoch logs (those of the epochs before
            a resume included).
        step_loss: the loss Keras reports after every step of the whole run
            (with the model's `steps_per_execution` k: after every k steps,
            Keras calling back once per call; k must divide the epoch).
        train_seconds: seconds in `fit` of the whole run, to its newest
            backup (a rerun of a finished run: the same number).
    """

    def __init__(self, directory, every=None, keep=KEEP_CHECKPOINTS, signals=None, process=(0, 1),
                 dataset=None, info=None):
        super().__init__()
        check_every(every, "every (StepBackup, kr.callbacks.default; train --checkpoint-every)")
        if isinstance(keep, bool) or int(keep) != keep or keep < 1:
            raise ValueError(f"keep (the backups kept; train --keep-checkpoints) must be a whole "
                             f"number >= 1, got {keep!r}.")
        self.directory = os.path.expanduser(os.fspath(directory))
        self.every = None if every is None else int(every)
        self.keep = int(keep)
        self.signals = signals
        self.process = tuple(process)
        self.dataset = dataset
        self.info = dict(info or {})
        self.sharded = keras.backend.backend() == "jax"  # Orbax: see the module docstring
        self.driven = False  # set by `fit`
        self.history, self.step_loss = {}, []
        self.epoch, self.done, self.step = 0, 0, 0
        self._restored = None  # the record of the backup this run resumed
        self._pending = None  # the newest backup's record, read by resume_point
        self._metrics = None  # metric states to restore at the resumed epoch's start
        self._resumed = False  # the restored backup is mid-epoch: that epoch resumes
        self._offset = 0  # steps of the epoch done before this `model.fit` call's first
        self._signal = None  # the signal this process stops on (taken from the noted ones)
        self._watching = False  # signals on for this `fit`
        self._agree = False
        self._cut = None  # the epoch whose validation a signal cut short
        self.seconds = 0.0  # training seconds of the run before this launch (its backup's)
        self._started = None  # when this launch's training began
        self.train_seconds = 0.0  # seconds in `fit` of the whole run, to its newest backup

    # ---- reading ------------------------------------------------------------
    def backups(self):
        """The complete backups, newest first: [(step, path), ...]."""
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            m = STEP_DIR.match(name)
            path = os.path.join(self.directory, name)
            if m and os.path.exists(os.path.join(path, RECORD)):
                found.append((int(m.group(1)), path))
        return sorted(found, reverse=True)

    def latest(self, quiet=False):
        """The newest backup's record (a dict with its `path`), or None.
        A backup that cannot be read is passed over for the one before it,
        said in one line (unless `quiet`). A backup of keras-reluvit 0.1
        (Keras' `BackupAndRestore`: the end of an epoch) is read too."""
        backups = self.backups()
        if not backups:
            return self._legacy()
        for _, path in backups:
            try:
                with open(os.path.join(path, RECORD)) as f:
                    record = json.load(f)
            except (OSError, ValueError) as e:
                if not quiet:
                    say(f"backup {path} cannot be read ({e}); using the one "
                        "before it.")
                continue
            return dict(record, path=path)
        return None

    def _legacy(self):
        meta = os.path.join(self.directory, LEGACY_RECORD)
        if not os.path.exists(meta):
            return None
        with open(meta) as f:
            epoch = int(json.load(f)["epoch"])
        return dict(epoch=epoch, done=0, step=None, history={}, step_loss=[],
                    path=self.directory, legacy=True)

    def resume_point(self):
        """(epoch, steps done in it) of the newest backup; (0, 0) if none.
        That backup is the one the run then restores (read once)."""
        self._pending = self.latest()
        record = self._pending
        step = record["step"] if record and record.get("step") is not None else 0
        torn = sorted(n for n in (os.listdir(self.directory) if os.path.isdir(self.directory)
                                  else []) if TORN.match(n) and int(TORN.match(n)[1]) > step)
        if torn and self.process[0] == 0:
            say(f"{os.path.join(self.directory, torn[-1])} was being written when the run "
                "stopped (incomplete): passed over, "
                + (f"resuming from {record['path']} (step {step} of the run)." if record
                   else "starting from the first step."))
        return (record["epoch"], record["done"]) if record else (0, 0)

    # ---- the callback -------------------------------------------------------
    def on_train_begin(self, logs=None):
        if self._started is None:
            self._started = time.time()
        if self._restored is None:
            self._restore()
            if not self.driven:
                self._resume_plain_fit()
        signals = self.driven if self.signals is None else self.signals
        self._agree = bool(signals) and self.process[1] > 1
        self._watching = bool(signals)
        if (signals and _main_thread()
                and signal.getsignal(signal.SIGTERM) is not noted_signals._handler):
            raise ValueError("StepBackup(signals=True) under a plain model.fit: run it within "
                             "`with kr.backup.signals_noted():` (which notes SIGTERM / SIGINT "
                             "for it and puts the handlers back after), or train with "
                             "kr.backup.fit, which does.")
        if signals and self._stop_agreed():  # one noted as the run was prepared: stop now
            where = (f"after step {self.done} of epoch {self.epoch + 1} (step {self.step} of "
                     "the run)" if self.step else "before the first step")
            raise Preempted(f"stopped by {self._signal_name()} as training began, {where}: "
                            "nothing was trained since; rerun the same command to "
                            + ("continue." if self.step else "start."))

    def on_train_end(self, logs=None):
        if not self.driven:
            from keras_reluvit import _keras_compat as compat

            compat.set_initial_epoch(self.model, None)  # Keras keeps it for the next fit

    def on_epoch_begin(self, epoch, logs=None):
        # Keras numbers the batches of each `model.fit` call from 0: the resumed
        # epoch's (its rest, `fit` below) count on from the steps it had done.
        resumed = epoch == self.epoch and self._resumed
        self._resumed = False
        if resumed and self._metrics is not None:
            variables = self.model.metrics_variables
            if len(self._metrics) != len(variables):
                raise ValueError(f"The backup {self._restored['path']} holds "
                                 f"{len(self._metrics)} metric states; the model has "
                                 f"{len(variables)}: was it compiled with other metrics?")
            for v, value in zip(variables, self._metrics):
                v.assign(value)
        if not resumed:
            self.epoch, self.done = epoch, 0
        self._offset = self.done
        self._metrics = None

    def on_train_batch_end(self, batch, logs=None):
        # `batch`: Keras' index of the last step this call ran (with the model's
        # `steps_per_execution` k, Keras calls back once every k steps).
        logs = logs or {}
        done = self._offset + batch + 1
        before, self.step = self.step, self.step + done - self.done
        self.done = done
        if "loss" in logs:
            loss = float(logs["loss"])
            if not math.isfinite(loss):
                last = self.latest()
                raise FloatingPointError(
                    f"The loss is {loss} after step {self.done} of epoch {self.epoch + 1} "
                    f"(step {self.step} of the run). The last good backup: "
                    + (f"{last['path']} (epoch {last['epoch'] + 1}, step {last['done']}); "
                       "rerunning resumes from it." if last else "none (nothing was saved)."))
            self.step_loss.append(loss)
        # At an epoch's last step the stop waits for the epoch's end (its validation
        # cut at once): a backup after the last step would be an epoch with no step left.
        last = (self.params or {}).get("steps") == batch + 1
        if not last and self._stop_agreed():
            self._stop(f"after step {self.done} of epoch {self.epoch + 1} (step {self.step} "
                       "of the run)")
        if self.every and self.step // self.every > before // self.every and not last:
            self.save()  # (the epoch's end saves)

    def on_test_batch_end(self, batch, logs=None):
        # A signal during fit's validation (one process): the validation ends at
        # this batch (Keras' public `stop_evaluating`) and the epoch is saved, its
        # validation's numbers NaN in the history (evaluating them again before the
        # resumed training would move its data stream). In a cluster the processes
        # agree at the epoch's end instead (a collective per batch would cost each).
        if (self.driven and not self._agree and self._cut is None
                and self._poll() is not None):
            self._cut = self.epoch
            self.model.stop_evaluating = True
            self.model.stop_training = True  # callbacks see the stop (EMAEvaluation)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self._cut == epoch:  # the validation's numbers (the EMA's: skipped) are NaN
            logs.update({k: math.nan for k in set(logs) | set(self.history)
                         if k.startswith(("val_", "ema_val_"))})
        for k, v in logs.items():
            self.history.setdefault(k, []).append(float(v))
        self.epoch, self.done = epoch + 1, 0
        self.save()
        # A signal during the epoch's validation (or the callbacks before this
        # one): the epoch is saved, the run stops before the next.
        if self._stop_agreed():
            where = f"at the end of epoch {epoch + 1} (step {self.step} of the run)"
            if self._cut == epoch:
                where += ", its validation cut short (NaN in the history)"
            self._stop(where)

    def _stop_agreed(self):
        """Whether to stop now: this process got a signal or, in a cluster,
        any did (a collective: every process asks at the same points)."""
        return noted_signals.agreed(self._poll() is not None,
                                    self.process if self._agree else (0, 1))

    def _signal_name(self):
        return (signal.Signals(self._signal).name if self._signal is not None
                else "a signal to another process")

    def _stop(self, where):
        name = self._signal_name()
        path = self.save()
        raise Preempted(f"stopped by {name} {where}, saved in {path}: rerun the same command "
                        "to continue.")

    # ---- writing ------------------------------------------------------------
    def save(self):
        """Writes the state after the current step; returns its folder."""
        from keras_reluvit.distribution import chief_writes

        final = os.path.join(self.directory, f"step_{self.step:09d}")
        if os.path.exists(os.path.join(final, RECORD)):
            return final  # this step is saved (a step that ends an epoch)
        # The launches before this one (to their backups) and this one's so far.
        self.train_seconds = self.seconds + (time.time() - self._started if self._started
                                             else 0.0)
        tmp = os.path.join(self.directory, f".tmp_step_{self.step:09d}")
        # On JAX the processes of a cluster write one backup; process 0 its record.
        shared = self.sharded and self.process[1] > 1
        writer = not shared or self.process[0] == 0
        if writer:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        if self.sharded:
            self._barrier("made")
            ocp = orbax_v1()  # every process writes the shards it holds (a collective)
            state = {"pytree": state_lists(self.model, lambda v: v.value)}
            if self.done and self.model.metrics_variables:  # an epoch in progress
                state["running_means"] = state_lists(self.model, lambda v: v.value, metrics=True)
            ocp.save_checkpointables(os.path.abspath(os.path.join(tmp, STATE)), state)
        else:
            with chief_writes(self.model):  # a TF / torch cluster: local full copies
                self.model.save_weights(os.path.join(tmp, WEIGHTS))
            metrics = metric_states(self.model) if self.done else []
            if metrics is not None:
                np.savez(os.path.join(tmp, METRICS), *metrics)
        if writer:
            record = dict(epoch=self.epoch, done=self.done, step=self.step,
                          history=self.history, step_loss=self.step_loss, every=self.every,
                          validation_cut=self._cut,
                          processes=self.process[1], train_seconds=self.train_seconds,
                          steps_per_execution=int(getattr(self.model, "steps_per_execution",
                                                          1) or 1),
                          **self.info)
            with open(os.path.join(tmp, RECORD), "w") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)  # atomic: the folder appears complete or not at all
            for _, old in self.backups()[self.keep:]:
                shutil.rmtree(old, ignore_errors=True)
            for name in os.listdir(self.directory):  # writes that a stop cut short
                if TORN.match(name) and int(TORN.match(name)[1]) < self.step:
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._barrier("saved")
        return final

    def _barrier(self, name):
        if self.sharded and self.process[1] > 1:
            from keras_reluvit.distribution import barrier

            barrier(f"backup_{name}_{self.step}")

    # ---- internals ----------------------------------------------------------
    def _restore(self):
        record = self._pending if self._pending is not None else self.latest()
        self._pending = None
        self._restored = record or {}
        if not record:
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        if record.get("legacy"):
            model.load_weights(os.path.join(record["path"], LEGACY_WEIGHTS))
            record["step"] = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
            say(f"resumed a keras-reluvit 0.1 backup in {self.directory} at "
                f"epoch {record['epoch'] + 1}; the history before it is not in it.")
        elif os.path.isdir(os.path.join(record["path"], STATE)):
            self._metrics = load_state(model, os.path.join(record["path"], STATE),
                                        metrics=bool(record["done"]))
        else:
            model.load_weights(os.path.join(record["path"], WEIGHTS))
            metrics = os.path.join(record["path"], METRICS)
            if record["done"] and os.path.exists(metrics):
                with np.load(metrics) as f:
                    self._metrics = [f[f"arr_{i}"] for i in range(len(f.files))]
            elif record["done"]:
                say(f"{record['path']} holds no running means of its epoch (a "
                    "cluster's distributed metrics): the resumed epoch's logged loss and "
                    "metrics average its steps from the resume on.")
        self.epoch, self.done, self.step = record["epoch"], record["done"], record["step"]
        self._resumed = bool(self.done)
        self.history = {k: list(v) for k, v in record["history"].items()}
        self.step_loss = list(record["step_loss"])
        self.seconds = self.train_seconds = float(record.get("train_seconds", 0.0))

    def restore(self, model):
        """Loads the newest backup into `model` now (`fit` does, when the
        run it resumes has no epoch left)."""
        self.set_model(model)
        if self._restored is None:
            self._restore()

    def _resume_plain_fit(self):
        from keras_reluvit import _keras_compat as compat

        if self.every:
            raise ValueError(
                f"every={self.every} backs up mid-epoch, and a plain model.fit can neither resume "
                "there nor save on SIGTERM: train with kr.backup.fit(model, train, epochs, "
                "callbacks=...), which does both, or leave every unset (a backup at each "
                "epoch's end, which model.fit resumes).")
        if self.done:
            raise ValueError(
                f"The backup in {self.directory} was taken after step {self.done} of epoch "
                f"{self.epoch + 1}: model.fit cannot start mid-epoch. Resume it with "
                "kr.backup.fit(model, train, epochs, backup=...).")
        compat.set_initial_epoch(self.model, self.epoch)
        if self.dataset is not None:
            skip_passes(self.dataset, self.epoch)

    def _poll(self):
        """This process's signal: the one it took, or the first noted since."""
        if self._watching and self._signal is None:
            self._signal = noted_signals.take()
        return self._signal


class EvaluationStop(keras.callbacks.Callback):
    """Ends an evaluation at the next batch once SIGTERM / SIGINT was noted
    (Keras' public `stop_evaluating`), for `stop_point` to stop the run
    after it. In a cluster (`process`: (index, count)) the processes agree
    every `every` batches (a collective and a host sync: they evaluate in
    step, the same batches), so that all end at the same one."""

    def __init__(self, process=(0, 1), every=10):
        super().__init__()
        self.process, self.every = process, every

    def on_test_batch_end(self, batch, logs=None):
        if self.process[1] > 1 and (batch + 1) % self.every:
            return
        if noted_signals.agreed(bool(noted_signals.NOTED), self.process):
            self.model.stop_evaluating = True


def backup_folder(root, process):
    """The folder `process` = (index, count) backs up in: `root` itself on
    JAX (one backup for the whole cluster, restored onto any process count),
    elsewhere `root/process_<index>` in a cluster -- and the same on JAX for
    the per-process backups an earlier version wrote. A ValueError when the
    backups in `root` were written per process by a run of another process
    count (a run that ignored them would restart at step 0 without a word)."""
    index, count = process
    processes = _process_folders(root)
    if keras.backend.backend() == "jax" and not processes:
        return root
    check_backup_layout(root, count)
    return os.path.join(root, *([f"process_{index}"] if count > 1 else []))


def _process_folders(root):
    names = os.listdir(root) if os.path.isdir(root) else []
    return sorted(int(n.split("_")[1]) for n in names
                  if n.startswith("process_") and n.split("_")[1].isdigit())


def _other_layout(root, was, now, how):
    """The error of a resume onto another process count (one message for
    both layouts below)."""
    return ValueError(f"{root} holds the backups of a run of {was}; this run has {now}. {how}, "
                      "or start anew in another --output.")


def check_backup_layout(root, count):
    """A ValueError when the backups in `root` were written per process by a
    run of another process count (TensorFlow and torch clusters: resuming
    them onto another count is not supported). JAX's one shared backup:
    `data_layout`."""
    if not os.path.isdir(root):
        return
    names = os.listdir(root)
    processes = _process_folders(root)
    single = any(n.startswith("step_") or n == "training_metadata.json" for n in names)
    had = len(processes) if processes else (1 if single else None)
    if had is not None and had != count:
        raise _other_layout(root, f"{had} process{'es' if had > 1 else ''}", count,
                            f"Resuming onto another process count is not supported: rerun "
                            f"with {had}")


def data_layout(root, shards, index, count, asked):
    """(the run's data shards, those process `index` of `count` reads) for
    a run backing up in `root`. A JAX run resumed on fewer processes keeps
    its data stream: its backup records the shards the run began with (one
    per process of its first launch), and each process now reads
    `shards / count` of them, their batches side by side in the global batch
    as the processes' were (said in one line); a count that does not divide
    them, or `asked` (data_shards=) other than them, is an error. (TensorFlow
    and torch keep per-process backups: `check_backup_layout`.)"""
    record = StepBackup(root).latest(quiet=True)
    was = (record or {}).get("data_shards")
    if keras.backend.backend() == "jax" and was and was != shards:
        if asked or was % count:
            this = f"data_shards={asked}" if asked else f"{count} processes"
            raise _other_layout(root, f"{was} data shards (its data stream split in {was})",
                                this, f"Resume it on a number of processes that divides {was} "
                                      f"(each reads {was} / processes shards)")
        say(f"resuming a run of {was} data shards on {count} "
            f"process{'es' if count > 1 else ''}: each reads {was // count} of them, so "
            "the global batches continue as they were.")
        shards = was
    per = shards // count
    mine = list(range(index * per, (index + 1) * per))
    return shards, (mine[0] if per == 1 else mine)


def fit(model, dataset, epochs, backup=None, validation_data=None, callbacks=(),
        steps_per_epoch=None, verbose="auto", distribute=None):
    """`model.fit` over `dataset`, one pass per epoch, resumed at the step
    `backup` (a `StepBackup`; default: the one in `callbacks`, as
    `kr.callbacks.default` returns) holds, on the data stream the
    uninterrupted run had there; returns the whole run's history (a dict of
    per-epoch lists). SIGTERM / SIGINT save and raise `Preempted`.

    A `kr.data` training set draws a new shuffle order and new augmentation
    draws for each pass (each iterator created from it). The passes before
    the backup's epoch are created without being read (cheap: tf.data starts
    work on the first read); the resumed epoch skips the batches already
    trained on (they are read and dropped: up to one epoch's input work) and
    ends at the epoch's usual step; the later epochs read one iterator of
    `dataset.repeat()`.

    Args:
        dataset: the one-epoch training `tf.data.Dataset`
            (`kr.data.load(...).train`).
        steps_per_epoch: default `len(dataset)`.
        distribute: a function `dataset -> what fit takes` (a TensorFlow
            cluster's distributed dataset).
    """
    callbacks = list(callbacks)
    if backup is None:
        found = [c for c in callbacks if isinstance(c, StepBackup)]
        if len(found) != 1:
            raise ValueError(f"kr.backup.fit needs one StepBackup (backup=, or in callbacks as "
                             f"kr.callbacks.default returns it); got {len(found)}.")
        backup = found[0]
    callbacks = [c for c in callbacks if c is not backup]
    steps = int(steps_per_epoch or len(dataset))
    distribute = distribute or (lambda ds: ds)
    epoch, done = backup.resume_point()
    if done >= steps:
        raise ValueError(f"The backup in {backup.directory} is at step {done} of an epoch of "
                         f"{steps} steps: was it written by another run (batch size, data)?")
    backup.driven = True
    skip_passes(dataset, epoch)
    if epoch >= epochs:  # the run had finished (killed while writing its artefacts)
        backup.restore(model)
        return backup.history
    _check_executions(model, steps, backup._pending, backup.directory)
    with noted_signals.signals_noted() if backup.signals is not False else \
            contextlib.nullcontext():  # one handler for both `model.fit` calls
        _fit(model, dataset, epochs, backup, epoch, done, steps, distribute,
             dict(validation_data=validation_data, verbose=verbose,
                  callbacks=list(callbacks) + [backup],
                  shuffle=False))  # a data set's own order (Keras: its shuffle ignored, warned)
    return backup.history


def _fit(model, dataset, epochs, backup, epoch, done, steps, distribute, kwargs):
    if done:  # the metrics' running means are restored before the epoch's first step
        if keras.backend.backend() == "tensorflow":  # its trainer builds them in the first step
            from keras_reluvit import _keras_compat as compat

            compat.build_metrics(model, dataset.element_spec)
        # Its cardinality hidden: Keras' TensorFlow trainer creates (and so
        # draws) a new iterator after an epoch that ends a finite data set.
        rest = dataset.skip(done).filter(lambda *_: True)
        model.fit(distribute(rest), steps_per_epoch=steps - done,
                  initial_epoch=epoch, epochs=epoch + 1, **kwargs)
        epoch += 1
    if epoch < epochs:
        model.fit(distribute(dataset.repeat()), steps_per_epoch=steps, initial_epoch=epoch,
                  epochs=epochs, **kwargs)


def _check_executions(model, steps, record, directory):
    """A ValueError where the model's `steps_per_execution` (k steps per
    call, Keras' `compile`) does not divide the epoch's steps -- Keras then
    runs whole calls, more steps an epoch than the data stream has -- or
    differs from the k the backup being resumed (`record`) was taken with:
    its record holds one loss per call."""
    k = int(getattr(model, "steps_per_execution", 1) or 1)
    was = int((record or {}).get("steps_per_execution", 1))
    if record and record.get("step") and was != k:
        raise ValueError(f"The backup in {directory} was taken with steps_per_execution={was} "
                         f"(its record holds one loss per call); this model has {k}. Resume "
                         f"with {was}, or start anew in another folder.")
    if steps % k:
        raise ValueError(f"The model's steps_per_execution={k} does not divide the epoch's "
                         f"{steps} steps: Keras would run {-(-steps // k) * k} steps an epoch "
                         f"(whole calls of {k}), past the epoch's data. Compile it with a "
                         f"steps_per_execution that divides {steps}.")
