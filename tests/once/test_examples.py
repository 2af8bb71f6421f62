"""The examples run as users run them: the notebook executed top to bottom
(nbclient, JAX kernel), the alpha sweep on a tiny grid, the ImageNet script
on a generated ImageNet through the real tfds builder, with a device mesh."""

import csv
import json
import os
import subprocess
import sys

import pytest
from conftest import subprocess_env

# A research / ImageNet example's whole run: full runs only.
EXAMPLE_RUN = pytest.mark.full_only("A research / ImageNet example's run: its pieces are "
                                    "covered by test_training, test_distribution and the other "
                                    "examples.")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


def test_quickstart_notebook_is_saved_without_outputs_and_runs_on_jax(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(EXAMPLES, "quickstart.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    source = "\n".join(c.source for c in code)
    for step in ('kr.ViT_S16(attention="relu"', ".summary()", ".fit(", ".evaluate(",
                 ".intermediates(", ".export(export_dir, format=\"tf_saved_model\")",
                 "tf.saved_model.load", "served.serve(",
                 "kr.data.imagenet("):
        assert step in source, step
    for key, value in subprocess_env("jax", optimized=True).items():
        monkeypatch.setenv(key, value)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on any failing cell or assert
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "on jax" in text
    assert "served top-1" in text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert len(images) == 1  # the attention maps figure
    assert (tmp_path / "runs/quickstart/saved_model/1/saved_model.pb").exists()


def run_example(args, backend="jax", extra_env=None, timeout=900, stderr=False):
    """The example's stdout (and its stderr, the library's lines: `stderr`)."""
    env = subprocess_env(backend)
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return (proc.stdout, proc.stderr) if stderr else proc.stdout


@EXAMPLE_RUN
def test_alpha_sweep_writes_csv_and_plot_and_resumes(tmp_path):
    args = [os.path.join(EXAMPLES, "alpha_sweep.py"), "--out", str(tmp_path),
            "--activations", "relu", "--alphas", "0,1", "--epochs", "2",
            "--width", "16", "--depth", "1", "--heads", "2", "--batch-size", "64"]
    out = run_example(args, backend="torch")  # no compile step: the fastest here
    assert "64 tokens" in out
    with open(tmp_path / "alpha_sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["activation"], r["alpha"]) for r in rows) == [
        ("relu", "0.0"), ("relu", "1.0"), ("softmax", "")]
    assert all(r["tokens"] == "64" for r in rows)
    # 10 digit classes: two epochs of a 1-block ViT are well above chance
    # (0.30 / 0.47 / 0.31 measured on torch).
    assert all(float(r["accuracy"]) > 0.2 for r in rows), rows
    assert (tmp_path / "alpha_sweep.png").stat().st_size > 10_000
    out = run_example(args, backend="torch")  # everything is already there: nothing retrained
    assert "3 runs, 3 already" in out
    with open(tmp_path / "alpha_sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    proc = subprocess.run([sys.executable, args[0], "--activations", "relu,tanh"],
                          capture_output=True, text=True, env=subprocess_env("jax"))
    assert proc.returncode != 0 and "tanh" in proc.stderr


@EXAMPLE_RUN
def test_train_imagenet_example_with_a_mesh(tmp_path, imagenet_manual):
    out_dir = tmp_path / "run"
    stdout = run_example(
        [os.path.join(EXAMPLES, "train_imagenet.py"), "--data-dir", str(tmp_path / "tfds"),
         "--manual-dir", str(imagenet_manual), "--model", "Ti/16", "--image-size", "32",
         "--batch-size", "4", "--epochs", "1", "--output", str(out_dir),
         "--mesh", "batch=2", "--sharding", "fsdp"],
        extra_env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    result = json.loads(stdout.strip().splitlines()[-1])
    # Noise images, 1000 classes, one epoch: the loss of a near-uniform
    # 1000-way prediction, ln(1000) = 6.9 (a wrong head size or label
    # encoding would be far off).
    assert 5.0 < result["loss"] < 9.0, result
    assert (out_dir / "model.keras").exists()
    assert (out_dir / "saved_model/1/saved_model.pb").exists()
    assert "steps per epoch, backend jax" in stdout


@EXAMPLE_RUN
def test_train_imagenet_example_runs_a_deit_recipe(tmp_path, imagenet_manual):
    """DeiT's recipe through the example: its own variant (the recipe's, no
    --model), the weights' EMA scored each epoch and saved."""
    out_dir = tmp_path / "run"
    stdout = run_example(
        [os.path.join(EXAMPLES, "train_imagenet.py"), "--data-dir", str(tmp_path / "tfds"),
         "--manual-dir", str(imagenet_manual), "--recipe", "deit_ti16_300ep",
         "--image-size", "32", "--batch-size", "4", "--epochs", "1", "--output", str(out_dir)])
    assert "vit_ti16:" in stdout and "the weights' EMA (decay 0.99996) is the model saved" in stdout
    result = json.loads(stdout.strip().splitlines()[-1])
    assert 5.0 < result["loss"] < 9.0, result
    assert (out_dir / "model.keras").exists()


@pytest.mark.full_only(
    "The relu_from_softmax research script (~40 s), as the other research scripts above: its "
    "recipe runs through the CLI in test_cli_train_from_a_checkpoint_with_relu_from_softmax.")
def test_relu_from_softmax_example_writes_every_arm_and_resumes(tmp_path):
    args = [os.path.join(EXAMPLES, "relu_from_softmax.py"), "--out", str(tmp_path),
            "--pretrain-epochs", "2", "--finetune-epochs", "1", "--seeds", "0",
            "--width", "32", "--depth", "1", "--heads", "2", "--batch-size", "64"]
    run_example(args, backend="torch")
    with open(tmp_path / "relu_from_softmax.csv") as f:
        rows = {r["arm"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["softmax_pretrain", "relu_swapped", "relu_finetuned",
                          "relu_scratch", "softmax_scratch"]
    assert [int(rows[a]["epochs"]) for a in rows] == [2, 2, 3, 3, 3]
    # 10 classes: every trained arm is well above chance after 2-3 epochs.
    for arm in ("softmax_pretrain", "relu_finetuned", "relu_scratch", "softmax_scratch"):
        assert float(rows[arm]["accuracy"]) > 0.3, (arm, rows[arm]["accuracy"])
    assert (tmp_path / "relu_from_softmax.png").stat().st_size > 10_000
    out = run_example(args, backend="torch")  # all rows there: nothing retrained
    assert "accuracy" not in out.split("softmax_pretrain")[0]
    with open(tmp_path / "relu_from_softmax.csv") as f:
        assert len(list(csv.DictReader(f))) == 5


def test_cli_train_from_a_checkpoint_with_relu_from_softmax(tmp_path):
    import keras

    import keras_reluvit as kr
    from keras_reluvit import cli

    soft = kr.ViT("Ti/8", attention="softmax", width=32, depth=1, num_heads=2, mlp_dim=64,
                  image_size=32, num_classes=3)
    soft.save_to_preset(tmp_path / "soft")
    out = tmp_path / "run"
    assert cli.main(["train", "--recipe", "relu_from_softmax", "--init", str(tmp_path / "soft"),
                     "--dataset", "sklearn_digits", "--data-dir", str(tmp_path / "tfds"),
                     "--image-size", "32", "--epochs", "1", "--batch-size", "128",
                     "--output", str(out), "--no-export", "--quiet"]) == 0
    model = keras.saving.load_model(out / "model.keras", compile=False)
    assert model.attention_args["activation"] == "relu"
    assert model.output_shape[-1] == 10  # a new head for the data set's classes
    config = json.loads((out / "config.json").read_text())
    assert config["init"] == str(tmp_path / "soft") and config["model"]["width"] == 32


@EXAMPLE_RUN
def test_length_study_and_attention_scale_on_a_tiny_grid(tmp_path):
    study = tmp_path / "study"
    args = [os.path.join(EXAMPLES, "length_study.py"), "--out", str(study),
            "--image-sizes", "8,16", "--alphas", "1", "--seeds", "0", "--qk-norm", "on",
            "--epochs", "1", "--width", "16", "--depth", "1", "--heads", "2", "--save-models"]
    run_example(args, backend="torch")
    with open(study / "length_study.csv") as f:
        rows = list(csv.DictReader(f))
    # softmax, relu alpha=1 and relu_learned at 4 and 16 tokens
    assert sorted((r["tokens"], r["activation"], r["learned_scale"]) for r in rows) == sorted(
        (t, a, learned) for t in ("4", "16")
        for a, learned in (("softmax", "False"), ("relu", "False"), ("relu", "True")))
    assert all(float(r["accuracy"]) > 0.15 for r in rows), rows  # 10 classes, above chance
    # The logged effective scale is exp(s_h) / L of the saved model.
    import keras
    import numpy as np

    import keras_reluvit  # noqa: F401  (registers ViT for load_model)

    for r in rows:
        if r["learned_scale"] == "True":
            model = keras.saving.load_model(
                study / "models" / f"t{r['tokens']}_relu_learned_a1_qk1_s0.keras", compile=False)
            expected = np.mean([np.exp(keras.ops.convert_to_numpy(b.attn.log_scale))
                                for b in model.blocks]) / int(r["tokens"])
            assert abs(float(r["effective_scale"]) - expected) < 1e-6 * expected
            assert float(r["inverse_tokens"]) == 1 / int(r["tokens"])
    assert (study / "length_study.png").stat().st_size > 10_000
    assert "6 runs, 6 already" in run_example(args, backend="torch")

    scale = tmp_path / "scale"
    run_example([os.path.join(EXAMPLES, "attention_scale.py"), "--out", str(scale),
                 "--tokens", "16,64,256", "--activations", "relu,sigmoid", "--width", "64",
                 "--heads", "2", "--trained", str(study / "models")], backend="torch")
    with open(scale / "attention_scale.csv") as f:
        rows = list(csv.DictReader(f))
    slopes = {(r["source"], r["activation"], r["alpha"], r["qk_norm"]): r
              for r in rows if r["tokens"] == "slope"}
    for qk in ("True", "False"):
        # The paper's E_j[a_ij] = O(L^-alpha): row sums grow like L^(1 - alpha)
        # for pointwise h with a non-zero mean on random scores.
        for act in ("relu", "sigmoid"):
            for alpha, expected in (("0.0", 1.0), ("0.5", 0.5), ("1.0", 0.0)):
                s = slopes[("init", act, alpha, qk)]
                assert abs(float(s["row_sum"]) - expected) < 0.1, s
                assert abs(float(s["rms_shared"]) - expected) < 0.15, s
                # independent values average out: ~sqrt(L) * L^-alpha (plus the
                # query's own key, which matters at small L)
                assert abs(float(s["rms_iid"]) - (expected - 0.5)) < 0.25, s
                # same weights (same seed) at every alpha: exactly L^-alpha apart
                s0 = slopes[("init", act, "0.0", qk)]
                for k in ("row_sum", "rms_shared", "rms_iid"):
                    assert abs(float(s0[k]) - float(s[k]) - float(alpha)) < 1e-3, (k, s)
        soft = [r for r in rows if r["source"] == "init" and r["activation"] == "softmax"
                and r["qk_norm"] == qk and r["tokens"] != "slope"]
        assert len(soft) == 3 and all(abs(float(r["row_sum"]) - 1) < 1e-4 for r in soft)
    trained = {r["source"] for r in rows if r["source"].startswith("t16_relu_learned")}
    assert trained == {"t16_relu_learned_a1_qk1_s0/block0"}
    assert (scale / "attention_scale.png").stat().st_size > 10_000


def test_finetune_folder_example_runs_end_to_end(tmp_path):
    """examples/finetune_folder.py as CI runs it: a generated folder of real
    photographs, a demo checkpoint of 10 classes -> 3, full fine-tune,
    evaluate, predict by name, export and serve (PyTorch)."""
    out, said = run_example([os.path.join(EXAMPLES, "finetune_folder.py"), "--out",
                             str(tmp_path)], backend="torch", stderr=True)
    assert "classes ['cat', 'coffee', 'rocket']" in out
    assert "freshly initialised" in said
    last = out.strip().splitlines()[-1]
    accuracy = float(last.split("validation accuracy ")[1].split()[0])
    assert accuracy >= 0.95, last
    assert "agrees with model.predict on 100%" in last
    assert "serves the class names ['rocket'" in out
    assert (tmp_path / "saved_model" / "1" / "saved_model.pb").exists()
