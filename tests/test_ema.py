"""timm's EMA of the weights in the recipe optimizers (`RecipeAdamW` /
`RecipeSGD` with `use_ema`): the averages follow timm's recurrence written
out here (starting from the initial weights; ModelEmaV3's warm-up), skip the
micro-steps of gradient accumulation, stay out of the model until
`swap_ema`, and are kept by a backup through a resume."""

import keras
import numpy as np
import pytest

from keras_reluvit import _keras_compat as compat
from keras_reluvit import recipes


def tiny(optimizer, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    return model


def data(n=8):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def weights(variables):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def model_ema_v3_decay(step, decay):
    """timm 1.0.31's `ModelEmaV3.get_decay(step)` with `use_warmup=True` and
    its defaults (update_after_step 0, warmup_gamma 1, power 2/3, min_decay 0),
    as timm's train.py calls it: `update(model, step=num_updates)`, the count
    of updates including this one."""
    step = max(0, step - 0 - 1)
    if step <= 0:
        return 0.0
    return max(min(1 - (1 + step / 1.0) ** (-2 / 3), decay), 0.0)


@pytest.mark.parametrize("warmup", [False, True])
def test_the_averages_follow_timms_recurrence(warmup):
    """Without warm-up DeiT's `ModelEma` (a constant decay); with it timm's
    `ModelEmaV3` as train.py steps it (the first update copies the weights;
    from the 3rd the decay d caps the warm-up's)."""
    d = 0.5
    model = tiny(recipes.RecipeSGD(learning_rate=0.3, momentum=0.0, use_ema=True,
                                   ema_momentum=d, ema_warmup=warmup))
    x, y = data()
    model.optimizer.build(model.trainable_variables)
    ema = weights(model.trainable_variables)  # timm: the average starts as the model
    for t in range(1, 6):
        model.train_on_batch(x, y)
        w = weights(model.trainable_variables)
        d_t = model_ema_v3_decay(t, d) if warmup else d
        ema = [d_t * e + (1 - d_t) * v for e, v in zip(ema, w)]
        got = weights(compat.ema_averages(model.optimizer))
        for a, b in zip(got, ema):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        copied = max(np.abs(a - b).max() for a, b in zip(got, w))
        assert copied == 0 if d_t == 0 else copied > 1e-4  # the first warm-up update copies
    if warmup:  # 1 - 2^(-2/3) = 0.37 < d = 0.5 < 1 - 3^(-2/3) = 0.52: both decide
        assert model_ema_v3_decay(2, d) < d == model_ema_v3_decay(3, d)


def test_accumulation_micro_steps_leave_the_average():
    """K = 2: 4 micro-steps are 2 updates, and the average moves only with them."""
    d = 0.8
    model = tiny(recipes.RecipeSGD(learning_rate=0.3, momentum=0.0, use_ema=True,
                                   ema_momentum=d, gradient_accumulation_steps=2))
    x, y = data()
    model.optimizer.build(model.trainable_variables)
    ema = weights(model.trainable_variables)
    for micro in range(1, 5):
        model.train_on_batch(x, y)
        if micro % 2 == 0:
            ema = [d * e + (1 - d) * v for e, v in zip(ema, weights(model.trainable_variables))]
        for a, b in zip(weights(compat.ema_averages(model.optimizer)), ema):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_fit_keeps_the_trained_weights_and_swap_ema_swaps_both_ways(tmp_path):
    model = tiny(recipes.RecipeAdamW(learning_rate=0.05, use_ema=True, ema_momentum=0.5))
    x, y = data()
    model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    trained = weights(model.trainable_variables)
    averages = weights(compat.ema_averages(model.optimizer))
    assert max(np.abs(a - b).max() for a, b in zip(trained, averages)) > 1e-4
    recipes.swap_ema(model)
    for a, b in zip(weights(model.trainable_variables), averages):
        np.testing.assert_array_equal(a, b)
    recipes.swap_ema(model)
    for a, b in zip(weights(model.trainable_variables), trained):
        np.testing.assert_array_equal(a, b)
    path = str(tmp_path / "m.keras")
    model.save(path)
    config = keras.saving.load_model(path).optimizer.get_config()
    assert (config["use_ema"], config["ema_momentum"], config["ema_warmup"]) == (True, 0.5, False)
    with pytest.raises(ValueError, match="keeps no EMA of the weights"):
        recipes.swap_ema(tiny(keras.optimizers.SGD()))


def test_a_recipe_with_ema_compiles_timms_ema():
    import keras_reluvit as kr

    model = kr.ViT("Ti/8", image_size=16, num_classes=3, width=16, depth=1, num_heads=2,
                   mlp_dim=32)
    recipes.compile(model, "digits", steps_per_epoch=10, ema=0.999)
    opt = model.optimizer
    assert isinstance(opt, recipes.RecipeAdamW) and opt.use_ema and opt.ema_momentum == 0.999
    assert recipes.get("digits")["ema"] is None  # off unless asked


class _Recorder(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.initial, self.steps = weights(self.model.trainable_variables), []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(weights(self.model.trainable_variables))


def test_under_fit_the_average_starts_as_the_model_and_follows_timms_recurrence():
    """`model.fit` builds the optimizer itself (the tests above build it
    first): after 4 updates the averages are timm's recurrence on the weights
    recorded after each step, from the initial weights -- and moved off them
    (an EMA never updated, or one started at zero, fails: on TensorFlow, fit
    builds the optimizer while tracing its step, and the averages began at
    zero until `build` copied the weights eagerly)."""
    d = 0.8
    model = tiny(recipes.RecipeSGD(learning_rate=0.3, momentum=0.0, use_ema=True,
                                   ema_momentum=d))
    x, y = data(16)
    recorder = _Recorder()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[recorder])
    assert len(recorder.steps) == 4
    expected = recorder.initial
    for w in recorder.steps:
        expected = [d * e + (1 - d) * v for e, v in zip(expected, w)]
    got = weights(compat.ema_averages(model.optimizer))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert max(np.abs(a - b).max() for a, b in zip(got, recorder.initial)) > 1e-3
