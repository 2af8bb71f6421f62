"""The extras of pyproject.toml cover what the package imports, and the
README tells users to install them."""

import ast
import importlib
import importlib.metadata
import os
import re
import sys

import pytest
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "keras_reluvit")


def _modules():
    """Every module of the package and of its subpackages, by its path in
    the package ("models/vit.py", "data/tfds.py", "kernels/__init__.py")."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, PACKAGE)
        found += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/")
                  for f in sorted(files) if f.endswith(".py")]
    return found


MODULES = _modules()

# Imports that happen inside other packages on our behalf (not visible in our
# source): Keras' ONNX exporter imports tf2onnx + onnx; its TensorBoard
# callback writes through tensorboard.
INDIRECT = {"export.py": {"tf2onnx", "onnx", "onnxruntime"},
            "training/callbacks.py": {"tensorboard"}}
# Modules whose imports are the `keras-reluvit train | eval | bench | export`
# path: core + one backend + [train] must cover them (a name ending in "/":
# every module of that subpackage).
TRAIN_PATH = {"cli/", "bench.py", "export.py", "training/", "data/", "distribution/",
              "preprocessing/"}
# Imports of train-path modules that another extra covers (behind a function
# whose error names that extra): the backups of JAX runs (orbax, [jax]), the
# sample photographs of `kr.image_folder.sample_folder` ([samples]).
OTHER_EXTRA = {"training/backup_state.py": {"orbax": "jax"},
               "data/folders.py": {"PIL": "samples", "skimage": "samples"}}
BACKENDS = {"jax", "torch", "tensorflow"}


def module_name(rel):
    """"data/tfds.py" -> "keras_reluvit.data.tfds" ("data/__init__.py" -> "keras_reluvit.data")."""
    parts = ["keras_reluvit"] + rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def on_train_path(rel):
    return any(rel == t or (t.endswith("/") and rel.startswith(t)) for t in TRAIN_PATH)


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


def test_every_subpackage_is_walked_and_the_tables_name_modules_that_exist():
    for rel in ("models/vit.py", "data/tfds.py", "data/folders.py", "distribution/engine.py",
                "preprocessing/images.py", "checkpoints/__init__.py", "kernels/triton.py"):
        assert rel in MODULES, rel
    for rel in set(INDIRECT) | set(OTHER_EXTRA) | TRAIN_PATH:
        assert (rel in MODULES if rel.endswith(".py")
                else any(m.startswith(rel) for m in MODULES)), f"{rel}: no such module"


@pytest.mark.parametrize("rel", MODULES)
def test_every_module_imports_and_its_imports_are_covered_by_the_extras(rel, project):
    imports = third_party_imports(os.path.join(PACKAGE, rel))
    # Triton loaded after TensorFlow aborts the process (kernels.triton_module):
    # under the torch backend (the once lane's) Keras imported Triton first.
    if not ("triton" in imports and "triton" not in sys.modules and "tensorflow" in sys.modules):
        importlib.import_module(module_name(rel))
    core = requirement_names(project["dependencies"])
    extras = {k: requirement_names(v) for k, v in project["optional-dependencies"].items()}
    mods = imports | INDIRECT.get(rel, set())
    for mod in sorted(mods):
        dist = "tensorflow" if mod == "tensorflow" else distribution(mod)
        dist = {"tensorflow-cpu": "tensorflow", "jaxlib": "jax"}.get(dist, dist)
        if dist in core:
            continue
        if mod in BACKENDS:  # backend-conditional code paths: the backend extra
            assert dist in extras[mod], (rel, mod)
            continue
        other = OTHER_EXTRA.get(rel, {}).get(mod)
        if other is not None:
            assert dist in extras[other], f"{rel} imports {mod} ({dist}), not in [{other}]"
        elif on_train_path(rel) and mod not in INDIRECT.get(rel, set()):
            assert dist in extras["train"], f"{rel} imports {mod} ({dist}), not in [train]"
        else:
            covering = [e for e, deps in extras.items() if dist in deps]
            assert covering, f"{rel} imports {mod} ({dist}), in no extra of pyproject.toml"


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
