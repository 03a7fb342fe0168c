"""Set-up mistakes named at fit time: nothing trainable, logits into a probability loss,
a schedule that decays to nothing, a shared optimizer, a loss that overflows."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import ConfigError, CorrectnessWarning, NonFiniteError, Task, Trainer


def data(n=64, classes=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    if classes is None:
        return x, (x[:, :1] > 0).astype("float32")
    return x, rng.integers(0, classes, n)


def messages(trainer, x, y, **fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, verbose=0, **fit)
    return [str(w.message) for w in caught if issubclass(w.category, CorrectnessWarning)]


def test_a_fully_frozen_model_is_reported():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.trainable = False
    found = messages(Trainer(model, "sgd", "mse"), *data(), batch_size=16)
    assert any("nothing is trainable" in m and "`model.trainable = True`" in m for m in found)


@pytest.mark.parametrize("loss,activation,named", [
    ("binary_crossentropy", None, True),
    (keras.losses.BinaryCrossentropy(), None, True),
    (keras.losses.binary_crossentropy, None, True),
    (keras.losses.BinaryCrossentropy(from_logits=True), None, False),
    ("binary_crossentropy", "sigmoid", False),
    ("mse", None, False),
])
def test_logits_into_a_probability_loss(loss, activation, named):
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(1, activation=activation, name="out")])
    found = [m for m in messages(Trainer(model, "sgd", loss), *data(), batch_size=16)
             if "has no activation" in m]
    assert bool(found) == named
    if named:
        assert "`out`" in found[0] and "BinaryCrossentropy(from_logits=True)" in found[0]


def test_logits_into_a_sparse_categorical_loss_names_the_sparse_fix():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="out")])
    found = messages(Trainer(model, "sgd", "sparse_categorical_crossentropy"),
                     *data(classes=3), batch_size=16)
    assert any("SparseCategoricalCrossentropy(from_logits=True)" in m for m in found)


def test_a_schedule_that_decays_to_nothing_is_reported_once():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    found = [m for m in messages(Trainer(model, keras.optimizers.SGD(schedule), "mse"),
                                 *data(), batch_size=8, epochs=4)
             if "has decayed" in m]
    # 8 steps an epoch: after the first 0.1 x 0.5^8 = 3.9e-4, above 1e-3 x 0.1; after
    # the second 0.1 x 0.5^16 = 1.53e-6, below it.
    assert len(found) == 1
    assert "decayed to 1.53e-06 from 0.1 after 16 optimizer steps, with 2 epoch(s)" in found[0]
    assert "ExponentialDecay" in found[0]
    gentle = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1000, decay_rate=0.5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert not [m for m in messages(Trainer(model, keras.optimizers.SGD(gentle), "mse"),
                                    *data(), batch_size=8, epochs=4) if "has decayed" in m]


class SharedOptimizer(Task):
    def __init__(self):
        super().__init__()
        adam = keras.optimizers.Adam(1e-3)
        self.a = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        self.b = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        self.add_update("first", "l1", self.a, adam)
        self.add_update("second", "l2", self.b, adam)


def test_two_updates_sharing_one_optimizer_instance_are_refused():
    with pytest.raises(ConfigError, match="Update 'second' was given the optimizer instance "
                                          "that update 'first' already uses"):
        SharedOptimizer()


def test_a_loss_that_overflows_from_exploding_outputs_names_the_learning_rate(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
    model.layers[0].kernel.assign(np.full((4, 1), 1e19, "float32"))
    x = np.ones((8, 4), "float32")
    trainer = Trainer(model, "sgd", "mse", nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError, match=r"they reach 4e\+19 and the loss term 'loss' "
                                             r"overflows float32.*learning rate too high"):
        trainer.fit(x, np.zeros((8, 1), "float32"), batch_size=8, verbose=0)


def test_a_softmax_over_one_unit_is_named_and_a_two_unit_one_is_not():
    import warnings

    import keras
    import numpy as np

    import tapeworks
    from tapeworks import CorrectnessWarning

    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    one = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="softmax",
                                                                  name="head")])
    with pytest.warns(CorrectnessWarning, match="`head`.*softmax over 1 unit.*sigmoid"):
        tapeworks.Trainer(one, "adam", "binary_crossentropy", jit_compile=False,
                          plan_cache=False).fit(x, y, verbose=0)
    two = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        tapeworks.Trainer(two, "adam", "sparse_categorical_crossentropy", jit_compile=False,
                          plan_cache=False).fit(x, y.astype("int32"), verbose=0)


@pytest.mark.parametrize("samples, batch_size, warned", [
    (8, 1, True), (9, 4, True), (8, 4, False), (10, 4, False)])
def test_batchnorm_on_a_batch_of_one_is_named(samples, batch_size, warned):
    import warnings

    import keras
    import numpy as np

    import tapeworks

    x = np.random.default_rng(0).normal(size=(samples, 4)).astype("float32")
    y = x[:, :1]
    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "adam", "mse", jit_compile=False, plan_cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, batch_size=batch_size, verbose=0)
    named = [w for w in caught if "BatchNormalization `bn`" in str(w.message)]
    assert bool(named) == warned


def test_a_warmup_longer_than_the_run_is_named():
    import warnings

    import keras
    import numpy as np

    import tapeworks

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x[:, :1]

    def fit(warmup_steps):
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, 1000, warmup_target=0.1, warmup_steps=warmup_steps)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        trainer = tapeworks.Trainer(model, keras.optimizers.SGD(schedule), "mse",
                                    jit_compile=False, plan_cache=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(x, y, batch_size=8, epochs=3, verbose=0)   # 24 optimizer steps
        return [str(w.message) for w in caught if "warms up" in str(w.message)]

    # A warm-up meant as 5 epochs, written as 5 x 64 samples: never reaches its peak.
    (message,) = fit(320)
    assert "over 320 optimizer steps" in message and "ends at step 24" in message
    assert "peak of 0.1" in message
    assert fit(16) == []   # two epochs of warm-up in steps: fine
