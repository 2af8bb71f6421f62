"""The Python blocks of the README and docs/ run, on small data: each block is
the page's own text, with only the sizes made small (named below per
block) and files it names generated (tiny checkpoints in the formats it
loads, a generated ImageNet through the real tfds builder)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
from conftest import run_hf_reference
from conftest import subprocess_env
from test_predict import cache_repo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pages():
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                  if f.endswith(".md"))
    return ["README.md"] + docs


def blocks(page=None):
    """The Python blocks of one page, or of the README then every docs page."""
    text = "\n".join(open(os.path.join(ROOT, p)).read() for p in ([page] if page else pages()))
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_python_block_parses_and_the_tour_matches_the_docs():
    """Every block compiles (the ones the test below does not run are at
    least parsed), and a README tour block repeated in a docs page is the
    same text there (one example, not two that drift)."""
    for page in pages():
        for i, block in enumerate(blocks(page)):
            compile(block, f"{page} python block {i}", "exec")
    def key(block):  # the first line that is not an import
        return next((line for line in block.splitlines()
                     if not line.startswith(("import ", "from "))), "")

    tour = {key(b): b for b in blocks("README.md")}
    repeated = 0
    for page in pages()[1:]:
        for block in blocks(page):
            if key(block) in tour:
                repeated += 1
                assert block == tour[key(block)], f"{page}: differs from the README's {key(block)!r}"
    assert repeated >= 3, repeated  # the training, serving and fsdp examples


def small(code, replacements, label):
    for old, new in replacements:
        assert old in code, f"{label}: the README no longer has {old!r}; update this test"
        code = code.replace(old, new)
    return code


def make_checkpoints(directory):
    """The files the 'Pretrained weights' block names, tiny, in their formats."""
    import keras_hub

    import keras_reluvit as kr

    sd_model = kr.ViT("S/16", depth=1, mlp_dim=64, image_size=32, pool="tok",
                      qk_norm=False, mlp_activation="gelu", attention="softmax")
    kr.export.timm_state_dict(
        sd_model, os.path.join(directory, "vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors"))
    npz_model = kr.ViT("S/16", depth=1, mlp_dim=64, image_size=32, pool="tok",
                       qk_norm=False, attention="softmax", posemb_prefix=True)
    kr.export.big_vision_npz(
        npz_model, os.path.join(directory, "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz"))
    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=16, num_layers=1,
                                            num_heads=2, hidden_dim=32, mlp_dim=64)
    backbone.save_to_preset(os.path.join(directory, "keras_hub_vit_base_patch16_224"))
    # The "one line each" block's files.
    kr.export.timm_state_dict(
        sd_model, os.path.join(directory, "vit_base_patch16_224.augreg2_in21k_ft_in1k.safetensors"))
    kr.export.big_vision_npz(
        npz_model, os.path.join(directory, "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz"))
    clip = kr.ViT("S/16", depth=1, mlp_dim=64, image_size=32, pool="tok", qk_norm=False,
                  pre_norm=True, mlp_activation="quick_gelu", attention="softmax")
    kr.export.timm_state_dict(
        clip, os.path.join(directory, "vit_base_patch16_clip_quickgelu_224.safetensors"))
    run_hf_reference("readme", os.path.join(directory, "hf"))


def test_readme_python_blocks_run(tmp_path, imagenet_dir, monkeypatch):
    code = blocks()
    by_marker = {}
    for i, block in enumerate(code):
        for marker in ("y = layer(x, x)", "model.save_to_preset(", "hf/facebook-dinov2-small",
                       "kr.data.imagenet(",
                       "kr.export.saved_model(", "sequence_axis=", "strategy=\"fsdp\"",
                       "def squareplus", "serve_preprocessed_xla(", "kr.use_kernel(",
                       "kr.load_image(\"cat.jpg\")"):
            if marker in block:
                by_marker.setdefault(marker, i)
    assert len(by_marker) == 11, by_marker
    monkeypatch.chdir(tmp_path)
    make_checkpoints(str(tmp_path))
    # hf:// handles: the Hub's copy, from a cache populated here, offline.
    import huggingface_hub.constants

    cache_repo(tmp_path / "hf_cache", "google/vit-base-patch16-224",
               tmp_path / "hf" / "google-vit-base-patch16-224")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    ns = {"x": np.random.default_rng(0).normal(size=(2, 197, 384)).astype("float32")}
    run = [
        (code[by_marker["y = layer(x, x)"]], []),
        (code[by_marker["hf/facebook-dinov2-small"]], []),
        (code[by_marker["model.save_to_preset("]], []),
        (code[by_marker["kr.data.imagenet("]], [
            ("batch_size=1024", "batch_size=4, image_size=32"),
            ('data_dir="~/tensorflow_datasets"', f'data_dir="{imagenet_dir}"'),
            ("num_classes=info.num_classes)", "num_classes=info.num_classes, image_size=32, depth=1)"),
            ("epochs=90", "epochs=1")]),
        (code[by_marker["kr.export.saved_model("]], []),
        (code[by_marker["serve_preprocessed_xla("]], [("[8, 224, 224, 3]", "[8, 32, 32, 3]")]),
        (code[by_marker["def squareplus"]], []),
    ]
    for i, (block, replacements) in enumerate(run):
        exec(compile(small(block, replacements, f"block {i}"), f"README python block {i}", "exec"),
             ns)
    assert tuple(ns["y"].shape) == (2, 197, 384)
    assert ns["model"].name and os.path.exists("presets/vit_s16_augreg/config.json")
    assert os.path.exists("serving/vit_s16_relu/1/saved_model.pb")
    assert os.path.exists("vit_s16_relu.onnx")
    assert ns["logits"].shape[0] == 8  # the SavedModel's XLA endpoint served a batch
    # The multi-device blocks: JAX with 8 virtual devices, in a subprocess.
    script = "import keras, keras_reluvit as kr\n" + "\n".join(
        small(code[by_marker[m]], [("attention=\"relu\")", "attention=\"relu\", image_size=32, depth=1)")],
              m) for m in ('strategy="fsdp"', "sequence_axis="))
    script += "\nprint('shape', model.output_shape)\n"
    # The kernel-switch block (the Pallas kernel: JAX), interpreted here.
    script += code[by_marker["kr.use_kernel("]] + "\nprint('kernel', y.shape, kr.get_kernel())\n"
    env = subprocess_env("jax")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shape (None, 1000)" in proc.stdout
    assert "kernel (2, 197, 6, 64) auto" in proc.stdout
    # The Predict block: its hf:// handle from a Hugging Face cache populated
    # here (a timm hub directory, as save_for_hf writes it), offline, on a
    # photograph.
    predict_block = code[by_marker['kr.load_image("cat.jpg")']]
    hub = tmp_path / "timm_hub"
    hub.mkdir()
    kr_model = __import__("keras_reluvit").ViT("S/16", depth=1, mlp_dim=64, image_size=32,
                                               pool="tok", qk_norm=False, num_classes=1000,
                                               mlp_activation="gelu", attention="softmax")
    __import__("keras_reluvit").export.timm_state_dict(kr_model, hub / "model.safetensors")
    (hub / "config.json").write_text(json.dumps({
        "architecture": "vit_small_patch16_224", "num_classes": 1000,
        "pretrained_cfg": {"input_size": [3, 32, 32], "interpolation": "bicubic",
                           "crop_pct": 0.9, "mean": [0.5] * 3, "std": [0.5] * 3}}))
    cache_repo(tmp_path / "hf_cache_timm", "timm/vit_small_patch16_224.augreg_in21k_ft_in1k",
               hub)
    import skimage.data
    from PIL import Image

    Image.fromarray(skimage.data.chelsea()).save(tmp_path / "cat.jpg")
    env = dict(subprocess_env("jax"), HF_HUB_CACHE=str(tmp_path / "hf_cache_timm"),
               HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", predict_block], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = eval(proc.stdout.strip().splitlines()[-1])  # the printed top-5
    names = __import__("keras_reluvit").imagenet1k_labels()
    assert len(top) == 5 and all(name in names for name, _ in top)
    probs = [p for _, p in top]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
