"""The signals of a run: one handler for SIGTERM / SIGINT (a preemptible
machine's notice, a Ctrl-C), installed by whoever runs first -- the command
line from its first line, else `kr.backup.fit` or `signals_noted` -- and put
back by the same, what no stop took then raised again. What it does with a
signal depends on where the run is:

- it notes it (`NOTED`); the run takes it at its next point of stopping:
  before its first step (`stop_if_noted`), at a step boundary (a
  `StepBackup` saves and stops: training.backup), between the batches of
  the final evaluation and between the artefacts' writes (`stop_point`);
  in a cluster every process stops at the same point (they agree there);
- a second SIGINT raises KeyboardInterrupt at once, wherever the run is.

Nothing raises from inside the code a signal interrupts, but a second
Ctrl-C: one process of a cluster leaving a collective alone would leave its
peers waiting in it.
"""

import contextlib
import signal
import threading
import types


class Preempted(Exception):
    """A run stopped on SIGTERM / SIGINT: raised by `StepBackup` once it
    saved, by `stop_if_noted` before the first step and by `stop_point`
    after training; its message says where, and that a rerun continues."""


NOTED = []  # SIGTERM / SIGINT noted, not yet taken by a stop (`take`)
_RECEIVED = []  # every one since the handler was installed (a second SIGINT interrupts)


def _main_thread():
    return threading.current_thread() is threading.main_thread()


def _handler(signum, frame):
    if signum == signal.SIGINT and signal.SIGINT in _RECEIVED:
        raise KeyboardInterrupt  # a second Ctrl-C: now
    _RECEIVED.append(signum)
    NOTED.append(signum)


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


def agreed(stop, process=(0, 1)):
    """`stop`, or in a cluster (`process`: (index, count)) whether it is True
    on any process: a collective every process calls at the same point."""
    if process[1] > 1:
        from keras_reluvit.distribution import any_process

        return any_process(stop)
    return bool(stop)


def stop_point(where, process=(0, 1), stop=None):
    """Raises `Preempted` ("stopped by SIGTERM `where`: rerun the same
    command to finish.") if a signal was noted (or `stop`, given: this
    process' own reason) -- in a cluster (`process`: (index, count)), on
    any process: every process calls it at the same point (a collective)
    and all stop there together. For the work after training (the final
    evaluation, the artefacts' writes), which a rerun redoes from the
    backup. The signal is taken only once the stop is decided (a collective
    that fails leaves it noted)."""
    if agreed(bool(NOTED) if stop is None else stop, process):
        mine = take()
        name = signal.Signals(mine).name if mine is not None else "a signal to another process"
        raise Preempted(f"stopped by {name} {where}: rerun the same command to finish.")
