"""A checkpoint of another model is refused; a full disk is a short CheckpointError that loses nothing."""

import os
import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.resume.checkpoint_folder import CheckpointError


def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(32, 4)).astype("float32"),
            rng.normal(size=(32, 3)).astype("float32"))


def trainer(extra_layer=False, width=6):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((4,)), keras.layers.Dense(width, activation="relu")]
    if extra_layer:
        layers.append(keras.layers.Dense(width, activation="relu"))
    layers.append(keras.layers.Dense(3))
    return tapeworks.Trainer(keras.Sequential(layers), "adam", "mse", jit_compile=False,
                             steps_per_call=2, plan_cache=False, seed=0)


def test_a_checkpoint_of_a_larger_model_is_refused_naming_the_first_difference(tmp_path):
    x, y = data()
    trainer(extra_layer=True).fit(x, y, batch_size=8, epochs=1, verbose=0,
                                  checkpoint_dir=str(tmp_path))
    smaller = trainer()
    smaller.build_state(x, y, batch_size=8)
    before = [w.copy() for w in smaller.model.get_weights()]
    with pytest.raises(CheckpointError) as caught:
        smaller.fit(x, y, batch_size=8, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    message = str(caught.value)
    assert "holds a run of another model" in message
    # The third variable: the extra layer's kernel (6, 6) where this run has (6, 3).
    assert "(6, 6) float32 as variable 2 of model 0" in message and "(6, 3)" in message
    assert "resume=False, overwrite=True" in message
    for old, new in zip(before, smaller.model.get_weights()):
        np.testing.assert_array_equal(old, new)


def test_the_same_model_resumes_with_its_structure_recorded(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=8, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    resumed = trainer()
    history = resumed.fit(x, y, batch_size=8, epochs=2, verbose=0,
                          checkpoint_dir=str(tmp_path))
    assert len(history.history["loss"]) == 1 and int(resumed.counters.epoch) == 1


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A folder on a 96 KiB tmpfs, or, where mounting is not allowed, a write that fails so."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    if not mounted:
        write = tf.train.Checkpoint.write

        def full(self, prefix, *args, **kwargs):
            if str(prefix).startswith(str(folder)):
                raise tf.errors.ResourceExhaustedError(
                    None, None, f"{prefix}; No space left on device " + "x" * 1500)
            return write(self, prefix, *args, **kwargs)

        monkeypatch.setattr(tf.train.Checkpoint, "write", full)
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_is_a_short_checkpoint_error_and_loses_nothing(small_disk):
    x, y = data()
    t = trainer(width=2048)   # 16k weights, 200 KB with Adam's two slots: over 96 KiB
    with pytest.raises(CheckpointError) as caught:
        t.fit(x, y, batch_size=8, epochs=1, verbose=0, checkpoint_dir=str(small_disk))
    message = str(caught.value)
    assert "could not be written to" in message and str(small_disk) in message
    assert "the disk is full" in message and "MiB free" in message
    assert "Fix: free space there" in message
    assert len(message) < 800
    assert caught.value.__cause__ is None     # TensorFlow's long message is not chained
    # Nothing half-written is left, and the model is as trained.
    assert [n for n in os.listdir(small_disk) if n.startswith("ckpt-")] == []
    assert int(t.counters.step) == 4
