"""`python -m keras_reluvit.cli ARGS`: the command line."""

import sys

from keras_reluvit.cli import main

sys.exit(main())
