"""One worker of a MultiWorkerMirroredStrategy training, or the same training in one process.

`tapeworks launch --workers 2 -- python -m tests.distribute.multiworker OUT`
trains under the strategy that `tapeworks.distribute.strategy()` picks from
TF_CONFIG; without TF_CONFIG it trains on one device. Each process writes
`OUT/worker-<index>.json` (or `OUT/single.json`): its weights, fit logs and
step count, for the test to compare.
"""

import json
import os
import sys


import tensorflow as tf

import tapeworks

# First, before TensorFlow runs anything: MultiWorkerMirroredStrategy
# configures the collective ops of this process.
strategy = tapeworks.distribute.strategy()

import keras  # noqa: E402

from tests.distribute import common  # noqa: E402


def main(out):
    x, y = common.regression_data()
    with strategy.scope():
        model = common.small_mlp()
        trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01), "mse",
                                    metrics=["mae"], steps_per_call=2, plan_cache=False)
    history = trainer.fit(x, y, global_batch_size=16, epochs=3, shuffle=False, verbose=0)
    weights = [w.tolist() for w in model.get_weights()]
    steps = int(trainer.counters.step.numpy())
    refused = None
    try:
        # A tf.data pipeline's iterator checkpoint cannot hold every worker's shard.
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).prefetch(2), verbose=0,
                    checkpoint_dir=os.path.join(out, "refused"))
    except tapeworks.ConfigError as error:
        refused = str(error)
    sharding = _one_file_sharding(out, trainer) if strategy.num_replicas_in_sync > 1 else {}
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    name = (f"worker-{config['task']['index']}" if config else "single")
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"replicas": strategy.num_replicas_in_sync,
                   "strategy": type(strategy).__name__,
                   "weights": weights,
                   "history": history.history,
                   "steps": steps,
                   "refused": refused, "sharding": sharding}, f)


def _one_file_sharding(out, trainer):
    """A pipeline of one file for two workers: sharded by data under AUTO, refused under FILE."""
    path = os.path.join(out, f"one-{os.getpid()}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for value in range(8):
            writer.write(tf.io.serialize_tensor(tf.fill([4], float(value))).numpy())

    def parse(record):
        x = tf.io.parse_tensor(record, tf.float32)
        x.set_shape([4])
        return x, x[:2]

    dataset = tf.data.TFRecordDataset([path]).map(parse, num_parallel_calls=2).batch(4)
    found = {}
    before = int(trainer.counters.step.numpy())
    trainer.fit(dataset.prefetch(2), verbose=0)
    found["auto_steps"] = int(trainer.counters.step.numpy()) - before
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    try:
        trainer.fit(dataset.with_options(options).prefetch(2), verbose=0)
    except tapeworks.DataSpecError as error:
        found["file_refused"] = str(error)
    return found


if __name__ == "__main__":
    main(sys.argv[1])
