"""tapeworks' compiled functions are instantiated with grappler's CPU-idle passes left out.

`graph_options.lean_instantiation` changes the per-call options of this
thread's function calls only inside it, keeps what the user chose, and
reaches tapeworks' own functions (seen from inside their trace) but not a
callback's; training with it gives the weights training without it gives.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

from tapeworks import Trainer
from tapeworks.engine.plan import graph_options

Rewriter = rewriter_config_pb2.RewriterConfig


def _rewrite_options_now():
    config = config_pb2.ConfigProto()
    config.ParseFromString(context.context().function_call_options.config_proto_serialized)
    return config.graph_options.rewrite_options


def test_inside_the_idle_passes_are_left_out_and_restored_after_even_on_error():
    before = context.context().function_call_options
    with pytest.raises(RuntimeError):
        with graph_options.lean_instantiation():
            rewrite = _rewrite_options_now()
            assert rewrite.meta_optimizer_iterations == Rewriter.ONE
            assert rewrite.layout_optimizer == Rewriter.OFF
            assert rewrite.memory_optimization == Rewriter.NO_MEM_OPT
            assert rewrite.disable_tfg_optimizer
            # The passes that change a CPU graph stay at their default.
            assert rewrite.remapping == Rewriter.DEFAULT
            assert rewrite.constant_folding == Rewriter.DEFAULT
            assert not rewrite.disable_meta_optimizer
            raise RuntimeError("inside")
    assert context.context().function_call_options is before
    assert _rewrite_options_now().meta_optimizer_iterations == Rewriter.DEFAULT_NUM_ITERS


def test_what_the_user_set_is_kept():
    config = config_pb2.ConfigProto(allow_soft_placement=True, intra_op_parallelism_threads=3)
    config.graph_options.rewrite_options.layout_optimizer = Rewriter.ON
    config.graph_options.rewrite_options.meta_optimizer_iterations = Rewriter.TWO
    config.graph_options.rewrite_options.memory_optimization = Rewriter.MANUAL
    lean = config_pb2.ConfigProto()
    lean.ParseFromString(
        graph_options.lean_options(config.SerializeToString()).config_proto_serialized)
    assert lean.graph_options.rewrite_options.layout_optimizer == Rewriter.ON
    assert lean.graph_options.rewrite_options.meta_optimizer_iterations == Rewriter.TWO
    assert lean.graph_options.rewrite_options.memory_optimization == Rewriter.MANUAL
    assert lean.intra_op_parallelism_threads == 3 and lean.allow_soft_placement


class SeesCallOptions(keras.layers.Layer):
    """The identity; records the call options in force whenever it is traced."""

    def __init__(self):
        super().__init__()
        self.iterations = []

    def call(self, x):
        self.iterations.append(_rewrite_options_now().meta_optimizer_iterations)
        return x


class CallbackSees(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.iterations = []

    def on_epoch_end(self, epoch, logs=None):
        @tf.function
        def user_function(x):
            self.iterations.append(_rewrite_options_now().meta_optimizer_iterations)
            return x + 1

        user_function(tf.constant(1.0))


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")


def _model(extra=None):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((4,)), keras.layers.Dense(8, activation="relu")]
    layers += [extra] if extra is not None else []
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_the_trainers_functions_run_lean_and_a_callbacks_function_does_not():
    seen = SeesCallOptions()
    callback = CallbackSees()
    Trainer(_model(seen), jit_compile=False, steps_per_call=4, plan_cache=False).fit(
        *_data(), batch_size=16, epochs=1, verbose=0, callbacks=[callback],
        validation_data=_data())
    # The loops' traces (train, then validation) ran inside tapeworks' calls.
    assert seen.iterations and set(seen.iterations[-2:]) == {Rewriter.ONE}
    assert callback.iterations == [Rewriter.DEFAULT_NUM_ITERS]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_training_gives_the_same_weights_with_and_without_the_lean_options(
        jit_compile, monkeypatch):
    def weights_after_fit():
        model = _model()
        Trainer(model, jit_compile=jit_compile, steps_per_call=4, plan_cache=False).fit(
            *_data(), batch_size=16, epochs=3, verbose=0)
        return [w.numpy() for w in model.weights]

    lean = weights_after_fit()
    monkeypatch.setattr(graph_options, "on_cpu_only", lambda: False)
    default = weights_after_fit()
    for a, b in zip(lean, default):
        np.testing.assert_array_equal(a, b)
