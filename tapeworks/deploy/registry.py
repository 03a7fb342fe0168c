"""A versioned model registry in TensorFlow Serving's own layout, with atomic promote and rollback.

Layout (a real TensorFlow Serving pointed at ROOT/models.config serves it):

    ROOT/models.config                   TF Serving's model config: each model pinned to `current`
    ROOT/<name>/<version>/               a SavedModel (integer folder names, as TF Serving reads)
    ROOT/<name>/<version>/tapeworks-version.json   label, time, metrics, checkpoint,
                                         signatures, content hash (TF Serving ignores it)
    ROOT/<name>/.tapeworks/model.json    `current`, the stack of previous currents, the history
    ROOT/.tapeworks.lock                 held (flock) while a version number is taken or a
                                         pointer moves

Every change is a rename of something complete: a version is copied into
`ROOT/<name>/.tapeworks/incoming-*`, fsynced, hashed against its source and
loaded before it is renamed to the next integer; `model.json` and
`models.config` are written to a temporary file, fsynced and renamed. A
process killed at any moment leaves either no new version or a whole one
(an abandoned `incoming-*` folder is removed by `gc`). Concurrent
publishers take distinct numbers under the lock; the slow part (copy, hash,
load) runs outside it.

A version number is never used twice: the next one is past every folder
present and every number `model.json` ever recorded (its `highest` and its
history), so a version removed by hand is not reborn with other weights
under its number (a server would keep serving what it loaded as "4").

What is copied: the source's files, never what its symbolic links point to
outside it (a link out of the folder is refused, naming it; links inside it
are copied as the files they point to). Files are written with the modes
the umask gives, so a TF Serving running as another user reads them.

What is loaded: see `graph_ops` for the trust model. A SavedModel whose
graph has ops that act on files, processes or the network is refused before
it is loaded (so an init op never runs at publish), unless `allow_ops`
names them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import numpy as np

from tapeworks.deploy.graph_ops import UnsafeGraphError, check_ops
from tapeworks.errors import TapeworksError
from tapeworks.fileio import fsync_folder, process_alive, remove_abandoned

if TYPE_CHECKING:
    # Annotations only: the registry imports Keras where a Keras model is published.
    import keras

VERSION_FILE = "tapeworks-version.json"
LOCK_FILE = ".tapeworks.lock"
META_DIR = ".tapeworks"
CONFIG_FILE = "models.config"
# TF Serving's model names appear in URLs (/v1/models/NAME); a name is one
# path component, never "." or "..".
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class RegistryError(TapeworksError, ValueError):
    """A registry operation was refused; nothing was changed."""


@dataclasses.dataclass
class VersionInfo:
    name: str
    version: int
    path: str
    label: str | None = None
    created: str | None = None
    metrics: dict[str, Any] | None = None
    checkpoint: str | None = None
    signatures: dict[str, Any] | None = None   # name -> {"inputs": {...}, "outputs": {...}}
    sha256: str | None = None
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("name", "path")}


def check_name(name, what="model name"):
    if not isinstance(name, str) or not NAME.match(name) or name in (".", ".."):
        raise RegistryError(
            f"Invalid {what} {name!r}. Expected letters, digits, '_', '-' or '.', starting "
            "with a letter or digit, at most 128 characters (no '/', no '..': a name is one "
            "folder under the registry root). Fix: rename it, e.g. 'digits_cnn'.")
    return name


def version_folders(model_dir):
    """{version: folder name} of the integer-named folders, read as TF Serving does ("007": 7)."""
    found = {}
    try:
        entries = os.listdir(model_dir)
    except FileNotFoundError:
        return found
    for entry in entries:
        if entry.isdigit() and os.path.isdir(os.path.join(model_dir, entry)):
            found.setdefault(int(entry), entry)
    return found


def recorded(version_folder):
    """What the registry recorded of a version (`tapeworks-version.json`), or {} for a bare
    SavedModel folder (a version TF Serving's way) or an unreadable record."""
    try:
        with open(os.path.join(version_folder, VERSION_FILE)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def content_hash(folder, skip=(VERSION_FILE,)):
    """sha256 over the relative paths and bytes of every file under `folder` (sorted)."""
    digest = hashlib.sha256()
    # Links are followed: a source's links inside it (check_links) are copied as files.
    for base, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            relative = os.path.relpath(path, folder)
            if relative in skip:
                continue
            digest.update(relative.replace(os.sep, "/").encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            digest.update(b"\0")
    return digest.hexdigest()


def _fsync_tree(folder):
    for base, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(base, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_folder(base)


def _umask():
    # Read, not set and restored, where Linux says it: os.umask would change
    # it for every thread of the process for a moment.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path, text):
    """Writes `text` to a temporary file beside `path`, fsyncs, renames over `path`.

    The file gets the mode a plain `open` would give (0666 less the umask),
    not mkstemp's 0600: TF Serving may run as another user.
    """
    folder = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        fsync_folder(folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def check_links(folder):
    """Refuses symbolic links under `folder` that lead outside it (or into a loop), naming them."""
    root = os.path.realpath(folder)
    outside = []
    for base, dirs, files in os.walk(folder):
        for entry in dirs + files:
            path = os.path.join(base, entry)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            inside = os.path.commonpath([root, target]) == root
            loops = os.path.isdir(target) and os.path.commonpath(
                [target, os.path.realpath(base)]) == target
            if not inside or loops or not os.path.exists(target):
                outside.append(f"{os.path.relpath(path, folder)} -> {os.readlink(path)}"
                               + (" (a loop)" if inside and loops else
                                  "" if inside and os.path.exists(target) else
                                  " (missing)" if inside else " (outside the folder)"))
    if outside:
        raise RegistryError(
            f"{folder} has symbolic links that lead outside it or nowhere: "
            f"{'; '.join(outside[:10])}. Nothing was published: a link's target would be "
            "copied into the registry. Expected a SavedModel folder whose files are its own. "
            "Fix: copy those files into the folder (or remove the links).")


def signatures_of(folder):
    """Loads the SavedModel at `folder` (raises if it does not load); its signatures' specs."""
    import tensorflow as tf

    loaded = tf.saved_model.load(folder)
    described = {}
    for key, function in loaded.signatures.items():
        inputs = function.structured_input_signature[1]
        described[key] = {
            "inputs": {k: {"dtype": s.dtype.name, "shape": s.shape.as_list()}
                       for k, s in sorted(inputs.items())},
            "outputs": {k: {"dtype": s.dtype.name, "shape": s.shape.as_list()}
                        for k, s in sorted(function.structured_outputs.items())},
        }
    return described


class Registry:
    """The registry at `root` (created on first publish).

    Example:
        ```python
        registry = tapeworks.deploy.Registry("models")
        v = registry.publish("digits", "exported/digits", label="v1.2",
                             metrics={"accuracy": 0.95}, promote=True)
        registry.rollback("digits")   # back to the version current before
        ```
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))

    # Paths and locking -----------------------------------------------------

    def _model_dir(self, name):
        return os.path.join(self.root, check_name(name))

    def _meta_dir(self, name):
        return os.path.join(self._model_dir(name), META_DIR)

    @contextlib.contextmanager
    def _locked(self):
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, LOCK_FILE), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _state(self, name):
        path = os.path.join(self._meta_dir(name), "model.json")
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {"current": None, "previous": [], "history": []}

    def _write_state(self, name, state):
        os.makedirs(self._meta_dir(name), exist_ok=True)
        write_atomically(os.path.join(self._meta_dir(name), "model.json"),
                         json.dumps(state, indent=2))

    # Reading ---------------------------------------------------------------

    def models(self) -> list[str]:
        """The model names under the root, sorted."""
        try:
            entries = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        return [e for e in entries if NAME.match(e) and os.path.isdir(os.path.join(self.root, e))
                and version_folders(os.path.join(self.root, e))]

    def versions(self, name: str) -> list[VersionInfo]:
        """Every published version of `name`, oldest first."""
        model_dir = self._model_dir(name)
        return [self._info(name, version, os.path.join(model_dir, folder))
                for version, folder in sorted(version_folders(model_dir).items())]

    def _info(self, name, version, path):
        fields = {f.name for f in dataclasses.fields(VersionInfo)} - {"name", "version", "path"}
        return VersionInfo(name=name, version=version, path=path,
                           **{k: v for k, v in recorded(path).items() if k in fields})

    def show(self, name: str, version: int | None = None) -> VersionInfo:
        """One version's information (default: the current one)."""
        state = self._state(name)
        if version is None and state["current"] is None and self.versions(name):
            raise RegistryError(
                f"Model {name!r} has no current version (none was promoted). Expected a "
                f"version number, one of {[v.version for v in self.versions(name)]}. Fix: "
                "name the version, or `promote` one.")
        version = state["current"] if version is None else int(version)
        for info in self.versions(name):
            if info.version == version:
                return info
        raise RegistryError(self._missing(name, version))

    def current(self, name: str) -> int | None:
        return self._state(name)["current"]

    def history(self, name: str) -> list[dict[str, Any]]:
        return list(self._state(name)["history"])

    def _missing(self, name, version):
        have = [v.version for v in self.versions(name)]
        if not have:
            return (f"No model {name!r} (no version of it) in the registry at {self.root}. "
                    f"Expected one of: {self.models()}. Fix: `publish` it first.")
        return (f"Model {name!r} has no version {version}. Expected one of: {have}. Fix: name "
                "one of those (`tapeworks registry list` shows them).")

    # Writing ---------------------------------------------------------------

    def publish(self, name: str, source: str | os.PathLike[str] | keras.Model, *,
                label: str | None = None, metrics: dict[str, Any] | None = None,
                checkpoint: str | os.PathLike[str] | None = None, promote: bool = False,
                sample: Any = None, allow_ops: Collection[str] = ()) -> VersionInfo:
        """Copies a SavedModel in as the next integer version; returns its `VersionInfo`.

        `source`: a SavedModel folder (e.g. what `tapeworks.deploy.export`
        wrote), or a Keras model or `.keras` file (loaded with safe_mode=True),
        exported and verified first. The copy is
        hashed against the source and loaded before it becomes visible; a
        copy that differs or does not load is never published. With
        `promote=True` it also becomes `current`. A graph with ops that act on
        files, processes or the network (`graph_ops.OUTSIDE_OPS`) is refused
        before it is loaded unless `allow_ops` names them.
        """
        check_name(name)
        if metrics is not None and not isinstance(metrics, dict):
            raise RegistryError(f"`metrics` must be a dict of name -> number. Received: "
                                f"{type(metrics).__name__}.")
        meta_dir = self._meta_dir(name)
        os.makedirs(meta_dir, exist_ok=True)
        incoming = tempfile.mkdtemp(prefix=f"incoming-{os.getpid()}-", dir=meta_dir)
        try:
            copy = os.path.join(incoming, "version")
            source_path = self._source_into(source, copy, incoming, sample)
            expected = content_hash(source_path) if source_path else None
            digest = content_hash(copy)
            if expected is not None and digest != expected:
                raise RegistryError(
                    f"The copy of {source_path} differs from it (content hash {digest[:12]} "
                    f"against {expected[:12]}): the source changed while it was copied. "
                    "Nothing was published. Fix: publish again once it is written.")
            try:
                # Before loading it: a load runs the graph's init op.
                check_ops(copy, allow_ops)
                signatures = signatures_of(copy)
            except UnsafeGraphError as error:
                raise RegistryError(f"{error.message} Nothing was published.") from None
            except Exception as error:   # noqa: BLE001 - any load failure refuses it
                raise RegistryError(
                    f"{source_path or 'the exported model'} is not a SavedModel that loads "
                    f"({type(error).__name__}: {str(error).splitlines()[0][:300]}). Nothing was "
                    "published. Fix: publish a folder written by tapeworks.deploy.export or "
                    "tf.saved_model.save.") from None
            info = VersionInfo(
                name=name, version=0, path="", label=label,
                created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                metrics=metrics, checkpoint=None if checkpoint is None else str(checkpoint),
                signatures=signatures, sha256=digest,
                source=source_path and os.path.abspath(source_path))
            with self._locked():
                state = self._state(name)
                info.version = self._next_version(name, state)
                info.path = os.path.join(self._model_dir(name), str(info.version))
                with open(os.path.join(copy, VERSION_FILE), "w") as f:
                    json.dump(dict(info.to_json(), version=info.version), f, indent=2)
                _fsync_tree(copy)
                os.rename(copy, info.path)
                fsync_folder(self._model_dir(name))
                state["highest"] = info.version
                state["history"].append(self._event("publish", None, info.version, label))
                if promote:
                    self._move(name, state, info.version, "promote")
                self._write_state(name, state)
                self._write_serving_config()
            return info
        finally:
            shutil.rmtree(incoming, ignore_errors=True)

    def _next_version(self, name, state):
        """One past every number used: folders present, and all model.json ever recorded."""
        used = set(version_folders(self._model_dir(name)))
        used.add(state.get("highest") or 0)
        for event in state["history"]:
            used.update(v for v in (event.get("from"), event.get("to")) if isinstance(v, int))
            used.update(v for v in event.get("removed", ()) if isinstance(v, int))
        return max(used, default=0) + 1

    def _source_into(self, source, copy, scratch, sample):
        """Puts the SavedModel to publish at `copy`; returns its source folder (None: exported)."""
        import keras

        source = source if isinstance(source, keras.Model) else os.fspath(source)
        if isinstance(source, str) and source.endswith(".keras") and os.path.isfile(source):
            try:
                # Safe mode: a Lambda's Python code is not run to publish a model.
                source = keras.saving.load_model(source, safe_mode=True)
            except (ValueError, OSError, TypeError) as error:
                raise RegistryError(
                    f"{source} does not load as a Keras model with safe_mode=True "
                    f"({str(error).splitlines()[0][:300]}). Nothing was published. Fix: "
                    "register its custom classes (keras.saving.register_keras_serializable), "
                    "or export a SavedModel from the script that defines them.") from None
        if isinstance(source, keras.Model):
            from tapeworks.deploy import export

            # Exported, then verified against the model in a fresh process.
            report = export(source, copy, format="saved_model", sample=sample)
            from tapeworks.serve import warmup

            if sample is not None and warmup.available():
                # The sample as TF Serving's warm-up requests (one example each):
                # TF Serving and `tapeworks serve` warm up on real inputs.
                arrays = sample if isinstance(sample, dict) else (
                    dict(zip(report.inputs, sample)) if isinstance(sample, (list, tuple))
                    else {report.inputs[0]: sample})
                warmup.write(copy, {k: np.asarray(v) for k, v in arrays.items()})
            return None
        if not os.path.isfile(os.path.join(source, "saved_model.pb")):
            raise RegistryError(
                f"{source} is not a SavedModel folder (no saved_model.pb in it). Expected what "
                "tapeworks.deploy.export(model, path) or tf.saved_model.save writes, or a "
                ".keras file. Fix: export the model first, or pass the keras.Model itself.")
        check_links(source)
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(VERSION_FILE))
        return source

    def promote(self, name: str, version: int) -> int | None:
        """Makes `version` current (TF Serving's config follows); returns the previous current."""
        version = int(version)
        with self._locked():
            if version not in version_folders(self._model_dir(name)):
                raise RegistryError(self._missing(name, version))
            state = self._state(name)
            before = state["current"]
            if before != version:
                self._move(name, state, version, "promote")
                self._write_state(name, state)
                self._write_serving_config()
            return before

    def rollback(self, name: str) -> int:
        """Moves `current` back to the version that was current before it; returns that version."""
        with self._locked():
            state = self._state(name)
            present = version_folders(self._model_dir(name))
            while state["previous"] and state["previous"][-1] not in present:
                state["previous"].pop()   # removed by hand since: not a place to go back to
            if not state["previous"]:
                raise RegistryError(
                    f"Model {name!r} has no previous current version to roll back to (current: "
                    f"{state['current']}). Fix: `promote` the version you want instead.")
            target = state["previous"].pop()
            state["history"].append(self._event("rollback", state["current"], target))
            state["current"] = target
            self._write_state(name, state)
            self._write_serving_config()
            return target

    def _move(self, name, state, version, action):
        if state["current"] is not None:
            state["previous"].append(state["current"])
        state["history"].append(self._event(action, state["current"], version))
        state["current"] = version

    @staticmethod
    def _event(action, before, after, label=None):
        event = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "action": action, "from": before, "to": after}
        if label:
            event["label"] = label
        return event

    def gc(self, name: str, keep: int) -> list[int]:
        """Removes all but the newest `keep` versions, never the current or the previous one.

        Returns the removed version numbers. Abandoned `incoming-*` folders
        of publishers that died are removed too.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise RegistryError(f"`keep` must be an integer >= 1. Received: keep={keep!r}")
        removed = []
        with self._locked():
            model_dir = self._model_dir(name)
            state = self._state(name)
            folders = version_folders(model_dir)
            if not folders:
                raise RegistryError(self._missing(name, None))
            protected = set(sorted(folders)[-keep:])
            # The previous version: where a rollback goes (the top of the stack),
            # and the one current just before the last move (undoing a rollback).
            moves = [e for e in state["history"] if e["action"] in ("promote", "rollback")]
            protected.update(v for v in (state["current"],
                                         state["previous"][-1] if state["previous"] else None,
                                         moves[-1]["from"] if moves else None)
                             if v is not None)
            trash = tempfile.mkdtemp(prefix="trash-", dir=self._meta_dir(name))
            for version, folder in sorted(folders.items()):
                if version not in protected:
                    # Renamed out first: a server never sees half a version.
                    os.rename(os.path.join(model_dir, folder), os.path.join(trash, folder))
                    removed.append(version)
            state["previous"] = [v for v in state["previous"] if v not in removed]
            if removed:
                state["history"].append(dict(self._event("gc", None, None), removed=removed))
                self._write_state(name, state)
            shutil.rmtree(trash, ignore_errors=True)
            for entry in os.listdir(self._meta_dir(name)):
                if entry.startswith("incoming-") and not process_alive(entry.split("-")[1]):
                    shutil.rmtree(os.path.join(self._meta_dir(name), entry), ignore_errors=True)
            # An export into the model's folder killed mid-way.
            remove_abandoned(model_dir)
        return removed

    def _write_serving_config(self):
        """ROOT/models.config: every model with a current version, pinned to it."""
        entries = []
        for name in self.models():
            current = self._state(name)["current"]
            if current is None:
                continue
            entries.append(
                "  config {\n"
                f"    name: \"{name}\"\n"
                f"    base_path: \"{self._model_dir(name)}\"\n"
                "    model_platform: \"tensorflow\"\n"
                "    model_version_policy {\n"
                f"      specific {{\n        versions: {current}\n      }}\n"
                "    }\n"
                "  }\n")
        write_atomically(os.path.join(self.root, CONFIG_FILE),
                         "model_config_list {\n" + "".join(entries) + "}\n")
