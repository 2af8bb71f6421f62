"""Shared test helpers: per-backend autodiff, deterministic seeds."""

import gc
import io
import os
import tarfile

# Triton's kernels run in its CPU interpreter in these tests; the variable is
# read when Triton defines a kernel, so it is set before anything imports it
# (Keras' torch backend does, through torch._dynamo; keras is imported before
# TensorFlow: see kernels.triton_module).
os.environ.setdefault("TRITON_INTERPRET", "1")

import keras  # noqa: E402
import numpy as np
import pytest

# Tests of TensorFlow-only code (tf.data pipelines, tfds builders, image
# folders, the pipeline benchmark) compute the same thing under every Keras
# backend: marked `backend_independent`, they run once. By default they are
# collected in the TensorFlow suite; scripts/test.sh sets
# KRV_BACKEND_INDEPENDENT=only in its once lane (tests/once plus these) and
# =skip in the three backend suites (deselected there, never skipped).
BACKEND_INDEPENDENT_SUITE = "tensorflow"

# CI runs a representative subset of the slowest tests: each kernel, layout,
# mask kind, dtype and head dim stays covered, as do the examples' code paths.
# A test CI leaves out carries `@pytest.mark.full_only(reason, backends=...,
# ids=...)` (the reason: what covers it in CI; `backends`: only on these
# backends' runs; `ids`: only these parameter sets); KRV_FULL_TESTS=1 runs them
# too (deselected otherwise, never skipped).


# End-to-end runs whose parts are checked on every backend run on PyTorch only.
END_TO_END_ON_TORCH = pytest.mark.full_only(
    "An end-to-end run on PyTorch only (~10-16 s each on JAX and TensorFlow): fit, evaluate, "
    "the heads, intermediates and for_model's tf.data are checked per backend in test_vit / "
    "test_finetune / test_training (the callbacks inside fit, and layer decay inside fit on "
    "TensorFlow: PyTorch only).", backends=("jax", "tensorflow"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "backend_independent: TensorFlow-only code (tf.data, tfds); runs once "
        "(KRV_BACKEND_INDEPENDENT, tests/conftest.py)")
    config.addinivalue_line(
        "markers", "full_only(reason, backends=None, ids=None): a slow test CI leaves out "
        "(on `backends`' runs, for the parameter sets `ids`; KRV_FULL_TESTS=1 runs it)")


def _full_only(item):
    """Whether `item` carries a `full_only` mark that applies to it: on this
    backend (`backends`, default all) and for its parameters (`ids`, default
    all). A mark without a reason, or naming an id the test does not have,
    is an error (a subset that silently matched nothing)."""
    mark = item.get_closest_marker("full_only")
    if mark is None:
        return False
    if not (mark.args and isinstance(mark.args[0], str) and mark.args[0].strip()):
        raise pytest.UsageError(f"{item.nodeid}: full_only needs its reason (what covers the "
                                "test in CI) as its first argument.")
    unknown = set(mark.kwargs) - {"backends", "ids"}
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: full_only takes backends= and ids=, not "
                                f"{sorted(unknown)}.")
    backends = mark.kwargs.get("backends")
    if backends is not None and not set(backends) <= {"jax", "tensorflow", "torch"}:
        raise pytest.UsageError(f"{item.nodeid}: full_only's backends {backends} are not "
                                "Keras backends (jax, tensorflow, torch).")
    if backends is not None and keras.backend.backend() not in backends:
        return False
    ids = mark.kwargs.get("ids")
    return ids is None or getattr(getattr(item, "callspec", None), "id", None) in ids


def _check_full_only_ids(config, items):
    """Every id a `full_only` mark names is one of its test's parameter sets
    (checked when whole folders are collected, as CI does: a selection
    collects some of a test's ids)."""
    if config.option.keyword or config.option.markexpr or not all(
            os.path.isdir(str(a).split("::")[0]) for a in config.args):
        return
    seen, named = {}, {}
    for item in items:
        mark = item.get_closest_marker("full_only")
        if mark is None or mark.kwargs.get("ids") is None:
            continue
        key = item.nodeid.split("[")[0]
        named[key] = set(mark.kwargs["ids"])
        seen.setdefault(key, set()).add(getattr(getattr(item, "callspec", None), "id", None))
    for key, ids in named.items():
        if ids - seen[key]:
            raise pytest.UsageError(f"{key}: full_only names ids it does not have: "
                                    f"{sorted(ids - seen[key])} (its ids: {sorted(seen[key])}).")


def _deselect(item):
    if os.environ.get("KRV_FULL_TESTS") != "1" and _full_only(item):
        return True
    marked = item.get_closest_marker("backend_independent") is not None
    mode = os.environ.get("KRV_BACKEND_INDEPENDENT")
    if mode == "only":  # the once lane: tests/once and the marked tests
        return not (marked or "tests/once/" in str(item.fspath).replace(os.sep, "/"))
    if mode == "skip":
        return marked
    return marked and keras.backend.backend() != BACKEND_INDEPENDENT_SUITE


def pytest_collection_modifyitems(config, items):
    _check_full_only_ids(config, items)
    deselected = [i for i in items if _deselect(i)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if i not in deselected]


@pytest.fixture(autouse=True, scope="module")
def _freeze_the_heap():
    """Keras' `Layer.__delattr__` runs `gc.collect()` for each variable it drops
    (`quantize` drops every kernel): ~0.25 s each in a process holding a
    backend's half million objects. Freezing what exists (after collecting it)
    at each module's start makes those collections scan only what the module
    made: test_finetune on PyTorch 51 -> 34 s."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    yield


def backend_name():
    return keras.backend.backend()


def grads(fn, variables, inputs):
    """Gradients of scalar `fn(*inputs)` w.r.t. `inputs` (numpy arrays) and
    the Keras `variables`, computed by the current backend's autodiff.

    Returns (input_grads, variable_grads) as float64 numpy arrays.
    """
    b = backend_name()
    if b == "jax":
        import jax

        def f(values, xs):
            # Rebinding the variables' values makes them traced inputs.
            mapping = list(zip(variables, values))
            with keras.StatelessScope(state_mapping=mapping):
                return fn(*xs)

        values = [v.value for v in variables]
        gv, gx = jax.grad(f, argnums=(0, 1))(values, [np.asarray(x) for x in inputs])
    elif b == "tensorflow":
        import tensorflow as tf

        xs = [tf.convert_to_tensor(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            loss = fn(*xs)
        g = tape.gradient(loss, xs + [v.value for v in variables])
        gx, gv = g[: len(xs)], g[len(xs):]
    elif b == "torch":
        import torch

        xs = [torch.tensor(x, requires_grad=True) for x in inputs]
        for v in variables:
            v.value.grad = None
        loss = fn(*xs)
        loss.backward()
        gx = [x.grad for x in xs]
        gv = [v.value.grad for v in variables]
    else:  # pragma: no cover
        raise RuntimeError(b)
    def to_np(t):
        return np.zeros(()) if t is None else np.asarray(keras.ops.convert_to_numpy(t), "float64")

    return [to_np(t) for t in gx], [to_np(t) for t in gv]


# Child-script source: a callback `Kill()` that SIGKILLs its own process after
# batch `kill_at[1]` of epoch `kill_at[0]` (`kill_at` defined by the script;
# None never kills) -- a real kill, not an exception after the backup.
KILL_CALLBACK = r"""
import os, signal
import keras
class Kill(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_end(self, batch, logs=None):
        if [self.epoch, batch] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
"""


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_together(procs, timeout):
    """Waits for every process of a cluster (at most `timeout` s each) and
    kills any still running (one that failed or hangs leaves its peers
    waiting): [(returncode, stdout, stderr), ...]."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def digits_val_loss(model, data_dir):
    """A model's mean cross-entropy on the embedded digits' validation split
    (32 px), computed here with NumPy: what a run that saved it reported."""
    import keras_reluvit as kr

    val = kr.data.load("sklearn_digits", 128, image_size=32, data_dir=data_dir).val
    total, count = 0.0, 0
    for x, y in val.as_numpy_iterator():
        p = keras.ops.convert_to_numpy(keras.ops.softmax(model(x)))
        total -= float(np.sum(y * np.log(np.clip(p, 1e-7, 1.0))))
        count += len(x)
    return total / count


def subprocess_env(backend, optimized=False):
    """The environment of a child process on `backend`, importing this tree.

    A JAX child compiles with most of XLA's optimisations off when
    KRV_JAX_FAST_COMPILE=1 (scripts/test.sh's default): a check script or a
    run of a few steps spends its time compiling (tests/helpers/sp_check.py:
    65 -> 43 s). `optimized=True` keeps them, for runs of many steps, where
    they pay (docs/development.md)."""
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    if backend == "jax" and not optimized and os.environ.get("KRV_JAX_FAST_COMPILE") == "1":
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


SYNSETS = ["n01440764", "n01443537", "n01484850"]


def jpeg(rng, h, w, grey=False):
    from PIL import Image

    arr = rng.integers(0, 256, (h, w) if grey else (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, mode="L" if grey else "RGB").save(buf, format="JPEG")
    return buf.getvalue()


def add(tar, name, payload):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """A tfds data dir for the digits set, built once per pytest run by the
    first test that loads it (each module's own copy cost ~4 s to build)."""
    return tmp_path_factory.mktemp("tfds_digits")


@pytest.fixture(scope="session")
def digits_built(digits_dir):
    """`digits_dir` with the digits set built in it (here, once, by
    `keras-reluvit prepare`), for tests whose subprocesses read it: each
    used to prepare its own (~8 s a module)."""
    from keras_reluvit import cli

    assert cli.main(["prepare", "sklearn_digits", "--data-dir", str(digits_dir)]) == 0
    return digits_dir


@pytest.fixture(scope="session")
def imagenet_manual(tmp_path_factory):
    """A tiny ImageNet in the official archive layout: the two tars (train:
    one inner tar per synset; val: ILSVRC2012_val_%08d.JPEG)."""
    manual = tmp_path_factory.mktemp("imagenet_manual")
    rng = np.random.default_rng(0)
    sizes = [(40, 60), (75, 50), (33, 33), (64, 96), (50, 41), (90, 70)]
    with tarfile.open(manual / "ILSVRC2012_img_train.tar", "w") as outer:
        for s, synset in enumerate(SYNSETS):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as t:
                for i, (h, w) in enumerate(sizes):
                    add(t, f"{synset}_{i}.JPEG", jpeg(rng, h, w, grey=(s == 0 and i == 2)))
            add(outer, f"{synset}.tar", inner.getvalue())
    with tarfile.open(manual / "ILSVRC2012_img_val.tar", "w") as t:
        for i, (h, w) in enumerate(sizes):
            add(t, f"ILSVRC2012_val_{i + 1:08d}.JPEG", jpeg(rng, h, w, grey=(i == 1)))
    return manual


@pytest.fixture(scope="session")
def imagenet_dir(tmp_path_factory, imagenet_manual):
    """That ImageNet built by the real tfds `imagenet2012` builder."""
    manual = imagenet_manual
    data_dir = tmp_path_factory.mktemp("imagenet") / "tfds"
    from keras_reluvit import data as D

    D.prepare("imagenet2012", data_dir=data_dir, manual_dir=manual)
    return data_dir




def run_hf_reference(*args):
    """`tests/helpers/hf_reference.py ARGS` in a child process: transformers (and the
    torch it imports) stays out of the test process; no Triton interpreter,
    no GPU, transformers' own logging quiet.

    The modes that write a directory from input files (`make`, `photos`) do
    not depend on the Keras backend under test: with `KRV_REFERENCE_CACHE`
    (scripts/test.sh sets one per run) their output is computed once per
    run and copied for the other suites, keyed by the helper's source, the
    arguments and the input files' bytes."""
    import shutil
    import subprocess
    import sys

    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "hf_reference.py")
    cache, out = os.environ.get("KRV_REFERENCE_CACHE"), args[1] if len(args) > 1 else None
    key = None
    if cache and args[0] in ("make", "photos"):
        key = _reference_key(script, args)
        if os.path.isdir(os.path.join(cache, key)):
            shutil.copytree(os.path.join(cache, key), out, dirs_exist_ok=True)
            return
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if key is not None:  # written aside, then renamed: a concurrent suite sees all or nothing
        staging = os.path.join(cache, f"{key}.{os.getpid()}")
        shutil.copytree(out, staging, ignore=shutil.ignore_patterns(
            *(os.path.basename(a) for a in args[2:])))
        try:
            os.rename(staging, os.path.join(cache, key))
        except OSError:  # another suite got there first: the same content
            shutil.rmtree(staging, ignore_errors=True)


def _reference_key(script, args):
    import hashlib

    h = hashlib.sha256(open(script, "rb").read())
    for i, a in enumerate(args):
        if i == 1:  # the output directory: its place, not its name
            continue
        if os.path.isfile(a):  # an input file: its name and bytes (not its directory)
            h.update(os.path.basename(a).encode())
            h.update(open(a, "rb").read())
        else:
            h.update(a.encode())
    return h.hexdigest()[:24]
