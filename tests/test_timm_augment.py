"""timm's automatic augmentations by name (`kr.data.timm_augment`,
`Augment(auto_augment=...)`): every operation against Pillow's (what timm
runs), the names parsed as timm parses them, and the draws' statistics."""

import importlib
import unittest.mock as mock

import numpy as np
import pytest
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps

from keras_reluvit import data as D
from keras_reluvit.data import pillow_calls as P
from keras_reluvit.data import pillow_graph as G
from keras_reluvit.data import timm_augment as A

pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def photo():
    """A photograph in 40-193: no operation leaves it as it is."""
    from skimage import data

    return (data.astronaut()[::4, ::4].astype(np.float32) * 0.6 + 40).round().astype(np.uint8)


def _diff(ours, reference):
    return np.abs(np.asarray(ours, np.float32) - np.asarray(reference, np.float32))


def test_point_operations_are_pillows(photo):
    import tensorflow as tf

    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    exact = [(P.equalize(x), ImageOps.equalize(pil)), (P.invert(x), ImageOps.invert(pil)),
             (G.solarize(x, 100.0), ImageOps.solarize(pil, 100)),
             (P.solarize_add(x, 50.0), pil.point([min(255, i + 50) if i < 128 else i
                                                  for i in range(256)] * 3))]
    exact += [(P.posterize(x, tf.constant(b)), ImageOps.posterize(pil, b)) for b in (1, 2, 4)]
    exact += [(P.auto_contrast(x), ImageOps.autocontrast(pil))]  # its table truncated
    for ours, theirs in exact:
        assert _diff(ours, theirs).max() == 0
    assert _diff(P.posterize(x, tf.constant(8)), photo).max() == 0
    # ImageEnhance: a blend that truncates, with Pillow's rounded gray (convert("L"),
    # Color), its rounded mean (Contrast), black, its rounded SMOOTH filter: the same
    # levels (Color was 1.3 levels off at M9 with an unrounded gray, none truncated).
    for factor in (0.3, 0.77, 1.0, 1.37, 1.7):
        for ours, theirs in ((G.color, ImageEnhance.Color), (G.contrast, ImageEnhance.Contrast),
                             (G.brightness, ImageEnhance.Brightness),
                             (P.sharpness, ImageEnhance.Sharpness)):
            d = _diff(ours(x, factor), theirs(pil).enhance(factor))
            assert d.max() == 0, (ours.__name__, factor, d.max(), d.mean())
    np.testing.assert_array_equal(G.grayscale(x), pil.convert("L").convert("RGB"))
    # Pillow's corners: a flat channel (autocontrast keeps it), a gray mean of exactly
    # x.5 (Contrast's int(mean + 0.5) rounds it up, not to even)
    flat = photo.copy()
    flat[..., 1] = 77
    np.testing.assert_array_equal(P.auto_contrast(tf.constant(flat, tf.float32)),
                                  ImageOps.autocontrast(Image.fromarray(flat)))
    half = np.array([[[100] * 3, [101] * 3]], np.uint8)  # gray mean 100.5
    for factor in (0.5, 1.5):
        np.testing.assert_array_equal(G.contrast(tf.constant(half, tf.float32), factor),
                                      ImageEnhance.Contrast(Image.fromarray(half))
                                      .enhance(factor))


def test_a_chain_of_operations_is_pillows_chain(photo):
    """Each operation writes Pillow's levels, so chains of them on a uint8 image
    equal Pillow's chains exactly (no drift between operations: without the
    rounding, ours came out 0.14-0.45 levels brighter on average); a float
    crop is first made levels as Pillow's resize writes them."""
    import tensorflow as tf

    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    chains = [
        (lambda t: G.contrast(G.color(t, 1.62), 0.55),
         lambda p: ImageEnhance.Contrast(ImageEnhance.Color(p).enhance(1.62)).enhance(0.55)),
        (lambda t: G.brightness(P.sharpness(P.auto_contrast(t), 1.9), 1.21),
         lambda p: ImageEnhance.Brightness(ImageEnhance.Sharpness(ImageOps.autocontrast(p))
                                           .enhance(1.9)).enhance(1.21)),
        (lambda t: G.solarize(G.color(P.equalize(t), 0.4), 120.0),
         lambda p: ImageOps.solarize(ImageEnhance.Color(ImageOps.equalize(p)).enhance(0.4), 120)),
    ]
    for ours, theirs in chains:
        assert _diff(ours(x), theirs(pil)).max() == 0
    crop = x + 0.5 - tf.random.stateless_uniform(x.shape, [1, 2])  # a resized crop's floats
    np.testing.assert_array_equal(G.pillow_levels(crop), np.floor(np.clip(crop, 0, 255) + 0.5))


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_geometric_operations_are_pillows_with_timms_fill(interpolation):
    """Pillow's own rotate and affine transform at both of its filters, in a
    tf.data map as the pipeline runs them: the same levels pixel for pixel
    at any argument, fractional shifts included (before, written in
    TensorFlow ops: 93 % of pixels at timm's TranslateXRel M10 on a 224 px
    image, -100.8 pixels; rotations but 1 pixel in 10^4)."""
    import tensorflow as tf
    from skimage import data

    photo = data.astronaut()[::2, ::2][:200, :224]  # not square: h and w not interchangeable
    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    w, h = pil.size
    kw = dict(resample={"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[interpolation],
              fillcolor=P.FILL)
    ops = {"rotate": (P.rotate, lambda v: pil.rotate(v, **kw)),
           "shear_x": (P.shear_x, lambda v: pil.transform(pil.size, Image.AFFINE,
                                                          (1, v, 0, 0, 1, 0), **kw)),
           "shear_y": (P.shear_y, lambda v: pil.transform(pil.size, Image.AFFINE,
                                                          (1, 0, 0, v, 1, 0), **kw)),
           "translate_x_rel": (P.translate_x_rel, lambda v: pil.transform(
               pil.size, Image.AFFINE, (1, 0, v * w, 0, 1, 0), **kw)),
           "translate_y_rel": (P.translate_y_rel, lambda v: pil.transform(
               pil.size, Image.AFFINE, (1, 0, 0, 0, 1, v * h), **kw))}
    rng = np.random.default_rng(5)
    cases = [("rotate", 27.0), ("rotate", -12.3), ("rotate", 90.0), ("shear_x", 0.27),
             ("shear_y", -0.2), ("translate_x_rel", -0.45), ("translate_y_rel", 0.3123)]
    cases += [("rotate", rng.uniform(-30, 30)) for _ in range(4)]
    cases += [(name, rng.uniform(-0.45, 0.45)) for name in list(ops)[1:] for _ in range(2)]
    names = tf.constant([list(ops).index(n) for n, _ in cases])
    values = tf.constant([v for _, v in cases], tf.float64)

    def apply(i, v):  # the argument in doubles, as timm computes it
        return tf.switch_case(i, [lambda f=f: f(x, v, interpolation=interpolation)
                                  for f, _ in ops.values()])

    ds = tf.data.Dataset.from_tensor_slices((names, values)).map(apply)
    for (name, v), ours in zip(cases, ds):
        d = _diff(ours, ops[name][1](v))
        assert d.max() == 0, (name, v, (d == 0).mean())
    # A Python float is taken in doubles too (not through float32: 0.3 -> 0.30000001)
    for name, v in (("shear_x", 0.3), ("translate_x_rel", 0.45), ("rotate", 20.3)):
        d = _diff(ops[name][0](x, v, interpolation=interpolation), ops[name][1](v))
        assert d.max() == 0, (name, v, (d == 0).mean())
    # the fill is timm's for DeiT: ImageNet's mean in 0-255
    corner = np.asarray(P.translate_x_rel(x, 0.4, interpolation=interpolation))[0, -1]
    np.testing.assert_allclose(corner, P.FILL, atol=1e-4)
    with pytest.raises(ValueError, match="interpolation must be one of"):
        P.shear_x(x, 0.1, interpolation="bicubik")


def test_auto_augments_whole_magnitudes_give_timms_geometry(photo):
    """timm computes the geometric arguments in doubles; so do we, so
    AutoAugment's fixed magnitudes give Pillow exactly timm's transform
    (ShearX at M5: 0.15; Rotate at M8: 24 degrees), bicubic as DeiT's."""
    import tensorflow as tf

    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    kw = dict(resample=Image.BICUBIC, fillcolor=P.FILL)
    m, s = tf.constant(5.0), tf.constant(1.0)
    ours = A.apply_op("ShearX", x, m, s, interpolation="bicubic")
    assert _diff(ours, pil.transform(pil.size, Image.AFFINE, (1, 5 / 10 * 0.3, 0, 0, 1, 0),
                                     **kw)).max() == 0
    ours = A.apply_op("TranslateYRel", x, tf.constant(9.0), -s, interpolation="bicubic")
    theirs = pil.transform(pil.size, Image.AFFINE, (1, 0, 0, 0, 1, -(9 / 10 * 0.45) * pil.size[1]),
                           **kw)
    assert _diff(ours, theirs).max() == 0


def test_names_are_parsed_as_timm_parses_them():
    fn, kw = A.parse("rand-m9-mstd0.5-inc1")
    assert fn is A.rand_augment
    assert kw == dict(magnitude=9.0, num_layers=2, mstd=0.5, mmax=None, increasing=True,
                      prob=0.5)
    assert A.parse("rand-m9-p0.8")[1]["prob"] == 0.8
    _, kw = A.parse("rand-n3-m7-mstd101")  # mstd > 100: uniform in [0, m]
    assert (kw["num_layers"], kw["magnitude"], kw["mstd"], kw["increasing"]) == (
        3, 7.0, float("inf"), False)
    assert A.parse("rand")[1]["magnitude"] == 10.0  # timm's default M10
    fn, kw = A.parse("augmix-m5-w4-d-1")
    assert fn is A.augmix and kw == dict(magnitude=5.0, width=4, depth=-1, alpha=1.0,
                                         mstd=float("inf"))
    assert A.parse("augmix-d2")[1]["depth"] == 2
    fn, kw = A.parse("original-mstd0.5")  # timm's auto_augment_transform
    assert fn is A.auto_augment and kw == dict(policy="original", mstd=0.5)
    assert A.parse("v0r")[1] == dict(policy="v0r", mstd=0.0)
    assert set(A.RAND_INCREASING_OPS) - set(A.RAND_OPS) == {
        "PosterizeIncreasing", "SolarizeIncreasing", "ColorIncreasing",
        "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"}
    for bad, match in (("rand-q9", "Unknown RandAugment section 'q9'"),
                       ("rand-m", "Unknown RandAugment section 'm'"),
                       ("v1", "AutoAugment's policies \\('original', 'v0', 'originalr'"),
                       ("v0-m9", "Unknown AutoAugment section 'm9'"),
                       ("original-mstdinf", "Unknown AutoAugment section 'mstdinf'"),
                       ("augmix-z1", "Unknown AugMix section 'z1'")):
        with pytest.raises(ValueError, match=match):
            A.parse(bad)


def _keys(n):
    import tensorflow as tf

    return [tf.constant([i, 3], tf.int64) for i in range(n)]


def test_magnitudes_are_drawn_as_timms():
    draws = np.array([float(A._draw_magnitude(9, 0.5, None, k)) for k in _keys(800)])
    assert abs(draws.mean() - 8.98) < 0.06 and abs(draws.std() - 0.49) < 0.05
    assert draws.max() <= 10.0  # clipped at timm's M10
    uniform = np.array([float(A._draw_magnitude(7, float("inf"), None, k)) for k in _keys(800)])
    assert uniform.min() >= 0 and uniform.max() <= 7
    assert abs(uniform.mean() - 3.5) < 0.2 and abs(uniform.std() - 7 / np.sqrt(12)) < 0.15


def test_rand_augment_applies_each_layer_with_probability_half(photo):
    """Two layers, each applied with probability 0.5: about a quarter of the
    images come out untouched (every operation changes this photograph)."""
    import tensorflow as tf

    x = tf.constant(photo, tf.float32)
    untouched = changed_pixels = 0
    keys = _keys(240)
    for key in keys:
        out = np.asarray(A.rand_augment(x, key, num_layers=2, magnitude=9, mstd=0.5,
                                        increasing=True))
        assert out.shape == photo.shape and out.min() >= 0 and out.max() <= 255
        same = np.array_equal(out, photo)
        untouched += same
        changed_pixels += not same
    assert 0.17 < untouched / len(keys) < 0.33, untouched  # 0.25, sd 0.028
    one = np.asarray(A.rand_augment(x, keys[0], num_layers=2, magnitude=9))
    np.testing.assert_array_equal(one, np.asarray(A.rand_augment(x, keys[0], num_layers=2,
                                                                 magnitude=9)))


def test_augmix_blends_the_image_with_its_mixed_chains(photo, monkeypatch):
    import tensorflow as tf

    x = tf.constant(photo, tf.float32)
    blended = []
    blend = G.blend
    monkeypatch.setattr(G, "blend", lambda d, image, f: blended.append(image) or blend(d, image, f))
    A.augmix(x, _keys(1)[0], magnitude=3, width=3)
    mix = np.asarray(blended[-1])  # timm: np.clip, then astype(uint8): truncated levels
    assert np.all(mix == np.floor(mix)) and 0 <= mix.min() and mix.max() <= 255
    monkeypatch.undo()
    outs = [np.asarray(A.augmix(x, k, magnitude=3, width=3)) for k in _keys(12)]
    for out in outs:
        assert out.min() >= 0 and out.max() <= 255
        assert 0 < _diff(out, photo).mean() < 60  # a blend: neither the image nor noise
        assert np.all(out == np.floor(out))  # timm: the mix as uint8, Image.blend's levels
    assert len({o.round(3).tobytes() for o in outs}) == 12


def test_the_pipeline_runs_timms_augmentation_by_name():
    import tensorflow as tf

    from keras_reluvit.data.pipeline import pipeline

    images = np.random.default_rng(0).integers(40, 200, (16, 24, 24, 3), dtype="uint8")
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(16) % 4})
    base = dict(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), flip=False)
    plain = [np.asarray(x) for x, _ in pipeline(ds, 4, 16, 8, True, D.Augment(**base), seed=2)]
    aug = D.Augment(**base, auto_augment="rand-m9-mstd0.5-inc1")
    timm = [np.asarray(x) for x, _ in pipeline(ds, 4, 16, 8, True, aug, seed=2)]
    changed = [not np.array_equal(a, b) for a, b in zip(np.concatenate(plain),
                                                        np.concatenate(timm))]
    assert 6 <= sum(changed) <= 16  # 3 in 4 expected
    # Pillow's operations run on levels: the resized crop is made levels first (as
    # Pillow's resize writes them), so every image is levels, changed or not; the
    # plain pipeline keeps the resize's fractions (normalised to [-1, 1] here).
    def fractions(batches):
        levels = (np.concatenate(batches).astype(np.float64) + 1.0) * 127.5
        return np.abs(levels - np.round(levels)).max()

    assert fractions(timm) < 1e-3 and fractions(plain) > 0.1
    with pytest.raises(ValueError, match="Unknown RandAugment section 'x9'"):
        pipeline(ds, 4, 16, 8, True, D.Augment(auto_augment="rand-x9"))
    with pytest.raises(ValueError, match="randaug .* and auto_augment .* both on"):
        pipeline(ds, 4, 16, 8, True, D.Augment(randaug=(2, 9), auto_augment="rand-m9"))


def _timms_op(name, pil, m, s):
    """timm 1.0.31's operation `name` at magnitude `m` and sign `s`
    (`auto_augment.py`: its level functions in Python floats, `_LEVEL_DENOM`
    10, then its Pillow call), written out here as the reference."""
    kw = dict(resample=Image.BILINEAR, fillcolor=P.FILL)
    lv = m / 10.0
    enhance, increasing = lv * 1.8 + 0.1, max(0.1, 1.0 + s * lv * 0.9)
    w, h = pil.size

    def posterize(bits):
        return pil if bits >= 8 else ImageOps.posterize(pil, bits)

    def affine(matrix):
        return pil.transform(pil.size, Image.AFFINE, matrix, **kw)

    ops = {
        "AutoContrast": lambda: ImageOps.autocontrast(pil),
        "Equalize": lambda: ImageOps.equalize(pil),
        "Invert": lambda: ImageOps.invert(pil),
        "Rotate": lambda: pil.rotate(s * lv * 30.0, **kw),
        "Posterize": lambda: posterize(int(lv * 4)),
        "PosterizeIncreasing": lambda: posterize(4 - int(lv * 4)),
        "PosterizeOriginal": lambda: posterize(int(lv * 4) + 4),
        "Solarize": lambda: ImageOps.solarize(pil, int(lv * 256)),
        "SolarizeIncreasing": lambda: ImageOps.solarize(pil, 256 - int(lv * 256)),
        "SolarizeAdd": lambda: pil.point([min(255, i + int(lv * 110)) if i < 128 else i
                                          for i in range(256)] * 3),
        "Color": lambda: ImageEnhance.Color(pil).enhance(enhance),
        "ColorIncreasing": lambda: ImageEnhance.Color(pil).enhance(increasing),
        "Contrast": lambda: ImageEnhance.Contrast(pil).enhance(enhance),
        "ContrastIncreasing": lambda: ImageEnhance.Contrast(pil).enhance(increasing),
        "Brightness": lambda: ImageEnhance.Brightness(pil).enhance(enhance),
        "BrightnessIncreasing": lambda: ImageEnhance.Brightness(pil).enhance(increasing),
        "Sharpness": lambda: ImageEnhance.Sharpness(pil).enhance(enhance),
        "SharpnessIncreasing": lambda: ImageEnhance.Sharpness(pil).enhance(increasing),
        "ShearX": lambda: affine((1, s * lv * 0.3, 0, 0, 1, 0)),
        "ShearY": lambda: affine((1, 0, 0, s * lv * 0.3, 1, 0)),
        "TranslateXRel": lambda: affine((1, 0, s * lv * 0.45 * w, 0, 1, 0)),
        "TranslateYRel": lambda: affine((1, 0, 0, 0, 1, s * lv * 0.45 * h)),
    }
    return ops[name]()


def test_every_operation_is_timms_at_its_magnitude_and_sign(photo):
    """Each of timm's operations (RandAugment's two sets, AutoAugment's
    PosterizeOriginal), by name through `apply_op`, at magnitudes 9, 5 and 2.5
    and both signs, equals timm's level function + Pillow call written out in
    `_timms_op`, pixel for pixel: the name -> function mapping (a ShearY sent
    to shear_x), each level function and the sign's direction are all
    checked. (Before, 12 operations at one magnitude each, within 0.7 levels
    on average.)"""
    import tensorflow as tf

    names = sorted(set(A.RAND_OPS + A.RAND_INCREASING_OPS + ("PosterizeOriginal",)))
    assert set(names) == set(A._OPS)  # every operation there is
    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    for name in names:
        for m in (9.0, 5.0, 2.5):
            for s in (1.0, -1.0):
                ours = A.apply_op(name, x, tf.constant(m), tf.constant(s))
                d = _diff(ours, _timms_op(name, pil, m, s))
                assert d.max() == 0, (name, m, s, (d == 0).mean(), d.max())


def _spy_run(monkeypatch, layers=2):
    """`run` (the one Pillow call a plan goes to) replaced by a spy whose
    output `[1, 1, 2 * layers]` holds the plan: per layer its Pillow kind + 1
    (0: not applied), then per layer its argument; so `rand_augment` /
    `auto_augment` run through a tf.data map as in the pipeline. Returns the
    list of the `(interpolation, first)` it was called with (at trace time)."""
    import tensorflow as tf

    calls = []

    def spy(image, kinds, arguments, applied, interpolation="bilinear", first=None):
        calls.append((interpolation, first))
        kinds, applied = tf.stack(kinds), tf.stack(applied)
        codes = tf.where(applied, tf.cast(kinds, tf.float32) + 1.0, 0.0)
        plan = tf.concat([codes, tf.cast(tf.stack(arguments), tf.float32)], 0)
        return tf.reshape(plan, [1, 1, 2 * layers])

    monkeypatch.setattr(A, "run", spy)
    return calls


def _plans(name, n, key=7, layers=2):
    """`by_name(name)` over n keys in a tf.data map with `run` spied
    (`_spy_run`): `(kinds + 1 or 0, arguments)`, each `[n, layers]`."""
    import tensorflow as tf

    ds = tf.data.Dataset.range(n).map(lambda i: A.by_name(
        tf.zeros([1, 1, 3]), name, tf.stack([i, tf.constant(key, tf.int64)]))[0, 0])
    out = np.array(list(ds.as_numpy_iterator()), np.float64)
    return out[:, :layers].astype(int), out[:, layers:]


def test_rand_augment_draws_each_operation_of_its_set_uniformly(monkeypatch):
    """Which operation each layer runs, read from the plan `run` gets (`_spy_run`):
    over about 3000 applied layers each of the set's 15 operations (15
    Pillow kinds) is drawn equally often (chi-square, 200 expected each), and
    the set is the one the name asks for: 'inc1' timm's increasing set
    (ColorIncreasing's factor on both sides of 1, with its sign), the default
    the plain one (Color's factor m / 10 * 1.8 + 0.1 > 1 at M9)."""
    from scipy import stats

    _spy_run(monkeypatch)
    codes, args = _plans("rand-m9-mstd0.5-inc1", 3000)
    applied = codes[codes > 0] - 1
    kinds = sorted(P.KINDS.index(A._OPS[n][0]) for n in A.RAND_INCREASING_OPS)
    assert len(set(kinds)) == 15 and set(applied) <= set(kinds)
    counts = np.bincount(applied, minlength=len(P.KINDS))[kinds]
    assert abs(len(applied) - 3000) < 4 * np.sqrt(1500), len(applied)
    assert stats.chisquare(counts).pvalue > 1e-3, counts
    color = args[codes == P.KINDS.index("color") + 1]
    assert (color < 1).any() and (color > 1).any()  # increasing: 1 +- m * 0.09
    m = np.abs(color - 1) / 0.09  # the magnitudes drawn: N(9, 0.5) clipped at 10
    assert abs(m.mean() - 8.98) < 0.12 and 0.38 < m.std() < 0.6, (m.mean(), m.std())
    codes, args = _plans("rand-m9-mstd0.5", 400)
    color = args[codes == P.KINDS.index("color") + 1]
    assert len(color) > 5 and (color > 1.4).all()  # plain: 8.9 / 10 * 1.8 + 0.1 ~ 1.7


def test_one_of_runs_the_operation_its_index_names(photo):
    """The switch the drawn index goes through: index i runs the set's i-th
    operation (at M7 each gives this photograph a different image)."""
    import tensorflow as tf

    x, m, s = tf.constant(photo[::2, ::2], tf.float32), tf.constant(7.0), tf.constant(-1.0)
    for ops in (A.RAND_OPS, A.RAND_INCREASING_OPS):
        outs = [np.asarray(A._one_of(ops, tf.constant(i), x, m, s)) for i in range(len(ops))]
        for name, out in zip(ops, outs):
            np.testing.assert_array_equal(out, np.asarray(A.apply_op(name, x, m, s)), err_msg=name)
        assert len({o.tobytes() for o in outs}) == len(ops)


def _augmix_draws(monkeypatch, n, depth=-1, width=3, alpha=1.0):
    """AugMix's draws, read back through spies: `_one_of` (the operation) adds
    1 to its chain's channel of row 1 at each applied step and sets row 0's
    to 1 (the chain is known from the order of the calls at trace time),
    `blend` returns the mixed chains and, in row 2, the blend factor. So, per
    image: row 0 holds each chain's Dirichlet weight w_c, row 1 w_c * depth_c.
    `augmix` itself runs, traced once in a tf.data map over n keys."""
    import tensorflow as tf

    calls = []
    steps = depth if depth > 0 else 3

    def spy(ops, index, image, magnitude, sign, interpolation="bilinear"):
        assert ops == A.AUGMIX_OPS
        chain, step = divmod(len(calls), steps)
        calls.append((chain, step))
        one = tf.one_hot(chain, 3)[None, None]
        first = 1.0 if step == 0 else 0.0
        return image + tf.concat([first * one, one], 0)

    def blend(degenerate, image, factor):
        return tf.concat([image, factor * tf.ones_like(image[:1])], 0)

    monkeypatch.setattr(A, "_one_of", spy)
    monkeypatch.setattr(G, "blend", blend)
    monkeypatch.setattr(A, "truncated_levels", lambda mixed: mixed)  # the weights, untruncated
    ds = tf.data.Dataset.range(n).map(lambda i: A.augmix(
        tf.zeros([2, 1, 3]), tf.stack([i, tf.constant(11, tf.int64)]), width=width,
        depth=depth, alpha=alpha))
    out = np.stack(list(ds.as_numpy_iterator()))[:, :, 0, :]  # [n, 3 rows, 3 channels]
    assert calls == [(c, s) for c in range(width) for s in range(steps)]  # traced once
    weights, depths, factors = out[:, 0, :width], out[:, 1, :width], out[:, 2, 0]
    return weights, depths / weights, factors


def test_augmix_mixes_chains_of_1_to_3_operations_with_dirichlet_weights(monkeypatch):
    """timm's `augmix-m3-w3-d-1`: 3 chains, each of depth uniform in {1, 2, 3}
    (`np.random.randint(1, 4)`), mixed with Dirichlet(1, 1, 1) weights (each
    marginally Beta(1, 2)), blended with the image by Beta(1, 1). Over 3000
    images: the depths by chi-square (3000 each expected), the weights and the
    blend factor by KS tests -- equal weights, a depth fixed at 1 or 3, or
    another alpha fail."""
    from scipy import stats

    weights, depths, factors = _augmix_draws(monkeypatch, 3000)
    np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-5)  # a convex mix
    d = np.rint(depths).astype(int)
    np.testing.assert_allclose(depths, d, atol=1e-3)
    counts = np.bincount(d.ravel(), minlength=4)
    assert counts[0] == 0 and counts.sum() == 9000
    assert stats.chisquare(counts[1:]).pvalue > 1e-3, counts
    # the chains draw their depths apart (not one depth for all three)
    assert np.mean((d[:, 0] == d[:, 1]) & (d[:, 1] == d[:, 2])) < 0.2  # 1/9
    for c in range(3):
        assert stats.kstest(weights[:, c], stats.beta(1, 2).cdf).pvalue > 1e-3, c
        assert stats.kstest(weights[:, c], stats.beta(2, 4).cdf).pvalue < 1e-6  # Dirichlet(2)
    assert stats.kstest(factors, stats.uniform.cdf).pvalue > 1e-3
    # a depth given is every chain's
    monkeypatch.undo()
    weights, depths, _ = _augmix_draws(monkeypatch, 200, depth=2)
    np.testing.assert_allclose(depths, 2.0, atol=1e-3)


def _timm_policies():
    """AutoAugment's tables as timm 1.0.31 writes them (requirements/keras-hub.txt
    installs it without its dependencies): read from its source, never
    imported (its torchvision is not installed)."""
    import ast
    import importlib.util
    import os

    spec = importlib.util.find_spec("timm")
    assert spec is not None, "timm's source is the reference: install requirements/keras-hub.txt"
    path = os.path.join(spec.submodule_search_locations[0], "data", "auto_augment.py")
    tree = ast.parse(open(path).read())
    out = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("auto_augment_policy_"):
            table = next(node.value for node in fn.body if isinstance(node, ast.Assign)
                         and node.targets[0].id == "policy")
            out[fn.name[len("auto_augment_policy_"):]] = ast.literal_eval(table)
    return out


def test_auto_augment_policies_are_timms_tables():
    """The four ImageNet policies timm's `--aa` names (timm's `3a` is DeiT III's
    3-Augment, `Augment(three_augment=True)`): every sub-policy's operations,
    probabilities and magnitudes, in order."""
    timm = _timm_policies()
    assert set(timm) - {"3a"} == set(A.AUTO_AUGMENT)
    for name, subs in A.AUTO_AUGMENT.items():
        assert len(subs) == 25 and subs == tuple(
            tuple((op, float(p), float(m)) for op, p, m in sub) for sub in timm[name]), name
    assert all(op in A._OPS for subs in A.AUTO_AUGMENT.values() for sub in subs
               for op, _, _ in sub)


@pytest.mark.parametrize("policy", ["original", "v0r"])
def test_auto_augment_runs_one_uniform_sub_policy_in_order_with_its_probabilities(
        monkeypatch, policy):
    """What each image gets, read from the plan `run` gets (`_spy_run`):
    each applied operation's Pillow kind and argument (its magnitude through
    timm's level function, either sign). Over 2000 images the sequences of
    applied operations follow timm's law: a sub-policy drawn uniformly, its
    first operation applied with its probability, then its second
    (chi-square against the exact distribution)."""
    from scipy import stats

    _spy_run(monkeypatch)
    n = 2000
    codes, args = _plans(policy, n, key=5)

    def op(name, m, s=1.0):  # what the plan holds for an operation
        return (P.KINDS.index(A._OPS[name][0]), round(abs(float(A.argument(name, m, s))), 4))

    seen = [tuple((c - 1, round(abs(a), 4)) for c, a in zip(cs, as_) if c > 0)
            for cs, as_ in zip(codes, args)]
    expected = {}
    for (o1, p1, m1), (o2, p2, m2) in A.AUTO_AUGMENT[policy]:
        c1, c2 = op(o1, m1), op(o2, m2)
        for outcome, p in (((), (1 - p1) * (1 - p2)), ((c1,), p1 * (1 - p2)),
                           ((c2,), (1 - p1) * p2), ((c1, c2), p1 * p2)):
            expected[outcome] = expected.get(outcome, 0.0) + p / 25 * n
    assert set(seen) <= {k for k, v in expected.items() if v > 0}, set(seen) - set(expected)
    keys = sorted((k for k, v in expected.items() if v > 0), key=lambda k: -expected[k])
    big = [k for k in keys if expected[k] >= 5]
    observed = [seen.count(k) for k in big] + [sum(seen.count(k) for k in keys[len(big):])]
    wanted = [expected[k] for k in big] + [sum(expected[k] for k in keys[len(big):])]
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    assert stats.chisquare(observed, wanted).pvalue > 1e-3, list(zip(big, observed, wanted))
    rotate = args[codes == P.KINDS.index("rotate") + 1]  # its sign drawn per image
    assert (rotate > 0).sum() > 5 and (rotate < 0).sum() > 5, rotate


def test_auto_augments_mstd_draws_each_operations_magnitude(monkeypatch):
    """`original-mstd0.5`: each operation's magnitude is its table's plus
    N(0, 0.5) noise drawn per operation (timm's `magnitude_std`; no 'above
    100: uniform' in AutoAugment), read back from the arguments `run` gets
    (Rotate's |m / 10 * 30|, Color's m / 10 * 1.8 + 0.1); without mstd it is
    the table's exactly (KS test on 1,500 images, two operations each)."""
    from scipy import stats

    _spy_run(monkeypatch)
    sure = {"original": ((("Rotate", 1.0, 5.0), ("Color", 1.0, 7.0)),)}
    with mock.patch.dict(A.AUTO_AUGMENT, sure):
        for name, std in (("original-mstd0.5", 0.5), ("original", 0.0)):
            _, args = _plans(name, 1500, key=3)
            m = np.stack([np.abs(args[:, 0]) / 3.0, (args[:, 1] - 0.1) / 0.18], 1)
            if std == 0:
                np.testing.assert_allclose(m, np.broadcast_to([5.0, 7.0], m.shape), atol=1e-5)
                continue
            for column, mean in ((0, 5.0), (1, 7.0)):
                assert stats.kstest(m[:, column], "norm", (mean, std)).pvalue > 1e-3
            assert abs(np.corrcoef(m[:, 0], m[:, 1])[0, 1]) < 0.1  # drawn apart


def test_auto_augment_runs_timms_operations_through_the_pipeline(photo):
    """Sub-policies' operations as timm runs them: with every probability
    1, each image of a tf.data map gets one sub-policy of 'original' (25),
    its two operations in order at their magnitudes, each with its own random
    sign, equal pixel for pixel to timm's chain (`_timms_op`) for that
    sub-policy and those signs; over 400 images every sub-policy is drawn
    and each signed operation shows both of its directions."""
    import tensorflow as tf

    pil, x = Image.fromarray(photo), tf.constant(photo, tf.float32)
    subs = A.AUTO_AUGMENT["original"]
    chains = {}  # timm's output -> the (sub-policy, its signs) giving it
    for i, ((o1, _, m1), (o2, _, m2)) in enumerate(subs):
        for s1 in (1.0, -1.0):
            for s2 in (1.0, -1.0):
                out = _timms_op(o2, _timms_op(o1, pil, m1, s1), m2, s2)
                chains.setdefault(np.asarray(out, np.float32).tobytes(), set()).add((i, s1, s2))
    sure = {"t": tuple(tuple((op, 1.0, m) for op, _, m in sub) for sub in subs)}
    with mock.patch.dict(A.AUTO_AUGMENT, sure):
        ds = tf.data.Dataset.range(400).map(lambda k: A.by_name(
            x, "t", tf.stack([k, tf.constant(1, tf.int64)])))
        outs = [np.asarray(o, np.float32).tobytes() for o in ds]
    assert all(o in chains for o in outs), sum(o not in chains for o in outs)
    drawn = set().union(*(chains[o] for o in outs))
    assert {i for i, _, _ in drawn} == set(range(len(subs)))  # (twins: either one)
    # each direction of a geometric first operation (its outputs differ by sign)
    directions = {s1 for o in outs for i, s1, _ in chains[o]
                  if subs[i][0][0] in A.GEOMETRIC and len(chains[o]) <= 2}
    assert directions == {1.0, -1.0}, directions


def test_bicubic_crops_are_pillows_resize():
    """`Augment(interpolation="bicubic")`: the inception crop's window resized
    as timm's `RandomResizedCrop(interpolation=BICUBIC)` resizes it on a PIL
    image, and DeiT III's simple crop resized as torchvision's `Resize(224,
    BICUBIC)` (the shorter side to the size, the longer truncated): Pillow's
    own resize, its levels exactly (before, in TensorFlow ops: ~1 pixel in
    10^4 a level off). Bilinear is 1-2 levels off on average."""
    import tensorflow as tf
    from skimage import data

    from keras_reluvit.data.augment import inception_crop
    from keras_reluvit.data.augment import random_crop
    from keras_reluvit.data.three_augment import simple_random_crop

    for image in (data.astronaut(), data.coffee()):
        x = tf.constant(image)
        for k in range(4):
            seed = tf.constant([k, 9], tf.int64)
            window = np.asarray(random_crop(x, (0.08, 1.0), (3 / 4, 4 / 3), seed))
            theirs = Image.fromarray(window).resize((96, 112), Image.BICUBIC)
            ours = inception_crop(x, (112, 96), (0.08, 1.0), (3 / 4, 4 / 3), seed, "bicubic")
            d = _diff(ours, theirs)
            assert d.max() == 0, (k, (d == 0).mean())
            assert _diff(inception_crop(x, (112, 96), (0.08, 1.0), (3 / 4, 4 / 3), seed),
                         theirs).mean() > 0.2  # bilinear: TensorFlow's, not Pillow's
    short = data.coffee()[:, :500]  # 400 x 500: the longer side 80 * 500 // 400 = 100
    resized = np.asarray(Image.fromarray(short).resize((100, 80), Image.BICUBIC), np.float32)
    padded = np.pad(resized, [(4, 4), (4, 4), (0, 0)], mode="reflect")
    # in a tf.data map, as the pipeline runs it (its size a tensor there)
    crop = next(iter(tf.data.Dataset.from_tensors(short).map(
        lambda im: simple_random_crop(im, (80, 80), tf.constant([3, 1]), "bicubic"))))
    crop = np.asarray(crop)
    best = min(_diff(padded[y:y + 80, x:x + 80], crop).sum() for y in range(9) for x in range(29))
    assert best == 0
    with pytest.raises(ValueError, match=r"Augment\(interpolation=\) must be one of"):
        D.Augment(interpolation="bicubik")


def test_the_pipeline_samples_with_the_augments_interpolation(monkeypatch):
    """`Augment(interpolation=)` reaches every Pillow call timm's
    augmentations make in the pipeline (timm's `hparams["interpolation"]`,
    the geometric operations' filter); with bicubic, RandAugment and
    AutoAugment take the crop's resize and flip in the same call."""
    import tensorflow as tf

    from keras_reluvit.data.pipeline import pipeline

    seen = []

    def spy(image, kinds, arguments, applied, interpolation="bilinear", first=None):
        seen.append((interpolation, first is not None))  # at trace time
        return tf.image.resize(image, (16, 16)) if first is not None else image

    monkeypatch.setattr(A, "run", spy)
    images = np.zeros((4, 24, 24, 3), "uint8")
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(4)})
    for name in ("rand-m9-mstd0.5-inc1", "augmix-m3", "v0"):
        for interpolation in ("bicubic", "bilinear"):
            seen.clear()
            aug = D.Augment(auto_augment=name, interpolation=interpolation, flip=False)
            next(iter(pipeline(ds, 4, 16, 4, True, aug)))
            assert {i for i, _ in seen} == {interpolation}, (name, interpolation, seen)
            fused = interpolation == "bicubic" and not name.startswith("augmix")
            assert {f for _, f in seen} == {fused}, (name, interpolation, seen)


def test_erasing_draws_its_noise_for_the_boxs_rows_alone():
    """Random erasing draws the noise of the box's rows only (`_normal_rows`:
    Philox's counter moved to their first value), value for value the draw
    of the whole image there (what it drew before, 2.4 ms per 224 px image):
    odd widths (a group of four split across rows), the first and last rows;
    and `random_erasing` in a tf.data map writes exactly those values."""
    import tensorflow as tf

    key = tf.constant([5, 3], tf.int64)
    for shape in ((37, 51, 3), (224, 224, 3), (9, 7, 1)):
        whole = tf.random.stateless_normal(shape, key).numpy()
        for first, rows in ((0, 1), (1, 3), (shape[0] - 2, 2), (2, shape[0] - 3)):
            part = A._normal_rows(tf.constant(shape), key, first, rows, tf.float32)
            np.testing.assert_array_equal(part, whole[first:first + rows], err_msg=(shape, first))
    image = tf.fill([40, 57, 3], 7.0)
    seeds = tf.data.Dataset.range(24).map(lambda i: tf.stack([i, tf.constant(4, tf.int64)]))
    outs = seeds.map(lambda s: A.random_erasing(image, 1.0, s))
    for seed, out in zip(seeds, outs):
        key = tf.random.experimental.stateless_split(seed, 5)[4]  # erasing's noise key
        whole = tf.random.stateless_normal([40, 57, 3], key).numpy()
        erased = np.asarray(out) != 7.0
        assert erased.any()
        np.testing.assert_array_equal(np.asarray(out)[erased], whole[erased])


def test_deits_one_pillow_call_equals_the_chain_step_by_step(monkeypatch):
    """With bicubic and RandAugment or AutoAugment the pipeline makes one
    Pillow call per image: the crop's resize, the flip and timm's operations
    (`first`). Its images equal, pixel for pixel, the chain run step by step
    (Pillow's resize, TensorFlow's stateless flip, then the operations) for
    the same seed, from JPEGs and from decoded pixels; and its flips are
    drawn (some images differ from an unflipped run, some do not)."""
    import tensorflow as tf
    from skimage import data

    pipeline_module = importlib.import_module("keras_reluvit.data.pipeline")
    ops_module = importlib.import_module("keras_reluvit.data.ops")
    photos = [data.astronaut(), data.coffee()[:, :512], data.chelsea()[:300, :400]]
    pixels = np.stack([p[y:y + 150, x:x + 170] for p in photos for y, x in ((0, 0), (90, 140))])
    jpegs = [tf.io.encode_jpeg(p, quality=90) for p in pixels]
    labels = np.arange(len(pixels)) % 3
    sources = {"decoded": {"image": pixels, "label": labels},
               "jpeg": {"image": tf.stack(jpegs), "label": labels}}

    def images(source, **augment):
        ds = tf.data.Dataset.from_tensor_slices(sources[source])
        aug = D.Augment(interpolation="bicubic", **augment)
        return np.concatenate([x for x, _ in pipeline_module.pipeline(ds, 3, 64, 6, True, aug,
                                                                      seed=3)])

    for name, source in (("rand-m9-mstd0.5-inc1", "decoded"), ("rand-m9-mstd0.5-inc1", "jpeg"),
                         ("original", "jpeg")):
        fused = images(source, auto_augment=name)
        unflipped = images(source, auto_augment=name, flip=False)
        with monkeypatch.context() as m:
            m.setattr(ops_module, "timm_takes_first", lambda name: False)
            step_by_step = images(source, auto_augment=name)
        np.testing.assert_array_equal(fused, step_by_step, err_msg=(name, source))
        same = [np.array_equal(a, b) for a, b in zip(fused, unflipped)]
        assert 0 < sum(same) < len(same), (name, source, same)


EXIT_SCRIPT = """
import numpy as np
from keras_reluvit.data import pillow_calls as P
import tensorflow as tf
x = tf.constant(np.random.default_rng(0).integers(0, 255, (64, 64, 3)), tf.uint8)
ds = tf.data.Dataset.range(10**6).map(
    lambda i: P.rotate(x, tf.cast(i % 30, tf.float64), "bicubic"),
    num_parallel_calls=tf.data.AUTOTUNE).batch(8).prefetch(tf.data.AUTOTUNE)
it = iter(ds)
next(it)
print("exits")
"""


def test_a_script_ending_beside_a_pillow_pipeline_exits():
    """A script that ends while a pipeline with Pillow calls is still
    prefetching (an iterator alive at exit: `next(iter(ds))`, a run stopped
    mid-epoch) exits: before, a call waiting for the GIL when Python began
    to finalize never returned and the exit hung for good (10 of 12 runs).
    Three runs side by side, each within two minutes."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    runs = [subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    try:
        for run in runs:
            out, err = run.communicate(timeout=120)
            assert run.returncode == 0 and "exits" in out, err[-2000:]
    finally:
        for run in runs:
            run.kill()


def test_a_chain_is_pillows_calls_in_order():
    """`pillow_calls.chain` (the pipeline's one call per image) against Pillow's
    calls written out: the crop's resize to a non-square size and the flip
    first, then the applied operations in their order (rotate then solarize
    is not solarize then rotate), those not applied skipped; posterize to 0
    bits is black (Pillow before 13 wrote it; timm's v0 policy and
    PosterizeIncreasing at M10 ask for it)."""
    import tensorflow as tf
    from skimage import data

    photo = data.astronaut()[::4, ::4][:100, :120]
    pil = Image.fromarray(photo)
    kw = dict(resample=Image.BICUBIC, fillcolor=P.FILL)
    k = P.KINDS.index
    cases = [
        ([k("rotate"), k("solarize")], [27.0, 100.0], [True, True],
         lambda p: ImageOps.solarize(p.rotate(27.0, **kw), 100)),
        ([k("solarize"), k("rotate")], [100.0, 27.0], [True, True],
         lambda p: ImageOps.solarize(p, 100).rotate(27.0, **kw)),
        ([k("shear_x"), k("equalize"), k("color")], [0.2, 0.0, 1.6], [True, False, True],
         lambda p: ImageEnhance.Color(p.transform(p.size, Image.AFFINE, (1, 0.2, 0, 0, 1, 0),
                                                  **kw)).enhance(1.6)),
        ([k("translate_y_rel"), k("posterize")], [0.3, 0.0], [True, True],
         lambda p: Image.new("RGB", p.size, 0)),
    ]
    for first in (None, ((48, 64), True), ((48, 64), False)):
        start = pil
        if first is not None:
            start = pil.resize((64, 48), Image.BICUBIC)
            if first[1]:
                start = start.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        for kinds, arguments, applied, theirs in cases:
            ours = P.chain(tf.constant(photo), kinds, arguments, applied, "bicubic", first)
            d = _diff(ours, theirs(start))
            assert d.max() == 0, (first, kinds, (d == 0).mean())


def test_at_exit_pillow_calls_fail_at_once_and_say_why(photo, monkeypatch):
    """Once the exit's drain has begun (`closing`), a call fails at once (the
    buffers fill, tf.data asks for no more, the exit goes on), with an error
    that names the exit: never images silently left black for a reader in a
    later exit hook."""
    import tensorflow as tf

    monkeypatch.setitem(P._CALLS, "closing", True)
    with pytest.raises(Exception, match="this process is exiting"):
        P.chain(tf.constant(photo), [P.KINDS.index("rotate")], [10.0], [True], "bicubic",
                ((20, 30), True))
    ds = tf.data.Dataset.range(2).map(lambda i: P.rotate(tf.constant(photo), 10.0))
    with pytest.raises(tf.errors.OpError, match="this process is exiting"):
        list(ds)
