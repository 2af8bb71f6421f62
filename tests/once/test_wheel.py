"""The package as a user installs it: `python -m build` makes an sdist and a
wheel; the wheel (not editable) goes into a fresh venv that reuses the pinned
dependencies of the test environment, and from outside the source tree
`keras-reluvit --version`, a one-epoch `keras-reluvit train`, a torch forward
through the C++ kernel read from the installed source, and
`kr.load_checkpoint` on a generated file work."""

import glob
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile

import pytest
from conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, cwd, env, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:  # a copy of the tracked tree: the build writes build/ beside it
        if f.startswith(("keras_reluvit/", "keras_reluvit_cli/")) or f in ("pyproject.toml", "README.md",
                                                        "CHANGELOG.md"):
            os.makedirs(os.path.dirname(src / f), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), src / f)
    env = dict(os.environ)
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"),
         str(src)], cwd=tmp, env=env)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp, env=env)
    # Reuse the pinned dependencies: the test environment's site-packages as a
    # plain path entry (its .pth files, the editable install among them, are
    # not processed from there).
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "pinned_deps.pth"), "w") as f:
        f.write(site.getsitepackages()[0] + "\n")
    wheel = glob.glob(str(tmp / "dist" / "*.whl"))[0]
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
         "--ignore-installed", "--no-index", wheel], cwd=tmp, env=env)
    work = tmp / "outside"
    work.mkdir()
    clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    return dict(tmp=tmp, venv=venv, work=work, env=clean, wheel=wheel,
                sdist=glob.glob(str(tmp / "dist" / "*.tar.gz"))[0])


def test_sdist_and_wheel_hold_the_package_data(installed):
    from keras_reluvit._version import __version__

    assert os.path.basename(installed["wheel"]).startswith(f"keras_reluvit-{__version__}-")
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert "keras_reluvit/kernels/csrc/pointwise_attention.cpp" in names
    assert {"keras_reluvit/kernels/pallas.py", "keras_reluvit/kernels/triton.py",
            "keras_reluvit_cli/__init__.py", "keras_reluvit_cli/__main__.py"} <= set(names)
    with tarfile.open(installed["sdist"]) as t:
        assert any(n.endswith("keras_reluvit/kernels/csrc/pointwise_attention.cpp")
                   for n in t.getnames())


def test_installed_package_runs_outside_the_source_tree(installed):
    from keras_reluvit._version import __version__

    bin_ = installed["venv"] / "bin"
    env, work = installed["env"], installed["work"]
    # The console script is the door (keras_reluvit_cli); --help and --version answer
    # through it (they import the package, and so Keras: the package reads no argv).
    answers = {"--help": "usage: keras-reluvit", "train --help": "usage: keras-reluvit train",
               "--version": f"keras-reluvit {__version__}"}
    for args, expected in answers.items():
        proc = subprocess.run([str(bin_ / "keras-reluvit"), *args.split()], cwd=work,
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith(expected), (args, proc.stdout[:200])
        if args == "--version":  # nothing else printed
            assert proc.stdout.strip() == expected
    where = run([str(bin_ / "python"), "-c", "import keras_reluvit, keras_reluvit.kernels.torch_cpu as "
                 "f; print(keras_reluvit.__file__); print(f.SOURCE)"], cwd=work,
                env=dict(env, KERAS_BACKEND="jax"))
    module, source = where.split()
    assert module.startswith(str(installed["venv"])) and source.startswith(str(installed["venv"]))
    assert os.path.isfile(source)
    # (compiled as the JAX suite's children are: tests/conftest.py subprocess_env)
    jax_env = {k: v for k, v in subprocess_env("jax").items() if k.startswith("JAX_")}
    run([str(bin_ / "keras-reluvit"), "train", "--epochs", "1", "--no-export", "--quiet",
         "--output", str(work / "run")], cwd=work, env=dict(env, KERAS_BACKEND="jax", **jax_env),
        timeout=900)
    assert (work / "run" / "metrics.json").exists()
    code = (
        "import numpy as np, keras, keras_reluvit as kr\n"
        "from keras_reluvit.kernels import torch_cpu\n"
        "assert torch_cpu.load() is not None, 'the C++ kernel did not build'\n"
        "x = np.random.default_rng(0).normal(size=(1, 20, 2, 8)).astype('float32')\n"
        "a = kr.pointwise_attention(x, x, x, implementation='torch_fused')\n"
        "b = kr.pointwise_attention(x, x, x, implementation='generic')\n"
        "assert np.abs(keras.ops.convert_to_numpy(a) - keras.ops.convert_to_numpy(b)).max() < 1e-5\n"
        "m = kr.ViT('Ti/16', image_size=32, depth=1, num_classes=3, attention='softmax',\n"
        "           mlp_activation='gelu')\n"
        "kr.export.timm_state_dict(m, 'tiny.safetensors')\n"
        "n = kr.load_checkpoint('tiny.safetensors', attention='softmax')\n"
        "img = np.random.default_rng(1).uniform(size=(2, 32, 32, 3)).astype('float32')\n"
        "d = np.abs(keras.ops.convert_to_numpy(m(img)) - keras.ops.convert_to_numpy(n(img))).max()\n"
        "print('ok', d)\n")
    # Its own build folder: the torch suite of the other CI lane may be building the
    # same kernel in the shared one at this moment (its lock would make load() None).
    out = run([str(bin_ / "python"), "-c", code], cwd=work,
              env=dict(env, KERAS_BACKEND="torch", TORCH_EXTENSIONS_DIR=str(work / "torch_extensions")),
              timeout=900)
    assert out.split()[0] == "ok" and float(out.split()[1]) < 1e-4
