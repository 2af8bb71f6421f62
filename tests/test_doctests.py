"""Every `>>>` example in the package's docstrings runs (doctest), once: the
examples use only `keras.ops` and NumPy, so the backend does not change
what they show (`backend_independent`: the once lane, under PyTorch; a
plain `pytest tests` runs it in the TensorFlow suite)."""

import doctest
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_reluvit")


def modules_with_examples():
    """The package's modules whose source holds a `>>>` example (found by
    reading the files, so a module that imports an optional dependency is
    imported only if it has an example)."""
    names = []
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                if ">>> " in open(path, encoding="utf-8").read():
                    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    names.append(rel[:-len(".__init__")] if rel.endswith(".__init__") else rel)
    return sorted(names)


@pytest.mark.backend_independent
def test_every_docstring_example_runs():
    names = modules_with_examples()
    # What the package documents today; a new module with examples joins by itself.
    assert {"keras_reluvit.models.attention", "keras_reluvit.models.vit",
            "keras_reluvit.models.zoo", "keras_reluvit.models.attention_kinds",
            "keras_reluvit.preprocessing.layer",
            "keras_reluvit.preprocessing.labels"} <= set(names), names
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    examples = {}
    for name in names:
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples:
                runner.run(test)
                examples[test.name] = len(test.examples)
    assert runner.failures == 0, f"{runner.failures} doctest example(s) failed (output above)"
    # Every builder documents itself (13) and every module above has one.
    assert sum(1 for n in examples if n.startswith("keras_reluvit.models.zoo.ViT_")) == 13, examples
    assert all(any(n.startswith(m + ".") for n in examples) for m in names), examples
    assert sum(examples.values()) >= 30, examples

