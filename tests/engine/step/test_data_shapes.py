"""A step called on batches of many shapes drawn on the host is traced once, for its data's.

Batches of one `padded_batch` differ in length (and the last in size too);
a fit of a few steps calls its step on each of them. Traced for the
dataset's `element_spec`, the step is traced once, and trains as Keras' fit
trains. Data whose batches differ at most in size keeps the batch's shapes.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.step import data_shapes

# Sequences of lengths 1-4 (after padding: batches of length 3, 4 and 2).
SEQUENCES = [[1.0], [0.5, 2.0, -1.0], [0.25, 0.25, 0.25, 0.25], [-2.0, 1.0], [3.0], [1.0, -1.0]]
TARGETS = [2.0, 1.0, 0.5, -1.0, 4.0, 0.0]


def padded(batch_size):
    data = tf.data.Dataset.from_generator(
        lambda: iter(zip(SEQUENCES, TARGETS)),
        output_signature=(tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32)))
    # Of known length, as a fit of few steps needs (`CallLoop.few_steps_left`).
    return data.apply(tf.data.experimental.assert_cardinality(6)).padded_batch(batch_size)


def summing_model(*, static_batch=False):
    """sum(sequence) -> Dense(1): the padding's zeros change nothing."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None,))
    if static_batch:
        # Reads the batch's size as a Python int: None in the data's shape.
        total = keras.layers.Lambda(
            lambda x: tf.reshape(tf.reduce_sum(x, axis=1), (x.shape[0], 1)),
            output_shape=(1,))(inputs)
    else:
        total = keras.layers.Lambda(lambda x: tf.reduce_sum(x, axis=1, keepdims=True))(inputs)
    net = keras.Model(inputs, keras.layers.Dense(1)(total))
    net.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return net


def assert_trains_as_keras(history, expected, net, reference):
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(net.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf.function", "xla"])
@pytest.mark.parametrize("batch_size", [2, 4], ids=["lengths-differ", "last-batch-smaller-too"])
def test_batches_of_other_shapes_call_one_trace_and_train_as_keras(jit_compile, batch_size):
    reference, net = summing_model(), summing_model()
    expected = reference.fit(padded(batch_size), epochs=2, shuffle=False, verbose=0)
    trainer = tapeworks.Trainer(net, jit_compile=jit_compile, plan_cache=False)
    history = trainer.fit(padded(batch_size), epochs=2, shuffle=False, verbose=0)
    assert "train_loop" not in trainer.compiled.kinds()   # a fit of few steps
    assert trainer.traces["train_step"] == 1
    assert_trains_as_keras(history, expected, net, reference)


def test_run_eagerly_trains_as_keras_on_batches_of_other_shapes():
    reference, net = summing_model(), summing_model()
    expected = reference.fit(padded(2), epochs=2, shuffle=False, verbose=0)
    history = tapeworks.Trainer(net, run_eagerly=True, plan_cache=False).fit(
        padded(2), epochs=2, shuffle=False, verbose=0)
    assert_trains_as_keras(history, expected, net, reference)


def test_a_later_loop_calls_the_step_traced_for_the_data():
    trainer = tapeworks.Trainer(summing_model(), jit_compile=False, plan_cache=False)
    trainer.fit(padded(2), epochs=1, verbose=0)               # 3 steps, one call each
    trainer.fit(padded(2).repeat(), steps_per_epoch=4, epochs=5, verbose=0)   # the loop
    assert "train_loop" in trainer.compiled.kinds()
    assert trainer.traces["train_step"] == 1


def test_a_step_that_needs_its_batchs_size_is_traced_for_its_batches_as_before():
    with pytest.raises(Exception):
        # Keras' fit traces for the data's shapes, where the batch size is None.
        summing_model(static_batch=True).fit(padded(3), shuffle=False, verbose=0)
    net = summing_model(static_batch=True)
    trainer = tapeworks.Trainer(net, jit_compile=False, plan_cache=False)
    history = trainer.fit(padded(3), epochs=2, shuffle=False, verbose=0)
    # What the same sums train to without the static reshape.
    expected = summing_model().fit(padded(3), epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    # The data's shapes failed (counted), then the batches' own: two batches
    # of 3 sequences of lengths 3 and 4 (the second trace relaxes the length).
    assert trainer.traces["train_step"] == 3


def test_data_of_one_shape_but_the_batch_size_keeps_the_batchs_shapes():
    sizes = []
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    seen = keras.layers.Lambda(lambda x: (sizes.append(x.shape[0]), x)[1])(inputs)
    net = keras.Model(inputs, keras.layers.Dense(1)(seen))
    net.compile(keras.optimizers.SGD(0.05), "mse")
    x, y = np.ones((12, 3), "float32"), np.zeros((12, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)   # element_spec: (None, 3)
    trainer = tapeworks.Trainer(net, jit_compile=False, plan_cache=False)
    trainer.fit(data, epochs=1, verbose=0)
    assert trainer.traces["train_step"] == 1
    assert sizes[-1] == 4   # traced for the batches' own shape: a graph of known shapes


def test_varies_looks_past_the_batch_dimension():
    assert not data_shapes.varies((tf.TensorSpec([None, 3]), tf.TensorSpec([None])))
    assert not data_shapes.varies({"x": tf.TensorSpec([None, 28, 28, 1]), "n": tf.TensorSpec([])})
    assert data_shapes.varies((tf.TensorSpec([None, None]), tf.TensorSpec([None])))
    assert data_shapes.varies(tf.TensorSpec(None))
    assert data_shapes.varies(tf.RaggedTensorSpec([None, None], tf.int64))


def test_fits_matches_structure_dtype_and_shape():
    spec = (tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None], tf.float32))
    assert data_shapes.fits(spec, (tf.zeros([2, 3]), tf.zeros([2])))
    assert not data_shapes.fits(spec, (tf.zeros([2, 3]), tf.zeros([2], tf.int32)))
    assert not data_shapes.fits(spec, (tf.zeros([2, 3]), tf.zeros([2, 1])))
    assert not data_shapes.fits(spec, {"x": tf.zeros([2, 3]), "y": tf.zeros([2])})
    assert not data_shapes.fits(spec, tf.zeros([2, 3]))


def test_a_batch_that_is_not_the_datas_is_traced_for_its_own_shape():
    traced = []

    @tf.function(reduce_retracing=True)
    def step(batch):
        traced.append(batch.shape.as_list())
        return tf.reduce_sum(batch)

    calls = data_shapes.DataShapedCalls(step)
    with data_shapes.drawn_from(tf.TensorSpec([None, None], tf.int32)):
        calls(tf.ones([2, 3]))                   # float32: not the data's
    with data_shapes.drawn_from(tf.TensorSpec([None, None], tf.float32)):
        assert float(calls(tf.ones([4, 3]))) == 12.0
        assert float(calls(tf.ones([1, 3]))) == 3.0
    # The data's shapes, not reduce_retracing's relaxed [None, 3].
    assert traced == [[2, 3], [None, None]]
    assert float(calls(tf.ones([2, 3]))) == 6.0  # outside: the function as it is


def test_a_callback_that_sees_every_batch_gets_steps_of_one_trace():
    class Lengths(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

    seen = Lengths()
    trainer = tapeworks.Trainer(summing_model(), jit_compile=False, plan_cache=False)
    trainer.fit(padded(2).repeat(4), epochs=1, callbacks=[seen], verbose=0)   # 12 steps
    assert seen.batches == 12
    assert trainer.traces["train_step"] == 1


def test_a_step_traced_again_for_its_batches_still_checks_an_encoder_built_in_inference_mode():
    keras.utils.set_random_seed(0)
    encoder = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2),
                                keras.layers.BatchNormalization()], name="encoder")
    inputs = keras.Input((None,))
    total = keras.layers.Lambda(   # reads the batch's size as a Python int: None in the data's
        lambda x: tf.reshape(tf.reduce_sum(x, axis=1), (x.shape[0], 1)),
        output_shape=(1,))(inputs)
    net = keras.Model(inputs, keras.layers.Dense(1)(encoder(total, training=False)))
    net.compile(keras.optimizers.SGD(0.05), "mse")
    trainer = tapeworks.Trainer(net, jit_compile=False, plan_cache=False)
    # The check reads the calls of a trace that got through, not of the one that failed.
    with pytest.warns(tapeworks.CorrectnessWarning,
                      match="`encoder` was called with training=False when its Functional"):
        trainer.fit(padded(3), epochs=1, verbose=0)
    # The data's shapes failed, then each batch's (sequences of length 3, then 4).
    assert trainer.traces["train_step"] == 3
