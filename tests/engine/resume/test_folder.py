"""The checkpoint folder on its own: atomic saves, manifests, retention, `checkpoint_every`."""

import json
import os

import pytest

from tapeworks import ConfigError
from tapeworks.engine.resume.checkpoint_folder import CheckpointFolder
from tapeworks.engine.resume.run_checkpoint import Every, parse_every


def write(text):
    def files(folder):
        with open(os.path.join(folder, "state"), "w") as f:
            f.write(text)
        with open(os.path.join(folder, "run.json"), "w") as f:
            json.dump({"text": text}, f)
    return files


def test_a_save_is_complete_checked_and_named_by_step(tmp_path):
    folder = CheckpointFolder(tmp_path, keep=5)
    path = folder.save(12, write("weights"))
    assert os.path.basename(path) == "ckpt-000000000012"
    assert folder.complete() == [(12, path)]
    assert folder.verify(path) is None
    manifest = json.load(open(os.path.join(path, "MANIFEST.json")))
    assert set(manifest["files"]) == {"state", "run.json"}
    assert manifest["files"]["state"]["bytes"] == len("weights")


def test_truncated_corrupt_missing_and_unfinished_saves_are_told_apart(tmp_path):
    folder = CheckpointFolder(tmp_path, keep=5)
    truncated = folder.save(1, write("0123456789"))
    with open(os.path.join(truncated, "state"), "r+") as f:
        f.truncate(4)
    assert "has 4 bytes, 10 were written (truncated" in folder.verify(truncated)
    corrupt = folder.save(2, write("0123456789"))
    with open(os.path.join(corrupt, "state"), "w") as f:
        f.write("9876543210")
    assert "does not match its checksum" in folder.verify(corrupt)
    missing = folder.save(3, write("x"))
    os.remove(os.path.join(missing, "state"))
    assert folder.verify(missing) == "state is missing"
    unfinished = folder.save(4, write("x"))
    os.remove(os.path.join(unfinished, "MANIFEST.json"))
    assert "did not finish" in folder.verify(unfinished)


def test_an_interrupted_save_leaves_only_a_partial_folder_which_is_removed(tmp_path):
    folder = CheckpointFolder(tmp_path, keep=5)
    folder.save(1, write("good"))

    def dies(path):
        write("half")(path)
        raise KeyboardInterrupt   # a kill in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        folder.save(2, dies)
    assert [step for step, _ in folder.complete()] == [1]   # the half save is not a checkpoint
    assert len(folder.partials()) == 1
    assert folder.remove_partials() == 1 and folder.partials() == []


def test_retention_keeps_the_newest_and_the_best(tmp_path):
    folder = CheckpointFolder(tmp_path, keep=2)
    paths = [folder.save(step, write(str(step))) for step in (1, 2, 3, 4)]
    folder.retain(best=paths[0])
    assert [step for step, _ in folder.complete()] == [1, 3, 4]


def test_the_run_seed_is_made_once(tmp_path):
    folder = CheckpointFolder(tmp_path)
    assert folder.seed(lambda: 1234) == 1234
    assert folder.seed(lambda: 99) == 1234


@pytest.mark.parametrize("value, expected", [
    (100, Every(steps=100)), ("epoch", Every(epoch=True)), ("10min", Every(seconds=600.0)),
    ("90s", Every(seconds=90.0)), ("1.5h", Every(seconds=5400.0)), ("2 hours", Every(seconds=7200.0)),
])
def test_checkpoint_every(value, expected):
    assert parse_every(value) == expected


@pytest.mark.parametrize("bad", [0, -5, 2.5, "often", "10 parsecs", True, "0s", None])
def test_checkpoint_every_refuses_anything_else(bad):
    with pytest.raises(ConfigError, match="checkpoint_every"):
        parse_every(bad)


def test_when_a_save_is_due(tmp_path, monkeypatch):
    from tapeworks.engine.resume import run_checkpoint

    now = {"t": 1000.0}
    monkeypatch.setattr(run_checkpoint.time, "monotonic", lambda: now["t"])
    by_steps = run_checkpoint.RunCheckpointer(tmp_path / "a", every=100)
    assert not by_steps.due_after_call(99)
    assert by_steps.due_after_call(100) and by_steps.due_after_call(130)

    def write_state(prefix):
        with open(prefix, "w") as f:
            f.write("state")

    # A save at step 130: the next is due at step 200 (every 100 steps, counted from 0).
    by_steps.save(130, {"epoch": 0, "steps_in_epoch": 130, "data": "replay"},
                  write_state=write_state, write_data=None, callbacks=[])
    assert not by_steps.due_after_call(199) and by_steps.due_after_call(205)
    by_time = run_checkpoint.RunCheckpointer(tmp_path / "b", every="10min")
    now["t"] += 599
    assert not by_time.due_after_call(10**6)
    now["t"] += 1
    assert by_time.due_after_call(1)
    by_epoch = run_checkpoint.RunCheckpointer(tmp_path / "c")
    assert not by_epoch.due_after_call(10**6) and by_epoch.due_after_epoch()
    by_epoch.preemption.signal = 15   # SIGTERM arrived: save after this call
    assert by_epoch.due_after_call(1)


def test_a_step_saved_again_replaces_the_old_save_only_once_the_new_one_is_in_place(tmp_path):
    folder = CheckpointFolder(tmp_path, keep=5)
    path = folder.save(6, write("mid-epoch"))
    folder.save(6, write("end of run"))
    assert open(os.path.join(path, "state")).read() == "end of run"
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000006"]
    # A kill between the two renames: the old one set aside, the new one not in place.
    os.rename(path, path + ".replaced-123")
    os.makedirs(path + ".partial-123")
    folder.remove_partials()
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000006"]
    assert folder.verify(path) is None


@pytest.mark.parametrize("options, message", [
    (dict(keep=0), "`keep` must be an integer >= 1"),
    (dict(keep_best=3), "`keep_best` must be None or the name of a logged metric"),
])
def test_bad_retention_options_are_refused(tmp_path, options, message):
    from tapeworks.engine.resume import run_checkpoint

    with pytest.raises(ConfigError, match=message):
        run_checkpoint.RunCheckpointer(tmp_path, **options)
    assert not os.path.exists(tmp_path / "ckpt-000000000001")


def test_bad_checkpoint_data_is_refused():
    from tapeworks.engine.inputs import data_position

    with pytest.raises(ConfigError, match='`checkpoint_data` must be "auto" or "skip"'):
        data_position.data_mode(None, "sometimes")
