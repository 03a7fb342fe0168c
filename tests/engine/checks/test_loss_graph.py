"""A Task's losses read as a graph at fit start (issue 37 #1, #5): a loss that broadcasts
the batch against itself, and regularisation losses an objective leaves out."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import CorrectnessWarning, Task, Trainer
from tapeworks.engine.checks import loss_graph
from tapeworks.engine.step.task import Counters

BROADCAST = "broadcasts the batch against itself"
DROPPED = "leaves them out"


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, x.sum(axis=1)          # targets of shape (n,): the classic (B,) against (B, 1)


def messages(trainer, x, y=None, **fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, batch_size=16, verbose=0, **fit)
    return [str(w.message) for w in caught if issubclass(w.category, CorrectnessWarning)]


class Regression(Task):
    """A one-model Task whose loss is `loss(y, pred, net)`."""

    def __init__(self, loss, net=None):
        super().__init__()
        self.net = net or keras.Sequential([keras.Input((3,)), keras.layers.Dense(8),
                                            keras.layers.Dense(1)])
        self.loss_fn = loss
        self.add_update("net", "loss", self.net, "sgd")

    def compute_losses(self, batch, training):
        x, y = batch
        return {"loss": self.loss_fn(y, self.net(x, training=training), self.net)}


# A loss that broadcasts ------------------------------------------------------------------

@pytest.mark.parametrize("run_eagerly", [False, True], ids=["tf.function", "eager"])
def test_targets_against_a_column_of_predictions_are_named_with_the_op_and_the_line(
        run_eagerly):
    task = Regression(lambda y, pred, net: tf.reduce_mean(tf.square(y - pred)))
    found = [m for m in messages(Trainer(task, run_eagerly=run_eagerly), *data())
             if BROADCAST in m]
    assert len(found) == 1
    assert "`Sub`" in found[0] and "shapes (B,) and (B, 1) into (B, B)" in found[0]
    assert "test_loss_graph.py:" in found[0]     # the lambda's line, the user's code
    assert "tf.squeeze(pred, -1)" in found[0]


def test_a_hand_written_cross_entropy_is_named_at_its_first_broadcasting_op():
    def cross_entropy(y, pred, net):
        label, p = tf.cast(y > 0, "float32"), tf.sigmoid(pred)
        return -tf.reduce_mean(label * tf.math.log(p) + (1 - label) * tf.math.log(1 - p))

    found = [m for m in messages(Trainer(Regression(cross_entropy)), *data()) if BROADCAST in m]
    assert len(found) == 1 and "`Mul`" in found[0] and "more such op(s)" in found[0]


@pytest.mark.parametrize("loss", [
    lambda y, pred, net: tf.reduce_mean(tf.square(y - tf.squeeze(pred, -1))),
    lambda y, pred, net: tf.reduce_mean(tf.square(tf.reshape(y, tf.shape(pred)) - pred)),
    lambda y, pred, net: keras.losses.MeanSquaredError()(y, pred),   # the loss object reshapes
    lambda y, pred, net: keras.losses.BinaryCrossentropy(from_logits=True)(
        tf.cast(y > 0, "float32"), pred),
], ids=["squeezed", "reshaped", "keras-mse-object", "keras-bce-object"])
def test_losses_of_matching_shapes_are_not_reported(loss):
    assert not [m for m in messages(Trainer(Regression(loss)), *data()) if BROADCAST in m]


def test_a_supervised_trainer_is_never_reported():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert not [m for m in messages(Trainer(model, "sgd", "mse"), *data()) if BROADCAST in m]


class Pairwise(Task):
    """Deliberate B x B matrices: a contrastive distance matrix and a sequence mask."""

    def __init__(self):
        super().__init__()
        self.net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
        self.add_update("net", "loss", self.net, "sgd")

    def compute_losses(self, batch, training):
        x, y = batch
        z = self.net(x, training=training)
        distances = tf.reduce_sum(tf.square(z[:, None, :] - z[None, :, :]), -1)   # (B, B)
        lengths = tf.cast(tf.abs(y), "int32") % 4 + 1
        mask = tf.cast(tf.sequence_mask(lengths, 4), "float32")                   # (B, 4)
        return {"loss": tf.reduce_mean(distances) + tf.reduce_mean(mask * z)}


def test_pairwise_matrices_written_on_purpose_are_not_reported():
    task = Pairwise()
    x, y = data()
    task.net(x[:2])
    traced = loss_graph.trace(task, (tf.TensorSpec([None, 3]), tf.TensorSpec([None])),
                              Counters())
    assert traced is not None and traced.batch not in (3, 4)
    assert loss_graph.broadcasts(traced) == []
    assert not [m for m in messages(Trainer(task), x, y) if BROADCAST in m]


def test_the_extra_trace_counts_no_step_trace_and_no_user_retrace():
    @tf.function
    def user_loss(y, pred):
        return tf.reduce_mean(tf.square(y - tf.squeeze(pred, -1)))

    trainer = Trainer(Regression(lambda y, pred, net: user_loss(y, pred)),
                      jit_compile=False, steps_per_call=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(*data(), batch_size=16, epochs=2, verbose=0)
    assert trainer.traces["train_step"] == 1
    assert trainer.retraces == []
    assert not [w for w in caught if "traced again" in str(w.message)]


# Regularisation dropped --------------------------------------------------------------------

def regularised(**layer):
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, name="hidden", **layer),
                             keras.layers.Dense(1, name="out")])


def mse(y, pred):
    return tf.reduce_mean(tf.square(y - tf.squeeze(pred, -1)))


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["tf.function", "eager"])
def test_an_objective_without_the_kernel_regulariser_is_named(run_eagerly):
    task = Regression(lambda y, pred, net: mse(y, pred),
                      net=regularised(kernel_regularizer=keras.regularizers.L2(0.01)))
    found = [m for m in messages(Trainer(task, run_eagerly=run_eagerly), *data())
             if DROPPED in m]
    assert len(found) == 1
    assert "update 'net'" in found[0] and "/hidden` (kernel_regularizer)" in found[0]
    assert "tf.add_n(self.net.losses)" in found[0]


def test_add_loss_terms_left_out_are_named():
    task = Regression(lambda y, pred, net: mse(y, pred),
                      net=regularised(activity_regularizer=keras.regularizers.L1(0.01)))
    found = [m for m in messages(Trainer(task), *data()) if DROPPED in m]
    assert len(found) == 1 and "(add_loss)" in found[0]


BOTH = {"kernel_regularizer": keras.regularizers.L2(0.01),
        "activity_regularizer": keras.regularizers.L1(0.01)}


@pytest.mark.parametrize("include", [
    lambda net: sum(net.losses),
    lambda net: tf.add_n(net.losses),
], ids=["sum", "add_n"])
def test_objectives_that_include_the_regularisers_are_not_reported(include):
    task = Regression(lambda y, pred, net: mse(y, pred) + include(net), net=regularised(**BOTH))
    assert not [m for m in messages(Trainer(task), *data()) if DROPPED in m]


def test_a_regulariser_written_out_counts_as_included():
    # The kernel's L2 computed by hand is the regulariser's own computation; the activity
    # term (an add_loss of the forward pass) is still left out, and only it is named.
    task = Regression(lambda y, pred, net: mse(y, pred) + 0.01 * tf.reduce_sum(
        tf.square(net.get_layer("hidden").kernel)), net=regularised(**BOTH))
    found = [m for m in messages(Trainer(task), *data()) if DROPPED in m]
    assert len(found) == 1
    assert "(add_loss)" in found[0] and "kernel_regularizer" not in found[0]


def test_a_supervised_model_with_regularisers_is_never_reported():
    model = regularised(kernel_regularizer=keras.regularizers.L2(0.01))
    assert not [m for m in messages(Trainer(model, "sgd", "mse"), *data()) if DROPPED in m]


class GAN(Task):
    """The discriminator is regularised and its update includes it; the generator's not."""

    def __init__(self, discriminator_loss_has_regularisation):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        self.discriminator = keras.Sequential([
            keras.Input((3,)),
            keras.layers.Dense(1, name="critic", kernel_regularizer=keras.regularizers.L2(0.1))])
        self.with_regularisation = discriminator_loss_has_regularisation
        self.add_update("discriminator", "d_loss", self.discriminator, "adam")
        self.add_update("generator", "g_loss", self.generator, "adam")

    def compute_losses(self, batch, training):
        real = batch
        fake = self.generator(self.random.normal((tf.shape(real)[0], 2)), training=training)
        real_score = self.discriminator(real, training=training)
        fake_score = self.discriminator(fake, training=training)
        d_loss = tf.reduce_mean(tf.nn.softplus(-real_score) + tf.nn.softplus(fake_score))
        if self.with_regularisation:
            d_loss += tf.add_n(self.discriminator.losses)
        return {"d_loss": d_loss, "g_loss": tf.reduce_mean(tf.nn.softplus(-fake_score))}


@pytest.mark.parametrize("included", [True, False])
def test_only_the_update_that_trains_the_regularised_layer_is_asked_for_it(included):
    found = [m for m in messages(Trainer(GAN(included)), data()[0]) if DROPPED in m]
    if included:
        assert found == []        # the generator's update trains no regularised layer
    else:
        assert len(found) == 1
        assert "update 'discriminator'" in found[0] and "update 'generator'" not in found[0]
        assert "/critic` (kernel_regularizer)" in found[0]
        assert "self.discriminator.losses" in found[0]


# In `explain` --------------------------------------------------------------------------------

def test_explain_lists_the_findings_with_what_changes_what_is_learned():
    broadcasting = Regression(lambda y, pred, net: tf.reduce_mean(tf.square(y - pred)),
                              net=regularised(kernel_regularizer=keras.regularizers.L2(0.01)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = Trainer(broadcasting, jit_compile=False).explain(
            tf.data.Dataset.from_tensor_slices(data()).batch(16), steps=2, try_xla=False)
    assert len(explained.correctness) == 2
    assert BROADCAST in explained.correctness[0] and DROPPED in explained.correctness[1]
    assert "Found while fitting (what is learned, not speed):" in str(explained)
    clean = Regression(lambda y, pred, net: mse(y, pred))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = Trainer(clean, jit_compile=False).explain(
            tf.data.Dataset.from_tensor_slices(data()).batch(16), steps=2, try_xla=False)
    assert explained.correctness == [] and "What changes what is learned" not in str(explained)


def test_a_task_that_cannot_be_traced_trains_eagerly_with_no_finding():
    # `.numpy()` in the loss works only eagerly: the diagnostic trace fails, silently,
    # and the eager fit goes on as before.
    def eager_only(y, pred, net):
        scale = float(tf.reduce_max(tf.abs(pred)).numpy()) + 1.0
        return tf.reduce_mean(tf.square(y - pred)) / scale

    x, y = data()
    assert loss_graph.findings(Regression(eager_only), (tf.TensorSpec([None, 3]),
                                                         tf.TensorSpec([None])), Counters()) == []
    trainer = Trainer(Regression(eager_only), run_eagerly=True)
    assert not [m for m in messages(trainer, x, y) if BROADCAST in m or DROPPED in m]
    assert trainer.counters.step.numpy() == 4
