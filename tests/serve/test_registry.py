"""The registry: atomic publish (SIGKILL halfway), concurrent publishers, promote, rollback, gc,
and the TF Serving config it keeps. Real files, real processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tapeworks.deploy import Registry, RegistryError
from tapeworks.serve.config import Source, parse_model_config
from tests.serve.saved_models import scaled


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("exported")
    return {k: scaled(str(base / f"k{k}"), k) for k in (1, 2, 3)}


def test_publish_promote_rollback_and_the_tf_serving_config(tmp_path, exported):
    registry = Registry(tmp_path)
    first = registry.publish("scaled", exported[1], label="v1", metrics={"mse": 0.5},
                             checkpoint="runs/a/ckpt-12", promote=True)
    assert (first.version, registry.current("scaled")) == (1, 1)
    assert first.signatures["serving_default"] == {
        "inputs": {"x": {"dtype": "float32", "shape": [None, 3]}},
        "outputs": {"y": {"dtype": "float32", "shape": [None, 3]}}}
    second = registry.publish("scaled", exported[2], label="v2")
    assert second.version == 2 and registry.current("scaled") == 1   # published, not promoted
    assert registry.show("scaled", 2).label == "v2"
    assert registry.show("scaled").metrics == {"mse": 0.5}
    assert registry.show("scaled").checkpoint == "runs/a/ckpt-12"
    assert registry.promote("scaled", 2) == 1
    assert registry.publish("scaled", exported[3], promote=True).version == 3
    # The config TF Serving reads pins the current version, parsed by protobuf.
    config = parse_model_config((tmp_path / "models.config").read_text())
    assert config == [("scaled", str(tmp_path / "scaled"), ("specific", [3]), {})]
    # TF Serving's own ModelServerConfig message (tensorflow-serving-api) reads it too.
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    theirs = text_format.Parse((tmp_path / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    (model,) = theirs.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == (
        "scaled", str(tmp_path / "scaled"), "tensorflow")
    assert list(model.model_version_policy.specific.versions) == [3]
    assert registry.rollback("scaled") == 2 and registry.rollback("scaled") == 1
    with pytest.raises(RegistryError, match="no previous current version to roll back to"):
        registry.rollback("scaled")
    actions = [(e["action"], e["from"], e["to"]) for e in registry.history("scaled")]
    assert actions == [("publish", None, 1), ("promote", None, 1), ("publish", None, 2),
                       ("promote", 1, 2), ("publish", None, 3), ("promote", 2, 3),
                       ("rollback", 3, 2), ("rollback", 2, 1)]
    # The hash covers the SavedModel's files; a version folder is what TF Serving loads.
    assert len(first.sha256) == 64 and os.path.isfile(tmp_path / "scaled" / "1" /
                                                      "saved_model.pb")
    plan = Source(str(tmp_path)).plan()["scaled"]
    assert (plan.versions, plan.current, plan.labels) == ({1: "1"}, 1, {"v1": 1})


def test_gc_keeps_the_newest_the_current_and_the_previous(tmp_path, exported):
    registry = Registry(tmp_path)
    for k in (1, 2, 3, 1, 2):
        registry.publish("scaled", exported[k])
    registry.promote("scaled", 1)
    registry.promote("scaled", 2)   # current 2, previous 1
    assert registry.gc("scaled", keep=1) == [3, 4]
    assert [v.version for v in registry.versions("scaled")] == [1, 2, 5]
    assert registry.rollback("scaled") == 1
    # After the rollback, 2 is where an undo goes: kept with 1 (current) and 5 (newest).
    assert registry.gc("scaled", keep=1) == []
    with pytest.raises(RegistryError, match="`keep` must be an integer >= 1"):
        registry.gc("scaled", keep=0)
    with pytest.raises(RegistryError, match="No model 'other'"):
        registry.gc("other", keep=1)
    registry.publish("unpromoted", exported[1])
    with pytest.raises(RegistryError, match="'unpromoted' has no current version.*\\[1\\]"):
        registry.show("unpromoted")


def test_bad_names_and_sources_are_refused_and_nothing_is_written(tmp_path, exported):
    registry = Registry(tmp_path)
    for name in ("../evil", "a/b", "/abs", "..", ""):
        with pytest.raises(RegistryError, match="Invalid model name"):
            registry.publish(name, exported[1])
    with pytest.raises(RegistryError, match="not a SavedModel folder"):
        registry.publish("scaled", str(tmp_path))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a protocol buffer")
    with pytest.raises(RegistryError, match="is not a SavedModel that loads.*Nothing was "
                                            "published"):
        registry.publish("scaled", str(broken))
    with pytest.raises(RegistryError, match="No model 'scaled' .no version of it.*Expected "
                                            "one of: \\[\\]"):
        registry.promote("scaled", 7)
    assert registry.versions("scaled") == [] and not (tmp_path / "models.config").exists()
    assert os.listdir(tmp_path / "scaled" / ".tapeworks") == []   # no incoming-* left


def _publish_command(root, name, path, *extra):
    return [sys.executable, "-m", "tapeworks.cli", "registry", "--root", str(root), "publish",
            name, path, *extra]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_concurrent_publishers_get_distinct_versions(tmp_path, exported):
    processes = [subprocess.Popen(_publish_command(tmp_path, "scaled", exported[k]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for k in (1, 2)]
    outputs = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    registry = Registry(tmp_path)
    versions = registry.versions("scaled")
    assert [v.version for v in versions] == [1, 2]
    assert {v.source for v in versions} == {exported[1], exported[2]}   # neither lost


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_publisher_killed_halfway_leaves_no_version(tmp_path, exported):
    from tests.serve.server_process import Server

    registry = Registry(tmp_path)
    registry.publish("scaled", exported[1], promote=True)
    before = (tmp_path / "models.config").read_text()
    server = Server(str(tmp_path), "--poll-seconds", "0.1")   # polls all along
    process = subprocess.Popen(_publish_command(tmp_path, "scaled", exported[2], "--promote"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meta = tmp_path / "scaled" / ".tapeworks"
    deadline = time.monotonic() + 60
    while not any(n.startswith("incoming-") for n in os.listdir(meta)):
        assert process.poll() is None and time.monotonic() < deadline, "publish never started"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)   # copying, hashing or loading: mid-way
    process.wait()
    time.sleep(0.5)                        # a few polls of the registry
    try:
        assert server.get("/healthz")[1]["models"] == {
            "scaled": {"default_version": 1, "versions": [1], "failures": {}}}
        status, body, headers = server.post("/v1/models/scaled:predict",
                                            {"instances": [[1.0, 1.0, 1.0]]})
        assert (status, headers["X-Model-Version"]) == (200, "1")
    finally:
        server.stop()
    assert [v.version for v in registry.versions("scaled")] == [1]
    assert registry.current("scaled") == 1
    assert (tmp_path / "models.config").read_text() == before
    # The abandoned copy is not a version; gc removes it (its process is dead).
    assert any(n.startswith("incoming-") for n in os.listdir(meta))
    registry.gc("scaled", keep=5)
    assert not any(n.startswith("incoming-") for n in os.listdir(meta))
    assert registry.publish("scaled", exported[2]).version == 2


def test_cli_lists_shows_and_refuses_with_exit_status_1(tmp_path, exported, capsys):
    from tapeworks import cli

    registry = Registry(tmp_path)
    registry.publish("scaled", exported[1], label="v1", promote=True)
    assert cli.main(["registry", "--root", str(tmp_path), "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"name": "scaled", "current": 1, "versions": [1]}]
    assert cli.main(["registry", "--root", str(tmp_path), "show", "scaled"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["version"], shown["label"], shown["current"]) == (1, "v1", True)
    assert cli.main(["registry", "--root", str(tmp_path), "promote", "scaled", "9"]) == 1
    assert "has no version 9" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_keras_file_is_exported_verified_and_published(tmp_path, capsys):
    import keras

    from tapeworks import cli

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="out")])
    model.save(tmp_path / "model.keras")
    assert cli.main(["registry", "--root", str(tmp_path / "models"), "publish", "m",
                     str(tmp_path / "model.keras"), "--promote"]) == 0
    info = Registry(tmp_path / "models").show("m")
    assert info.version == 1 and info.source is None
    assert info.signatures["serving_default"]["outputs"] == {
        "output_0": {"dtype": "float32", "shape": [None, 2]}}
    (tmp_path / "lambda.keras").write_bytes(b"not a zip")
    assert cli.main(["registry", "--root", str(tmp_path / "models"), "publish", "m",
                     str(tmp_path / "lambda.keras")]) == 1
    assert "does not load as a Keras model with safe_mode=True" in capsys.readouterr().err
    assert [v.version for v in Registry(tmp_path / "models").versions("m")] == [1]
