"""The plan cache: round trip, corruption, concurrent writers, and the Trainer using it."""

import json
import multiprocessing
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import tapeworks
from tapeworks.engine.plan.plan_cache import PlanCache
from tests.engine import models, plan_writers


def test_round_trip(tmp_path):
    cache = PlanCache(str(tmp_path))
    assert cache.get("abc") is None
    cache.put("abc", "update", 14, "measured", {"models": ["m"]})
    plan = cache.get("abc")
    assert (plan["jit_compile"], plan["steps_per_call"]) == ("update", 14)
    assert [key for key, _ in cache.entries()] == ["abc"]
    assert cache.clear() == 1 and cache.get("abc") is None


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": 1, "jit_compile": "maybe", '
                                     '"steps_per_call": 3}', ""])
def test_a_corrupt_entry_is_ignored_removed_and_rebuilt(tmp_path, content):
    cache = PlanCache(str(tmp_path))
    os.makedirs(cache.folder, exist_ok=True)
    path = os.path.join(cache.folder, "abc.json")
    with open(path, "w") as f:
        f.write(content)
    assert cache.get("abc") is None
    assert not os.path.exists(path)
    cache.put("abc", False, 4, "measured", {})
    assert cache.get("abc")["steps_per_call"] == 4


@pytest.mark.multiprocess
def test_concurrent_writers_never_leave_half_a_file(tmp_path):
    folder = str(tmp_path)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=plan_writers.write_many, args=(folder, w)) for w in range(3)]
    for writer in writers:
        writer.start()
    cache = PlanCache(folder)
    reads = 0
    while any(w.is_alive() for w in writers):
        plan = cache.get("shared")
        if plan is not None:
            reads += 1
            assert plan["reason"] == "race"   # a whole plan, from one writer
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    final = cache.get("shared")
    assert final["steps_per_call"] == 200 and final["what"]["worker"] in (0, 1, 2)   # a last write
    assert [n for n in os.listdir(cache.folder) if n.endswith(".tmp")] == []


def _trainer(folder, **options):
    return tapeworks.Trainer(models.sequential(), "sgd", "mse", seed=0, plan_cache=folder,
                             **options)


def _measured(folder, x, y):
    """A trainer that fitted until "auto" chose (and stored) its plan."""
    trainer = _trainer(folder)
    for _ in range(20):
        trainer.fit((x, y), batch_size=10, epochs=2, verbose=0)
        if not trainer.tuning["reason"] == "still measuring":
            break
    return trainer


def test_a_second_run_starts_in_the_stored_plan(tmp_path):
    x, y = models.regression_data(n=400)
    first = _measured(str(tmp_path), x, y)
    chosen = (first.tuning["jit_compile"], first.tuning["steps_per_call"])
    assert not first.tuning["from_cache"]
    second = _trainer(str(tmp_path))
    second.fit((x, y), batch_size=10, epochs=1, verbose=0)
    assert second.tuning["from_cache"]
    assert (second.jit_compile, second.steps_per_call) == chosen
    assert second.tuning["measured"] == {}   # nothing measured
    # Another batch size is another plan.
    third = _trainer(str(tmp_path))
    third.fit((x, y), batch_size=20, epochs=1, verbose=0)
    assert not third.tuning["from_cache"]


def test_plan_cache_false_and_the_environment_switch(tmp_path, monkeypatch):
    x, y = models.regression_data(n=400)
    monkeypatch.setenv("TAPEWORKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TAPEWORKS_PLAN_CACHE", "1")
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False,
                                steps_per_call="auto", plan_cache=False)
    for _ in range(10):
        trainer.fit((x, y), batch_size=10, epochs=2, verbose=0)
    assert not os.path.exists(os.path.join(str(tmp_path), "plans"))
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False)
    for _ in range(10):
        trainer.fit((x, y), batch_size=10, epochs=2, verbose=0)
        if trainer.tuning["jit_compile"] is not None:
            break
    assert len(os.listdir(os.path.join(str(tmp_path), "plans"))) == 1


def test_deterministic_auto_repeats_a_fixed_mode_run():
    x, y = models.regression_data(n=400)
    losses = []
    for options in (dict(deterministic=True), dict(jit_compile=False, steps_per_call=1)):
        keras.utils.set_random_seed(0)
        trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", seed=0, **options)
        history = trainer.fit((x, y), batch_size=10, epochs=3, verbose=0)
        losses.append(history.history["loss"])
        assert trainer.jit_compile is False
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    with pytest.raises(tapeworks.ConfigError, match="deterministic"):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", deterministic=True, jit_compile=True)


def test_progress_line_shows_the_tuning_state_and_the_choice_once(capsys):
    x, y = models.regression_data(n=40)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse")
    # A first fit of 4 steps runs them one call each, measuring nothing
    # (`CallLoop.few_steps_left`); the next fit measures.
    trainer.fit((x, y), batch_size=10, epochs=1, verbose=2)
    assert "tuning" not in capsys.readouterr().out
    trainer.fit((x, y), batch_size=10, epochs=1, verbose=2)
    assert "tuning 1/3" in capsys.readouterr().out
    for _ in range(60):
        trainer.fit((x, y), batch_size=10, epochs=1, verbose=2)
        if trainer.tuning["jit_compile"] is not None:
            break
    trainer.fit((x, y), batch_size=10, epochs=1, verbose=2)
    out = capsys.readouterr().out
    assert out.count("tapeworks: jit_compile=") == 1


def test_cache_cli_show_and_clear(tmp_path):
    PlanCache(os.path.join(str(tmp_path), "plans")).put(
        "k1", True, 12, "XLA measured fastest", {"models": ["net"], "batch": [32, "x"]})
    PlanCache(os.path.join(str(tmp_path), "plans")).put(
        "k2", False, 8, "tf.function measured fastest", {"models": ["small"]},
        memory={"waiting": ["update"], "steps_seen": 640, "calls": [], "start_seconds": [],
                "reference_batch": 32})
    compiled = tmp_path / "xla" / "machine"   # an executable TensorFlow saved
    compiled.mkdir(parents=True)
    (compiled / "xla_compile_cache__1__2__XLA_CPU_JIT.pb").write_bytes(b"\x0a\x02ab")
    env = dict(os.environ, TAPEWORKS_CACHE_DIR=str(tmp_path))
    # `cache show` needs no TensorFlow (whose import takes about 10 s here).
    show = subprocess.run([sys.executable, "-c", "import sys; from tapeworks import cli; "
                           "rc = cli.main(['cache', 'show']); "
                           "print('tensorflow imported:', 'tensorflow' in sys.modules); "
                           "sys.exit(rc)"], capture_output=True, text=True, env=env)
    assert show.returncode == 0, show.stderr
    assert "tensorflow imported: False" in show.stdout
    assert "1 XLA executable (0.0 MiB)" in show.stdout
    assert "k1" in show.stdout and "jit_compile=True" in show.stdout
    assert "not tried yet: XLA update (after 640 steps" in show.stdout
    listed = json.loads(subprocess.run(
        [sys.executable, "-m", "tapeworks.cli", "cache", "show", "--json"],
        capture_output=True, text=True, env=env).stdout)
    assert {e["key"] for e in listed} == {"k1", "k2"}
    clear = subprocess.run([sys.executable, "-m", "tapeworks.cli", "cache", "clear"],
                           capture_output=True, text=True, env=env)
    assert clear.returncode == 0 and "2 plans" in clear.stdout
    assert "1 XLA executable from" in clear.stdout and not list(compiled.iterdir())
    assert PlanCache(os.path.join(str(tmp_path), "plans")).entries() == []


def test_a_plan_with_modes_still_waiting_counts_the_steps_of_each_run(tmp_path):
    # 40 steps per epoch of a tiny model: far too few to repay an XLA start,
    # so the plan is stored with the XLA modes waiting; each run that uses it
    # adds its steps, so that a script run often enough tries them.
    x, y = models.regression_data(n=400)
    first = _trainer(str(tmp_path))
    for _ in range(20):
        first.fit((x, y), batch_size=10, epochs=2, verbose=0)
        if first.tuning["jit_compile"] is not None:
            break
    assert first.tuning["jit_compile"] is False and first.tuning["waiting_to_try"]
    first.fit((x, y), batch_size=10, epochs=1, verbose=0)   # the count follows every fit
    trained = int(first.counters.step)
    (key, plan), = PlanCache(str(tmp_path)).entries()
    assert plan["memory"]["steps_seen"] == trained
    assert set(plan["memory"]["waiting"]) == {True, "update"}
    assert plan["reason"] == first.tuning["reason"]

    second = _trainer(str(tmp_path))
    second.fit((x, y), batch_size=10, epochs=1, verbose=0)
    assert second.tuning["from_cache"] and second.tuning["steps_of_earlier_runs"] == trained
    assert second.tuning["measured"] == {}
    (_, plan), = PlanCache(str(tmp_path)).entries()
    assert plan["memory"]["steps_seen"] == trained + 40
    assert plan["reason"] == first.tuning["reason"]   # the measuring run's reason, kept


GOOD = {"format": 1, "jit_compile": False, "steps_per_call": 4, "reason": "measured",
        "what": {}}


@pytest.mark.parametrize("change, says", [
    ({"steps_per_call": 0}, "steps_per_call=0"),
    ({"steps_per_call": -3}, "steps_per_call=-3"),
    ({"steps_per_call": 100_000}, "steps_per_call=100000"),
    ({"steps_per_call": "4"}, "steps_per_call='4'"),
    ({"steps_per_call": True}, "steps_per_call=True"),
    ({"steps_per_call": 4.0}, "steps_per_call=4.0"),
    ({"jit_compile": 1}, "jit_compile=1"),
    ({"jit_compile": "xla"}, "jit_compile='xla'"),
    ({"jit_compile": None}, "jit_compile=None"),
    ({"reason": None}, "reason=None"),
    ({"format": 2}, "format 2"),
    ({"memory": {"waiting": ["update"], "calls": [[False, 0, 1.0, 1.0]],
                 "start_seconds": [[False, 1.0]], "reference_batch": 10, "steps_seen": 5}},
     "memory"),
    ({"memory": {"waiting": ["warp"], "calls": [], "start_seconds": [],
                 "reference_batch": 10, "steps_seen": 5}}, "memory"),
    ({"memory": {"waiting": [True], "calls": [[False, 4, "x", 1.0]],
                 "start_seconds": [[False, 1.0]], "reference_batch": 10, "steps_seen": 5}},
     "memory"),
    ({"memory": [1, 2]}, "memory"),
])
def test_every_field_read_from_disk_is_checked(tmp_path, change, says):
    cache = PlanCache(str(tmp_path))
    os.makedirs(cache.folder, exist_ok=True)
    path = os.path.join(cache.folder, "abc.json")
    with open(path, "w") as f:
        json.dump(dict(GOOD, **change), f)
    with pytest.warns(tapeworks.TapeworksWarning, match=f"ignoring the plan cache entry "
                      f".*abc.json: .*{re.escape(says)}"):
        assert cache.get("abc") is None
    assert not os.path.exists(path)
    with open(path, "w") as f:
        json.dump(GOOD, f)
    assert cache.get("abc")["steps_per_call"] == 4


def test_a_trainer_given_an_invalid_stored_plan_measures_again(tmp_path):
    x, y = models.regression_data(n=400)
    _measured(str(tmp_path), x, y)
    [name] = [n for n in os.listdir(tmp_path) if n.endswith(".json")]
    with open(tmp_path / name) as f:
        stored = json.load(f)
    stored["steps_per_call"] = 0
    with open(tmp_path / name, "w") as f:
        json.dump(stored, f)
    second = _trainer(str(tmp_path))
    with pytest.warns(tapeworks.TapeworksWarning, match="steps_per_call=0"):
        second.fit((x, y), batch_size=10, epochs=1, verbose=0)
    assert not second.tuning["from_cache"]
    assert second.steps_per_call >= 1
