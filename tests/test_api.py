"""The package's surface: attributes, versions, reprs, and no noise of tapeworks' own."""

import logging
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

import tapeworks


def test_subpackages_are_attributes_whatever_was_imported_before():
    result = subprocess.run(
        [sys.executable, "-c", "import tapeworks; print(tapeworks.data.pipeline.__name__, "
                               "tapeworks.lint.check_source.__name__)"],
        capture_output=True, text=True)
    assert result.stdout.split() == ["pipeline", "check_source"], result.stderr


def test_dir_lists_each_name_once():
    names = dir(tapeworks)
    assert len(names) == len(set(names)) and "Trainer" in names and "data" in names


def test_reprs_are_readable():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)], name="tiny")
    trainer = tapeworks.Trainer(model, "sgd", "mse", precision="float32")
    assert repr(trainer.precision) == "<precision 'float32' (asked for)>"
    assert repr(trainer) == ("<tapeworks.Trainer model='tiny' jit_compile='auto (measuring)' "
                             "steps_per_call='auto (measuring)' precision='float32' "
                             "accumulate=1>")


def test_many_trainers_in_one_process_trigger_no_retracing_warning(caplog):
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    y = x[:, :1]
    with caplog.at_level(logging.WARNING):
        for fold in range(7):   # a k-fold loop
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            tapeworks.Trainer(model, "sgd", "mse").fit(x, y, batch_size=8, verbose=0)
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_log_lines_carry_no_doubled_prefix(caplog):
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)
    with caplog.at_level(logging.INFO, logger="tapeworks"):
        tapeworks.Trainer(model, "sgd", "mse", jit_compile=False).fit(dataset, verbose=0)
    assert caplog.records and not [r for r in caplog.records
                                   if r.getMessage().startswith("tapeworks:")]
