"""The literal reader: every shell and Python block of README.md's tour and
of docs/finetune.md, extracted from the pages and run as written, on JAX,
in a directory holding what the blocks name:

- `my_images/`: a folder of real photographs (scikit-image's, 3 classes,
  `train/` + `val/`), as `kr.image_folder.sample_folder` writes it;
- `vit_s16.safetensors` and `vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors`:
  small softmax checkpoints of 10 classes in timm's format (64 px: the commands
  fine-tune at the checkpoint's resolution; 224 px: the Python blocks ask for it);
- `TFDS_DATA_DIR`: an ImageNet generated through the real tfds builder.

The only text changed is listed in `SIZES` (an ImageNet-scale training
command made small); blocks another test already runs are listed in
`ELSEWHERE` with that test. A block that is neither run here nor listed
fails: a new doc block must run. The outcomes are checked, not only the
exit codes: the fine-tune keeps the checkpoint's attention and names the
folder's classes, `eval` reproduces the accuracy the run reported, the
served SavedModel names the classes, the recipe's batch adapts to the folder.
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLASSES = ["cat", "coffee", "rocket"]

# Blocks (or one command of a shell block) that another test runs, found by
# a piece of their text.
ELSEWHERE = {
    "y = layer(x, x)": "test_readme_python.py::test_readme_python_blocks_run",
    'kr.load_image("cat.jpg")': "test_readme_python.py::test_readme_python_blocks_run",
    "kr.data.imagenet(": "test_readme_python.py::test_readme_python_blocks_run",
    "kr.export.saved_model(": "test_readme_python.py::test_readme_python_blocks_run",
    'strategy="fsdp"': "test_readme_python.py::test_readme_python_blocks_run",
    "keras-reluvit predict hf://google/vit-base-patch16-224": "test_predict.py (offline Hub cache)",
    "KERAS_BACKEND=torch python examples/finetune_folder.py --out":
        "test_examples.py::test_finetune_folder_example_runs_end_to_end",
}
# The only text changed: ImageNet-scale sizes (90 epochs of ViT-S/16 at 224 px).
SIZES = {
    "--recipe s16_i1k_90ep": "--recipe s16_i1k_90ep --epochs 1 --batch-size 8 --image-size 32 "
                             "--output runs/s16_relu --no-export",
}


def page_blocks():
    """(page, language, text) of every block of README.md's tour and of
    docs/finetune.md, in page order."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    tour = readme[readme.index("## A tour"):readme.index("## Documentation")]
    finetune = open(os.path.join(ROOT, "docs", "finetune.md")).read()
    out = []
    for page, text in (("README.md", tour), ("docs/finetune.md", finetune)):
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
            if lang in ("python", "bash"):
                out.append((page, lang, block))
    return out


def commands(block):
    """The commands of a shell block, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def elsewhere(text):
    return next((test for marker, test in ELSEWHERE.items() if marker in text), None)


def sized(command):
    for old, new in SIZES.items():
        if old in command:
            command = command.replace(old, new)
    return command


def checkpoint(path, rng, image_size):
    """A small softmax ViT-S/16 of 10 classes (one block) at `image_size`, its
    weights perturbed (a zero head would give zero logits), in timm's format."""
    import keras

    import keras_reluvit as kr

    model = kr.ViT("S/16", depth=1, mlp_dim=64, num_classes=10, pool="tok", qk_norm=False,
                   mlp_activation="gelu", attention="softmax", image_size=image_size)
    for v in model.weights:
        v.assign(keras.ops.convert_to_numpy(v) + rng.normal(0, 0.02, v.shape).astype("float32"))
    kr.export.timm_state_dict(model, path)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, imagenet_dir):
    import keras_reluvit as kr

    tmp = tmp_path_factory.mktemp("reader")
    kr.image_folder.sample_folder(str(tmp / "my_images"), split=True)
    rng = np.random.default_rng(0)
    # The commands fine-tune at the checkpoint's resolution (bv_transfer's image_size
    # None): vit_s16 at 64 px, 4x4 patches, where 224 px took ~30 s a command more; the
    # Python blocks ask for 224 and load the _224 checkpoint.
    for name, size in (("vit_s16.safetensors", 64),
                       ("vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors", 224)):
        checkpoint(str(tmp / name), rng, size)
    os.symlink(os.path.join(ROOT, "examples"), tmp / "examples")
    env = subprocess_env("jax")
    env["TFDS_DATA_DIR"] = str(imagenet_dir)
    return tmp, env


def run(command, cwd, env, timeout=600):
    start = time.time()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    print(f"{time.time() - start:6.1f} s  {command[:100]}")  # shown with pytest -s
    return proc.stdout + proc.stderr


def test_every_tour_and_finetune_block_runs_as_written(workdir):
    tmp, env = workdir
    outputs, ran = {}, []
    python = {}
    for page, lang, block in page_blocks():
        if lang == "python":
            if elsewhere(block):
                continue
            python.setdefault(page, []).append(block)  # one session per page, in order
            continue
        for command in commands(block):
            if elsewhere(command) or command in outputs:  # repeated on another page
                continue
            outputs[command] = run(sized(command), tmp, env)
            ran.append(command)
    for page, code in python.items():
        script = tmp / (page.replace("/", "_") + ".py")
        script.write_text("\n".join(code))
        outputs[page] = run(f"{sys.executable} {script.name}", tmp, env)
    assert set(python) == {"docs/finetune.md"}, set(python)  # the README's run elsewhere
    assert len(ran) >= 6, ran

    # The full fine-tune: the checkpoint's attention, the folder's classes.
    full = next(c for c in ran if "--output runs/mine " in c + " ")
    assert "architecture changed" not in outputs[full], outputs[full][-2000:]
    config = json.loads((tmp / "runs/mine/config.json").read_text())
    assert config["model"]["attention"] == "softmax", config["model"]["attention"]
    assert config["label_names"] == CLASSES and config["model"]["num_classes"] == 3
    assert config["model"]["image_size"] == [64, 64]  # the checkpoint's resolution
    # eval reproduces the validation accuracy (and loss) the run reported, on val/.
    metrics = json.loads((tmp / "runs/mine/metrics.json").read_text())["final"]
    evaluation = next(c for c in ran if c.startswith("keras-reluvit eval"))
    scored = json.loads([line for line in outputs[evaluation].splitlines()
                         if line.startswith("{")][-1])
    assert scored["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    assert scored["loss"] == pytest.approx(metrics["loss"], rel=1e-4)
    assert "the validation split, its own folder (18 images)" in outputs[evaluation]
    # predict --json: one record per validation photograph, labels from the classes.
    predict = next(c for c in ran if c.startswith("keras-reluvit predict runs/mine"))
    records = [json.loads(line) for line in outputs[predict].splitlines()
               if line.startswith("{")]
    assert len(records) == 18
    assert all({t["label"] for t in r["top"]} <= set(CLASSES) for r in records)
    # The served SavedModel (TF Serving's version folder) names the classes.
    import tensorflow as tf

    served = tf.saved_model.load(str(tmp / "runs/mine/saved_model/1"))
    photo = sorted((tmp / "my_images/val/cat").iterdir())[0]
    named = served.signatures["serve_bytes"](image_bytes=tf.reshape(tf.io.read_file(str(photo)),
                                                                    [1]))
    assert sorted(n.decode() for n in named["top_k_labels"].numpy()[0]) == CLASSES
    # LoRA without --batch-size: bv_transfer's 512 adapts to the 54 training photographs.
    lora = next(c for c in ran if "--trainable lora" in c)
    assert "training with batch 54" in outputs[lora], outputs[lora][-2000:]
    lora_config = json.loads((tmp / "runs/mine_lora/config.json").read_text())
    assert lora_config["batch_size"] == 54 and lora_config["model"]["attention"] == "softmax"
    # The ImageNet command ran with ReLU/L.
    s16 = json.loads((tmp / "runs/s16_relu/config.json").read_text())
    assert s16["model"]["attention"] == "relu" and s16["model"]["variant"] == "S/16"
    # The Python blocks of docs/finetune.md: fit, evaluate, export by Keras' own call.
    assert (tmp / "serving/mine/1/saved_model.pb").exists()


def test_every_block_is_run_here_or_by_a_named_test():
    """The bookkeeping of the test above, without running anything: each
    block is run here or by a test that exists (a new block cannot slip by)."""
    blocks = page_blocks()
    assert len(blocks) >= 10, len(blocks)
    for marker, test in ELSEWHERE.items():
        assert any(marker in text for _, _, text in blocks), f"{marker!r} left the pages"
        path = os.path.join(ROOT, "tests", "once", test.split("::")[0].split(" ")[0])
        name = test.split("::")[1] if "::" in test else None
        assert os.path.exists(path), test
        assert name is None or f"def {name}(" in open(path).read(), test
    for old in SIZES:
        assert any(old in text for _, _, text in blocks), f"{old!r} left the pages"
