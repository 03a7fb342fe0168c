"""The Trainer under tf.distribute strategies, in this process (one replica).

Several replicas need logical devices set before TensorFlow starts: those
tests run in fresh processes (tests/distribute).
"""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import distribute
from tests.engine import models


def _train(strategy, **kwargs):
    x, y = models.regression_data(n=32)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = models.sequential()
        trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2,
                                    plan_cache=False, **kwargs)
    trainer.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
    return model.get_weights(), trainer


@pytest.mark.parametrize("strategy", [
    lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
], ids=["one-device", "mirrored-one-replica"])
def test_a_strategy_of_one_replica_trains_like_the_default_strategy(strategy):
    # MirroredStrategy with one replica still synchronises through merge_call:
    # the replicated step (its own tf.function, no branch around the update).
    expected, _ = _train(tf.distribute.get_strategy(), accumulate=2)
    weights, trainer = _train(strategy(), accumulate=2)
    for want, got in zip(expected, weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert trainer.counters.step.numpy() == 8
    # One replica takes whole batches: the dataset's own iterator, not a
    # distributed one (which made some whole fits 60% slower; Replication.iterate).
    assert isinstance(trainer.replication.iterate(tf.data.Dataset.range(2)), tf.data.Iterator)


def test_the_strategy_argument_is_the_scope_the_trainer_was_made_in():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    expected, _ = _train(tf.distribute.get_strategy())
    x, y = models.regression_data(n=32)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = models.sequential()
    # Created outside the scope, given the strategy: it enters the scope itself.
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2,
                                plan_cache=False, strategy=strategy)
    trainer.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
    for want, got in zip(expected, model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_trainer_made_outside_the_scope_uses_the_strategy_the_model_was_made_in():
    # Keras' fit does: `with strategy.scope(): model = ...`, then `model.fit` outside.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    expected, _ = _train(tf.distribute.get_strategy())
    x, y = models.regression_data(n=32)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = models.sequential()
        model.compile(keras.optimizers.SGD(0.01), "mse")
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2,
                                plan_cache=False)
    assert trainer.replication.strategy is strategy
    trainer.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
    for want, got in zip(expected, model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_model_built_outside_the_scope_is_refused_and_untouched():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    x, y = models.regression_data(n=16)
    model = models.sequential()
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, "sgd", "mse", strategy=strategy, plan_cache=False)
    with pytest.raises(tapeworks.ConfigError, match=r"built outside the scope of "
                       r"MirroredStrategy.*Fix: create \(and build\) the model inside"):
        trainer.fit((x, y), batch_size=8, verbose=0)
    for was, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(was, now)


def test_an_optimizer_made_outside_the_scope_is_refused():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    x, y = models.regression_data(n=16)
    optimizer = keras.optimizers.SGD(0.1)
    with strategy.scope():
        model = models.sequential()
        trainer = tapeworks.Trainer(model, optimizer, "mse", plan_cache=False)
    with pytest.raises(tapeworks.ConfigError, match=r"optimizer SGD was created outside"):
        trainer.fit((x, y), batch_size=8, verbose=0)


def test_xla_is_refused_under_a_replicated_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = models.sequential()
        with pytest.raises(tapeworks.ConfigError, match=r"jit_compile=True under "
                           r"MirroredStrategy.*Fix: pass jit_compile=False"):
            tapeworks.Trainer(model, "sgd", "mse", jit_compile=True)


def test_parameter_server_strategy_is_refused_with_the_reason():
    # Its steps are scheduled by a ClusterCoordinator: not a lockstep replicated step.
    strategy = object.__new__(tf.distribute.experimental.ParameterServerStrategy)
    with pytest.raises(tapeworks.ConfigError, match="ParameterServerStrategy is not supported"):
        distribute.resolve(strategy)


def test_the_replicas_are_announced_once(capsys):
    _, trainer = _train(tf.distribute.MirroredStrategy(["/cpu:0"]))
    x, y = models.regression_data(n=16)
    trainer.fit(x, y, batch_size=8, verbose=1)
    trainer.fit(x, y, batch_size=8, verbose=1)
    lines = [line for line in capsys.readouterr().out.splitlines()
             if "under MirroredStrategy" in line]
    # The first fit (verbose=0) printed nothing; the next ones say it once.
    assert lines == ["tapeworks: training on 1 replica under MirroredStrategy (the scope the "
                     "Trainer was created in); global batch 8, 8 per replica"]


def test_a_second_strategy_is_refused():
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = models.sequential()
        with pytest.raises(tapeworks.ConfigError, match="another strategy"):
            tapeworks.Trainer(model, "sgd", "mse",
                              strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))


def test_global_batch_size_splits_evenly_or_is_refused():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert distribute.per_replica_batch_size(64, strategy) == 64
    with pytest.raises(tapeworks.ConfigError, match=r"integer >= 1"):
        distribute.per_replica_batch_size(0, strategy)
    _, trainer = _train(strategy)
    x, y = models.regression_data(n=32)
    with pytest.raises(tapeworks.ConfigError, match="disagree"):
        trainer.fit(x, y, batch_size=8, global_batch_size=16, verbose=0)
    trainer.fit(x, y, global_batch_size=16, verbose=0)
    assert trainer.per_replica_batch_size == 16


class _FourReplicas:
    """Only the replica count `per_replica_batch_size` reads (this machine has no 4 devices)."""

    num_replicas_in_sync = 4


def test_a_global_batch_that_does_not_split_evenly_names_the_sizes_that_would():
    assert distribute.per_replica_batch_size(32, _FourReplicas()) == 8
    with pytest.raises(tapeworks.ConfigError, match=r"global batch of 30 .* does not split "
                       r"evenly over 4 replicas\. Expected a multiple of 4\. Fix: use 28 or 32"):
        distribute.per_replica_batch_size(30, _FourReplicas())


def test_bad_distribution_arguments_are_refused():
    with pytest.raises(tapeworks.ConfigError, match=r"`strategy` must be a "
                       r"tf.distribute.Strategy. Received: str"):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", strategy="mirrored")
    with pytest.raises(tapeworks.ConfigError, match=r"`sync_batchnorm` must be True or False"):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", sync_batchnorm="yes")
    with pytest.raises(tapeworks.ConfigError, match=r"`base_batch_size` must be an integer"):
        distribute.linear_scaling(0.1, 0, 512)


def test_linear_scaling_rule_with_warmup():
    schedule = distribute.linear_scaling(0.1, base_batch_size=256, global_batch_size=1024,
                                         warmup_steps=4)
    # 0.1 -> 0.4 linearly over 4 updates, then flat at 0.4.
    rates = [float(schedule(step)) for step in (0, 1, 2, 4, 100)]
    np.testing.assert_allclose(rates, [0.1, 0.175, 0.25, 0.4, 0.4], rtol=1e-6)
    assert distribute.linear_scaling(0.1, 256, 512) == pytest.approx(0.2)
    with pytest.raises(tapeworks.ConfigError, match="warmup_steps"):
        distribute.linear_scaling(0.1, 256, 512, warmup_steps=-1)


def test_sync_batchnorm_sets_keras_synchronized_on_every_batchnorm():
    inner = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    model = keras.Sequential([keras.Input((3,)), inner, keras.layers.BatchNormalization(),
                              keras.layers.Dense(1)])
    tapeworks.Trainer(model, "sgd", "mse", sync_batchnorm=True)
    norms = [layer for layer in inner.layers + model.layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == 2 and all(layer.synchronized for layer in norms)


def test_choosing_a_strategy_reads_tf_config():
    workers = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
               "task": {"type": "worker", "index": 0}}
    assert distribute.cluster_workers(json.dumps(workers)) == 2
    assert distribute.cluster_workers("") == 0
    chief = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}}
    assert distribute.cluster_workers(json.dumps(chief)) == 2
    with pytest.raises(tapeworks.ConfigError, match="TF_CONFIG is not valid JSON"):
        distribute.cluster_workers("{cluster")
    one = json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker",
                                                                       "index": 0}})
    strategy, why = distribute.choose(tf_config=one, gpus=0)
    assert strategy is tf.distribute.get_strategy() and why == "one device (no GPU)"


def test_a_pipeline_of_too_few_files_is_sharded_by_data_or_refused(tmp_path):
    paths = []
    for index in range(2):
        paths.append(str(tmp_path / f"part-{index}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            writer.write(b"record")
    by = tf.data.experimental.AutoShardPolicy
    one_file = tf.data.TFRecordDataset(paths[:1]).batch(2)
    with pytest.warns(tapeworks.PerformanceWarning, match="sharded by data instead"):
        sharded = distribute.shardable(one_file, workers=2)
    assert sharded.options().experimental_distribute.auto_shard_policy == by.DATA
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = by.FILE
    with pytest.raises(tapeworks.DataSpecError, match=r"reads 1 file\(s\) and asks for FILE "
                       r"sharding between 2 workers.*AutoShardPolicy.DATA"):
        distribute.shardable(one_file.with_options(options), workers=2)
    # Enough files, one worker, or arrays in memory: left to tf.data as they are.
    two_files = tf.data.TFRecordDataset(paths).batch(2)
    arrays = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2))).batch(2)
    for dataset, workers in ((two_files, 2), (one_file, 1), (arrays, 2)):
        assert distribute.shardable(dataset, workers) is dataset


LATE_MULTI_WORKER = textwrap.dedent("""
    import json, os
    from tapeworks.launch import free_ports
    ports = free_ports(2)
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": 0}})
    import tensorflow as tf
    tf.constant(1.0) + 1.0   # TensorFlow has run something: too late for collectives
    import tapeworks
    try:
        tapeworks.distribute.choose()
    except tapeworks.ConfigError as error:
        print("REFUSED:", error)
""")


@pytest.mark.multiprocess
def test_a_multi_worker_strategy_chosen_too_late_says_to_create_it_first():
    result = subprocess.run([sys.executable, "-c", LATE_MULTI_WORKER], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED: TF_CONFIG names a cluster of 2 workers" in result.stdout
    assert "Fix: call `strategy = tapeworks.distribute.strategy()` at the top" in result.stdout
