"""No import circles inside keras_reluvit/: every `import` statement of the
package (module level and inside functions) is an edge; a cycle fails."""

import ast
import os

PKG = "keras_reluvit"
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
    assert "keras_reluvit.kernels" in edges["keras_reluvit.attention"]
    # inside functions (the Pallas kernel imports jax: only on its own paths)
    assert "keras_reluvit.kernels.pallas" in edges["keras_reluvit.kernels.sharded"]
    assert "keras_reluvit.kernels.pallas" in edges["keras_reluvit.kernels"]
    # one way: layer -> kernels; the torch fast path needs nothing of the layer
    assert not any("keras_reluvit.attention" in edges[m] for m in edges
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


def test_fast_help_recognises_the_console_script_under_every_launcher_name(monkeypatch):
    import keras_reluvit

    for argv0, expected in [("/venv/bin/keras-reluvit", True), ("keras-reluvit.exe", True),
                            ("/venv/Scripts/Keras-Reluvit.EXE", True),
                            ("keras-reluvit-script.py", True), ("/usr/bin/python", False),
                            ("/x/keras_reluvit/cli.py", False)]:
        monkeypatch.setattr("sys.argv", [argv0, "--help"])
        assert keras_reluvit._command_line_help_only() is expected, argv0
    monkeypatch.setattr("sys.argv", ["keras-reluvit.exe", "train", "--epochs", "1"])
    assert not keras_reluvit._command_line_help_only()


def test_the_documented_modules_are_attributes_of_the_package():
    """`import keras_reluvit as kr; kr.train.build_config(...)` as the docs
    write it, in a fresh process (in this one other tests imported them)."""
    import subprocess
    import sys

    code = ("import keras_reluvit as kr; "
            "print(kr.train.build_config, kr.settings.RunSettings, kr.remat.check, "
            "kr.recipes.compile, kr.backup.fit, kr.data.Augment)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="jax"))
    assert done.returncode == 0, done.stderr[-2000:]
