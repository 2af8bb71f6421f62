"""`python -m keras_reluvit_cli ARGS` (torchrun's `-m`): the command's door."""

import sys

from keras_reluvit_cli import main

sys.exit(main())
