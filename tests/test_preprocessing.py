"""Predict like the source: each checkpoint's preprocessing, applied where
images enter, against the sources' own pipelines.

References are independent of our code: PIL (what timm's torchvision
transforms and transformers' image processors call on uint8 images) with
torchvision's / transformers' crop rules written out here, Keras' own
`Resizing(crop_to_aspect_ratio=True)` (keras-hub's converter), TensorFlow's
area resize (big_vision's), and transformers itself in a child process on
JPEG photographs (scikit-image's sample images).
"""

import json
import math

import keras
import numpy as np
import pytest
from conftest import run_hf_reference
from PIL import Image
from test_checkpoints import save_safetensors
from test_checkpoints import timm_state_dict

import keras_reluvit as kr
from keras_reluvit import preprocessing as P
from keras_reluvit.checkpoints import CheckpointError
from keras_reluvit.preprocessing.keras_ops import generic as keras_ops_generic


def photographs():
    import skimage.data as d

    return {n: getattr(d, n)() for n in ("astronaut", "coffee", "chelsea", "rocket")}


def jpeg_files(tmp_path, images=None):
    paths = []
    for name, img in (images or photographs()).items():
        path = tmp_path / f"{name}.jpg"
        Image.fromarray(img).save(path, quality=90)
        paths.append(str(path))
    return paths


def varied_photographs():
    """Other shapes than the four landscape / square photographs: portrait,
    tall and narrow, tiny."""
    p = photographs()
    return {"portrait": np.ascontiguousarray(np.rot90(p["coffee"])),   # 600 x 400
            "narrow": np.ascontiguousarray(p["astronaut"][:, 180:330]),  # 512 x 150
            "tiny": np.ascontiguousarray(p["chelsea"][100:140, 150:180])}  # 40 x 30


def rgba_photograph():
    """A photograph with an alpha gradient (transparent on the left, opaque
    on the right), as PNG files with transparency hold."""
    img = photographs()["chelsea"]
    alpha = np.broadcast_to(np.linspace(0, 255, img.shape[1]).round().astype("uint8"),
                            img.shape[:2])
    return np.concatenate([img, alpha[..., None]], -1)


def to_np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


# ------------------------------------------------------- PIL references
def pil_timm(img, size, crop_pct, resample, mean, std, squash=False):
    """timm's eval transform as torchvision runs it on a PIL image:
    Resize(floor(size / crop_pct)) (the shorter side; the other truncated),
    CenterCrop (offsets round((H - h) / 2)), ToTensor, Normalize."""
    im = Image.fromarray(img)
    s = math.floor(size / crop_pct)
    w, h = im.size
    if squash:
        nw = nh = s
    elif w <= h:
        nw, nh = s, int(s * h / w)
    else:
        nw, nh = int(s * w / h), s
    a = np.asarray(im.resize((nw, nh), resample)).astype("float64")
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    a = a[top:top + size, left:left + size] / 255.0
    return ((a - mean) / std).astype("float32")


def pil_transformers(img, size, crop, resample, mean, std, shortest_edge=False):
    """transformers' PIL image processors: resize (squash to `size`, or the
    shortest edge to `size`), centre crop with offsets (H - h) // 2,
    rescale 1/255, normalise."""
    im = Image.fromarray(img)
    w, h = im.size
    if shortest_edge:
        short, long = (w, h) if w <= h else (h, w)
        new = (size, int(size * long / short))
        nw, nh = (new[0], new[1]) if w <= h else (new[1], new[0])
    else:
        nw = nh = size
    a = np.asarray(im.resize((nw, nh), resample)).astype("float64")
    if crop:
        top, left = (nh - crop) // 2, (nw - crop) // 2
        a = a[top:top + crop, left:left + crop]
    return ((a / 255.0 - mean) / std).astype("float32")


ONE_LEVEL = 1.0 / 255.0  # one uint8 step, in [0, 1] pixel units


def in_levels(diff, std):
    """Differences of normalised pixels in uint8 steps."""
    return np.abs(diff) * np.asarray(std) / ONE_LEVEL


TIMM = dict(resize="shorter", crop_pct=0.9, interpolation="bicubic", antialias=True,
            round_uint8=True, crop_offset="round", resize_rounding="floor", mean=(0.5,) * 3,
            std=(0.5,) * 3)


@pytest.mark.parametrize("case", ["timm_center", "timm_squash", "hf_vit", "hf_deit", "hf_clip"])
def test_preprocessor_equals_pil_pipelines_on_photographs(case):
    """`model.preprocessor` on each photograph against the PIL pipeline it
    stands for: at most one uint8 step anywhere (PIL's fixed-point filter
    weights), equal almost everywhere."""
    imagenet = (P.IMAGENET_MEAN, P.IMAGENET_STD)
    clip = (P.OPENAI_CLIP_MEAN, P.OPENAI_CLIP_STD)
    recipe, ref = {
        "timm_center": (TIMM, lambda im: pil_timm(im, 224, 0.9, Image.BICUBIC, 0.5, 0.5)),
        "timm_squash": (dict(TIMM, resize="squash", crop_pct=0.875, mean=imagenet[0],
                             std=imagenet[1]),
                        lambda im: pil_timm(im, 224, 0.875, Image.BICUBIC, *imagenet,
                                            squash=True)),
        "hf_vit": (dict(TIMM, resize="squash", crop_pct=1.0, interpolation="bilinear",
                        crop_offset="floor"),
                   lambda im: pil_transformers(im, 224, None, Image.BILINEAR, 0.5, 0.5)),
        "hf_deit": (dict(TIMM, resize="squash", crop_pct=224 / 256, crop_offset="floor",
                         mean=imagenet[0], std=imagenet[1]),
                    lambda im: pil_transformers(im, 256, 224, Image.BICUBIC, *imagenet)),
        "hf_clip": (dict(TIMM, crop_pct=1.0, crop_offset="floor", mean=clip[0], std=clip[1]),
                    lambda im: pil_transformers(im, 224, 224, Image.BICUBIC, *clip,
                                                shortest_edge=True)),
    }[case]
    pre = kr.ImagePreprocessor((224, 224), **recipe)
    for name, img in photographs().items():
        got, want = to_np(pre(img))[0], ref(img)
        assert got.shape == want.shape == (224, 224, 3), name
        steps = in_levels(got - want, recipe["std"])
        assert steps.max() <= 1.01, (name, steps.max())
        assert (steps > 0.5).mean() < 0.02, (name, (steps > 0.5).mean())
    # The recipe matters: our default (area, 256/224, [-1, 1]) is far off.
    default = to_np(kr.ImagePreprocessor((224, 224))(img))[0]
    assert in_levels(default - want, recipe["std"]).mean() > 2


def test_rounding_like_pil_matters():
    """Without PIL's rounding to uint8 after each pass, bicubic overshoot at
    sharp edges survives: many steps off in places (so the option is what
    makes the comparison above tight)."""
    img = photographs()["astronaut"]
    want = pil_timm(img, 224, 0.9, Image.BICUBIC, 0.5, 0.5)
    loose = to_np(kr.ImagePreprocessor(224, **dict(TIMM, round_uint8=False))(img))[0]
    assert in_levels(loose - want, 0.5).max() > 2


@pytest.mark.backend_independent
def test_pillow_resize_in_a_graph_is_pillows_resize():
    """`kr.preprocessing.pillow_resize`, the TensorFlow-op version of Pillow's
    resize (for graphs that cannot run Python: a SavedModel, tf.data
    service), in a tf.data map with a tensor size: Pillow's bicubic levels
    but for ~1 pixel in 10^4 a level off (float32 weights where Pillow's are
    fixed point); bilinear (TensorFlow's own resize) is 1-2 levels off."""
    import tensorflow as tf
    from skimage import data

    for image, (h, w) in ((data.astronaut()[40:340, 60:300], (112, 96)),
                          (data.coffee(), (150, 200))):
        theirs = np.asarray(Image.fromarray(image).resize((w, h), Image.BICUBIC), np.float32)
        ours = next(iter(tf.data.Dataset.from_tensors(image).map(
            lambda x, h=h, w=w: kr.preprocessing.pillow_resize(x, (tf.constant(h),
                                                                   tf.constant(w))))))
        d = np.abs(np.asarray(ours) - theirs)
        assert (d == 0).mean() > 0.999 and d.max() <= 1, (d == 0).mean()
        plain = np.asarray(tf.image.resize(image, (h, w), "bilinear"))
        assert np.abs(plain - theirs).mean() > 0.2


def test_pillow_pass_order_and_rounding():
    """Pillow 13 resamples vertically first when the height shrinks by more
    pixels than twice the width does, and rounds halves up: a tall, narrow
    photograph squashed (timm `crop_mode="squash"`, bicubic) and an exact 2x
    bilinear reduction (shortest edge 256 from 512, crop 224: ties
    everywhere) equal Pillow within one step on < 2 % of values, on the
    backend's path and TensorFlow's; Pillow 12's order and half-to-even
    rounding do not."""
    import tensorflow as tf

    narrow = varied_photographs()["narrow"]  # 512 x 150 -> 256 x 256
    squash = dict(TIMM, resize="squash", crop_pct=0.875)
    halving = dict(TIMM, crop_pct=224 / 256, interpolation="bilinear", crop_offset="floor")
    cases = [(squash, narrow, pil_timm(narrow, 224, 0.875, Image.BICUBIC, 0.5, 0.5, squash=True)),
             (halving, photographs()["astronaut"],
              pil_transformers(photographs()["astronaut"], 256, 224, Image.BILINEAR, 0.5, 0.5,
                               shortest_edge=True))]

    def both_paths(recipe, img):
        recipe = P.check_preprocessing(recipe)
        graph = tf.function(lambda x: P.tf_preprocess(x, (224, 224), recipe))
        return to_np(keras_ops_generic(img[None], (224, 224), recipe))[0], graph(tf.constant(img)).numpy()

    for recipe, img, want in cases:
        for got in both_paths(recipe, img):
            steps = in_levels(got - want, 0.5)
            assert steps.max() <= 1.01 and (steps > 0.5).mean() < 0.02, (
                steps.max(), (steps > 0.5).mean())
    # The controls: Pillow 12's pass order on the narrow photograph ...
    recipe, img, want = cases[0]
    for got in both_paths(dict(recipe, pass_order="horizontal"), img):
        steps = in_levels(got - want, 0.5)
        assert steps.max() > 2 and (steps > 0.5).mean() > 0.05, (steps.max(), (steps > 0.5).mean())
    # ... and rounding half to even on the exact halving.
    recipe, img, want = cases[1]
    from keras_reluvit.preprocessing import pillow

    half_up = pillow.round_half_up
    try:
        pillow.round_half_up = lambda x, ops: ops.clip(ops.round(x), 0.0, 255.0)
        got = to_np(keras_ops_generic(img[None], (224, 224), P.check_preprocessing(recipe)))[0]
    finally:
        pillow.round_half_up = half_up
    assert (in_levels(got - want, 0.5) > 0.5).mean() > 0.05


@pytest.mark.parametrize("name", ["nearest", "box", "hamming", "lanczos"])
def test_pillows_other_filters(name):
    """timm's `interpolation` / transformers' `resample` names for Pillow's
    nearest, box, hamming and lanczos filters: a portrait photograph through
    timm's centre-crop recipe equals Pillow (the backend's path and
    TensorFlow's: <= 1 step on < 0.5 % of values), bicubic does not."""
    import tensorflow as tf

    img = varied_photographs()["portrait"]
    resample = getattr(Image, name.upper())
    want = pil_timm(img, 224, 0.9, resample, 0.5, 0.5)
    recipe = P.check_preprocessing(dict(TIMM, interpolation=name))
    graph = tf.function(lambda x: P.tf_preprocess(x, (224, 224), recipe))
    for got in (to_np(keras_ops_generic(img[None], (224, 224), recipe))[0],
                graph(tf.constant(img)).numpy()):
        steps = in_levels(got - want, 0.5)
        assert steps.max() <= 1.01 and (steps > 0.5).mean() < 0.005, (
            steps.max(), (steps > 0.5).mean())
    bicubic = to_np(keras_ops_generic(img[None], (224, 224), P.check_preprocessing(TIMM)))[0]
    assert (in_levels(bicubic - want, 0.5) > 0.5).mean() > 0.1


def pil_timm_border(img, size, crop_pct, resample, mean, std):
    """timm's `crop_mode="border"` on a PIL image: ResizeKeepRatio(longest=1)
    to `floor(size / crop_pct)`, then CenterCropOrPad(size) with the fill
    `round(255 mean)`, written out from timm's transforms."""
    im = Image.fromarray(img)
    s = math.floor(size / crop_pct)
    w, h = im.size
    ratio = max(h / s, w / s)
    nh, nw = round(h / ratio), round(w / ratio)
    a = np.asarray(im.resize((nw, nh), resample)).astype("float64")
    fill = [round(255 * m) for m in np.broadcast_to(mean, (3,))]
    ph, pw = max(size - nh, 0), max(size - nw, 0)
    padded = np.empty((nh + ph, nw + pw, 3))
    padded[...] = fill
    padded[ph // 2:ph // 2 + nh, pw // 2:pw // 2 + nw] = a
    top, left = int(round((padded.shape[0] - size) / 2)), int(round((padded.shape[1] - size) / 2))
    a = padded[top:top + size, left:left + size] / 255.0
    return ((a - mean) / std).astype("float32")


def test_timm_border_crop_mode():
    """timm's `crop_mode="border"`: the longer side fits, the shorter is
    padded with the mean colour -- a portrait and a wide photograph equal
    timm's transform on PIL (<= 1 step on < 2 %) on both paths; centre
    cropping them instead would cut the image."""
    import tensorflow as tf

    imagenet = (np.asarray(P.IMAGENET_MEAN), np.asarray(P.IMAGENET_STD))
    recipe = P.check_preprocessing(dict(TIMM, resize="border", mean=P.IMAGENET_MEAN,
                                        std=P.IMAGENET_STD))
    graph = tf.function(lambda x: P.tf_preprocess(x, (224, 224), recipe))
    for img in (varied_photographs()["portrait"], photographs()["rocket"]):
        want = pil_timm_border(img, 224, 0.9, Image.BICUBIC, *imagenet)
        for got in (to_np(keras_ops_generic(img[None], (224, 224), recipe))[0],
                    graph(tf.constant(img)).numpy()):
            steps = in_levels(got - want, imagenet[1])
            assert steps.max() <= 1.01 and (steps > 0.5).mean() < 0.02, (
                steps.max(), (steps > 0.5).mean())
        centre = to_np(keras_ops_generic(img[None], (224, 224), dict(recipe, resize="shorter")))[0]
        assert (in_levels(centre - want, imagenet[1]) > 2).mean() > 0.2


def test_keras_hub_bicubic_converter_keeps_its_overshoot(tmp_path):
    """keras-hub's own `ViTImageConverter(interpolation="bicubic")`, saved as
    a preset saves it and read back: our preprocessor equals the converter
    (its values beyond [0, 255] kept); clipping them would be off by many
    steps at sharp edges."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_reluvit.checkpoints import keras_hub as reader

    conv = keras_hub.layers.ViTImageConverter(image_size=(224, 224), scale=1 / 127.5,
                                              offset=-1.0, interpolation="bicubic")
    (tmp_path / "image_converter.json").write_text(
        json.dumps(keras.saving.serialize_keras_object(conv)))
    recipe = reader.preprocessing_from_converter(str(tmp_path))
    assert recipe["clip"] is False
    img = photographs()["astronaut"]
    want = to_np(conv(img[None].astype("float32")))[0]
    assert want.min() < -1.02 and want.max() > 1.02  # overshoot beyond 0 and 255
    got = to_np(kr.ImagePreprocessor(224, **recipe)(img))[0]
    assert in_levels(got - want, 0.5).max() < 0.05
    clipped = to_np(kr.ImagePreprocessor(224, **dict(recipe, clip=True))(img))[0]
    assert in_levels(clipped - want, 0.5).max() > 5


def test_do_rescale_false_takes_unit_floats(tmp_path):
    """transformers' `do_rescale=False`: its processor is handed images
    already in [0, 1]. The recipe read from it takes [0, 1] floats
    (`input_scale=1`): the model inputs of the uint8 pixels they came from,
    within one level of transformers' PIL pipeline on those pixels (which
    rounds the resize to uint8; the default backend does not, next test);
    uint8 stays 0-255; floats above 1 are refused by name."""
    from keras_reluvit.checkpoints import hf

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(dict(
        size={"height": 224, "width": 224}, resample=2, do_rescale=False,
        image_mean=[0.5] * 3, image_std=[0.5] * 3)))
    recipe = hf.preprocessing_from_processor(str(tmp_path), "vit")
    assert recipe["input_scale"] == 1.0 and recipe["mean"] == (0.5,) * 3
    pre = kr.ImagePreprocessor(224, **recipe)
    img = photographs()["coffee"]
    want = pil_transformers(img, 224, None, Image.BILINEAR, 0.5, 0.5)
    for given in (img.astype("float32") / 255.0, img):
        steps = in_levels(to_np(pre(given))[0] - want, 0.5)
        assert steps.max() <= 1.01
    with pytest.raises(ValueError, match=r"takes float images in \[0, 1\].*up to 255"):
        pre(img.astype("float32"))
    # The control: read as 0-255 pixels, [0, 1] floats are nearly black.
    loose = kr.ImagePreprocessor(224, **dict(recipe, input_scale=255))
    assert in_levels(to_np(loose(img.astype("float32") / 255.0))[0] - want, 0.5).mean() > 50


def test_do_rescale_false_resizes_floats_as_transformers_default_backend(tmp_path):
    """A `do_rescale=False` processor is handed [0, 1] floats, which
    transformers' default backend (torchvision's) resizes as floats: torch's
    antialiased interpolation, no uint8 rounding, no clipping of bicubic's
    overshoot. The recipe read from it gives the same model inputs, within
    0.05 levels, on photographs, for a squash (ViT's processor, bilinear)
    and a shortest edge + crop (CLIP's, bicubic); rounded and clipped (the
    PIL backend's way) it would differ by up to ~15 levels."""
    from keras_reluvit.checkpoints import hf
    from tests.conftest import run_hf_reference

    clip_mean, clip_std = [0.4815, 0.4578, 0.4082], [0.2686, 0.2613, 0.2758]
    configs = {
        "vit": (dict(size={"height": 224, "width": 224}, resample=2, do_rescale=False,
                     image_mean=[0.5] * 3, image_std=[0.5] * 3), (224, 0, 0, 0)),
        "clip": (dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
                      do_center_crop=True, resample=3, do_rescale=False, image_mean=clip_mean,
                      image_std=clip_std), (224, 224, 1, 1)),
    }
    images = {name: img.astype("float32") / 255 for name, img in photographs().items()}
    images["rocket_odd"] = images["rocket"][:427, :641]  # an odd crop offset: (336 - 224) / 2
    given = {}
    for family, (config, spec) in configs.items():
        mean, std = config["image_mean"], config["image_std"]
        for name, img in images.items():
            given[f"image/{family}-{name}"] = img
            given[f"spec/{family}-{name}"] = np.array([*spec, *mean, *std], "float64")
    np.savez(tmp_path / "in.npz", **given)
    run_hf_reference("float-resize", str(tmp_path / "in.npz"), str(tmp_path / "out.npz"))
    want = np.load(tmp_path / "out.npz")
    worst = {}
    for family, (config, _) in configs.items():
        (tmp_path / family).mkdir()
        (tmp_path / family / "preprocessor_config.json").write_text(json.dumps(config))
        recipe = hf.preprocessing_from_processor(str(tmp_path / family), "clip" if family ==
                                                 "clip" else "vit")
        assert not recipe["round_uint8"] and not recipe["clip"]
        for rounded in (False, True):
            r = dict(recipe, round_uint8=rounded, clip=rounded)
            pre = kr.ImagePreprocessor(224, **r)
            for name, img in images.items():
                steps = in_levels(to_np(pre(img))[0] - want[f"pixels/{family}-{name}"],
                                  config["image_std"])
                worst[family, rounded] = max(worst.get((family, rounded), 0), steps.max())
    assert worst["vit", False] < 0.05 and worst["clip", False] < 0.05, worst
    assert worst["clip", True] > 5, worst  # the control: the PIL backend's rounding and clip


@pytest.mark.parametrize("recipe", [
    TIMM, dict(TIMM, resize="squash", crop_offset="floor"),
    dict(TIMM, interpolation="bilinear", round_uint8=False, crop_pct=1.0),
    {},  # ours: area
    dict(resize="crop_resize", crop_pct=1.0, interpolation="bilinear", antialias=False),
])
def test_tensorflow_graph_path_equals_the_keras_ops_path(recipe):
    """SavedModels and tf.data run the recipe in TensorFlow ops on dynamic
    shapes; the backend's `keras.ops` path computes the same (one uint8
    step where rounding ties fall differently)."""
    import tensorflow as tf

    recipe = P.check_preprocessing(recipe)
    for img in photographs().values():
        for size in ((224, 224), (96, 64)):
            generic = to_np(keras_ops_generic(img[None], size, recipe))
            graph = tf.function(lambda x: P.tf_preprocess(x, size, recipe),
                                input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)])
            in_graph = graph(tf.constant(img)).numpy()[None]
            steps = in_levels(generic - in_graph, recipe["std"])
            limit = 1.01 if recipe["round_uint8"] else 0.01
            assert steps.max() <= limit, (size, steps.max())


def test_crop_resize_is_keras_resizing_with_crop_to_aspect_ratio():
    """keras-hub's ImageConverter: Keras' Resizing(crop_to_aspect_ratio=True),
    then x * scale + offset."""
    recipe = dict(resize="crop_resize", crop_pct=1.0, interpolation="bilinear",
                  antialias=False, mean=(0.5,) * 3, std=(0.5,) * 3)
    for img in photographs().values():
        for size in ((224, 224), (64, 96)):
            want = keras.layers.Resizing(*size, crop_to_aspect_ratio=True,
                                         interpolation="bilinear")(img[None].astype("float32"))
            want = to_np(want) / 127.5 - 1.0
            got = to_np(kr.ImagePreprocessor(size, **recipe)(img))
            np.testing.assert_allclose(got, want, atol=1e-4)


def test_area_is_tensorflows_area_resize():
    """Ours and big_vision's: resize_small(256) (both sides rounded) with
    TensorFlow's area method, then the central crop ((H - h) // 2), [-1, 1]."""
    import tensorflow as tf

    for img in photographs().values():
        h, w = img.shape[:2]
        s = 256
        nh, nw = round(s * h / min(h, w)), round(s * w / min(h, w))
        small = tf.image.resize(tf.cast(img, tf.float32), (nh, nw), method="area").numpy()
        top, left = (nh - 224) // 2, (nw - 224) // 2
        want = small[top:top + 224, left:left + 224] / 127.5 - 1.0
        got = to_np(kr.ImagePreprocessor(224)(img))[0]
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_inputs_of_any_form():
    pre = kr.ImagePreprocessor(32, interpolation="bicubic")
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, s, dtype="uint8") for s in ((40, 50, 3), (70, 33, 3)))
    one, batch, mixed = pre(a), pre(np.stack([a, a])), pre([a, b])
    assert tuple(one.shape) == (1, 32, 32, 3) and tuple(mixed.shape) == (2, 32, 32, 3)
    np.testing.assert_allclose(to_np(batch)[1], to_np(one)[0], atol=1e-6)
    np.testing.assert_allclose(to_np(mixed)[1], to_np(pre(b))[0], atol=1e-6)
    np.testing.assert_allclose(to_np(pre(a.astype("float32"))), to_np(one), atol=1e-5)
    with pytest.raises(ValueError, match=r"images \[H, W, C\] or \[N, H, W, C\] of 1 \(grey\)"):
        pre(rng.integers(0, 256, (40, 50), dtype="uint8"))
    with pytest.raises(ValueError, match=r"4 \(RGBA\) channels, got shape \(1, 40, 50, 5\)"):
        pre(rng.integers(0, 256, (40, 50, 5), dtype="uint8"))
    # Grey (1 channel) is its value in R, G and B; grey + alpha (2) follows the
    # recipe's alpha rule as RGBA does.
    grey = rng.integers(0, 256, (40, 50, 1), dtype="uint8")
    np.testing.assert_array_equal(to_np(pre(grey)), to_np(pre(np.repeat(grey, 3, -1))))
    la = rng.integers(0, 256, (40, 50, 2), dtype="uint8")
    rgba = np.concatenate([np.repeat(la[..., :1], 3, -1), la[..., 1:]], -1)
    white = kr.ImagePreprocessor(32, interpolation="bicubic", alpha="white")
    np.testing.assert_array_equal(to_np(white(la)), to_np(white(rgba)))


@pytest.mark.parametrize("bad, message", [
    ({"resize": "stretch"}, "'resize' must be one of"),
    ({"interpolation": "lanczos3"}, "'interpolation' must be one of"),
    ({"crop_pct": 1.2}, r"'crop_pct' must be in \(0, 1\]"),
    ({"crop_pct": "x"}, r"'crop_pct' must be in \(0, 1\]"),
    ({"mean": (0.5, 0.5)}, "'mean' must be one number or three"),
    ({"std": 0.0}, "'std' must be positive"),
    ({"antialias": "yes"}, "'antialias' must be True or False"),
    ({"scale": 2}, r"Unknown preprocessing key\(s\) \['scale'\]"),
    ({"resize": "crop_resize", "crop_pct": 0.9}, "takes crop_pct=1"),
    ({"pass_order": "vertical"}, "'pass_order' must be one of"),
    ({"alpha": "black"}, "'alpha' must be one of"),
    ({"clip": 1}, "'clip' must be True or False"),
    ({"input_scale": 100}, "'input_scale' must be 255"),
    ({"input_scale": True}, "'input_scale' must be 255"),
])
def test_bad_recipes_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        P.check_preprocessing(bad)
    with pytest.raises(ValueError, match=message):
        kr.ViT("Ti/16", depth=1, image_size=32, preprocessing=bad)


def test_recipe_and_labels_travel_with_the_model(tmp_path):
    recipe = dict(TIMM, mean=P.IMAGENET_MEAN, std=P.IMAGENET_STD)
    model = kr.ViT("Ti/16", depth=1, width=32, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=3, preprocessing=recipe, label_names=["cat", "dog", "eel"])
    model.save(tmp_path / "m.keras")
    back = keras.saving.load_model(tmp_path / "m.keras")
    assert back.preprocessing == P.check_preprocessing(recipe)
    assert back.label_names == ["cat", "dog", "eel"]
    model.save_to_preset(tmp_path / "preset")
    preset = kr.ViT.from_preset(tmp_path / "preset")
    assert preset.preprocessing == model.preprocessing and preset.label_names == model.label_names
    assert kr.ViT.from_preset(tmp_path / "preset", num_classes=4).label_names is None
    config = json.loads((tmp_path / "preset" / "config.json").read_text())
    config["config"]["preprocessing"]["crop_mode"] = "center"
    (tmp_path / "preset" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"preset/config.json: Unknown preprocessing "
                                              r"key\(s\) \['crop_mode'\]"):
        kr.ViT.from_preset(tmp_path / "preset")
    # A head of another size cannot take the names.
    with pytest.raises(ValueError, match="2 `label_names` for num_classes=3"):
        kr.ViT("Ti/16", depth=1, image_size=32, num_classes=3, label_names=["a", "b"])
    with pytest.raises(ValueError, match="this ViT has no head"):
        kr.ViT("Ti/16", depth=1, image_size=32, include_top=False, label_names=["a"])


def test_decode_predictions_and_imagenet_names():
    names = kr.imagenet1k_labels()
    assert len(names) == 1000 and len(set(names)) == 999  # WordNet's two "crane"s
    assert names[0] == "tench, Tinca tinca" and names[999].startswith("toilet tissue")
    probs = np.zeros((2, 1000))
    probs[0, [1, 207, 3]] = [0.5, 0.3, 0.2]
    probs[1, 999] = 1.0
    top = kr.decode_predictions(probs, label_names=names, top=3)
    assert [n for n, _ in top[0]] == [names[1], names[207], names[3]]
    assert top[0][0][1] == 0.5 and top[1][0] == (names[999], 1.0)
    assert kr.decode_predictions(probs[:, :4], top=1)[0] == [("class_1", 0.5)]
    with pytest.raises(ValueError, match="3 label names for 1000 classes"):
        kr.decode_predictions(probs, label_names=["a", "b", "c"])


# ------------------------------------------------- readers fill the recipe
def timm_hub(tmp_path, architecture, pretrained_cfg, sd=None, **extra):
    hub = tmp_path / architecture
    hub.mkdir(parents=True)
    save_safetensors(sd or timm_state_dict(np.random.default_rng(1)), hub / "model.safetensors")
    (hub / "config.json").write_text(json.dumps(dict(
        architecture=architecture, num_classes=5, pretrained_cfg=pretrained_cfg, **extra)))
    return hub


def test_timm_hub_directories_carry_their_pretrained_cfg(tmp_path):
    """AugReg-style (crop_pct 0.9, 0.5/0.5) and DeiT (a deit_* name, ImageNet
    mean/std): the recipe, and class names from label_names /
    label_descriptions."""
    cfg = dict(input_size=[3, 32, 32], interpolation="bicubic", crop_pct=0.9,
               crop_mode="center", mean=[0.5] * 3, std=[0.5] * 3)
    names = [f"n0{i}" for i in range(5)]
    augreg = kr.ViT.from_preset(timm_hub(tmp_path, "vit_small_patch16_224", cfg,
                                         label_names=names,
                                         label_descriptions={"n01": "goldfish"}), num_heads=2)
    assert augreg.preprocessing == P.check_preprocessing(TIMM)
    assert augreg.label_names == ["n00", "goldfish", "n02", "n03", "n04"]
    deit_cfg = dict(cfg, crop_pct=0.875, mean=list(P.IMAGENET_MEAN), std=list(P.IMAGENET_STD))
    deit = kr.ViT.from_preset(timm_hub(tmp_path, "deit_small_patch16_224", deit_cfg),
                              num_heads=2)
    assert deit.preprocessing["mean"] == P.IMAGENET_MEAN and deit.preprocessing["crop_pct"] == 0.875
    assert deit.label_names is None  # 5 classes, no names given
    lanczos = kr.ViT.from_preset(timm_hub(tmp_path / "lanczos", "vit_small_patch16_224",
                                          dict(cfg, interpolation="lanczos")), num_heads=2)
    assert lanczos.preprocessing["interpolation"] == "lanczos"  # Pillow's, as timm names it
    for name in ("deit3_base_patch16_224", "flexivit_small", "vit_base_patch16_siglip_224"):
        kr.ViT.from_preset(timm_hub(tmp_path, name, cfg), num_heads=2)


@pytest.mark.parametrize("name, what", [
    ("vit_relpos_base_patch16_224", "VisionTransformerRelPos"),
    ("deit_small_distilled_patch16_224", "VisionTransformerDistilled"),
    ("vit_base_r50_s16_224", "a hybrid CNN stem"),
    ("vit_base_patch16_rope_224", "Eva"),
    ("eva02_base_patch14_224", "keras_reluvit loads the architectures"),
    ("convnext_tiny", "keras_reluvit loads the architectures"),
])
def test_timm_architectures_built_by_other_classes_are_refused(tmp_path, name, what):
    with pytest.raises(CheckpointError, match=what):
        kr.ViT.from_preset(timm_hub(tmp_path, name, {}))


@pytest.mark.parametrize("field, value, message", [
    ("interpolation", "random", "pretrained_cfg.interpolation 'random'"),
    ("crop_mode", "letterbox", "pretrained_cfg.crop_mode 'letterbox'"),
    ("mean", [0.5, "x", 0.5], "pretrained_cfg.mean"),
    ("crop_pct", 1.5, "pretrained_cfg.crop_pct"),
])
def test_malformed_timm_preprocessing_names_file_and_field(tmp_path, field, value, message):
    hub = timm_hub(tmp_path, "vit_small_patch16_224", {field: value})
    with pytest.raises(CheckpointError, match=f"config.json: {message}"):
        kr.ViT.from_preset(hub, num_heads=2)


def test_bare_timm_state_dicts_take_timm_defaults_or_the_named_family(tmp_path):
    path = save_safetensors(timm_state_dict(np.random.default_rng(2), classes=1000),
                            tmp_path / "w.safetensors")
    plain = kr.load_checkpoint(path, num_heads=2)
    assert plain.preprocessing == P.check_preprocessing(TIMM)  # VisionTransformer's _cfg
    assert plain.label_names == kr.imagenet1k_labels()  # a 1000-class head: ImageNet-1k
    deit = kr.load_checkpoint(path, num_heads=2, architecture="deit_small_patch16_224.fb_in1k")
    assert deit.preprocessing["mean"] == P.IMAGENET_MEAN
    with pytest.raises(CheckpointError, match="VisionTransformerDistilled"):
        kr.load_checkpoint(path, architecture="deit_small_distilled_patch16_224")
    plain.save(tmp_path / "m.keras")
    with pytest.raises(CheckpointError, match="names the timm model of a bare state dict"):
        kr.load_checkpoint(tmp_path / "m.keras", architecture="vit_small_patch16_224")


def keras_hub_converter(directory, **conv):
    (directory / "image_converter.json").write_text(json.dumps(
        {"module": "keras_hub.src.models.vit.vit_image_converter",
         "class_name": "ViTImageConverter", "config": conv}))


def test_keras_hub_and_big_vision_recipes(tmp_path):
    from keras_reluvit.checkpoints import keras_hub

    keras_hub_converter(tmp_path, image_size=[224, 224], scale=[1 / 127.5] * 3,
                        offset=[-1.0] * 3, interpolation="bilinear", antialias=False,
                        crop_to_aspect_ratio=True)
    r = keras_hub.preprocessing_from_converter(str(tmp_path))
    assert r["resize"] == "crop_resize" and r["interpolation"] == "bilinear"
    np.testing.assert_allclose(r["mean"], 0.5)
    np.testing.assert_allclose(r["std"], 0.5)
    keras_hub_converter(tmp_path, scale=1 / 255.0, offset=None, interpolation="nearest")
    with pytest.raises(CheckpointError, match="image_converter.json: interpolation 'nearest'"):
        keras_hub.preprocessing_from_converter(str(tmp_path))
    # big_vision / AugReg .npz: big_vision's evaluation (our default) and, for a
    # 1000-class head, the ImageNet-1k names.
    model = kr.ViT("Ti/16", depth=1, width=32, num_heads=2, mlp_dim=64, image_size=32,
                   num_classes=1000, preprocessing=TIMM, attention="softmax")
    kr.export.big_vision_npz(model, tmp_path / "bv.npz")
    bv = kr.load_checkpoint(tmp_path / "bv.npz")
    assert bv.preprocessing == P.check_preprocessing(None) != model.preprocessing
    assert bv.label_names == kr.imagenet1k_labels()


def test_transformers_preprocessor_configs(tmp_path):
    """`preprocessor_config.json` fields, including the legacy int sizes and
    a rescale factor other than 1/255; malformed ones name file and field."""
    from keras_reluvit.checkpoints import hf

    def recipe(family, **pc):
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(pc))
        return hf.preprocessing_from_processor(str(tmp_path), family)

    vit = recipe("vit", size=224, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    assert (vit["resize"], vit["crop_pct"], vit["interpolation"]) == ("squash", 1.0, "bilinear")
    clip = recipe("clip", size={"shortest_edge": 256}, crop_size=224, do_center_crop=True)
    assert (clip["resize"], clip["crop_pct"]) == ("shorter", 224 / 256)
    assert clip["mean"] == P.OPENAI_CLIP_MEAN  # transformers' CLIP default
    for resample, name in ((0, "nearest"), (1, "lanczos"), (4, "box"), (5, "hamming")):
        assert recipe("vit", resample=resample)["interpolation"] == name  # PIL's enums
    scaled = recipe("vit", rescale_factor=1 / 127.5, image_mean=[1.0] * 3, image_std=[1.0] * 3)
    np.testing.assert_allclose(scaled["mean"], 0.5)
    np.testing.assert_allclose(scaled["std"], 0.5)
    for bad, message in [(dict(resample=7), "resample 7"),
                         (dict(size={"longest_edge": 3}), "size {'longest_edge': 3}"),
                         (dict(size={"shortest_edge": 224}, do_center_crop=False),
                          "size is a shortest_edge without do_center_crop"),
                         (dict(image_mean="x"), "image_mean")]:
        with pytest.raises(CheckpointError, match="preprocessor_config.json: .*" + message):
            recipe("vit", **bad)


# ---------------------------------------- against transformers on photographs
@pytest.fixture(scope="module")
def hf_photos(tmp_path_factory):
    """transformers' processors and models on JPEG photographs of every
    shape, and (for the processors that convert to RGB) a grayscale JPEG
    and an RGBA PNG."""
    tmp = tmp_path_factory.mktemp("hf_photos")
    jpegs = jpeg_files(tmp, {**photographs(), **varied_photographs()})
    gray = tmp / "gray.jpg"
    Image.fromarray(photographs()["coffee"].mean(-1).astype("uint8"), "L").save(gray, quality=90)
    rgba = tmp / "rgba.png"
    Image.fromarray(rgba_photograph(), "RGBA").save(rgba)
    converted = [str(gray), str(rgba)]
    run_hf_reference("photos", str(tmp), *jpegs, "--convert-rgb", *converted)
    return tmp, {"": jpegs, "/convert_rgb": converted}, dict(np.load(tmp / "photos.npz"))


def check_pixels_and_probabilities(model, files, ref, key, preprocessor=None, close=True):
    """Each file through `preprocessor` (the model's) and the model against
    transformers' pixels and probabilities: within the resampler floor, or
    (`close=False`) the fraction of values off by more than 2 steps and the
    largest probability gap."""
    off, gap = [], 0.0
    for j, path in enumerate(files):
        x = to_np((preprocessor or model.preprocessor)(kr.load_image(path, alpha="keep")))
        steps = in_levels(x[0] - ref[f"{key}/{j}/pixels"], model.preprocessing["std"])
        probs = P.probabilities(model.predict(x, verbose=0))[0]
        if close:
            assert steps.max() <= 2.01 and (steps > 0.5).mean() < 0.01, (
                path, steps.max(), (steps > 0.5).mean())
            np.testing.assert_allclose(probs, ref[f"{key}/{j}"], atol=1e-3, err_msg=path)
        off.append((steps > 2.01).mean())
        gap = max(gap, np.abs(probs - ref[f"{key}/{j}"]).max())
    return np.mean(off), gap


@pytest.mark.full_only(
    "CLIP and DINOv2 through transformers' pipeline on every backend (~12 s each): their "
    "checkpoints equal transformers in test_hf_checkpoints; ViT and DeiT keep this test's "
    "preprocessing path.",
    ids=('clip', 'dinov2'))
@pytest.mark.parametrize("name", ["vit", "deit", "clip", "dinov2"])
def test_transformers_checkpoints_predict_like_transformers(hf_photos, name):
    """save_pretrained directories (model + image processor), loaded here,
    on JPEG photographs (landscape, square, portrait, tall and narrow, tiny):
    our preprocessor gives transformers' pixel values within one uint8 step
    (TF's accurate-DCT decode vs PIL's, PIL's fixed-point resampling), and
    the probabilities agree to 1e-3. The processors that convert to RGB
    (CLIP, DINOv2) likewise on a grayscale JPEG and an RGBA PNG composited
    onto white. DINOv2, configured at 518 px, is built at its processor's
    224 px (transformers resamples the position embedding at run time)."""
    tmp, files, ref = hf_photos
    model = kr.ViT.from_preset(tmp / name)
    assert model.image_size == (224, 224)
    check_pixels_and_probabilities(model, files[""], ref, name)
    if name in ("clip", "dinov2"):
        assert model.preprocessing["alpha"] == "white"
        check_pixels_and_probabilities(model, files["/convert_rgb"], ref, name + "/convert_rgb")
        # The control: timm's rule (drop the alpha channel) is far off.
        dropped = kr.ImagePreprocessor(224, **dict(model.preprocessing, alpha="drop"))
        x = to_np(dropped(kr.load_image(files["/convert_rgb"][1], alpha="keep")))[0]
        steps = in_levels(x - ref[f"{name}/convert_rgb/1/pixels"], model.preprocessing["std"])
        assert steps.max() > 100 and (steps > 2).mean() > 0.3
    # With the recipe dropped (our default one), the pixels are far from
    # transformers' and so are the probabilities.
    off, gap = check_pixels_and_probabilities(
        model, files[""], ref, name, kr.ImagePreprocessor(model.image_size), close=False)
    assert off > 0.5 and gap > 1e-2, (off, gap)


@pytest.mark.parametrize("recipe", [
    dict(resize="squash", crop_pct=224 / 256, interpolation="bicubic", mean=P.IMAGENET_MEAN,
         std=P.IMAGENET_STD),                                     # DeiT's processor
    dict(resize="shorter", crop_pct=1.0, interpolation="bicubic", mean=P.OPENAI_CLIP_MEAN,
         std=P.OPENAI_CLIP_STD),                                  # CLIP's
    dict(resize="squash", crop_pct=1.0, interpolation="bilinear"),  # ViT's
    dict(resize="squash", crop_pct=1.0, interpolation="lanczos", alpha="white",
         input_scale=1),                                          # PIL's lanczos, flags
])
def test_transformers_writer_round_trips_the_recipe(tmp_path, recipe):
    """`hf_state_dict` writes `preprocessor_config.json`; the reader gives the
    recipe back (transformers' own crop offsets and PIL rounding; floats,
    `do_rescale=False`, resized unrounded and unclipped, as its default
    backend does)."""
    from keras_reluvit.checkpoints import hf

    pixels = recipe.get("input_scale", 255) == 255
    want = P.check_preprocessing(dict(recipe, round_uint8=pixels, clip=pixels,
                                      crop_offset="floor", resize_rounding="floor"))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(hf.processor_config(want, 224)))
    family = {"CLIPImageProcessor": "clip"}.get(hf.processor_config(want, 224)[
        "image_processor_type"], "vit")
    back = hf.preprocessing_from_processor(str(tmp_path), family)
    assert back == want
    assert hf.processor_config(P.check_preprocessing(None), 224) is None  # area: no equivalent


# ------------------------------------------- kr.load_image and the alpha rule
def test_load_image_gives_the_preprocessor_what_its_alpha_rule_needs(tmp_path):
    """The README tour's `model.preprocessor(kr.load_image(path))` on a
    transparent PNG: a CLIP / DINOv2 recipe (`alpha="white"`) gets Pillow's
    composite onto white (transformers' `convert_to_rgb`), ours / timm's
    (`"drop"`) PIL's `convert("RGB")`; an opaque image stays `[H, W, 3]`.
    `kr.data.for_model` applies the same rule to RGBA batches."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (40, 52, 4)).astype("uint8")
    rgba[:20, :, 3] = 0  # the top half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "t.png")
    Image.fromarray(rgba[..., :3]).save(tmp_path / "o.jpg")
    loaded = kr.load_image(str(tmp_path / "t.png"))
    assert loaded.shape == (40, 52, 4) and kr.load_image(str(tmp_path / "o.jpg")).shape[-1] == 3
    photo = Image.open(tmp_path / "t.png")
    pil = {"white": np.asarray(Image.alpha_composite(Image.new("RGBA", photo.size, (255,) * 4),
                                                     photo).convert("RGB")),
           "drop": np.asarray(photo.convert("RGB"))}
    for rule, rgb in pil.items():
        model = kr.ViT("Ti/16", image_size=32, depth=1, num_classes=3,
                       preprocessing=dict(alpha=rule, interpolation="bicubic"))
        want = to_np(model.preprocessor(rgb))
        np.testing.assert_array_equal(to_np(model.preprocessor(loaded)), want, err_msg=rule)
        ds = tf.data.Dataset.from_tensor_slices((loaded[None], [1]))
        x = next(iter(kr.data.for_model(ds, model, batch_size=1)))[0].numpy()
        np.testing.assert_allclose(x, want, atol=1e-4, err_msg=rule)
    assert np.abs(to_np(model.preprocessor(pil["white"])) - want).max() > 0.1  # rules differ
