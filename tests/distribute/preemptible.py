"""A multi-worker training that saves to `checkpoint_dir` and can be preempted.

`tapeworks launch --workers 2 -- python -m tests.distribute.preemptible CKPT OUT`
(or without the launcher: one process). Each worker prints `PID <pid>` first
and `PROGRESS <step>` after every step, so that a test can send SIGTERM to one
worker mid-run; at the end each writes `OUT/<name>.json` with its weights and
step count.
"""

import json
import os
import sys
import time

import tapeworks

strategy = tapeworks.distribute.strategy()

import keras  # noqa: E402

from tests.distribute import common  # noqa: E402

EPOCHS = 12   # 48 steps: the test signals at step 20


class Progress(keras.callbacks.Callback):
    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer

    def on_train_batch_end(self, batch, logs=None):
        print(f"PROGRESS {int(self.trainer.counters.step.numpy())}", flush=True)
        time.sleep(0.05)   # a window for the test's signal


def main(checkpoint_dir, out):
    print(f"PID {os.getpid()}", flush=True)
    x, y = common.regression_data()
    with strategy.scope():
        model = common.small_mlp()
        trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01), "mse", seed=7,
                                    steps_per_call=1, jit_compile=False, plan_cache=False)
    trainer.fit(x, y, global_batch_size=16, epochs=EPOCHS, verbose=0,
                callbacks=[Progress(trainer)], checkpoint_dir=checkpoint_dir,
                checkpoint_every=3)
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    name = f"worker-{config['task']['index']}" if config else "single"
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"weights": [w.tolist() for w in model.get_weights()],
                   "steps": int(trainer.counters.step.numpy()),
                   "saves": len(trainer.checkpoint_saves)}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
