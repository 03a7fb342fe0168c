"""The registry loses nothing and leaks nothing: version numbers never come back, links out of a
source are refused, files follow the umask, graphs that act on load are refused before they
load. Real files, real SavedModels."""

import json
import os
import shutil
import stat

import pytest
import tensorflow as tf

from tapeworks.deploy import Registry, RegistryError
from tapeworks.deploy.graph_ops import UnsafeGraphError, outside_ops
from tapeworks.serve.servable import Servable
from tests.serve.saved_models import scaled


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("exported")
    return {k: scaled(str(base / f"k{k}"), k) for k in (1, 2)}


def writes_on_load(path, marker):
    """A TF1 SavedModel whose init op (main_op) writes `marker` when it is loaded."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        x = v1.placeholder(tf.float32, [None], name="x")
        y = tf.identity(x * 2.0, name="y")
        write = v1.io.write_file(marker, "written on load", name="leak")
        signature = v1.saved_model.signature_def_utils.predict_signature_def({"x": x}, {"y": y})
        builder = v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(session, ["serve"], main_op=write,
                                             signature_def_map={"serving_default": signature})
        builder.save()
    return path


def test_a_version_number_is_never_used_twice(tmp_path, exported):
    registry = Registry(tmp_path)
    for k in (1, 2, 1, 2):
        registry.publish("scaled", exported[k], promote=True)
    shutil.rmtree(tmp_path / "scaled" / "4")   # removed by hand
    assert registry.publish("scaled", exported[1]).version == 5
    assert registry.gc("scaled", keep=1) == [1, 2]
    assert registry.publish("scaled", exported[1]).version == 6
    assert json.loads((tmp_path / "scaled" / ".tapeworks" / "model.json").read_text())[
        "highest"] == 6


def test_links_out_of_the_source_are_refused_by_name(tmp_path, exported):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not publish")
    source = tmp_path / "model"
    shutil.copytree(exported[1], source)
    (source / "assets").mkdir(exist_ok=True)
    os.symlink(secret, source / "assets" / "notes.txt")
    registry = Registry(tmp_path / "registry")
    with pytest.raises(RegistryError, match=r"assets/notes.txt -> .*secret.txt \(outside the "
                                            r"folder\).*Nothing was published"):
        registry.publish("scaled", source)
    assert registry.versions("scaled") == []
    # A link that stays inside is copied as the file it points to.
    os.unlink(source / "assets" / "notes.txt")
    (source / "assets" / "real.txt").write_text("inside")
    os.symlink("real.txt", source / "assets" / "notes.txt")
    info = registry.publish("scaled", source)
    copied = os.path.join(info.path, "assets", "notes.txt")
    assert not os.path.islink(copied) and open(copied).read() == "inside"
    # A folder linking to its own parent: a loop, refused.
    os.symlink("..", source / "assets" / "up")
    with pytest.raises(RegistryError, match=r"assets/up -> \.\. \(a loop\)"):
        registry.publish("scaled", source)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_files_follow_the_umask(tmp_path, exported, umask, mode):
    before = os.umask(umask)
    try:
        registry = Registry(tmp_path)
        info = registry.publish("scaled", exported[1], promote=True)
    finally:
        os.umask(before)
    for path in (tmp_path / "models.config", tmp_path / "scaled" / ".tapeworks" / "model.json",
                 os.path.join(info.path, "tapeworks-version.json")):
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, path


def test_a_graph_that_writes_a_file_on_load_is_refused_before_it_loads(tmp_path):
    marker = tmp_path / "written"
    model = writes_on_load(str(tmp_path / "leaky"), str(marker))
    assert [op for op, _ in outside_ops(model)] == ["WriteFile"]
    registry = Registry(tmp_path / "registry")
    with pytest.raises(RegistryError, match=r"WriteFile at node 'leak' of the graph .*"
                                            r"allow_ops=\['WriteFile'\].*Nothing was published"):
        registry.publish("leaky", model)
    with pytest.raises(UnsafeGraphError, match="WriteFile"):
        Servable("leaky", 1, model)   # `tapeworks serve` refuses it the same way
    assert not marker.exists() and registry.versions("leaky") == []
    # Told otherwise, it is published (and its init op runs when it loads).
    assert registry.publish("leaky", model, allow_ops=["WriteFile"]).version == 1
    assert marker.read_text() == "written on load"


def test_savers_own_checkpoint_ops_are_not_flagged(exported):
    assert outside_ops(exported[1]) == []
