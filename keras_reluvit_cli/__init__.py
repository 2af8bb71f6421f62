"""The `keras-reluvit` command's door: SIGTERM and SIGINT are noted from the
process's first line, before `keras_reluvit` imports Keras and a backend
(seconds; on JAX a KeyboardInterrupt raised then would mostly be
swallowed by JAX's garbage-collection callback), then
`keras_reluvit.cli.main` runs with the signals noted: `train` stops cleanly
(exit 0, said), any other command gets them back as they came.

A package of its own because importing any module of `keras_reluvit`
imports the package first (Keras, the backend, its registered classes).
`python -m keras_reluvit_cli` (and `torchrun -m keras_reluvit_cli`) is the
same door.
"""

import signal


def main(argv=None):
    """`keras-reluvit ARGS`: the exit code."""
    noted = []
    for s in (signal.SIGTERM, signal.SIGINT):  # until `cli.main` notes them itself
        signal.signal(s, lambda signum, frame: noted.append(signum))
    from keras_reluvit import cli

    return cli.main(argv, noted=noted, exiting=True)
