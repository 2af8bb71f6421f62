"""The package's shape: no import circles inside keras_reluvit/ (every
`import` statement, module level and inside functions, is an edge), at the
level of modules and of packages; no arrow from a lower floor up (`FLOORS`:
the model imports nothing of checkpoints, serving, data, distribution or
training); at most 8 modules at the top besides packages; the package
installs nothing at import and keeps no old module names."""

import ast
import os

import numpy as np

PKG = "keras_reluvit"
# The modules' names before the packages, gone (the CHANGELOG lists the moves).
MOVED_NAMES = ("vit", "vit_config", "layers", "attention", "attention_kinds", "activations",
               "posemb", "variants", "zoo", "remat", "keywords", "train", "recipes", "backup",
               "callbacks", "fewshot", "finetune", "settings", "runs", "embedded",
               "image_folder")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def modules(root=ROOT, pkg=PKG):
    found = {}
    for dirpath, _, files in os.walk(os.path.join(root, pkg)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return found


def import_graph(root=ROOT, pkg=PKG):
    mods = modules(root, pkg)
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name`, mod.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:  # what the statement names, a parent too
                    edges[name].add(target)
                # Importing a.b.c runs a.b's __init__ too (unless a.b is ours).
                target = target.rpartition(".")[0]
                while target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
                    target = target.rpartition(".")[0]
    return edges


def find_cycle(edges):
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_function_level_imports():
    edges = import_graph()
    assert "keras_reluvit.kernels" in edges["keras_reluvit.models.attention"]
    # inside functions (the Pallas kernel imports jax: only on its own paths)
    assert "keras_reluvit.kernels.pallas" in edges["keras_reluvit.kernels.sharded"]
    assert "keras_reluvit.kernels.pallas" in edges["keras_reluvit.kernels"]
    # one way: layer -> kernels; the torch fast path needs nothing of the layer
    assert not any("keras_reluvit.models.attention" in edges[m] for m in edges
                   if m.startswith("keras_reluvit.kernels"))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert "keras_reluvit.kernels.switches" in edges["keras_reluvit.kernels.pallas"]


def test_a_name_imported_from_the_own_package_is_an_edge(tmp_path):
    """`from pkg.kernels import name` inside pkg/kernels/pallas.py runs
    pkg/kernels/__init__.py: an edge (kernels -> sharded -> pallas -> kernels
    was such a circle, unseen while only implicit parents were edges)."""
    kernels = tmp_path / "pkg" / "kernels"
    kernels.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (kernels / "__init__.py").write_text("from pkg.kernels import sharded\n")
    (kernels / "sharded.py").write_text("def f():\n    from pkg.kernels import pallas\n")
    (kernels / "pallas.py").write_text("def g():\n    from pkg.kernels import flag\n")
    cycle = find_cycle(import_graph(str(tmp_path), "pkg"))
    assert cycle == ["pkg.kernels", "pkg.kernels.sharded", "pkg.kernels.pallas", "pkg.kernels"]


def test_no_import_circles_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


# The floors, lowest first: a module may import its own floor's and lower
# floors' modules only (`__init__`, the public face, imports every floor).
FLOORS = [
    ("_version", "_keras_compat", "_defaults", "_logging"),
    ("kernels",),
    ("preprocessing",),
    ("models",),
    ("checkpoints",),
    ("export",),
    ("data",),
    ("distribution",),
    ("training",),
    ("bench", "cli"),
]
TOP_MODULES = 8  # at most, besides packages (the limit)


def floor_of(module):
    parts = module.split(".")
    if len(parts) == 1:
        return len(FLOORS)  # keras_reluvit/__init__.py
    for i, names in enumerate(FLOORS):
        if parts[1] in names:
            return i
    raise AssertionError(f"{module} is on no floor: add its package to FLOORS")


def upward_arrows(edges):
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if floor_of(b) > floor_of(a))


def package_graph(edges):
    """The graph of the top-level packages (keras_reluvit.X), from the modules'."""
    top = {}
    for a, targets in edges.items():
        pa = ".".join(a.split(".")[:2])
        for b in targets:
            pb = ".".join(b.split(".")[:2])
            if pa != pb and pa != PKG and pb != PKG:
                top.setdefault(pa, set()).add(pb)
            top.setdefault(pb, set())
        top.setdefault(pa, set())
    return top


def test_no_arrow_goes_up_and_no_package_circle():
    edges = import_graph()
    assert upward_arrows(edges) == []
    cycle = find_cycle(package_graph(edges))
    assert cycle is None, "package circle: " + " -> ".join(cycle)
    # the checks see what they must: an upward arrow and a package circle
    assert upward_arrows({f"{PKG}.models.vit": {f"{PKG}.training.run"}}) == [
        (f"{PKG}.models.vit", f"{PKG}.training.run")]
    assert find_cycle(package_graph({f"{PKG}.models.vit": {f"{PKG}.data.x"},
                                     f"{PKG}.data.y": {f"{PKG}.models.zoo"}})) is not None


def test_every_import_names_a_module_that_exists():
    """Inside the package, imports use the modules' homes, not the old
    names `keras_reluvit/__init__.py` keeps for users (`keras_reluvit.vit`)."""
    mods = modules()
    stale = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                named = ([f"{PKG}.{a.name}" for a in node.names if a.name in MOVED_NAMES]
                         if node.module == PKG else [node.module or ""])
            else:
                continue
            stale += [(name, m) for m in named if m.startswith(PKG + ".") and m not in mods]
    assert stale == []


def test_the_tree_is_small_at_the_top():
    top = [f for f in os.listdir(os.path.join(ROOT, PKG)) if f.endswith(".py")]
    assert len(top) <= TOP_MODULES, sorted(top)


def test_importing_the_package_installs_nothing_and_reads_no_command_line():
    """`import keras_reluvit` under the command line of `keras-reluvit train`
    leaves SIGTERM and SIGINT as they were, adds no import finder and no
    exit or fork hook, and keeps none of the modules' old names (was: a
    SIGTERM handler installed at import when sys.argv looked like `train`; a
    finder for 21 old names; Pillow's exit drain registered at import)."""
    import subprocess
    import sys

    code = ("import atexit, os, signal, sys; sys.argv = ['keras-reluvit', 'train']\n"
            "before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT),"
            " list(sys.meta_path))\n"
            # exit and fork hooks, noted as they are registered
            "hooks, register, at_fork = [], atexit.register, os.register_at_fork\n"
            "atexit.register = lambda f, *a, **k: (hooks.append(f), register(f, *a, **k))[1]\n"
            "os.register_at_fork = lambda **k: (hooks.extend(k.values()), at_fork(**k))[1]\n"
            "import importlib, keras_reluvit as kr\n"
            "assert 'keras_reluvit.data.pillow_calls' in sys.modules\n"
            "assert not [f for f in hooks if (getattr(f, '__module__', None) or '').startswith("
            "'keras_reluvit')], hooks\n"
            "after = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT),"
            " list(sys.meta_path))\n"
            "assert after[:2] == before[:2], after\n"
            "assert not [f for f in after[2] if f not in before[2] and"
            " 'keras_reluvit' in getattr(f, '__module__', '')], after[2]\n"
            f"for old in {MOVED_NAMES!r}:\n"
            "    if old not in ('recipes', 'backup', 'callbacks', 'fewshot', 'finetune',"
            " 'settings', 'train', 'remat', 'image_folder', 'attention_kinds'):\n"
            "        assert not hasattr(kr, old), old\n"
            "    try:\n"
            "        importlib.import_module('keras_reluvit.' + old)\n"
            "    except ModuleNotFoundError:\n"
            "        continue\n"
            "    raise AssertionError(old)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="jax"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "ok"


def test_a_compiled_model_loads_after_importing_the_package(tmp_path):
    """`import keras_reluvit` registers what a run's compiled `model.keras`
    holds (the recipe optimizers, schedules, losses): a fresh process that
    imports only the package and Keras loads it with its optimizer (the
    package once stopped importing training/: 'Could not locate class
    RecipeAdamW')."""
    import subprocess
    import sys

    import keras

    import keras_reluvit as kr

    m = kr.ViT("Ti/16", image_size=32, depth=1, num_classes=3)
    kr.recipes.compile(m, "digits", steps_per_epoch=2, accum_steps=2, ema=0.9)
    m.fit(np.zeros((4, 32, 32, 3), "float32"), np.eye(3, dtype="float32")[[0, 1, 2, 0]],
          batch_size=2, verbose=0)
    m.save(tmp_path / "m.keras")
    load = ("import keras, keras_reluvit\n"
            f"m = keras.saving.load_model({str(tmp_path / 'm.keras')!r})\n"
            "print(type(m.optimizer).__name__,"
            " m.optimizer.get_config()['learning_rate']['class_name'])\n")
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["RecipeAdamW", "PerUpdate"], done.stdout


def test_the_documented_modules_are_attributes_of_the_package():
    """`import keras_reluvit as kr; kr.build_config(...)` as the docs
    write it, in a fresh process (in this one other tests imported them)."""
    import subprocess
    import sys

    code = ("import keras_reluvit as kr; "
            "print(kr.build_config, kr.train, kr.settings.RunSettings, kr.remat.check, "
            "kr.recipes.compile, kr.backup.fit, kr.data.Augment)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="jax"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_library_speaks_through_its_logger_only():
    """Every line the library says goes through `keras_reluvit._logging.say`
    (the logger "keras_reluvit"): no module outside the command line prints
    a `keras_reluvit:` / `keras-reluvit:` line itself (was: 40 prints under
    two prefixes). Shown by default on the current stderr (a command's
    stdout holds its results alone), one prefix; Python's logging silences
    or routes it."""
    import contextlib
    import io
    import logging

    from keras_reluvit import _logging

    def leftmost(node):  # the first constant piece of a string built from pieces
        while isinstance(node, (ast.BinOp, ast.JoinedStr)):
            node = node.left if isinstance(node, ast.BinOp) else (node.values or [None])[0]
        return node.value if isinstance(node, ast.Constant) else None

    def to_stderr(call):  # print(..., file=sys.stderr): a progress line, not a message
        return any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr"
                   for k in call.keywords)

    printers = []
    for name, path in modules().items():
        if name in (f"{PKG}.cli", f"{PKG}._logging"):
            continue
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            printing = (getattr(func, "id", None) == "print" and not to_stderr(node)) or (
                getattr(func, "attr", None) == "write")
            if printing and str(leftmost(node.args[0])).startswith(
                    ("keras_reluvit:", "keras-reluvit:")):
                printers.append(f"{path}:{node.lineno}")
    assert printers == []
    logger = logging.getLogger("keras_reluvit")
    ours = [h for h in logger.handlers if isinstance(h, _logging._Stderr)]  # (pytest adds its own)
    assert logger.propagate is False and len(ours) == 1  # shown once
    out, err, records = io.StringIO(), io.StringIO(), []
    probe = logging.Handler()
    probe.emit = records.append
    logger.addHandler(probe)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _logging.say("a default changed")  # the stderr of the moment, as a notebook's
    finally:
        logger.removeHandler(probe)
    assert err.getvalue() == "keras_reluvit: a default changed\n"
    assert "a default changed" not in out.getvalue()
    assert [r.levelno for r in records] == [logging.INFO]
    level = logger.level
    try:
        logger.setLevel(logging.WARNING)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            _logging.say("silenced")
        assert err.getvalue() == ""
    finally:
        logger.setLevel(level)
