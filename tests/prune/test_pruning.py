"""Magnitude pruning: schedules, masks in the compiled step (every mode), resume, strip.

The model: Dense 16 -> 25 -> 10 (kernels of 400 and 250 weights: `round(s * n)`
is never a tie at the sparsities used), trained 8 updates per epoch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import ConfigError
from tapeworks.prune import ConstantSparsity, PolynomialDecay, Pruning, two_of_four_mask

MODES = {"eager": dict(run_eagerly=True, jit_compile=False),
         "tf.function": dict(jit_compile=False), "XLA": dict(jit_compile=True),
         "XLA update": dict(jit_compile="update")}


def data(n=128):
    rng = np.random.RandomState(0)
    x = rng.randn(n, 16).astype("float32")
    return x, rng.randint(0, 10, n).astype("int32")


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16,)),
                             keras.layers.Dense(25, activation="relu", name="hidden"),
                             keras.layers.Dense(10, name="out")])


def trainer(pruning, optimizer=None, **options):
    options = dict(dict(seed=1, steps_per_call=3), **options)
    return tapeworks.Trainer(
        model(), optimizer or keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), pruning=pruning,
        **options)


def zeros(kernel):
    return int(np.sum(np.asarray(kernel) == 0))


def test_schedules_match_hand_computed_values_on_numbers_and_tensors():
    schedule = PolynomialDecay(0.0, 0.8, begin_step=10, end_step=22, frequency=4)
    assert [t for t in range(30) if schedule.due(t)] == [10, 14, 18, 22]
    # 0.8 + (0 - 0.8) * (1 - 6/12) ** 3 = 0.7
    assert schedule.sparsity(16) == pytest.approx(0.7)
    assert schedule.sparsity(5) == 0.0 and schedule.sparsity(40) == pytest.approx(0.8)
    # The end step is due even off the frequency's grid: the final sparsity is reached.
    off_grid = PolynomialDecay(0.2, 0.6, begin_step=0, end_step=10, power=1, frequency=4)
    assert [t for t in range(20) if off_grid.due(t)] == [0, 4, 8, 10]
    assert off_grid.sparsity(5) == pytest.approx(0.4)
    constant = ConstantSparsity(0.5, begin_step=3, frequency=2)
    assert [t for t in range(10) if constant.due(t)] == [3, 5, 7, 9]
    for s in (schedule, off_grid, constant):
        for t in range(30):
            assert bool(s.due(tf.constant(t, tf.int64))) == s.due(t)
            assert float(s.sparsity(tf.constant(t, tf.int64))) == pytest.approx(
                s.sparsity(t), abs=1e-6)


@pytest.mark.parametrize("mode", list(MODES))
def test_sparsity_follows_the_schedule_and_masks_hold_in_every_mode(mode):
    x, y = data()
    schedule = PolynomialDecay(0.0, 0.8, begin_step=0, end_step=20, frequency=5)
    pruning = Pruning(schedule)
    t = trainer(pruning, **MODES[mode])
    first, second = t.model.layers[0].kernel, t.model.layers[1].kernel
    seen = []
    for epoch in range(4):   # updates 0-7, 8-15, 16-23, 24-31
        history = t.fit(x, y, batch_size=16, epochs=1, verbose=0)
        last_due = max(s for s in range(8 * epoch + 8) if schedule.due(s))
        target = schedule.sparsity(last_due)
        assert (zeros(first), zeros(second)) == (round(target * 400), round(target * 250))
        logs = {k: v[-1] for k, v in history.history.items()}
        assert logs["sparsity/hidden"] == zeros(first) / 400
        assert logs["sparsity"] == pytest.approx((zeros(first) + zeros(second)) / 650)
        seen.append(np.asarray(first) == 0)
    assert int(pruning.step) == 32 and round(0.8 * 400) == zeros(first)
    # After the last mask (update 20), Adam's moments still move every weight:
    # the masked ones stayed exactly zero, at the same places.
    np.testing.assert_array_equal(seen[-1], seen[-2])
    np.testing.assert_array_equal(np.asarray(pruning.masks[0]) == 0, seen[-1])
    # Masks are monotone: what was pruned stays pruned.
    assert np.all(seen[-1][seen[1]])


def test_eager_and_tf_function_prune_the_same_weights():
    x, y = data()
    results = []
    for mode in ("eager", "tf.function"):
        t = trainer(Pruning(ConstantSparsity(0.6, frequency=4)), **MODES[mode])
        t.fit(x, y, batch_size=16, epochs=2, verbose=0)
        results.append([np.asarray(w) for w in t.model.get_weights()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a == 0, b == 0)


def test_global_scope_reaches_the_sparsity_over_all_kernels_together():
    x, y = data()
    pruning = Pruning(ConstantSparsity(0.5, begin_step=15, frequency=100), scope="global")
    t = trainer(pruning)
    t.fit(x, y, batch_size=16, epochs=2, verbose=0)   # update 15 is the last: masks at the end
    first, second = (np.abs(np.asarray(layer.kernel)) for layer in t.model.layers)
    assert zeros(first) + zeros(second) == round(0.5 * 650)
    assert zeros(first) != 200   # one threshold, not each layer at 50%


def test_a_tiny_kernel_keeps_its_largest_weight():
    from tapeworks.prune.pruning import magnitude_threshold

    magnitudes = tf.constant([0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 1.0])
    # 9 of 10 at or below:
    assert float(magnitude_threshold(magnitudes, 0.95)) == pytest.approx(0.9)
    assert float(magnitude_threshold(magnitudes, 0.3)) == pytest.approx(0.3)
    assert float(magnitude_threshold(magnitudes, 0.0)) == -1.0


def test_updates_are_counted_not_batches_with_accumulation():
    x, y = data()
    pruning = Pruning(ConstantSparsity(0.5, begin_step=3, frequency=100))
    t = trainer(pruning, accumulate=2)
    t.fit(x, y, batch_size=16, epochs=1, verbose=0)   # 8 batches, 4 updates
    assert int(pruning.step) == 4
    assert zeros(t.model.layers[0].kernel) == 200


def test_two_of_four_keeps_the_two_largest_of_each_group_of_input_channels():
    kernel = tf.constant(np.arange(1, 25, dtype="float32").reshape(8, 3)[[3, 1, 0, 2, 7, 5, 4, 6]]
                         * np.array([1, -1, 1], dtype="float32"))
    mask = two_of_four_mask(kernel).numpy()
    # Along the 8 input channels (axis 0), rows 3,1,0,2 then 7,5,4,6 of an
    # increasing matrix: in each group, the rows holding 3 and 2 (and 7, 6) win.
    np.testing.assert_array_equal(mask[:, 0], [1, 0, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(mask, np.repeat(mask[:, :1], 3, axis=1))
    conv = tf.random.stateless_normal([3, 3, 8, 5], seed=[1, 2])
    groups = np.moveaxis(two_of_four_mask(conv).numpy(), 2, 3).reshape(-1, 4)
    assert np.all(groups.sum(axis=1) == 2)


def test_two_of_four_in_training_skips_layers_whose_channels_do_not_group_by_four():
    keras.utils.set_random_seed(0)
    cnn = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(8, 3, name="first"),
                            keras.layers.Conv2D(4, 3, name="second"), keras.layers.Flatten(),
                            keras.layers.Dense(3, name="head")])
    x = np.random.RandomState(0).rand(32, 6, 6, 1).astype("float32")
    y = np.arange(32) % 3
    pruning = Pruning(ConstantSparsity(0.5, frequency=3), structure="2:4")
    t = tapeworks.Trainer(cnn, "adam", keras.losses.SparseCategoricalCrossentropy(True),
                          pruning=pruning, seed=0)
    history = t.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert [layer.name for layer in pruning.layers] == ["second", "head"]   # first: 1 channel
    for layer in pruning.layers:
        kernel = np.asarray(layer.kernel)
        groups = np.moveaxis(kernel, -2, -1).reshape(-1, 4)
        assert np.all((groups != 0).sum(axis=1) == 2), layer.name
    assert history.history["sparsity"] == [0.5]
    with pytest.raises(ConfigError, match="'first' has 1 input channels.*multiple of 4"):
        tapeworks.Trainer(cnn, "adam", keras.losses.SparseCategoricalCrossentropy(True),
                          pruning=Pruning(layers=["first"], structure="2:4")).build_state(x, y)


def test_a_pruned_checkpoint_resumes_bit_for_bit(tmp_path):
    x, y = data()

    def run():
        return trainer(Pruning(PolynomialDecay(0.1, 0.7, begin_step=2, end_step=28,
                                               frequency=3)))

    run().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    resumed = run()
    resumed.fit(x, y, batch_size=16, epochs=4, verbose=0, checkpoint_dir=str(tmp_path))
    straight = run()
    straight.fit(x, y, batch_size=16, epochs=4, verbose=0)
    assert int(resumed.pruning.step) == int(straight.pruning.step) == 32
    # The checkpoint holds the masks and the counter; the kernels once, with the model.
    assert len(straight.pruning.variables) == len(straight.pruning.masks) + 1 == 3
    for a, b in zip(resumed.model.get_weights() + resumed.pruning.masks,
                    straight.model.get_weights() + straight.pruning.masks):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_strip_leaves_the_zeros_after_an_ema_swap_and_outside_writes():
    x, y = data()
    pruning = Pruning(ConstantSparsity(0.75, frequency=2))
    t = trainer(pruning, keras.optimizers.Adam(1e-2, use_ema=True))
    t.fit(x, y, batch_size=16, epochs=2, verbose=0)
    # Keras copies the EMA of every weight into it at the end of fit; the
    # averages of pruned weights are not zero, the Trainer masks them again.
    kernel = t.model.layers[0].kernel
    assert zeros(kernel) == 300
    kernel.assign(tf.ones_like(kernel))   # written outside training
    assert pruning.strip() == [t.model.layers[0], t.model.layers[1]]
    assert zeros(kernel) == 300 and zeros(t.model.layers[1].kernel) == round(0.75 * 250)


def test_bad_pruning_arguments_say_what_and_how_to_fix():
    with pytest.raises(ConfigError, match=r"in \[0, 1\).*sparsity=1.0"):
        ConstantSparsity(1.0)
    with pytest.raises(ConfigError, match="`end_step` must be after `begin_step`"):
        PolynomialDecay(0.0, 0.5, begin_step=10, end_step=10)
    with pytest.raises(ConfigError, match="prunes exactly half"):
        Pruning(ConstantSparsity(0.8), structure="2:4")
    with pytest.raises(ConfigError, match="`scope` must be"):
        Pruning(scope="model")
    with pytest.raises(ConfigError, match="`pruning` must be None or a tapeworks.prune.Pruning"):
        trainer(0.8)
    x, y = data(16)
    with pytest.raises(ConfigError, match="'nope'.*layers with a kernel: \\['hidden', 'out'\\]"):
        trainer(Pruning(layers=["nope"])).build_state(x, y)
    frozen = trainer(Pruning(layers=["hidden"]))
    frozen.model.layers[0].trainable = False
    with pytest.raises(ConfigError, match="'hidden'.s kernel is not trained by any update"):
        frozen.build_state(x, y)
    keras.utils.set_random_seed(0)
    flat = keras.Sequential([keras.Input((4, 4)), keras.layers.Flatten(name="flat"),
                             keras.layers.Dense(2)])
    with pytest.raises(ConfigError, match="'flat' \\(Flatten\\) has no kernel"):
        tapeworks.Trainer(flat, "adam", "mse", pruning=Pruning(layers=["flat"])).build_state(
            np.zeros((2, 4, 4), "float32"), np.zeros((2, 2), "float32"))
