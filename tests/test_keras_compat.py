"""The seam for Keras' private code (keras_reluvit/_keras_compat.py): every
private API it lists holds on the installed Keras, a change is reported by
name, and nothing else in the package reaches into Keras' internals."""

import ast
import collections
import functools
import os
import re

import keras
import pytest

from keras_reluvit import _keras_compat as compat

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_reluvit")
KERAS_SRC = os.path.join(os.path.dirname(os.path.abspath(keras.__file__)), "src")

# What the name scan below cannot see (no leading underscore): Keras' private
# modules, and a preprocessing layer's `backend` object.
PRIVATE_MODULES = re.compile(r"keras\.src|\.backend\.set_backend\b")


def test_every_private_keras_api_holds_on_this_keras():
    assert compat.check() == {}, compat.check()


def test_a_keras_change_is_reported_by_name(monkeypatch):
    """Seeded: Keras renames MultiHeadAttention's hook and RandAugment's
    table of sub-layers."""
    monkeypatch.delattr(keras.layers.MultiHeadAttention, "_compute_attention")
    monkeypatch.delattr(keras.layers.RandAugment, "_AUGMENT_LAYERS", raising=False)
    failed = compat.check()
    # (calling a MultiHeadAttention fails too: "attention")
    assert {"overridden", "augment"} <= set(failed) <= {"overridden", "augment", "attention"}, failed
    assert "MultiHeadAttention._compute_attention" in failed["overridden"]


def test_a_renamed_private_attribute_is_reported_by_name(monkeypatch):
    """Seeded: Keras renames the optimizers' `_use_weight_decay` (LAMB's
    decay would follow it) and MultiHeadAttention's `_use_gate` (the torch
    fast path would skip the gate)."""
    owner = next(c for c in keras.optimizers.Lamb.__mro__ if "_use_weight_decay" in vars(c))
    monkeypatch.setattr(owner, "_decays", owner._use_weight_decay, raising=False)
    monkeypatch.delattr(owner, "_use_weight_decay")
    init = keras.layers.MultiHeadAttention.__init__

    def renamed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._gated = self.__dict__.pop("_use_gate")

    monkeypatch.setattr(keras.layers.MultiHeadAttention, "__init__", renamed)
    failed = compat.check()
    assert {"adam_slots", "attention"} <= set(failed), failed
    assert "_use_weight_decay" in failed["adam_slots"], failed


# --- the scan for Keras' private names ----------------------------------------------
# Which names are Keras' own private ones comes from Keras' installed source,
# not from a list: the rule is in `private_keras_uses`' docstring.

ACCESSORS = ("getattr", "setattr", "hasattr", "delattr")


def _private(name):
    return isinstance(name, str) and len(name) > 1 and name[0] == "_" and name[1] != "_"


def _last_name(node):
    """"Dense" of `keras.layers.Dense` (a base class) or of `f(...)`."""
    while isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def _string_arg(node, accepts):
    """"_x" of `getattr(obj, "_x", ...)`, where `accepts` the called name."""
    if (isinstance(node, ast.Call) and len(node.args) >= 2 and accepts(_last_name(node.func) or "")
            and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)):
        return node.args[1].value
    return None


def _is_self(node):
    """`self`, `cls` or `super()`."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "super")


def _bound(body):
    """The names a module or class body binds (`def`, `class`, `_x = ...`)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            if isinstance(target, ast.Name):
                yield target.id


def _walk(tree):
    """Every node of `tree`, with the innermost class around it."""
    stack = [(tree, None)]
    while stack:
        node, cls = stack.pop()
        yield node, cls
        inner = node if isinstance(node, ast.ClassDef) else cls
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _index(trees, every_name=None):
    """classes: class name -> (base names, the private names the class
    defines: its methods, its class attributes, what its methods assign as
    `self._x = ...` / `setattr(self, "_x", ...)`); `import A as B` aliases;
    and, into `every_name`, every private name the code defines anywhere."""
    classes = collections.defaultdict(lambda: (set(), set()))
    aliases = collections.defaultdict(set)
    for tree in trees:
        if every_name is not None:
            every_name.update(_bound(tree.body))  # module-level functions and constants
        for node, cls in _walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name][0].update(filter(None, map(_last_name, node.bases)))
                classes[node.name][1].update(n for n in _bound(node.body) if _private(n))
                if every_name is not None:
                    every_name.update(_bound(node.body))
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    aliases[a.asname or a.name].add(a.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if cls is not None and _is_self(node.value) and _private(node.attr):
                    classes[cls.name][1].add(node.attr)
                if every_name is not None:  # on any object: `x._keras_mask = mask`
                    every_name.add(node.attr)
            elif every_name is not None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                every_name.add(node.name)
            else:
                # setattr(self, "_x", v); Keras': set_tensor_attr(x, "_keras_mask", mask)
                name = _string_arg(node, lambda f: "set" in f and "attr" in f)
                if name and cls is not None and _is_self(node.args[0]):
                    classes[cls.name][1].add(name)
                if name and every_name is not None:
                    every_name.add(name)
    return classes, aliases


def _parse(root, skip):
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and not skip(path):
                with open(path, encoding="utf-8") as fh:
                    yield path, ast.parse(fh.read(), path)


@functools.lru_cache(maxsize=None)
def keras_private_names():
    """(every private name Keras' source defines, its classes, its aliases)."""
    names = set()
    classes, aliases = _index((t for _, t in _parse(KERAS_SRC, lambda p: p.endswith("_test.py"))),
                              names)
    return frozenset(n for n in names if _private(n)), classes, aliases


def _keras_defined(bases, kclasses, aliases, seen):
    """The private names the Keras classes `bases` and their ancestors define."""
    out = set()
    for base in bases:
        for name in {base} | aliases.get(base, set()):
            if name in kclasses and name not in seen:
                seen.add(name)
                out |= kclasses[name][1] | _keras_defined(kclasses[name][0], kclasses, aliases, seen)
    return out


def private_keras_uses(sources):
    """Every use of a private Keras name in `sources` ({path: code}), as
    "path:line: _name".

    A use is `obj._name` (read, written or deleted), `getattr` / `setattr` /
    `hasattr` / `delattr(obj, "_name", ...)`, or a method `def _name` of ours
    that overrides a Keras one. `_name` (one leading underscore) counts as
    Keras' when Keras' own source (keras/src, tests left out) defines it --
    a function or method, a class or module attribute, `anything._name = `,
    `setattr(x, "_name")` -- and the code does not make it its own:

    - on `self` / `cls` / `super()` in a class of ours: the name is Keras'
      when a Keras class in the class's hierarchy defines it (the Keras
      bases of the class, of our classes above it, and of those it is mixed
      into: a mixin's `self._x` belongs to the Keras class it is mixed
      with), *even if our class assigns it too* (`self._flash_attention =
      False` in a MultiHeadAttention subclass changes Keras' attribute); it
      is ours when only our classes of that hierarchy define it;
    - on any other object (`model._distribute_strategy`): it is ours when
      one of our classes defines it outside a Keras hierarchy that defines
      it too (`layer._qk_norm`), else Keras'.

    Exempt: the protected methods our subclasses override, declared in
    `compat.OVERRIDDEN` (and checked by `compat.check()`)."""
    keras_names, kclasses, aliases = keras_private_names()
    declared = {m for methods in compat.OVERRIDDEN.values() for m in methods}
    trees = {path: ast.parse(code, path) for path, code in sources.items()}
    ours, _ = _index(trees.values())

    def above(c, seen):
        seen.add(c)
        for b in ours[c][0]:
            if b in ours and b not in seen:
                above(b, seen)
        return seen

    lines = {c: above(c, set()) for c in list(ours)}
    keras_defines, we_define = {}, {}
    for c in lines:
        family = set().union(*(lines[d] for d in lines if c in lines[d]))
        keras_defines[c] = _keras_defined({b for f in family for b in ours[f][0] if b not in ours},
                                          kclasses, aliases, set())
        we_define[c] = set().union(*(ours[f][1] for f in family))
    ours_anywhere = set().union(*(we_define[c] - keras_defines[c] for c in lines))

    found = []
    for path, tree in trees.items():
        for node, cls in _walk(tree):
            name = obj = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and cls is not None:
                if (node in cls.body and node.name in keras_names
                        and node.name in keras_defines[cls.name] and node.name not in declared):
                    found.append((path, node.lineno, f"{node.name} (overridden)"))
                continue
            if isinstance(node, ast.Attribute) and _private(node.attr):
                name, obj = node.attr, node.value
            else:
                name = _string_arg(node, ACCESSORS.__contains__)
                obj = name and node.args[0]
            if name not in keras_names:
                continue
            if cls is not None and _is_self(obj):
                ours_here = name not in keras_defines[cls.name] and name in we_define[cls.name]
                ok = ours_here or (name in declared and name in keras_defines[cls.name])
            else:
                ok = name in ours_anywhere
            if not ok:
                found.append((path, node.lineno, name))
    return [f"{p}:{line}: {name}" for p, line, name in sorted(found)]


def package_sources():
    """{path relative to the package: code} of every module but the seam."""
    return {os.path.relpath(path, PKG): open(path, encoding="utf-8").read()
            for path, _ in _parse(PKG, lambda p: os.path.relpath(p, PKG) == "_keras_compat.py")}


# Static scans of the sources (ours and Keras'): the same under every backend.
@pytest.mark.backend_independent
def test_nothing_outside_the_seam_uses_a_private_keras_name():
    found = private_keras_uses(package_sources())
    assert not found, ("Keras' private names used outside keras_reluvit/_keras_compat.py "
                       "(add an accessor there, with a check()):\n" + "\n".join(found))


@pytest.mark.backend_independent
def test_the_scan_finds_what_it_should():
    """Seeded: a private Keras attribute read on a model, one written (and
    read) on a Keras subclass although our class assigns it, one through
    getattr, an undeclared override; not our own attributes, nor a declared
    override."""
    seeded = """
import keras

class Attention(keras.layers.MultiHeadAttention):
    def __init__(self):
        super().__init__(2, 4)
        self._flash_attention = False
        self._chunks = 3

    def _compute_attention(self, *args):
        return super()._compute_attention(*args), self._chunks, self._dropout_layer

    def _masked_softmax(self, scores, mask=None):
        return scores


class Mixin:
    def update_step(self, gradient, variable, learning_rate):
        return self._momentums


class Lamb(Mixin, keras.optimizers.Lamb):
    pass


def strategy(model, layer):
    return getattr(model, "_distribute_strategy", None), model._kernel, layer._chunks
"""
    found = [f.split(":", 1)[1] for f in private_keras_uses({"seeded.py": seeded})]
    assert found == ["7: _flash_attention", "11: _dropout_layer",
                     "13: _masked_softmax (overridden)", "19: _momentums",
                     "27: _distribute_strategy", "27: _kernel"], found


def test_nothing_outside_the_seam_imports_keras_private_modules():
    found = []
    for path, code in package_sources().items():
        for i, line in enumerate(code.splitlines(), 1):
            if PRIVATE_MODULES.search(line.split("#")[0]):
                found.append(f"{path}:{i}: {line.strip()}")
    assert not found, "\n".join(found)

