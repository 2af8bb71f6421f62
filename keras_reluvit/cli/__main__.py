"""`python -m keras_reluvit.cli ARGS`: the command line, through its door
(`keras_reluvit_cli`: the signals noted from the first line)."""

import sys

from keras_reluvit_cli import main

sys.exit(main())
