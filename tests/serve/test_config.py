"""What to serve: TF Serving's model config (parsed by protobuf), base paths, registry roots."""

import pytest

from tapeworks.deploy import Registry
from tapeworks.serve.config import ServingConfigError, Source
from tapeworks.serve.server import add_arguments, settings_from


def versions(base, *names):
    for name in names:
        (base / name).mkdir(parents=True)
        (base / name / "saved_model.pb").write_bytes(b"")


def test_tf_serving_model_config_policies_and_labels(tmp_path):
    versions(tmp_path / "a", "1", "2", "0003", "notes")
    versions(tmp_path / "b", "1", "2")
    config = tmp_path / "models.config"
    config.write_text(f"""
model_config_list {{
  config {{ name: "a" base_path: "{tmp_path / 'a'}" model_platform: "tensorflow"
           model_version_policy {{ latest {{ num_versions: 2 }} }} }}
  config {{ name: "b" base_path: "{tmp_path / 'b'}"
           model_version_policy {{ specific {{ versions: 1 versions: 7 }} }}
           version_labels {{ key: "stable" value: 1 }} }}
  config {{ name: "c" base_path: "{tmp_path / 'a'}" model_version_policy {{ all {{}} }} }}
}}""")
    plans = Source(model_config_file=str(config)).plan()
    assert (plans["a"].versions, plans["a"].current) == ({2: "2", 3: "0003"}, 3)
    assert (plans["b"].versions, plans["b"].labels) == ({1: "1"}, {"stable": 1})
    assert sorted(plans["c"].versions) == [1, 2, 3]


@pytest.mark.parametrize("text, message", [
    ("model_config_list { config { name: 'x' bogus: 1 } }", "not a TensorFlow Serving model "
                                                            "config"),
    ("model_config_list { config { name: '../x' base_path: '/tmp' } }", "cannot be served"),
    ("model_config_list { config { name: 'x' base_path: '/tmp' model_platform: 'onnx' } }",
     "only \"tensorflow\""),
])
def test_bad_configs_are_refused_with_the_reason(tmp_path, text, message):
    config = tmp_path / "models.config"
    config.write_text(text)
    with pytest.raises(ServingConfigError, match=message):
        Source(model_config_file=str(config)).plan()


def test_a_registry_root_serves_current_only_and_nothing_outside_it(tmp_path):
    versions(tmp_path / "registry" / "m", "1", "2")
    (tmp_path / "registry" / ".tapeworks.lock").write_text("")
    assert Source(str(tmp_path / "registry")).plan() == {}   # nothing promoted yet
    (tmp_path / "registry" / "models.config").write_text(
        "model_config_list { config { name: 'm' base_path: '/etc' } }")
    with pytest.raises(ServingConfigError, match="outside the served root"):
        Source(str(tmp_path / "registry")).plan()
    # A plain folder of TF Serving model folders: each at its latest version.
    versions(tmp_path / "plain" / "m", "1", "2")
    assert Source(str(tmp_path / "plain")).plan()["m"].versions == {2: "2"}
    assert Registry(tmp_path / "plain").models() == ["m"]


def test_tf_serving_flags_move_over(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--port=8500", "--rest_api_port=8601", "--model_name=m",
                              f"--model_base_path={tmp_path}", "--enable_batching=false",
                              "--file_system_poll_wait_seconds=3"])
    port, source, settings, poll, grpc_port = settings_from(args)
    assert (port, poll, settings.max_batch_size, grpc_port) == (8601, 3.0, 0, 8500)
    assert source["model_name"] == "m" and source["model_base_path"] == str(tmp_path)
    with pytest.raises(ServingConfigError, match="Serve one of"):
        Source(str(tmp_path), model_config_file=str(tmp_path / "x"))


def test_the_built_in_messages_read_what_tf_servings_own_read(tmp_path, monkeypatch):
    """The subset built without tensorflow-serving-api gives the same plan as TF Serving's."""
    from tapeworks.serve import config as config_module

    versions(tmp_path / "m", "1", "2")
    text = f"""model_config_list {{ config {{
        name: "m" base_path: "{tmp_path / 'm'}" model_platform: "tensorflow"
        model_version_policy {{ specific {{ versions: 1 }} }}
        version_labels {{ key: "stable" value: 1 }} }} }}"""
    with_theirs = config_module.parse_model_config(text)
    built_in = config_module.builtin_model_server_config()
    assert config_module.parse_model_config(text, message_class=built_in) == with_theirs == [
        ("m", str(tmp_path / "m"), ("specific", [1]), {"stable": 1})]
