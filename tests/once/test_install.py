"""The extras of pyproject.toml cover what the package imports, and the
README tells users to install them."""

import ast
import glob
import importlib
import importlib.metadata
import os
import re
import sys

import pytest
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(glob.glob(os.path.join(ROOT, "keras_reluvit", "*.py")))

# Imports that happen inside other packages on our behalf (not visible in our
# source): Keras' ONNX exporter imports tf2onnx + onnx; its TensorBoard
# callback writes through tensorboard.
INDIRECT = {"export.py": {"tf2onnx", "onnx", "onnxruntime"}, "callbacks.py": {"tensorboard"}}
# Modules whose imports are the `keras-reluvit train | eval | bench | export`
# path: core + one backend + [train] must cover them.
TRAIN_PATH = {"cli.py", "train.py", "data.py", "embedded.py", "callbacks.py", "recipes.py",
              "bench.py", "export.py"}
BACKENDS = {"jax", "torch", "tensorflow"}


def third_party_imports(path):
    tree = ast.parse(open(path).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "keras_reluvit"}


def distribution(module):
    dists = importlib.metadata.packages_distributions().get(module)
    assert dists, f"{module} is imported but not installed in the test environment"
    return re.sub(r"[-_.]+", "-", dists[0]).lower()


def requirement_names(reqs):
    return {re.sub(r"[-_.]+", "-", re.split(r"[<>=\[; ]", r, maxsplit=1)[0]).lower()
            for r in reqs}


@pytest.fixture(scope="module")
def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_every_module_imports_and_its_imports_are_covered_by_the_extras(path, project):
    name = os.path.basename(path)
    importlib.import_module("keras_reluvit." + name[:-3])
    core = requirement_names(project["dependencies"])
    extras = {k: requirement_names(v) for k, v in project["optional-dependencies"].items()}
    mods = third_party_imports(path) | INDIRECT.get(name, set())
    for mod in sorted(mods):
        dist = "tensorflow" if mod == "tensorflow" else distribution(mod)
        dist = {"tensorflow-cpu": "tensorflow", "jaxlib": "jax"}.get(dist, dist)
        if dist in core:
            continue
        if mod in BACKENDS:  # backend-conditional code paths: the backend extra
            assert dist in extras[mod], (name, mod)
            continue
        if name in TRAIN_PATH and mod not in INDIRECT.get(name, set()):
            assert dist in extras["train"], f"{name} imports {mod} ({dist}), not in [train]"
        else:
            covering = [e for e, deps in extras.items() if dist in deps]
            assert covering, f"{name} imports {mod} ({dist}), in no extra of pyproject.toml"


def test_readme_install_lines_name_the_extras():
    text = open(os.path.join(ROOT, "README.md")).read()
    for extras in ("[jax]", "[jax,train]", "[torch,train,onnx]"):
        assert f'pip install -e ".{extras}"' in text, extras
    assert "download.pytorch.org/whl/cpu" in text


def test_cli_names_the_missing_extra_instead_of_a_traceback(tmp_path):
    """`pip install ".[jax]"` then `keras-reluvit train`: tensorflow_datasets
    is missing (blocked here); the command says which extra installs it."""
    import subprocess

    code = ("import sys; sys.modules['tensorflow_datasets'] = None\n"
            "from keras_reluvit import cli\n"
            f"sys.exit(cli.main(['train', '--epochs', '1', '--output', {str(tmp_path)!r}]))\n")
    env = dict(os.environ, KERAS_BACKEND="jax")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert ('`keras-reluvit train` needs tensorflow_datasets, which is not installed: '
            'pip install "keras-reluvit[train]"') in proc.stderr
