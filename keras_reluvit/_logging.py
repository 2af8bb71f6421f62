"""The library's messages: one logger, `logging.getLogger("keras_reluvit")`.

Each line the library says -- a default that changed what a run asked for,
a checkpoint's fresh head, a resume, a data set being prepared -- is an INFO
record of this logger, shown as `keras_reluvit: MESSAGE` on the standard
error of the moment (a notebook's cell, a terminal, pytest's capture), as
transformers' and Python's own handlers write: a command's standard output
holds its results alone (`eval`'s and `predict`'s JSON, a path).
Python's own controls apply: `logging.getLogger("keras_reluvit").setLevel(
logging.WARNING)` silences them; replacing its handler (`logger.handlers`)
routes them elsewhere; `logger.propagate = True` also passes them to the
root logger's handlers.
"""

import logging
import sys

logger = logging.getLogger("keras_reluvit")


class _Stderr(logging.StreamHandler):
    """A handler writing to `sys.stderr` as it is when a record comes (a
    notebook or pytest replaces it after this module is imported)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler's own assignment: the current stderr is used
        pass


if not logger.handlers:
    _handler = _Stderr()
    _handler.setFormatter(logging.Formatter("keras_reluvit: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def say(message):
    """`message` as one INFO line of the library's logger."""
    logger.info(message)
