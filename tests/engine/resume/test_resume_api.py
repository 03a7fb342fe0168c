"""`fit(checkpoint_dir=...)` in one process: what is saved, refused, reported and restored.

The kill tests (real processes, SIGKILL and SIGTERM) are in test_kills.py.
"""

import json
import os
import warnings
import zlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import ConfigError, CorrectnessWarning
from tapeworks.engine.resume.run_checkpoint import CheckpointError


def data(n=48):
    rng = np.random.RandomState(0)
    x = rng.randn(n, 4).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def trainer(**options):
    """The tests' trainer: a Dropout MLP, seed 1, tf.function one step per call unless told."""
    options = dict(dict(seed=1, jit_compile=False, steps_per_call=1), **options)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return tapeworks.Trainer(model, **options)


def weights(t):
    return [np.asarray(w) for w in t.model.get_weights()]


def saves(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("ckpt-"))


def test_a_second_fit_resumes_where_the_first_left_and_says_so(tmp_path, capsys):
    x, y = data()
    first = trainer()
    first.fit(x, y, batch_size=16, epochs=2, verbose=1, checkpoint_dir=str(tmp_path))
    assert "resumed" not in capsys.readouterr().out
    assert saves(tmp_path) == ["ckpt-000000000003", "ckpt-000000000006"]
    run = json.load(open(tmp_path / "ckpt-000000000006" / "run.json"))
    assert (run["epoch"], run["steps_in_epoch"], run["passes"]) == (2, 0, 2)
    assert run["planner"] == [False, 1]

    # The same command with more epochs: a fresh trainer picks up at epoch 3.
    second = trainer()
    history = second.fit(x, y, batch_size=16, epochs=4, verbose=1,
                         checkpoint_dir=str(tmp_path))
    out = capsys.readouterr().out
    assert "tapeworks: resumed from" in out and "the start of epoch 3" in out
    assert "global step 6" in out
    assert history.epoch == [2, 3]
    assert int(second.counters.step) == 12

    straight = trainer()
    straight.fit(x, y, batch_size=16, epochs=4, verbose=0)
    for a, b in zip(weights(second), weights(straight)):
        np.testing.assert_array_equal(a, b)   # bit for bit, Dropout's draws included


def test_a_finished_run_trains_nothing_when_run_again(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    again = trainer()
    history = again.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    assert history.history == {} and int(again.counters.step) == 6


def test_resume_false_refuses_a_folder_with_checkpoints_unless_overwrite(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    fresh = trainer()
    before = weights(fresh)
    with pytest.raises(ConfigError, match="not empty and resume=False"):
        fresh.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path),
                  resume=False)
    assert saves(tmp_path) == ["ckpt-000000000003"]   # nothing deleted
    for a, b in zip(before, weights(fresh)):
        np.testing.assert_array_equal(a, b)
    fresh.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path),
              resume=False, overwrite=True)
    assert int(fresh.counters.step) == 6   # started over: two whole epochs


def test_a_truncated_latest_falls_back_to_the_one_before_with_a_warning(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    # The largest data file (a traced write may shard the state in two).
    latest = max((tmp_path / "ckpt-000000000006").glob("state.data-*"),
                 key=os.path.getsize)
    with open(latest, "r+b") as f:
        f.truncate(os.path.getsize(latest) // 2)
    resumed = trainer()
    with pytest.warns(CorrectnessWarning, match="ckpt-000000000006 is unusable.*truncated"):
        resumed.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    assert int(resumed.counters.step) == 6   # resumed at 3, trained epoch 2 again


def test_a_folder_where_nothing_loads_is_an_error_and_changes_nothing(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    with open(tmp_path / "ckpt-000000000003" / "state.index", "wb") as f:
        f.write(b"not a checkpoint")
    fresh = trainer()
    fresh.build_state(x, y, batch_size=16)
    before = weights(fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorrectnessWarning)
        with pytest.raises(CheckpointError, match="No checkpoint .* can be loaded: ckpt-000000000003: state.index has 16 bytes"):
            fresh.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    for a, b in zip(before, weights(fresh)):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_another_model_is_refused_and_the_weights_are_put_back(tmp_path):
    x, y = data()
    trainer().fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    keras.utils.set_random_seed(0)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    other.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fresh = tapeworks.Trainer(other, seed=1, jit_compile=False, steps_per_call=1)
    fresh.build_state(x, y, batch_size=16)
    before = [np.asarray(w) for w in other.get_weights()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorrectnessWarning)
        # Refused from the structure its run recorded, before anything is read.
        with pytest.raises(CheckpointError, match="holds a run of another model: "
                           r"ckpt-000000000003 has \(4, 8\) float32 as variable 0"):
            fresh.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    for a, b in zip(before, other.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_keep_and_keep_best(tmp_path):
    x, y = data()
    t = trainer()
    t.fit(x, y, batch_size=16, epochs=5, verbose=0, checkpoint_dir=str(tmp_path),
          checkpoint_every=1, keep=2, keep_best="loss")
    kept = saves(tmp_path)
    runs = {n: json.load(open(tmp_path / n / "run.json")) for n in kept}
    assert kept[-2:] == ["ckpt-000000000014", "ckpt-000000000015"]
    best = [n for n in kept if "monitored" in runs[n]]
    assert len(kept) <= 3 and best
    assert min(runs[n]["monitored"]["loss"] for n in best) == pytest.approx(
        min(t.model.history.history["loss"]))


def test_callbacks_state_is_saved_and_restored(tmp_path):
    x, y = data()
    stop = keras.callbacks.EarlyStopping("loss", patience=5, min_delta=10.0)
    trainer().fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[stop],
                  checkpoint_dir=str(tmp_path))
    assert stop.wait == 2
    saved = json.load(open(tmp_path / "ckpt-000000000009" / "run.json"))["callbacks"]
    assert saved[0]["class"] == "EarlyStopping" and saved[0]["fields"]["wait"] == 2
    again = keras.callbacks.EarlyStopping("loss", patience=5, min_delta=10.0)
    trainer().fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[again],
                  checkpoint_dir=str(tmp_path))
    assert again.wait == 3   # counted on from 2, not from 0 (on_train_begin resets it)
    assert again.best == pytest.approx(stop.best)


def test_csv_logger_continues_with_the_right_epochs(tmp_path):
    x, y = data()
    log = tmp_path / "log.csv"
    trainer().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path / "c"),
                  callbacks=[keras.callbacks.CSVLogger(str(log), append=True)])
    trainer().fit(x, y, batch_size=16, epochs=3, verbose=0, checkpoint_dir=str(tmp_path / "c"),
                  callbacks=[keras.callbacks.CSVLogger(str(log), append=True)])
    epochs = [line.split(",")[0] for line in open(log).read().split("\n")[1:] if line
              and not line.startswith("epoch")]
    assert epochs == ["0", "1", "2"]


def test_backup_and_restore_is_refused_with_checkpoint_dir(tmp_path):
    x, y = data()
    with pytest.raises(ConfigError, match="BackupAndRestore.*checkpoint_dir"):
        trainer().fit(x, y, batch_size=16, verbose=0, checkpoint_dir=str(tmp_path / "c"),
                      callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "b"))])


def test_a_py_function_pipeline_gets_a_clear_error_and_skip_works(tmp_path):
    x, y = data()

    def numpy_noise(features, label):
        noisy = tf.py_function(lambda f: f + 0.0, [features], tf.float32)
        return tf.ensure_shape(noisy, features.shape), label

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).map(numpy_noise).batch(16)
    t = trainer()
    with pytest.raises(ConfigError, match=r"cannot be checkpointed: it runs .*PyFunc.*"
                                          r"checkpoint_data=\"skip\""):
        t.fit(dataset, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    assert saves(tmp_path) == []
    t.fit(dataset, epochs=1, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_data="skip")
    assert saves(tmp_path) == ["ckpt-000000000003"]


def test_a_generator_needs_checkpoint_data_skip(tmp_path):
    x, y = data()

    def batches():
        for i in range(0, 48, 16):
            yield x[i:i + 16], y[i:i + 16]

    with pytest.raises(ConfigError, match="generator.*checkpoint_data=\"skip\""):
        trainer().fit(batches, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    t = trainer()
    t.fit(batches, epochs=2, verbose=0, checkpoint_dir=str(tmp_path), checkpoint_data="skip")
    assert int(t.counters.step) == 6


class NoisyTask(tapeworks.Task):
    def __init__(self, model, use_global):
        super().__init__()
        self.net, self.use_global = model, use_global
        self.add_update("model", loss="loss", trains=model, optimizer="sgd")

    def compute_losses(self, batch, training):
        x, y = batch
        draw = tf.random.normal if self.use_global else self.random.normal
        noise = draw(tf.shape(x))
        return {"loss": tf.reduce_mean(tf.square(self.net(x + noise) - y[:, None]))}


@pytest.mark.parametrize("use_global", [True, False])
def test_a_global_random_op_in_a_task_is_named_under_checkpoint_dir(tmp_path, use_global):
    x, y = data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    t = tapeworks.Trainer(NoisyTask(model, use_global), seed=0, jit_compile=False,
                          steps_per_call=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit((x, y.astype("float32")), batch_size=16, epochs=1, verbose=0,
              checkpoint_dir=str(tmp_path))
    named = [w for w in caught if "tf.random.normal (op RandomStandardNormal)" in str(w.message)]
    assert bool(named) == use_global
    if named:
        assert "self.random.normal(shape)" in str(named[0].message)


def test_the_task_generator_is_seeded_and_checkpointed():
    x, y = data()
    draws = []
    for _ in range(2):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        t = tapeworks.Trainer(NoisyTask(model, False), seed=5, jit_compile=False)
        t.build_state((x, y.astype("float32")), batch_size=16)
        draws.append(t.task.random.normal((3,)).numpy())
        assert t.checkpoint.task_random is t.task.random
    np.testing.assert_array_equal(draws[0], draws[1])   # Trainer(seed=) seeds it


def test_a_keras_model_s_generator_is_made_when_a_checkpoint_asks_seeded_all_the_same(
        monkeypatch):
    # A SupervisedTask never draws from it: made by the checkpoint, not by every fit.
    made = []
    for name in ("from_seed", "from_non_deterministic_state"):
        original = getattr(tf.random.Generator, name)
        monkeypatch.setattr(tf.random.Generator, name, staticmethod(
            lambda *a, _name=name, _original=original, **k: (
                made.append(_name), _original(*a, **k))[1]))
    x, y = data()
    states = []
    for _ in range(2):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        t = tapeworks.Trainer(model, seed=5, jit_compile=False)
        t.fit(x, y.astype("float32"), batch_size=16, epochs=1, verbose=0)
        # Nothing made by this fit: one generator per checkpoint asked for before.
        assert made == ["from_seed"] * len(states)
        states.append(t.checkpoint.task_random.state.numpy())
    np.testing.assert_array_equal(states[0], states[1])
    monkeypatch.undo()
    np.testing.assert_array_equal(states[0], tf.random.Generator.from_seed(5).state.numpy())


def test_resuming_on_other_data_or_another_seed_is_told(tmp_path):
    x, y = data(96)
    t = trainer()
    t.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path),
          checkpoint_every=4)
    # Keep only the mid-epoch save of step 4 (4 batches into the first pass).
    for name in saves(tmp_path):
        if name != "ckpt-000000000004":
            import shutil
            shutil.rmtree(tmp_path / name)
    fewer = trainer()
    before = weights(fewer)
    with pytest.raises(tapeworks.DataSpecError, match="4 batches into a pass.*ends after 3"):
        fewer.fit(x[:48], y[:48], batch_size=16, epochs=2, verbose=0,
                  checkpoint_dir=str(tmp_path))
    for a, b in zip(before, weights(fewer)):   # the restored weights were put back
        np.testing.assert_array_equal(a, b)
    other_seed = trainer(seed=2)
    with pytest.warns(CorrectnessWarning, match="shuffled with seed 1, this trainer with 2"):
        other_seed.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))


def test_keep_best_names_a_metric_that_is_not_logged(tmp_path):
    x, y = data()
    with pytest.warns(CorrectnessWarning, match="keep_best='val_loss' is not among"):
        trainer().fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path),
                      keep_best="val_loss")


def test_the_end_of_the_last_epoch_is_not_run_twice(tmp_path):
    # A save every 3 steps catches the last step before the epoch's end work
    # (validation, epoch callbacks); the end of the run is saved after it, so
    # running the command again trains nothing and logs no epoch twice.
    x, y = data()
    log = tmp_path / "log.csv"
    trainer().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path / "c"),
                  checkpoint_every=3, callbacks=[keras.callbacks.CSVLogger(str(log), append=True)])
    run = json.load(open(tmp_path / "c" / "ckpt-000000000006" / "run.json"))
    assert (run["epoch"], run["steps_in_epoch"]) == (2, 0)
    trainer().fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path / "c"),
                  callbacks=[keras.callbacks.CSVLogger(str(log), append=True)])
    rows = [line for line in open(log).read().splitlines() if line and line[0].isdigit()]
    assert [r.split(",")[0] for r in rows] == ["0", "1"]


def test_a_resumed_auto_run_keeps_the_saved_choice_and_a_fixed_setting_stays_fixed(tmp_path):
    x, y = data(96)   # 6 steps an epoch: steps per call are capped at half an epoch
    first = trainer()
    first.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    run = json.load(open(tmp_path / "ckpt-000000000006" / "run.json"))
    run["planner"] = [False, 2]   # as if "auto" had chosen 2 steps per call
    with open(tmp_path / "ckpt-000000000006" / "run.json", "w") as f:
        json.dump(run, f)
    import tapeworks.engine.resume.run_checkpoint as rc
    folder = rc.CheckpointFolder(tmp_path)
    manifest = json.load(open(tmp_path / "ckpt-000000000006" / "MANIFEST.json"))
    run_json = tmp_path / "ckpt-000000000006" / "run.json"
    # The manifest's format: the file's size, and its CRC-32 (zlib) in 8 hex digits.
    manifest["files"]["run.json"] = {"bytes": os.path.getsize(run_json),
                                     "crc32": f"{zlib.crc32(run_json.read_bytes()):08x}"}
    with open(tmp_path / "ckpt-000000000006" / "MANIFEST.json", "w") as f:
        json.dump(manifest, f)
    assert folder.verify(str(tmp_path / "ckpt-000000000006")) is None
    auto = trainer(jit_compile="auto", steps_per_call="auto", plan_cache=False)
    auto.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    assert (auto.jit_compile, auto.steps_per_call) == (False, 2)
    assert "kept by the checkpoint" in auto.tuning["reason"]
    fixed = trainer()   # jit_compile=False, steps_per_call=1 given
    fixed.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    assert (fixed.jit_compile, fixed.steps_per_call) == (False, 1)


def test_a_saved_pipeline_position_that_does_not_fit_is_refused_and_changes_nothing(tmp_path):
    x, y = data(96)

    def pipeline(extra_map=False):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=3)
        if extra_map:
            dataset = dataset.map(lambda a, b: (a * 2.0, b))
        return dataset.batch(16)

    trainer().fit(pipeline(), epochs=1, verbose=0, checkpoint_dir=str(tmp_path),
                  checkpoint_every=4)
    for name in saves(tmp_path):   # keep the mid-epoch save: an iterator position
        if name != "ckpt-000000000004":
            import shutil
            shutil.rmtree(tmp_path / name)
    other = trainer()
    before = weights(other)
    with pytest.raises(tapeworks.DataSpecError,
                       match="data position in the checkpoint does not fit this pipeline"):
        other.fit(pipeline(extra_map=True), epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    for a, b in zip(before, weights(other)):
        np.testing.assert_array_equal(a, b)
    assert int(other.counters.step) == 0
    # The same pipeline resumes from that position.
    same = trainer()
    same.fit(pipeline(), epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    assert int(same.counters.step) == 6


@pytest.mark.parametrize("asynchronous", [True, False])
def test_asynchronous_and_synchronous_saves_hold_the_same_state(tmp_path, asynchronous):
    x, y = data(96)
    folder = tmp_path / str(asynchronous)
    t = trainer()
    t.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(folder),
          checkpoint_every=2, keep=10, checkpoint_async=asynchronous)
    # fit returns once every save is complete: six saves, none left partial.
    assert saves(folder) == [f"ckpt-{s:012d}" for s in (2, 4, 6, 8, 10, 12)]
    assert [r.step for r in t.checkpoint_saves] == [2, 4, 6, 8, 10, 12]
    assert all(r.publish_seconds is not None for r in t.checkpoint_saves)
    # Each save holds the state at its step: the last one equals the
    # trainer now, and a resumed copy trains on exactly as the original.
    reader = tf.train.load_checkpoint(str(folder / "ckpt-000000000012" / "state"))
    saved = {name: reader.get_tensor(name) for name, _ in
             tf.train.list_variables(str(folder / "ckpt-000000000012" / "state"))
             if "_trainable_variables" in name}
    assert len(saved) == len(t.model.trainable_weights)
    for w in t.model.trainable_weights:
        assert any(np.array_equal(np.asarray(w), v) for v in saved.values())
    # A mid-run save restores the trainer to that step, then trains on equal.
    resumed = trainer()
    import shutil
    for name in saves(folder):
        if name != "ckpt-000000000008":
            shutil.rmtree(folder / name)
    resumed.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(folder))
    for a, b in zip(weights(t), weights(resumed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_save_that_cannot_be_completed_is_an_error_and_loses_nothing(tmp_path, monkeypatch,
                                                                        asynchronous):
    from tapeworks.engine.resume import run_checkpoint
    x, y = data()
    t = trainer()
    t.fit(x, y, batch_size=16, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    kept = saves(tmp_path)
    publish = run_checkpoint.CheckpointFolder.publish

    def disk_full(self, partial, final):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_checkpoint.CheckpointFolder, "publish", disk_full)
    with pytest.raises(CheckpointError, match=r"step 6 .*could not be completed.*No space left"
                                              r".*checkpoints before it are intact"):
        t.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path),
              checkpoint_async=asynchronous)
    monkeypatch.setattr(run_checkpoint.CheckpointFolder, "publish", publish)
    # The earlier checkpoint is as it was; the unpublished one stays partial.
    assert [n for n in saves(tmp_path) if ".partial" not in n] == kept
    assert int(t.counters.step) == 6  # the model is as trained
    # The next start removes the unpublished folder and resumes from step 3.
    again = trainer()
    again.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if ".partial" in n]
    assert int(again.counters.step) == 6
