"""`python -m keras_reluvit.cli ARGS`: the command line. The package's
imports (about 5 s: Keras and a backend) run before it, and a Ctrl-C or
SIGTERM during them is Python's default; `keras-reluvit` and `python -m
keras_reluvit_cli` (the door) note the signals from their first line."""

import sys

if __name__ == "__main__":
    from keras_reluvit.cli import main

    sys.exit(main(exiting=True))
