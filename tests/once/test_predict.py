"""`keras-reluvit predict` and hf:// handles, offline over a Hugging Face
cache this test populates, and the SavedModel's `serve_bytes` against
transformers' own predictions on JPEG photographs."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_hf_reference
from conftest import subprocess_env
from test_checkpoints import save_safetensors
from test_checkpoints import timm_state_dict
from test_preprocessing import jpeg_files
from test_preprocessing import rgba_photograph

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache, repo, files_from):
    """One repository in huggingface_hub's cache layout
    (models--ORG--NAME/{refs/main, snapshots/COMMIT/...})."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    shutil.copytree(files_from, root / "snapshots" / COMMIT)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hub")
    jpegs = jpeg_files(tmp)
    from PIL import Image

    Image.fromarray(rgba_photograph(), "RGBA").save(tmp / "rgba.png")
    run_hf_reference("photos", str(tmp), *jpegs, "--convert-rgb", str(tmp / "rgba.png"))
    cache = tmp / "cache"
    cache_repo(cache, "google/vit-base-patch16-224", tmp / "vit")
    timm_dir = tmp / "timm_dir"
    timm_dir.mkdir()
    save_safetensors(timm_state_dict(np.random.default_rng(3), width=192, heads=3, classes=1000),
                     timm_dir / "model.safetensors")
    (timm_dir / "config.json").write_text(json.dumps({
        "architecture": "vit_small_patch16_224", "num_classes": 1000,
        "pretrained_cfg": {"input_size": [3, 32, 32], "interpolation": "bicubic",
                           "crop_pct": 0.9, "mean": [0.5] * 3, "std": [0.5] * 3}}))
    cache_repo(cache, "timm/vit_small_patch16_224.augreg_in21k_ft_in1k", timm_dir)
    env = dict(subprocess_env("jax"), HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    ref = dict(np.load(tmp / "photos.npz"))
    for name in ("vit", "deit"):  # per file -> one array
        ref[name] = np.stack([ref[f"{name}/{j}"] for j in range(len(jpegs))])
    return tmp, jpegs, ref, env


def predict(env, *args):
    return subprocess.run([sys.executable, "-m", "keras_reluvit.cli", "predict", *args],
                          env=env, capture_output=True, text=True, timeout=600)


def test_predict_a_hub_handle_offline_gives_transformers_top5(hub):
    """`keras-reluvit predict hf://google/vit-base-patch16-224 photo.jpg`
    from the populated cache: transformers' own top-5 (its id2label names,
    its probabilities within 1e-3), for every photograph."""
    tmp, jpegs, ref, env = hub
    proc = predict(env, "hf://google/vit-base-patch16-224", *jpegs, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    id2label = json.loads((tmp / "vit" / "config.json").read_text())["id2label"]
    for row, probs in zip(out, ref["vit"]):
        want = np.argsort(-probs)[:5]
        assert [t["label"] for t in row["top"]] == [id2label[str(i)] for i in want]
        np.testing.assert_allclose([t["probability"] for t in row["top"]], probs[want],
                                   atol=1e-3)
    text = predict(env, "hf://google/vit-base-patch16-224", jpegs[0])
    assert text.returncode == 0 and text.stdout.startswith(jpegs[0])
    assert len(text.stdout.strip().splitlines()) == 6  # the path, then five classes


def test_timm_hub_handle_and_missing_handles(hub):
    _, jpegs, _, env = hub
    proc = predict(env, "hf://timm/vit_small_patch16_224.augreg_in21k_ft_in1k", jpegs[1],
                   "--json", "--top", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = json.loads(proc.stdout)[0]["top"]
    # A 1000-class timm head without names: the ImageNet-1k class names.
    import keras_reluvit as kr

    assert len(top) == 3 and all(t["label"] in kr.imagenet1k_labels() for t in top)
    missing = predict(env, "hf://someone/not-cached", jpegs[0])
    assert missing.returncode == 2
    assert "hf://someone/not-cached: cannot get someone/not-cached" in missing.stderr
    assert "hf download someone/not-cached" in missing.stderr


SERVE = """
import json, sys, numpy as np, tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
data = [open(p, "rb").read() for p in sys.argv[2:]]
out = model.signatures["serve_bytes"](image_bytes=tf.constant(data))
# serving_default on uint8 pixels (one image: the files differ in size),
# decoded by PIL as the source's pipeline does.
from PIL import Image
pixels = [model.signatures["serving_default"](images=tf.constant(
    np.asarray(Image.open(p).convert("RGB"))[None]))["probabilities"].numpy()[0].tolist()
    for p in sys.argv[2:] if not p.endswith(".png")]
print(json.dumps({"probabilities": out["probabilities"].numpy().tolist(), "pixels": pixels,
                  "labels": [[s.decode() for s in row] for row in out["top_k_labels"].numpy()]}))
"""


def serve(path, files):
    proc = subprocess.run([sys.executable, "-c", SERVE, str(path), *files],
                          env=subprocess_env("tensorflow"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_saved_model_serves_transformers_predictions(hub, tmp_path):
    """A transformers DINOv2 checkpoint (configured at 518 px, its processor
    resizing the shortest edge to 256 and cropping 224, bicubic, ImageNet
    mean / std, transparency composited onto white) exported with its
    recipe, served with plain TensorFlow: `serve_bytes` on the JPEG files and
    an RGBA PNG, and `serving_default` on the JPEGs' pixels, give
    transformers' probabilities (1e-3) and class names."""
    import keras_reluvit as kr

    src, jpegs, ref, _ = hub
    model = kr.ViT.from_preset(src / "dinov2")
    png = str(src / "rgba.png")
    out = serve(kr.export.saved_model(model, tmp_path / "dinov2" / "1"), [*jpegs, png])
    want = [ref[f"dinov2/{j}"] for j in range(len(jpegs))]
    np.testing.assert_allclose(out["probabilities"], [*want, ref["dinov2/convert_rgb/0"]],
                               atol=1e-3)
    np.testing.assert_allclose(out["pixels"], want, atol=1e-3)
    assert out["labels"][0][0] == model.label_names[int(np.argmax(want[0]))]
