"""tapeworks' train calls instantiated lean and with TensorFlow's default options, in one process.

    python benchmarks/examples-third-run/lean_against_default.py cnn|mlp

One Trainer (tf.function, 16 steps a call) fits one epoch at a time, 16
rounds, the two ways alternated within each round (`graph_options` on, or
off through its CPU check); each way's functions are instantiated once
(TensorFlow keys an instantiation by its call options) and then reused.
Prints the median epoch time of each way over rounds 3-16, and their ratio.
"""

import json
import statistics
import sys
import time

import numpy as np

import tapeworks  # noqa: F401  (before TensorFlow, as a user imports it)
from tapeworks import Trainer
from tapeworks.engine.plan import graph_options

import keras  # noqa: E402

WHICH = sys.argv[1] if len(sys.argv) > 1 else "cnn"
lean = [True]
graph_options.on_cpu_only = lambda: lean[0]
keras.utils.set_random_seed(0)
if WHICH == "cnn":
    x = np.random.rand(1024, 32, 32, 3).astype("float32")
    y = np.random.randint(0, 10, 1024)
    model = keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10)])
else:
    x = np.random.rand(4096, 64).astype("float32")
    y = np.random.randint(0, 10, 4096)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
trainer = Trainer(model, jit_compile=False, steps_per_call=16)
epochs = {False: [], True: []}
for round_index in range(16):
    for way in ((False, True) if round_index % 2 == 0 else (True, False)):
        lean[0] = way
        start = time.perf_counter()
        trainer.fit(x, y, epochs=1, verbose=0)
        if round_index >= 2:
            epochs[way].append(time.perf_counter() - start)
default, leaned = statistics.median(epochs[False]), statistics.median(epochs[True])
print(json.dumps({"model": WHICH, "default_epoch_s": round(default, 4),
                  "lean_epoch_s": round(leaned, 4), "lean/default": round(leaned / default, 3)}))
