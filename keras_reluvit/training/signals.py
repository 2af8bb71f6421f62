"""The signals of a run: one handler for SIGTERM / SIGINT (a preemptible
machine's notice, a Ctrl-C), installed by whoever runs first -- the command
line from its first line, else `kr.backup.fit` or `signals_noted` -- and put
back by the same, what no stop took then raised again. What it does with a
signal depends on where the run is:

- while the run is prepared or trains, it notes it (`NOTED`): the run stops
  before its first step (`stop_if_noted`) or a `StepBackup` saves at the
  next step boundary and stops (training.backup);
- while the artefacts are written (`signals_stop`), it raises `Preempted`
  at once: the training is saved, a rerun writes them;
- a second SIGINT raises KeyboardInterrupt at once, wherever the run is.
"""

import contextlib
import signal
import threading
import types


class Preempted(Exception):
    """Raised by `StepBackup` after it saved the run on SIGTERM / SIGINT."""


NOTED = []  # SIGTERM / SIGINT noted, not yet taken by a stop (`take`)
_RECEIVED = []  # every one since the handler was installed (a second SIGINT interrupts)
_STOPPING = []  # `signals_stop`'s `where`, innermost last: a signal raises at once


def _main_thread():
    return threading.current_thread() is threading.main_thread()


def _handler(signum, frame):
    if signum == signal.SIGINT and signal.SIGINT in _RECEIVED:
        raise KeyboardInterrupt  # a second Ctrl-C: now
    _RECEIVED.append(signum)
    if _STOPPING:
        raise _stopped_while(signum)
    NOTED.append(signum)


def _stopped_while(signum):
    return Preempted(f"stopped by {signal.Signals(signum).name} while {_STOPPING[-1]}: rerun "
                     "the same command to finish.")


def install():
    """Installs the handler for SIGTERM and SIGINT (off the main thread,
    where Python sets none: nothing); returns the function that puts back
    what it replaced -- a no-op for the calls that found it installed --
    then raises again what no stop took, which has its own effect under
    them (a SIGTERM that came after the run's last check is not lost).
    `put_back(keep=True)` leaves it in place (the command's process,
    exiting: see `signals_noted`); `to`: the handlers to put instead of the
    ones it replaced."""
    if not _main_thread():
        return lambda keep=False, to=None: None
    nested = signal.getsignal(signal.SIGTERM) is _handler
    if not nested:  # what an earlier process-exiting handler (kept) noted is stale
        NOTED.clear()
        _RECEIVED.clear()
        _STOPPING.clear()
    # Set again where it is in place: a library may have put a C-level handler
    # under Python's since (TensorFlow's cluster, for SIGTERM), which Python's
    # record of the handler does not show.
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGTERM, signal.SIGINT)}
    if nested:
        return lambda keep=False, to=None: None

    def put_back(keep=False, to=None):
        if keep:
            return
        for s, handler in previous.items():
            signal.signal(s, (to or previous)[s])
        pending = list(NOTED)
        NOTED.clear()
        _RECEIVED.clear()
        for s in pending:
            signal.raise_signal(s)

    return put_back


def note(*signums):
    """Notes signals received before the handler was in place (the
    command's door notes them while the package is imported)."""
    _RECEIVED.extend(signums)
    NOTED.extend(signums)


def take():
    """The first signal noted and not yet taken (its number), or None; a
    stop that acts on it takes it (the signals after it stay noted)."""
    return NOTED.pop(0) if NOTED else None


@contextlib.contextmanager
def signals_noted():
    """Within: SIGTERM / SIGINT are noted, not fatal, until a stop takes
    them (`stop_if_noted`, a `StepBackup`: in a cluster every process stops
    at one step); a second SIGINT interrupts at once. The command line's
    `main` runs in here from its first line, so that a preemption notice
    (or a Ctrl-C) that comes while a run is prepared still ends in a clean
    stop (exit 0, said in one line). Nested, it is the outer one's.

    On the way out the handlers from before are back and what no stop took
    is raised again (`install`). Yields an object whose `keep`, set True,
    leaves the handler in place instead: the command's process, about to
    exit once a run returned, notes the late copies of a signal that a
    launcher sends its workers one by one, so that none kills a worker that
    saved before it reports; and whose `restore`, set to {signal: handler},
    is put back instead of the handlers from before."""
    way_out = types.SimpleNamespace(keep=False, restore=None)
    put_back = install()
    try:
        yield way_out
    finally:
        put_back(keep=way_out.keep, to=way_out.restore)


def stop_if_noted(where, process=(0, 1)):
    """Raises `Preempted` now if a signal was noted: a single process stops
    at `where` (while the run is prepared) instead of at the first step,
    which on a large data set may come after a preemption notice's ~30 s. A
    cluster's process goes on to the first step, where its peers agree (one
    stopping alone would leave them waiting)."""
    if NOTED and process[1] == 1:
        name = signal.Signals(take()).name
        raise Preempted(f"stopped by {name} {where}, before the first step: nothing was "
                        "trained since; rerun the same command to continue or start.")


@contextlib.contextmanager
def signals_stop(where):
    """Within: SIGTERM / SIGINT (or one noted before) raise `Preempted` at
    once, its message "stopped by SIGTERM while `where`" -- for the work
    after training (scoring, writing the artefacts), which a rerun redoes
    from the backup: a preemptible machine's notice is shorter than it."""
    put_back = install()
    depth = len(_STOPPING)
    try:
        _STOPPING.append(where)
        if NOTED:
            raise _stopped_while(take())
        yield
    finally:
        del _STOPPING[depth:]
        put_back()
