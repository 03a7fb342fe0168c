"""XLA's persistent compilation cache, switched on at `import tapeworks`.

The flag is read by TensorFlow once per process, so what it does is tested
in fresh processes; the switch itself (an environment variable) in this one.
"""

import os
import subprocess
import sys

import pytest

from tapeworks import xla_cache

SCRIPT = """
import os, sys
import tapeworks   # before any TensorFlow op: the cache flag is set here
import keras
import numpy as np

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
model.compile(keras.optimizers.Adam(1e-2), "mse")
x = np.linspace(-1, 1, 64 * 4, dtype="float32").reshape(64, 4)
y = x.sum(1, keepdims=True)
trainer = tapeworks.Trainer(model, jit_compile=True, steps_per_call=2, seed=0)
history = trainer.fit(x, y, batch_size=16, epochs=2, verbose=0)
print(repr(history.history["loss"][-1]))
"""


def _switched(monkeypatch, tmp_path, flags=None, switch="1"):
    monkeypatch.setenv("TAPEWORKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(xla_cache.ENV_SWITCH, switch)
    if flags is None:
        monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("TF_XLA_FLAGS", flags)


def test_enable_points_tensorflow_at_this_machines_folder(monkeypatch, tmp_path):
    _switched(monkeypatch, tmp_path, flags="--tf_xla_auto_jit=0")
    folder = xla_cache.enable()
    assert folder.startswith(str(tmp_path / "xla"))
    assert os.environ["TF_XLA_FLAGS"] == (
        f"--tf_xla_auto_jit=0 --tf_xla_persistent_cache_directory={folder} "
        "--tf_xla_persistent_cache_device_types=CPU")
    assert xla_cache.enable() is None   # already set: not added twice
    assert os.environ["TF_XLA_FLAGS"].count("persistent_cache_directory") == 1


def test_the_users_own_cache_directory_and_the_switch_are_respected(monkeypatch, tmp_path):
    own = "--tf_xla_persistent_cache_directory=/somewhere/else"
    _switched(monkeypatch, tmp_path, flags=own)
    assert xla_cache.enable() is None and os.environ["TF_XLA_FLAGS"] == own
    _switched(monkeypatch, tmp_path, switch="0")
    assert xla_cache.enable() is None and "TF_XLA_FLAGS" not in os.environ


def test_a_folder_that_cannot_be_written_leaves_the_cache_off(monkeypatch, tmp_path):
    # TensorFlow would fail every XLA call on a cache folder it cannot write.
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    _switched(monkeypatch, blocked)
    assert xla_cache.enable() is None and "TF_XLA_FLAGS" not in os.environ


def test_the_folder_depends_on_the_cpu_and_tensorflows_version(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEWORKS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(xla_cache, "_cpu", lambda: ("CPU A", "avx2 fma"))
    monkeypatch.setattr(xla_cache, "_tensorflow_version", lambda: "2.21.0")
    here = xla_cache.folder()
    monkeypatch.setattr(xla_cache, "_cpu", lambda: ("CPU A", "avx2 avx512f fma"))
    assert xla_cache.folder() != here      # other instructions: other executables
    monkeypatch.setattr(xla_cache, "_cpu", lambda: ("CPU A", "avx2 fma"))
    monkeypatch.setattr(xla_cache, "_tensorflow_version", lambda: "2.22.0")
    assert xla_cache.folder() != here      # another XLA
    monkeypatch.setattr(xla_cache, "_tensorflow_version", lambda: None)
    assert xla_cache.folder() is None      # unknown version: no cache at all


def _run(tmp_path):
    env = dict(os.environ, TAPEWORKS_CACHE_DIR=str(tmp_path), TAPEWORKS_XLA_CACHE="1",
               TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1], done.stderr


def _entries(tmp_path):
    base = tmp_path / "xla"
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in base.glob("*/*.pb")}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_second_process_loads_the_executables_and_a_damaged_one_is_rebuilt(tmp_path):
    loss, _ = _run(tmp_path)
    first = _entries(tmp_path)
    assert first, "the first run saved no XLA executable"
    # The second run reads what the first wrote: nothing rewritten, nothing
    # added, and the same training.
    again, _ = _run(tmp_path)
    assert again == loss and _entries(tmp_path) == first
    # An entry cut short (a full disk, a copy interrupted) would fail every
    # later XLA call in TensorFlow; it is removed at import and compiled again.
    damaged = next(iter(first))
    with open(damaged, "r+b") as f:
        f.truncate(first[damaged][0] // 2)
    rebuilt, stderr = _run(tmp_path)
    assert rebuilt == loss
    assert "removing the unreadable XLA cache entry" in stderr
    # Written again whole (a compile's bytes need not repeat exactly).
    assert _entries(tmp_path)[damaged][0] > first[damaged][0] // 2


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_entry_with_two_bytes_flipped_is_caught_by_its_checksum_and_compiled_again(tmp_path):
    loss, _ = _run(tmp_path)
    first = _entries(tmp_path)
    assert first and all(os.path.exists(path + xla_cache.CHECKSUM) for path in first)
    # Same size, and it still parses as a protocol buffer: only the checksum sees it.
    damaged = max(first, key=lambda path: first[path][0])
    data = bytearray(first[damaged][2])
    middle = len(data) // 2
    data[middle] ^= 0xFF
    data[middle + 1] ^= 0xFF
    with open(damaged, "wb") as f:
        f.write(data)
    rebuilt, stderr = _run(tmp_path)
    assert rebuilt == loss
    assert f"removed the damaged XLA cache entry {damaged}" in stderr
    assert _entries(tmp_path)[damaged][2] != bytes(data)
    with open(damaged + xla_cache.CHECKSUM) as f:
        assert f.read().strip() == xla_cache.digest(damaged)


def test_checksums_written_checked_and_orphans_removed(tmp_path):
    (tmp_path / "a.pb").write_bytes(b"\x08\x01")
    xla_cache.check_checksums(str(tmp_path))   # first sight: recorded
    assert (tmp_path / "a.pb.sha256").exists()
    (tmp_path / "b.pb.sha256").write_text("0" * 64)   # its entry is gone
    (tmp_path / "a.pb").write_bytes(b"\x08\x02")       # same size, other bytes
    with pytest.warns(UserWarning, match="removed the damaged XLA cache entry"):
        xla_cache.check_checksums(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == []
