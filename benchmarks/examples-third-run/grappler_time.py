"""Grappler's time at the first calls of one fit: Keras', tapeworks' lean, tapeworks' default options.

    python benchmarks/examples-third-run/grappler_time.py

Each approach is a fresh process fitting a 3-conv CNN (512 samples, 32x32x3,
one epoch) with grappler's own log on (`TF_CPP_VMODULE=meta_optimizer=1`);
the time of every pass on graphs over 100 nodes is summed. "tapeworks,
default options" turns `graph_options` off (its CPU check answers False), so
tapeworks' functions are instantiated with TensorFlow's defaults.
"""

import os
import re
import subprocess
import sys
import tempfile

FIT = r'''
import sys, numpy as np
import tapeworks
from tapeworks import Trainer
from tapeworks.engine.plan import graph_options
import keras
keras.utils.set_random_seed(0)
x = np.random.rand(512, 32, 32, 3).astype("float32"); y = np.random.randint(0, 10, 512)
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
if sys.argv[1] == "keras":
    model.fit(x, y, epochs=1, verbose=0)
else:
    if sys.argv[1] == "default":
        graph_options.on_cpu_only = lambda: False
    Trainer(model).fit(x, y, epochs=1, verbose=0)
'''


def grappler_ms(approach):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="meta_optimizer=1",
               TAPEWORKS_CACHE_DIR=tempfile.mkdtemp())
    log = subprocess.run([sys.executable, "-c", FIT, approach], env=env, capture_output=True,
                         text=True, check=True).stderr
    total, passes = 0.0, 0
    for line in log.splitlines():
        found = re.search(r"Graph size after: (\d+) nodes.*time = ([\d.]+)ms", line)
        if found and int(found.group(1)) > 100:
            total += float(found.group(2))
            passes += 1
    return total, passes


if __name__ == "__main__":
    for approach, label in [("keras", "Keras fit"), ("lean", "tapeworks"),
                            ("default", "tapeworks, default options")]:
        total, passes = grappler_ms(approach)
        print(f"{label}: {total:.0f} ms of grappler in {passes} passes on graphs over 100 nodes")
