"""The on-disk format of `fit(checkpoint_dir=)`: one folder of complete, checksummed saves.

A save is written into `ckpt-<step>.partial-<pid>` and renamed to
`ckpt-<step>` once complete and synced, so a kill at any moment leaves either
the previous checkpoints alone or a complete new one; leftovers of an
interrupted save are removed at the next start. `MANIFEST.json`, written
last, holds the size and CRC-32 of every other file: a checkpoint whose files
do not match it (truncated, corrupt) is reported and the previous one used
(`run_checkpoint.RunCheckpointer.restore`).
"""

import json
import logging
import os
import re
import shutil
import zlib

import numpy as np

from tapeworks.errors import TapeworksError
from tapeworks.fileio import fsync_folder

logger = logging.getLogger("tapeworks")

FORMAT = 1
PREFIX = "ckpt-"
MANIFEST = "MANIFEST.json"
RUN = "run.json"
SEED = "seed.json"
_COMPLETE = re.compile(r"^ckpt-(\d{12})$")
_PARTIAL = re.compile(r"^ckpt-\d{12}\.partial-\d+$")
_REPLACED = re.compile(r"^(ckpt-\d{12})\.replaced-\d+$")


class CheckpointError(TapeworksError, RuntimeError):
    """A checkpoint folder holds checkpoints, and none of them can be loaded."""


def _crc32(path):
    """The file's CRC-32 (zlib).

    A checksum against truncation and corruption, not tampering: what
    TensorFlow's own checkpoints keep per tensor (CRC-32C). SHA-256 was
    tried first: 0.21 s of a 0.30 s save of the 60 MiB large-MLP checkpoint
    on this project's 2-core machine, against 0.06 s for CRC-32 (one-off
    measurement).
    """
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, default=_json_default)
        f.flush()
        os.fsync(f.fileno())


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in run.json")


class CheckpointFolder:
    """The checkpoints of one run: complete ones, interrupted ones, retention."""

    def __init__(self, path, keep=3):
        self.path = os.path.abspath(os.fspath(path))
        self.keep = keep

    def complete(self):
        """[(global step, folder)] of complete saves, oldest first."""
        if not os.path.isdir(self.path):
            return []
        found = []
        for name in os.listdir(self.path):
            match = _COMPLETE.match(name)
            if match and os.path.isdir(os.path.join(self.path, name)):
                found.append((int(match.group(1)), os.path.join(self.path, name)))
        return sorted(found)

    def partials(self):
        if not os.path.isdir(self.path):
            return []
        return [os.path.join(self.path, n) for n in os.listdir(self.path) if _PARTIAL.match(n)]

    def is_empty(self):
        return not os.path.isdir(self.path) or not os.listdir(self.path)

    def remove_partials(self):
        """Removes what interrupted saves left; returns how many.

        A checkpoint being replaced by a save of the same step is put back
        when the kill came between the two renames.
        """
        partials = self.partials()
        for path in partials:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.path) if os.path.isdir(self.path) else []:
            match = _REPLACED.match(name)
            if match:
                original = os.path.join(self.path, match.group(1))
                if os.path.exists(original):
                    shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
                else:
                    os.rename(os.path.join(self.path, name), original)
        return len(partials)

    def clear(self):
        for step, path in self.complete():
            shutil.rmtree(path, ignore_errors=True)
        self.remove_partials()
        for name in (SEED,):
            if os.path.exists(os.path.join(self.path, name)):
                os.remove(os.path.join(self.path, name))

    def save(self, step, write_files):
        """Writes a checkpoint atomically; returns its folder (`write`, then `publish`)."""
        return self.publish(*self.write(step, write_files))

    def write(self, step, write_files):
        """The part of a save that must see the state as it is now: the files.

        `write_files(folder)` writes the content into a partial folder; returns
        (partial, final) for `publish`. Until it is published, a kill leaves a
        partial folder that the next start removes.
        """
        os.makedirs(self.path, exist_ok=True)
        final = os.path.join(self.path, f"{PREFIX}{step:012d}")
        partial = f"{final}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        try:
            write_files(partial)
        except Exception:
            # An error (a full disk): its files go now, not at the next start. An
            # interruption (KeyboardInterrupt, like a kill) leaves the partial folder
            # for the next start to remove.
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return partial, final

    def publish(self, partial, final):
        """Makes a written checkpoint durable and complete; returns its folder.

        Syncs every file, writes the manifest (sizes and CRC-32) last, and
        renames the folder into place. Reads only files that are complete
        already, so it may run while training goes on (`RunCheckpointer`'s
        asynchronous saves).
        """
        files = {}
        for root, _, names in os.walk(partial):
            for name in names:
                full = os.path.join(root, name)
                with open(full, "rb+") as f:
                    os.fsync(f.fileno())
                files[os.path.relpath(full, partial)] = {
                    "bytes": os.path.getsize(full), "crc32": _crc32(full)}
        write_json(os.path.join(partial, MANIFEST), {"format": FORMAT, "files": files})
        fsync_folder(partial)
        replaced = None
        if os.path.exists(final):
            # The same step saved again (the end of the run after a
            # step-count save caught its last step): the newer one replaces
            # it, the old one set aside until the new one is in place.
            replaced = f"{final}.replaced-{os.getpid()}"
            os.rename(final, replaced)
        os.rename(partial, final)
        fsync_folder(self.path)
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)
        return final

    def verify(self, folder):
        """None when `folder`'s files match its manifest, else what is wrong."""
        manifest_path = os.path.join(folder, MANIFEST)
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
            files = manifest["files"]
        except FileNotFoundError:
            return "its MANIFEST.json is missing (the save did not finish)"
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"its MANIFEST.json cannot be read ({error})"
        for name, expected in files.items():
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                return f"{name} is missing"
            size = os.path.getsize(path)
            if size != expected["bytes"]:
                return f"{name} has {size} bytes, {expected['bytes']} were written (truncated or changed)"
            if _crc32(path) != expected["crc32"]:
                return f"{name} does not match its checksum (corrupt)"
        return None

    def retain(self, best=None):
        """Removes all but the newest `keep` saves and the `best` folder."""
        saves = self.complete()
        keep = {path for _, path in saves[-self.keep:]} if self.keep else set()
        if best is not None:
            keep.add(best)
        for _, path in saves:
            if path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def seed(self, make):
        """The run's seed: stored at the first start, the same after every restart."""
        path = os.path.join(self.path, SEED)
        try:
            with open(path, encoding="utf-8") as f:
                return int(json.load(f)["seed"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        seed = make()
        os.makedirs(self.path, exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        write_json(temporary, {"seed": seed})
        os.replace(temporary, path)
        return seed


# Callbacks' state --------------------------------------------------------------------

# What each stateful Keras callback keeps between epochs (read in their
# sources, keras/src/callbacks/*.py): numbers, restored as they were.


def structure_difference(saved, current):
    """The first difference between a saved and the running structure, as words; None if none.

    Each is `{"models": [[[shape], dtype, path], ...] per model], "optimizers": ...}`;
    shapes and dtypes are compared (layer names carry a process-wide counter),
    the running model's paths name the difference. None when either is unknown
    (a checkpoint written before structures were recorded).
    """
    if not saved or not current:
        return None
    for part in ("models", "optimizers"):
        theirs, ours = saved.get(part, []), current.get(part, [])
        if len(theirs) != len(ours):
            return (f"was saved with {len(theirs)} {part[:-1]}(s), this run has {len(ours)}")
        for index, (old, new) in enumerate(zip(theirs, ours)):
            for position, (was, now) in enumerate(zip(old, new)):
                if list(was[:2]) != list(now[:2]):
                    return (f"has {tuple(was[0])} {was[1]} as variable {position} of "
                            f"{part[:-1]} {index}, where this run has {now[2]} "
                            f"{tuple(now[0])} {now[1]}")
            if len(old) != len(new):
                extra = (f"{len(old) - len(new)} variable(s) more (the first: {old[len(new)][2]}"
                         f" {tuple(old[len(new)][0])})" if len(old) > len(new) else
                         f"{len(new) - len(old)} variable(s) fewer (this run's "
                         f"{new[len(old)][2]} is not in it)")
                return f"has {extra} in {part[:-1]} {index} than this run"
    return None
