"""Hugging Face transformers checkpoints on the current backend, against
transformers' own forwards.

`hf_reference.py make` (a child process: transformers imports torch) builds
small ViT, DeiT, DINOv2 (+ registers) and CLIP models with transformers,
perturbs every parameter, writes each with `save_pretrained` and records what
transformers computes; here `kr.load_checkpoint` reads the directories and
must give the same numbers. The other way, `kr.export.hf_state_dict` writes a
directory that `ViTForImageClassification.from_pretrained` loads (child
process again) with our logits.
"""

import json
import os

import keras
import numpy as np
import pytest
from conftest import run_hf_reference

import keras_reluvit as kr
from keras_reluvit import checkpoints as C


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    run_hf_reference("make", str(out))
    return out, dict(np.load(out / "reference.npz"))


# case -> (load_checkpoint kwargs, expected config entries)
CASES = {
    "vit": ({}, dict(pool="tok", mlp_activation="gelu", layer_norm_epsilon=1e-12,
                     include_top=True, num_classes=5, num_register_tokens=0)),
    "vit_sharded": ({}, dict(include_top=True, num_classes=5)),
    "vit_tanh_nobias": ({}, dict(mlp_activation="gelu_tanh", mlp_dim=48, num_classes=3,
                                 layer_norm_epsilon=1e-6)),
    "vit_model_pooler": ({}, dict(include_top=False, representation_size=32)),
    "deit": ({}, dict(num_register_tokens=1, posemb_prefix=True, pool="tok")),
    "deit_teacher": ({"num_classes": 0}, dict(num_register_tokens=1, include_top=False)),
    "dinov2": ({}, dict(pool="tok_gap", layer_scale=1.0, layer_norm_epsilon=1e-6, mlp_dim=64)),
    "dinov2_model": ({}, dict(pool="tok", include_top=False, layer_scale=1.0)),
    "dinov2_registers": ({}, dict(pool="tok_gap", num_register_tokens=2, posemb_prefix=False)),
    "clip_vision": ({}, dict(pre_norm=True, mlp_activation="quick_gelu", num_classes=16,
                             layer_norm_epsilon=1e-5)),
    "clip": ({}, dict(pre_norm=True, mlp_activation="quick_gelu", num_classes=16)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_directory_equals_transformers(hf, case):
    out, ref = hf
    kwargs, expected = CASES[case]
    model = kr.load_checkpoint(out / case, **kwargs)
    cfg = model.get_config()
    assert {k: cfg[k] for k in expected} == expected
    assert model.attention_args["activation"] == "softmax"
    assert model.checkpoint_source["format"] == "hf"
    got = to_np(model(ref["images"]))
    assert got.shape == ref[case].shape
    np.testing.assert_allclose(got, ref[case], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("case,size", [("dinov2", 48), ("dinov2", 16), ("dinov2_registers", 24)])
def test_dinov2_at_another_size_equals_transformers_run_time_resampling(hf, case, size):
    """transformers' DINOv2 resamples its position embedding for other image
    sizes at run time (bicubic, antialiased); load_checkpoint(image_size=)
    resamples it once the same way, so the logits agree up and down."""
    out, ref = hf
    model = kr.load_checkpoint(out / case, image_size=size)
    np.testing.assert_allclose(to_np(model(ref[f"images@{size}"])), ref[f"{case}@{size}"],
                               atol=5e-5, rtol=1e-4)
    bilinear = kr.load_checkpoint(out / case, image_size=size, posemb_resampling="bilinear")
    assert np.abs(to_np(bilinear(ref[f"images@{size}"])) - ref[f"{case}@{size}"]).max() > 1e-4


def test_relu_attention_fine_tune_start_and_new_head_and_size(hf):
    out, ref = hf
    model = kr.load_checkpoint(out / "dinov2", attention="relu", num_classes=7, image_size=48)
    assert model.attention_args["activation"] == "relu"
    assert model.image_size == (48, 48)
    assert model.get_layer("head").kernel.shape == (64, 7)  # tok_gap: 2 * width features
    assert np.all(to_np(model.get_layer("head").kernel) == 0)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 48, 48, 3)).astype("float32")
    assert np.all(np.isfinite(to_np(model(x))))


def test_deit_with_teacher_is_refused_by_name_without_num_classes(hf):
    out, _ = hf
    with pytest.raises(C.CheckpointError, match="WithTeacher averages a class-token head"):
        kr.load_checkpoint(out / "deit_teacher")
    fresh = kr.load_checkpoint(out / "deit_teacher", num_classes=4)
    assert fresh.get_config()["num_classes"] == 4


@pytest.mark.full_only(
    "The rectangular HF round trip on TensorFlow and PyTorch (~8 + 5 s): it runs on JAX; the "
    "square one on all three (the conversion is NumPy, the logits per backend).",
    backends=('tensorflow', 'torch'), ids=('size1',))
@pytest.mark.parametrize("size", [(32, 32), (32, 24)])
def test_round_trip_ours_to_hf_to_ours_is_exact_and_transformers_agrees(tmp_path, size):
    """Written as a transformers ViT (a rectangular one with image_size
    [h, w], which transformers' ViT takes), read back exactly, and
    transformers computes our logits."""
    model = kr.ViT("Ti/8", attention="softmax", num_classes=6, image_size=size, width=32, depth=2,
                   num_heads=2, mlp_dim=48, pool="tok", mlp_activation="gelu",
                   layer_norm_epsilon=1e-12, qk_norm=False,
                   preprocessing=dict(resize="squash", crop_pct=1.0, interpolation="bilinear",
                                      round_uint8=True, resize_rounding="floor"))
    rng = np.random.default_rng(3)
    for v in model.weights:
        v.assign(rng.normal(0, 0.2, tuple(v.shape)).astype("float32"))
    sd, config = kr.export.hf_state_dict(model, tmp_path / "hf")
    assert config["architectures"] == ["ViTForImageClassification"]
    assert "vit.encoder.layer.1.attention.attention.query.weight" in sd
    back = kr.load_checkpoint(tmp_path / "hf")
    for a, b in zip(model.weights, back.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(to_np(a), to_np(b))
    assert back.image_size == size
    # the processor ({"height", "width"}: rectangular too) read back as written
    assert back.preprocessing == model.preprocessing
    photo = np.random.default_rng(5).integers(0, 256, (50, 70, 3), dtype="uint8")
    np.testing.assert_array_equal(to_np(back.preprocessor(photo)), to_np(model.preprocessor(photo)))
    assert tuple(back.preprocessor(photo).shape) == (1, *size, 3)
    x = np.random.default_rng(4).uniform(-1, 1, (2, *size, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    run_hf_reference("logits", str(tmp_path / "hf"), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), to_np(model(x)), atol=2e-5, rtol=1e-4)


def test_hf_writer_refuses_what_hf_vit_cannot_express(tmp_path):
    relu = kr.ViT("Ti/8", attention="relu", num_classes=3, image_size=16, width=32, depth=1,
                  num_heads=2, pool="tok")
    with pytest.raises(ValueError, match="HF computes softmax"):
        kr.export.hf_state_dict(relu)
    gap = kr.ViT("Ti/8", attention="softmax", num_classes=3, image_size=16, width=32, depth=1,
                 num_heads=2, pool="gap", qk_norm=True)
    with pytest.raises(ValueError, match=r"pool='gap'.*qk_norm=True"):
        kr.export.hf_state_dict(gap)


def test_load_weights_and_the_command_line_take_a_transformers_directory(hf, tmp_path, capsys):
    from keras_reluvit import cli

    out, ref = hf
    model = kr.ViT("Ti/8", attention="softmax", num_classes=5, image_size=32, width=32, depth=2,
                   num_heads=2, mlp_dim=64, pool="tok", mlp_activation="gelu",
                   layer_norm_epsilon=1e-12, qk_norm=False)
    kr.load_weights(model, out / "vit")
    np.testing.assert_allclose(to_np(model(ref["images"])), ref["vit"], atol=2e-5, rtol=1e-4)
    preset = kr.ViT.from_preset(out / "deit")
    np.testing.assert_allclose(to_np(preset(ref["images"])), ref["deit"], atol=2e-5, rtol=1e-4)
    assert cli.main(["convert", str(out / "clip_vision"), str(tmp_path / "clip.keras")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["format"] == "hf"
    clip = keras.saving.load_model(tmp_path / "clip.keras")
    np.testing.assert_allclose(to_np(clip(ref["images"])), ref["clip_vision"], atol=2e-5, rtol=1e-4)
    assert cli.main(["convert", str(out / "vit"), str(tmp_path / "vit_hf"), "--to", "hf"]) == 0
    again = kr.load_checkpoint(tmp_path / "vit_hf")
    np.testing.assert_allclose(to_np(again(ref["images"])), ref["vit"], atol=2e-5, rtol=1e-4)


def _hf_dir(tmp_path, config, name="m"):
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


def test_bad_transformers_directories_name_the_problem(hf, tmp_path):
    out, _ = hf
    with pytest.raises(C.CheckpointError, match=r"model_type 'beit'.*supported: vit, deit"):
        kr.load_checkpoint(_hf_dir(tmp_path, {"model_type": "beit"}, "beit"))
    for name, text, match in [("list", "[1, 2]", "holds a JSON list, not an object"),
                              ("empty", "  \n", "the file is empty"),
                              ("broken", "{\"model_type\": ", "not valid JSON")]:
        with pytest.raises(C.CheckpointError, match=rf"{name}/config.json: {match}"):
            kr.load_checkpoint(_hf_dir(tmp_path, text, name))
    mim = json.loads((out / "vit" / "config.json").read_text())
    mim["architectures"] = ["ViTForMaskedImageModeling"]
    with pytest.raises(C.CheckpointError, match=r"ViTForMaskedImageModeling is not supported.*"
                                                r"ViTModel, ViTForImageClassification"):
        kr.load_checkpoint(_hf_dir(tmp_path, mim, "mim"))
    with pytest.raises(C.CheckpointError, match="no model.safetensors"):
        kr.load_checkpoint(_hf_dir(tmp_path, {"model_type": "vit"}, "noweights"))
    act = json.loads((out / "vit" / "config.json").read_text())
    act["hidden_act"] = "swish"
    d = _hf_dir(tmp_path, act, "swish")
    os.symlink(out / "vit" / "model.safetensors", d / "model.safetensors")
    with pytest.raises(C.CheckpointError, match="hidden_act 'swish' is not supported"):
        kr.load_checkpoint(d)
    # a weight outside the layout: named, nothing loaded
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    sd = load_file(str(out / "vit" / "model.safetensors"))
    sd["vit.encoder.layer.0.attention.attention.relative_position_bias"] = np.zeros(3, "float32")
    d = _hf_dir(tmp_path, json.loads((out / "vit" / "config.json").read_text()), "extra")
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(C.CheckpointError, match="relative_position_bias"):
        kr.load_checkpoint(d)


def test_every_family_name_map_is_symmetric(hf):
    """ours -> each family's layout -> ours gives the same weights (the
    DINOv2-with-registers map folds the class position row into the class
    token on the way in and writes it back as a zero row)."""
    from keras_reluvit.checkpoints import hf as H
    from keras_reluvit.checkpoints.common import model_weights
    from keras_reluvit.checkpoints.common import read_links
    from keras_reluvit.checkpoints.common import write_links

    out, _ = hf
    for case, family, base, head in [
            ("deit", "deit", "deit.", "classifier"),
            ("dinov2_registers", "dinov2_with_registers", "dinov2_with_registers.", "classifier"),
            ("clip", "clip", "vision_model.", "visual_projection")]:
        model = kr.load_checkpoint(out / case)
        ours = model_weights(model)
        links = H.name_map(model.get_config(), family, base, head)
        theirs = write_links(ours, links)
        back = read_links(theirs, links, case, "the round trip")
        assert set(back) == set(ours), case
        for key, (value, _) in back.items():
            np.testing.assert_allclose(value, ours[key], atol=1e-7, err_msg=f"{case}: {key}")
