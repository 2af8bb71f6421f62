"""CI's subset (tests/conftest.py): a `full_only` mark leaves its test out
on the backends and parameter sets it names, and a mark that would match
nothing, or says nothing of what covers the test, is an error."""

import os
import types

import keras
import pytest
from conftest import _check_full_only_ids
from conftest import _full_only

pytestmark = pytest.mark.backend_independent
HERE = os.path.dirname(os.path.abspath(__file__))


def item(name, mark=None, param=None):
    marks = {"full_only": mark.mark} if mark is not None else {}
    return types.SimpleNamespace(
        nodeid=f"tests/test_x.py::{name}" + (f"[{param}]" if param else ""),
        callspec=types.SimpleNamespace(id=param) if param else None,
        get_closest_marker=marks.get)


def whole_folder():
    return types.SimpleNamespace(option=types.SimpleNamespace(keyword="", markexpr=""),
                                 args=[HERE])


def test_a_mark_leaves_out_its_backends_and_ids_only():
    backend = keras.backend.backend()
    other = next(b for b in ("jax", "tensorflow", "torch") if b != backend)
    assert _full_only(item("t", pytest.mark.full_only("covered elsewhere")))
    assert _full_only(item("t", pytest.mark.full_only("x", backends=(backend,))))
    assert not _full_only(item("t", pytest.mark.full_only("x", backends=(other,))))
    mark = pytest.mark.full_only("x", ids=("a",))
    assert _full_only(item("t", mark, "a")) and not _full_only(item("t", mark, "b"))
    assert not _full_only(item("t"))


def test_a_mark_that_would_match_nothing_or_gives_no_reason_is_an_error():
    with pytest.raises(pytest.UsageError, match="needs its reason"):
        _full_only(item("t", pytest.mark.full_only()))
    with pytest.raises(pytest.UsageError, match="not Keras backends"):
        _full_only(item("t", pytest.mark.full_only("x", backends=("tensorflw",))))
    with pytest.raises(pytest.UsageError, match="takes backends= and ids="):
        _full_only(item("t", pytest.mark.full_only("x", backend=("jax",))))
    stale = pytest.mark.full_only("x", ids=("renamed",))
    items = [item("t", stale, "a"), item("t", stale, "b")]
    with pytest.raises(pytest.UsageError, match=r"names ids it does not have: \['renamed'\]"):
        _check_full_only_ids(whole_folder(), items)
    _check_full_only_ids(whole_folder(), [item("t", pytest.mark.full_only("x", ids=("a",)), "a"),
                                          item("t", pytest.mark.full_only("x", ids=("a",)), "b")])
    selected = types.SimpleNamespace(option=types.SimpleNamespace(keyword="t", markexpr=""),
                                     args=[HERE])
    _check_full_only_ids(selected, items)  # -k selects some of a test's ids: not checked
