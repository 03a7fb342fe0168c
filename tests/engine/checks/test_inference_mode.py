"""A trainable sub-model called with training=False inside the step: named once, unless meant."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import CorrectnessWarning, Task, Trainer
from tapeworks.engine.checks.inference_mode import acts_by_mode


def encoder_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                             keras.layers.BatchNormalization(), keras.layers.Dense(4)],
                            name="encoder")


class WithHead(keras.Model):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.head = keras.layers.Dense(1, name="head")

    def call(self, x, training=None):
        return self.head(self.encoder(x, training=False))   # the pretrained-extractor idiom


def with_head(encoder):
    return WithHead(encoder)


def test_keras_replaces_a_functional_models_baked_in_training_false():
    """Why the check looks at calls, not at source: in a Functional model, Keras 3 passes
    the outer call's training=True down, over a `training=False` given when it was built."""
    encoder = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(encoder(inputs, training=False)))
    before = encoder.layers[0].moving_mean.numpy().copy()
    model(np.full((8, 3), 5.0, "float32"), training=True)
    assert not np.allclose(before, encoder.layers[0].moving_mean.numpy())


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")


def fit(model, **options):
    trainer = Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2, **options)
    trainer.fit(*data(), batch_size=8, epochs=2, verbose=0)
    return trainer


def test_a_trainable_encoder_in_inference_mode_is_named_once():
    with pytest.warns(CorrectnessWarning, match=r"`encoder` is called with training=False.*"
                      r"6 trainable variable\(s\).*encoder.trainable = False") as caught:
        fit(with_head(encoder_model()))
    assert sum("is called with training=False" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("how", ["frozen", "meant"])
def test_no_warning_when_frozen_or_meant(how):
    encoder = encoder_model()
    options = {}
    if how == "frozen":
        # "Pretrained": statistics computed (a frozen, never-trained one is
        # reported on its own, below).
        encoder(np.random.default_rng(1).normal(size=(32, 3)).astype("float32"), training=True)
        encoder.trainable = False
    else:
        options["fine_tune_in_inference_mode"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        fit(with_head(encoder), **options)


class Probe(Task):
    def __init__(self):
        super().__init__()
        self.encoder = encoder_model()
        self.head = keras.layers.Dense(1, name="head")
        self.add_update("all", "mse", [self.encoder, self.head], keras.optimizers.SGD(0.1))

    def compute_losses(self, batch, training):
        x, y = batch
        features = self.encoder(x, training=False)
        return {"mse": tf.reduce_mean(tf.square(self.head(features) - y))}


def test_a_task_that_trains_an_encoder_it_calls_in_inference_mode():
    trainer = Trainer(Probe(), jit_compile=False, steps_per_call=2)
    with pytest.warns(CorrectnessWarning, match=r"`encoder`.*updated by 'all'"):
        trainer.fit(*data(), batch_size=8, verbose=0)


def functional_with_encoder(encoder):
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(encoder(inputs,
                                                                           training=False)))


def test_a_functional_model_built_with_a_trainable_encoder_in_inference_mode():
    """Keras drops the built-in training=False (above): the encoder is fine-tuned in training mode."""
    with pytest.warns(CorrectnessWarning, match=r"`encoder` was called with training=False when "
                      r"its Functional model was built, but its 6 trainable variable\(s\) are "
                      r"trained.*encoder.trainable = False") as caught:
        fit(functional_with_encoder(encoder_model()))
    assert sum("was called with training=False" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        fit(functional_with_encoder(encoder_model()), fine_tune_in_inference_mode=True)


def test_a_frozen_batchnorm_whose_statistics_were_never_computed():
    def model(pretrained):
        keras.utils.set_random_seed(0)
        norm = keras.layers.BatchNormalization(name="norm")
        built = keras.Sequential([keras.Input((3,)), norm, keras.layers.Dense(1)])
        if pretrained:
            norm(np.full((8, 3), 4.0, "float32") + np.arange(8)[:, None], training=True)
        norm.trainable = False
        return built

    with pytest.warns(CorrectnessWarning, match=r"BatchNormalization `norm` is frozen.*never "
                                                r"computed \(mean 0 and variance 1"):
        fit(model(pretrained=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        fit(model(pretrained=True))


@pytest.mark.parametrize("layer", [keras.layers.LSTM, keras.layers.GRU, keras.layers.SimpleRNN])
def test_no_warning_for_a_training_default_keras_filled_in(layer):
    # Keras records an RNN's own `training=False` default in the Functional
    # graph when the user passed nothing: that False is not the user's.
    inputs = keras.Input((5, 3))
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(4)(inputs)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        Trainer(model, "adam", "mse", jit_compile=False, plan_cache=False).fit(
            np.zeros((8, 5, 3), "float32"), np.zeros((8, 1), "float32"), verbose=0)


def test_a_training_false_the_user_wrote_on_an_rnn_free_layer_still_warns():
    # The same graph with an encoder the user called with training=False.
    encoder = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                keras.layers.Dropout(0.5, name="drops")])
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(encoder(inputs, training=False)))
    with pytest.warns(CorrectnessWarning, match="training=False when its Functional model.*"
                      "Dropout `drops` included"):
        Trainer(model, "adam", "mse", jit_compile=False, plan_cache=False).fit(
            np.zeros((8, 3), "float32"), np.zeros((8, 1), "float32"), verbose=0)


def quiet_fit(model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        Trainer(model, "adam", "mse", jit_compile=False, plan_cache=False).fit(
            np.ones((8, 3), "float32"), np.zeros((8, 1), "float32"), verbose=0)


@pytest.mark.parametrize("inside", [
    lambda: [keras.layers.Dense(4)],
    lambda: [keras.layers.Dense(4), keras.layers.Dropout(0.0)],
    lambda: [keras.layers.Reshape((1, 3)), keras.layers.LSTM(2)],
], ids=["dense", "dropout-0", "lstm-without-dropout"])
def test_no_warning_where_training_false_changes_nothing_in_the_encoder(inside):
    # Its weights train, but the mode changes nothing it computes: there is
    # nothing true for the warning to say.
    encoder = keras.Sequential([keras.Input((3,)), *inside()])
    inputs = keras.Input((3,))
    quiet_fit(keras.Model(inputs, keras.layers.Dense(1)(encoder(inputs, training=False))))


def test_the_layers_whose_computation_the_mode_changes():
    class OwnNoise(keras.layers.Layer):
        def call(self, x, training=None):
            return x + 1.0 if training else x

    frozen_bn = keras.layers.BatchNormalization(name="frozen_bn")
    frozen_bn.trainable = False
    encoder = keras.Sequential([
        keras.Input((4, 4, 3)), keras.layers.RandomFlip(name="flip"),
        keras.layers.Conv2D(2, 3, name="conv"), keras.layers.BatchNormalization(name="bn"),
        frozen_bn, keras.layers.Flatten(), keras.layers.Dense(3, name="dense"),
        keras.layers.Dropout(0.2, name="drop"), keras.layers.Dropout(0.0, name="no_drop"),
        keras.layers.Lambda(lambda x, training=None: x, name="reads_mode"),
        keras.layers.Lambda(lambda x: x, name="ignores_mode"),
        OwnNoise(name="own"), keras.layers.Reshape((1, 3)),
        keras.layers.GRU(2, dropout=0.1, name="gru"), keras.layers.Reshape((1, 2)),
        keras.layers.LSTM(2, name="lstm")])
    acting = [layer.name for layer in acts_by_mode(encoder)]
    assert acting[:5] == ["flip", "bn", "drop", "reads_mode", "own"]
    # The GRU counts through its cell (dropout 0.1); the LSTM's cell has none.
    assert len(acting) == 6 and isinstance(acts_by_mode(encoder)[-1], keras.layers.GRUCell)


def transfer_model():
    """Keras' transfer-learning guide, second part: the base unfrozen to fine-tune it."""
    base = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                             keras.layers.BatchNormalization(name="bn")], name="base")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(base(inputs, training=False)))
    base.trainable = True
    return model, base


def test_fine_tuning_a_base_with_batchnorm_names_it_and_the_way_to_keep_it_in_inference_mode():
    model, base = transfer_model()
    with pytest.warns(CorrectnessWarning, match=r"`base` was called with training=False.*"
                      r"BatchNormalization `bn` included.*`trainable = False` on "
                      r"each BatchNormalization layer in it"):
        Trainer(model, "adam", "mse", jit_compile=False, plan_cache=False).fit(
            np.ones((8, 3), "float32"), np.zeros((8, 1), "float32"), verbose=0)


def test_following_that_fix_keeps_the_statistics_and_warns_no_more():
    model, base = transfer_model()
    bn = base.get_layer("bn")
    bn.moving_mean.assign([0.5, -0.5, 1.0, 0.0])   # as pretrained weights would set them
    bn.trainable = False
    before = bn.moving_mean.numpy().copy()
    kernel = base.layers[0].kernel.numpy().copy()
    quiet_fit(model)
    np.testing.assert_array_equal(bn.moving_mean.numpy(), before)
    assert not np.array_equal(base.layers[0].kernel.numpy(), kernel)   # fine-tuned


def test_a_task_calling_a_dense_encoder_in_inference_mode_gets_no_warning():
    # Nothing in it computes differently in inference mode.
    class DenseProbe(Task):
        def __init__(self):
            super().__init__()
            self.encoder = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)],
                                            name="encoder")
            self.head = keras.layers.Dense(1)
            self.add_update("all", "mse", [self.encoder, self.head], keras.optimizers.SGD(0.1))

        def compute_losses(self, batch, training):
            x, y = batch
            return {"mse": tf.reduce_mean(tf.square(self.head(self.encoder(x, training=False))
                                                    - y))}

    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        Trainer(DenseProbe(), jit_compile=False, steps_per_call=2).fit(
            *data(), batch_size=8, verbose=0)
