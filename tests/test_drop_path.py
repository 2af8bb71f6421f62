"""Stochastic depth (`ViT(drop_path=)`, timm's `drop_path_rate`): each
block's rate rises linearly from 0 as timm's `torch.linspace(0, rate,
depth)`; in training a residual branch is dropped for whole samples at that
rate and the kept ones scaled by 1 / (1 - rate), each branch with its own
draw; at inference it does nothing. Checked on numbers on every backend (the
backends' random streams differ: the statistics are compared)."""

import keras
import numpy as np
import pytest

import keras_reluvit as kr

TINY = dict(variant="Ti/8", width=32, depth=5, num_heads=2, mlp_dim=64, image_size=16,
            num_classes=5)


def perturbed(model, seed=0):
    rng = np.random.default_rng(seed)  # the head starts at zero
    model.set_weights([w + rng.normal(0, 0.05, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def test_the_rate_rises_linearly_over_the_blocks_and_round_trips(tmp_path):
    model = kr.ViT(**TINY, drop_path=0.2)
    rates = [b.drop_path for b in model.blocks]
    np.testing.assert_allclose(rates, np.linspace(0, 0.2, 5), rtol=1e-12)  # timm's schedule
    assert model.blocks[0].stochastic_depth is None  # rate 0: no layer, no draws
    assert [b.stochastic_depth.rate for b in model.blocks[1:]] == rates[1:]
    assert model.get_config()["drop_path"] == 0.2
    path = str(tmp_path / "dp.keras")
    model.save(path)
    back = keras.saving.load_model(path)
    assert [b.drop_path for b in back.blocks] == rates
    assert kr.ViT_S16(drop_path=0.1, num_classes=3, image_size=32).blocks[-1].drop_path == 0.1
    assert kr.ViT(**dict(TINY, depth=1), drop_path=0.3).blocks[0].drop_path == 0.0
    # DeiT III's models_v2.py: every block at the rate
    uniform = kr.ViT(**TINY, drop_path=0.2, drop_path_schedule="uniform")
    assert [b.drop_path for b in uniform.blocks] == [0.2] * 5
    uniform.save(path)
    back = keras.saving.load_model(path)
    assert back.get_config()["drop_path_schedule"] == "uniform"
    assert [b.drop_path for b in back.blocks] == [0.2] * 5


def test_whole_samples_are_dropped_at_the_rate_and_the_kept_ones_scaled():
    rate = 0.3
    layer = kr.EncoderBlock(num_heads=2, mlp_dim=8, drop_path=rate).stochastic_depth
    n = 20000
    x = np.ones((n, 3, 4), "float32")
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    per_sample = y.reshape(n, -1)
    assert (per_sample == per_sample[:, :1]).all()  # one draw per sample: tokens and channels
    values = per_sample[:, 0]
    kept = values != 0
    np.testing.assert_allclose(values[kept], 1 / (1 - rate), rtol=1e-6)
    dropped = 1 - kept.mean()
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n), dropped
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, training=False)), x)


def test_a_block_in_training_drops_each_branch_per_sample_and_nothing_at_inference():
    """With dropout off, each sample's output is one of the four
    combinations of its two branches kept (scaled) or dropped, computed
    here from the block's own sub-layers; all four occur; at inference the
    block equals one without stochastic depth."""
    rate = 0.5
    keras.utils.set_random_seed(1)
    block = kr.EncoderBlock(num_heads=2, mlp_dim=16, attention="relu", drop_path=rate)
    x = np.random.default_rng(0).normal(size=(64, 5, 8)).astype("float32")
    block(x)
    perturbed(block)
    plain = kr.EncoderBlock(num_heads=2, mlp_dim=16, attention="relu")
    plain(x)
    plain.set_weights(block.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                  keras.ops.convert_to_numpy(plain(x)))
    out = keras.ops.convert_to_numpy(block(x, training=True))

    def np_(t):
        return keras.ops.convert_to_numpy(t)

    scale = 1 / (1 - rate)
    t = block.norm1(x)
    kept = x + scale * np_(block.attn(t, t))
    candidates = {}  # (attention kept, MLP kept) -> every sample's output
    for first, h in ((False, x), (True, kept)):
        m = np_(block.mlp(block.norm2(h)))
        candidates[(first, False)], candidates[(first, True)] = h, h + scale * m
    seen = set()
    for i in range(len(x)):
        found = [k for k, c in candidates.items()
                 if np.allclose(out[i], c[i], rtol=1e-5, atol=1e-5)]
        assert len(found) == 1, (i, found)
        seen.add(found[0])
    assert seen == {(False, False), (False, True), (True, False), (True, True)}


def test_a_bad_rate_is_named():
    with pytest.raises(ValueError, match="drop_path"):
        kr.ViT(**TINY, drop_path=1.0)
    with pytest.raises(ValueError, match="drop_path"):
        kr.EncoderBlock(num_heads=2, mlp_dim=8, drop_path=-0.1)
    with pytest.raises(ValueError, match="Unknown drop_path_schedule 'constant'"):
        kr.ViT(**TINY, drop_path=0.1, drop_path_schedule="constant")
