"""What an export killed mid-way leaves beside its path is removed by the next export or `gc`.

An export writes `.NAME.partial-PID` (and, while it swaps a folder in,
`.NAME.old-PID`) beside its path; a kill leaves them. A real killed process's
PID names them here; a live writer's are kept, and so is anything not named so.
"""

import os
import subprocess
import sys

from tapeworks import fileio
from tapeworks.deploy import Registry, export
from tests.deploy.test_export import sequential


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def leftovers(folder, pid):
    made = [folder / f".model.partial-{pid}", folder / f".model.old-{pid}",
            folder / f".model.tflite.partial-{pid}.tflite"]
    made[0].mkdir()
    (made[0] / "saved_model.pb").write_bytes(b"half")
    made[1].mkdir()
    made[2].write_bytes(b"half")
    return made


def test_only_dead_writers_leftovers_are_removed(tmp_path):
    dead = leftovers(tmp_path, dead_pid())
    live = tmp_path / f".other.partial-{os.getpid()}"
    live.mkdir()
    users = [tmp_path / "results.old-2024", tmp_path / ".cache.partial"]
    for path in users:
        path.mkdir()
    removed = fileio.remove_abandoned(str(tmp_path))
    assert sorted(removed) == sorted(p.name for p in dead)
    assert not any(p.exists() for p in dead)
    assert live.exists() and all(p.exists() for p in users)


def test_the_next_export_removes_a_killed_exports_leftovers(tmp_path):
    dead = leftovers(tmp_path, dead_pid())
    export(sequential(), tmp_path / "model")
    assert not any(p.exists() for p in dead)
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_registry_gc_removes_a_killed_exports_leftovers(tmp_path):
    registry = Registry(str(tmp_path / "registry"))
    model = tmp_path / "model"
    export(sequential(), model)
    registry.publish("net", str(model))
    model_dir = tmp_path / "registry" / "net"
    dead = leftovers(model_dir, dead_pid())
    registry.gc("net", keep=1)
    assert not any(p.exists() for p in dead)
