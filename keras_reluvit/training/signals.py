"""The signals of a run: SIGTERM / SIGINT (a preemptible machine's notice)
noted while a run is prepared, the stop they cause before the first step
and while the artefacts are written. `StepBackup` (training.backup) takes
the noted signal over and stops at a step boundary (see its module)."""

import contextlib
import signal
import threading
import types


class Preempted(Exception):
    """Raised by `StepBackup` after it saved the run on SIGTERM / SIGINT."""


NOTED = []  # SIGTERM / SIGINT noted by `signals_noted`, for the next StepBackup
_DEPTH = [0]  # `signals_noted` within itself (the CLI's, then `train`'s)


def _main_thread():
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def signals_noted():
    """Within: SIGTERM / SIGINT are noted, not fatal, until a `StepBackup`
    takes over (it then stops the run before its first step, in a cluster
    every process); a second SIGINT interrupts at once. The command line's `main` runs in
    here from its first line, so that a preemption notice (or a Ctrl-C) that
    comes while a run is prepared still ends in a clean stop (exit 0, said
    in one line).

    Yields an object whose `keep`, set True, leaves the noting handler in
    place on the way out instead of the ones from before: the command's
    process, about to exit once a run returned, notes the late copies of a
    signal that a launcher sends its workers one by one, so that none kills
    a worker that saved before it reports (a second Ctrl-C still
    interrupts)."""
    way_out = types.SimpleNamespace(keep=False)
    if not _main_thread():
        yield way_out
        return

    def note(signum, frame):
        if signum == signal.SIGINT and signal.SIGINT in NOTED:
            raise KeyboardInterrupt
        NOTED.append(signum)

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    _DEPTH[0] += 1
    try:
        yield way_out
    finally:
        for s, handler in previous.items():
            if not way_out.keep:
                signal.signal(s, handler)
        _DEPTH[0] -= 1
        if not _DEPTH[0]:  # the outermost: what no StepBackup took is dropped
            NOTED.clear()


def stop_if_noted(where, process=(0, 1)):
    """Raises `Preempted` now if `signals_noted` noted a signal: a single
    process stops at `where` (while the run is prepared) instead of at the
    first step, which on a large data set may come after a preemption
    notice's ~30 s. A cluster's process goes on to the first step, where its
    peers agree (one stopping alone would leave them waiting)."""
    if NOTED and process[1] == 1:
        name = signal.Signals(NOTED[0]).name
        NOTED.clear()
        raise Preempted(f"stopped by {name} {where}, before the first step: nothing was "
                        "trained since; rerun the same command to continue or start.")


@contextlib.contextmanager
def signals_stop(where):
    """Within: SIGTERM / SIGINT (or one noted before) raise `Preempted` at
    once, its message "stopped by SIGTERM while `where`" -- for the work
    after training (scoring, writing the artefacts), which a rerun redoes
    from the backup: a preemptible machine's notice is shorter than it."""
    if not _main_thread():
        yield
        return

    def stop(signum, frame):
        raise Preempted(f"stopped by {signal.Signals(signum).name} while {where}: rerun the "
                        "same command to finish.")

    pending = list(NOTED)
    NOTED.clear()
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if pending:
            stop(pending[0], None)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
