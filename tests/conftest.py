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
# mask kind, dtype and head dim stays covered, as do the examples' code paths
# (the research scripts' runs, the MHA suite on PyTorch, the ImageNet example's
# pieces in test_training / test_distribution). KRV_FULL_TESTS=1 runs these
# too (deselected otherwise, never skipped).
FULL_ONLY = (
    "test_accelerator_kernels.py::test_kernel_grid[64-float32-0.0-False-(197, 197)]",
    "test_accelerator_kernels.py::test_kernel_grid[64-bfloat16-1.0-False-(197, 197)]",
    "test_accelerator_kernels.py::test_kernel_grid_in_the_tpu_layout[64-bfloat16-1.0-False-(197, 197)]",
    "test_accelerator_kernels.py::test_pallas_deterministic_backward_equals_the_fused_one_and_repeats_bitwise[key]",
    "test_accelerator_kernels.py::test_pallas_deterministic_backward_equals_the_fused_one_and_repeats_bitwise[None]",
    "test_accelerator_kernels.py::test_cuda_block_caps_compute_the_same[128-bfloat16-tokens1-False-256]",
    "test_accelerator_kernels.py::test_triton_deterministic_backward_equals_the_fused_one_and_repeats_bitwise[key]",
    "test_keras_mha_suite.py::test_keras_multi_head_attention_suite_passes_with_pointwise_attention[tensorflow]",
    "test_keras_mha_suite.py::test_keras_multi_head_attention_suite_passes_with_pointwise_attention[jax]",
    "test_examples.py::test_train_imagenet_example_with_a_mesh",
    "test_examples.py::test_train_imagenet_example_runs_a_deit_recipe",
    "test_examples.py::test_length_study_and_attention_scale_on_a_tiny_grid",
    "test_examples.py::test_alpha_sweep_writes_csv_and_plot_and_resumes",
    # The relu_from_softmax research script (~40 s), as the other research scripts above:
    # its recipe runs through the CLI in test_cli_train_from_a_checkpoint_with_relu_from_softmax.
    "test_examples.py::test_relu_from_softmax_example_writes_every_arm_and_resumes",
    # Multi-process FSDP (~2.5 min): FSDP's numerics run in one process on 8
    # devices (test_distribution.py), a 2-process FSDP cluster is killed and resumes
    # on one process in test_killed_fsdp_cluster_resumes_on_one_process_with_half_the_devices.
    "test_multihost.py::test_fsdp_cluster_trains_like_one_process",
    # The sequence-parallel cluster of 2 processes (~100 s uninterrupted, ~2 min killed and
    # resumed): in CI sequence-parallel attention equals dense on 8 devices in one process
    # (every kernel case, forward and gradient, three ViT pools trained:
    # test_jax_sequence_parallel_attention_equals_dense_on_eight_devices, ~50 s), and a
    # killed 2-process JAX cluster resumes in
    # test_killed_fsdp_cluster_resumes_on_one_process_with_half_the_devices (the CLI's
    # --sequence-axis across processes: full runs only).
    "test_multihost.py::test_sequence_parallel_cluster_trains_like_one_process[uninterrupted]",
    "test_multihost.py::test_sequence_parallel_cluster_trains_like_one_process[killed]",
    # The SIGKILLed torch and TF clusters, trained with AdamW (~60 s each, and a
    # one-process AdamW run each): the same clusters stopped by SIGTERM, trained
    # with SGD (where a gradient summed over the processes shows), resume mid-epoch
    # in test_a_cluster_sent_sigterm_stops_at_one_step_and_resumes_there, a
    # SIGKILLed JAX (FSDP) cluster in test_multihost, a SIGKILLed run with step backups
    # in test_resume.
    "test_engines.py::test_killed_cluster_trains_like_one_process_and_resumes[torch]",
    "test_engines.py::test_killed_cluster_trains_like_one_process_and_resumes[tensorflow]",
    # The rectangular HF round trip on TensorFlow and PyTorch (~8 + 5 s): it runs on JAX;
    # the square one on all three (the conversion is NumPy, the logits per backend).
    "test_hf_checkpoints.py::test_round_trip_ours_to_hf_to_ours_is_exact_and_transformers_"
    "agrees[size1]@tensorflow",
    "test_hf_checkpoints.py::test_round_trip_ours_to_hf_to_ours_is_exact_and_transformers_"
    "agrees[size1]@torch",
    # The torch cluster reading one shard twice (~22 s): the training read's shards are
    # checked disjoint and covering in test_training (tfds and folders, 2 and 3 processes);
    # that the cluster check fails on a broken cluster, by the NO_ALL_REDUCE controls.
    "test_engines.py::test_broken_clusters_are_caught[torch-SAME_SHARD]",
    # A SIGTERM mid-epoch and the exact rerun on TensorFlow (~45-65 s): on JAX and PyTorch
    # in this test; TensorFlow's step backup stops mid-epoch and resumes exactly in the
    # SIGTERM cluster test of test_engines; test_signals stops it before the first step
    # and while the artefacts are written; a single process restores the metrics'
    # running means mid-epoch (compat.build_metrics) in
    # test_a_write_killed_midway_leaves_the_previous_backup (a tiny model).
    "test_backup.py::test_sigterm_mid_epoch_saves_and_the_rerun_ends_as_the_uninterrupted_run"
    "@tensorflow",
    # The accelerator benchmark's smoke run (~60 s): its kernels are checked
    # against the generic path in test_accelerator_kernels / test_accelerator_build.
    "test_accelerator_build.py::test_accelerator_benchmark_runs_end_to_end_in_smoke_mode",
    # CLIP and DINOv2 through transformers' pipeline on every backend (~12 s each):
    # their checkpoints equal transformers in test_hf_checkpoints; ViT and DeiT
    # keep this test's preprocessing path.
    "test_preprocessing.py::test_transformers_checkpoints_predict_like_transformers[clip]",
    "test_preprocessing.py::test_transformers_checkpoints_predict_like_transformers[dinov2]",
    # Gradient accumulation on TensorFlow (~25 s): the same K=4 check runs on JAX and
    # PyTorch, and Keras' accumulation is one code path (base_optimizer) on every backend.
    "test_backup.py::test_accumulation_of_4_micro_batches_equals_one_step_of_the_whole_batch"
    "@tensorflow",
    # DeiT III's tiny epoch on JAX and TensorFlow (~19 s each): PyTorch's runs in CI;
    # RecipeLamb and the bce loss are checked on every backend apart, 3-Augment once (tf.data),
    # and DeiT's own tiny epoch runs on all three.
    "test_deit3.py::test_deit3_s16_runs_one_tiny_epoch_with_everything_it_turns_on@jax",
    "test_deit3.py::test_deit3_s16_runs_one_tiny_epoch_with_everything_it_turns_on@tensorflow",
    # DeiT's tiny epoch on JAX (~20-30 s): it runs on PyTorch; its parts (RecipeAdamW and
    # the EMA, timm_mix, erasing, timm's RandAugment in tf.data) are checked apart on every
    # backend or once.
    "test_deit.py::test_deit_s16_runs_one_tiny_epoch_with_everything_it_turns_on@jax",
    # The fine-tune CLI end to end on JAX (~24 s): PyTorch's runs; the literal reader runs
    # the README's fine-tune commands on JAX with their outcomes checked (the checkpoint's
    # attention, the classes, eval = the run's score, the served classes).
    "test_finetune.py::test_fine_tune_a_folder_through_the_cli@jax",
    # A SIGTERM in the last validation on TensorFlow (~20 s): the stop is StepBackup's
    # backend-free callback code (`_stop_agreed` at the epoch's end), run on JAX and PyTorch;
    # on TensorFlow the SIGTERM cluster of test_engines stops mid-epoch and resumes, and
    # test_backup's tiny model resumes a finished run.
    "test_signals.py::test_sigterm_in_the_last_validation_stops_at_the_epoch_end_and_the_rerun_"
    "finishes@tensorflow",
    # End-to-end runs on one backend (PyTorch's, the cheapest) where the parts they
    # combine are checked on every backend (issue 59's rule; ~225 s of ci12's 29.5-min
    # backend lane):
    # - the fine-tune CLI on TensorFlow (~50 s): PyTorch's runs, the literal reader runs
    #   the README's fine-tune, eval and predict commands on JAX;
    "test_finetune.py::test_fine_tune_a_folder_through_the_cli@tensorflow",
    # - DeiT's tiny epoch on TensorFlow (~33 s): PyTorch's runs; the XLA recipe step on
    #   TensorFlow in test_recipes_compile_uses_xla_on_tensorflow_and_trains_the_same
    #   (digits, no EMA), the EMA on every backend in test_ema (plain compile): the EMA
    #   inside TensorFlow's XLA step and `train`'s ema_val metrics run on PyTorch only;
    "test_deit.py::test_deit_s16_runs_one_tiny_epoch_with_everything_it_turns_on"
    "@tensorflow",
    # - the fine-tune API, the fine-tune controls, the few-shot and attention-statistics
    #   callbacks, a Keras image folder through for_model (~10-16 s each on JAX and
    #   TensorFlow): fit, evaluate, the heads, intermediates and for_model's tf.data
    #   are checked per backend in test_vit / test_finetune / test_training (the
    #   callbacks inside fit, and layer decay inside fit on TensorFlow: PyTorch only);
    "test_finetune.py::test_fine_tune_a_folder_through_the_api@jax",
    "test_finetune.py::test_fine_tune_a_folder_through_the_api@tensorflow",
    "test_finetune.py::test_fine_tune_controls_the_checkpoint_is_used_and_no_training_is_"
    "chance@jax",
    "test_finetune.py::test_fine_tune_controls_the_checkpoint_is_used_and_no_training_is_"
    "chance@tensorflow",
    "test_fewshot.py::test_the_callback_logs_the_probe_of_the_trained_models_pre_logits@jax",
    "test_fewshot.py::test_the_callback_logs_the_probe_of_the_trained_models_pre_logits"
    "@tensorflow",
    "test_training.py::test_attention_stats_callback_logs_per_layer_statistics@jax",
    "test_training.py::test_attention_stats_callback_logs_per_layer_statistics@tensorflow",
    "test_finetune.py::test_image_dataset_from_directory_trains_through_for_model@jax",
    # - the layer-decay recipe through a SavedModel on TensorFlow (~15 s): JAX's and
    #   PyTorch's run;
    "test_finetune.py::test_layer_decay_through_the_recipe_and_a_saved_model@tensorflow",
    # - saved_model_cli on the JAX and TensorFlow exports (~9 s each): plain TensorFlow
    #   loads all four signatures of every backend's export in test_export's `exported`
    #   fixture (the dynamic (-1, -1, -1, 3) shape is read on PyTorch's only);
    "test_export.py::test_saved_model_cli_lists_the_signatures@jax",
    "test_export.py::test_saved_model_cli_lists_the_signatures@tensorflow",
    # - a SIGTERM mid-epoch and the exact rerun in-process on JAX (~25 s): the CLI's JAX
    #   run is killed and preempted mid-epoch and resumes exactly in test_resume (the
    #   digits recipe: the EMA's and drop path's state resumed exactly on PyTorch only).
    "test_backup.py::test_sigterm_mid_epoch_saves_and_the_rerun_ends_as_the_uninterrupted_run"
    "@jax",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "backend_independent: TensorFlow-only code (tf.data, tfds); runs once "
        "(KRV_BACKEND_INDEPENDENT, tests/conftest.py)")


def _full_only(item):
    """In FULL_ONLY: a test id's end, or `end@backend` for that backend's run only."""
    for entry in FULL_ONLY:
        name, _, backend = entry.partition("@")
        if item.nodeid.endswith(name) and backend in ("", keras.backend.backend()):
            return True
    return False


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


def subprocess_env(backend):
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # KRV_JAX_FAST_COMPILE (scripts/test.sh, on by default) turns XLA's optimisations off in
    # the JAX suite's own process (tiny models: compiling dominates); a
    # subprocess trains a run of many steps, where they pay (docs/development.md).
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
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
