"""Which versions are loaded, and the switch between them (hot reload).

A `ModelManager` holds, per model, an immutable `ModelState` (loaded
versions, labels, the default version, load failures). Requests read the
state once and keep the `Servable` they got: a switch replaces the state in
one assignment, requests in flight finish on the version they started on,
and an unloaded version is freed when its last request lets go of it.

`sync()` (the poller calls it every `poll_seconds`) reads the plan, loads
and warms any wanted version not loaded yet (in the poller's thread, so
serving goes on), then publishes the new state. Versions that are no longer
wanted are dropped only once a wanted version is available: a version that
fails to load leaves the current one serving, and its error shows in the
model's status. A failed version is retried when its files change (any
file's path, size or modification time: a version copied in parts, its
`variables/` a poll after `saved_model.pb`, loads once it is whole), as TF
Serving retries. A loaded version whose files change (a folder replaced
under the same number, a registry record with another content hash) is
loaded again and switched to; if that load fails, the copy loaded before
keeps serving and the failure shows in the status and `/healthz`.
"""

import dataclasses
import logging
import os
import threading
import time

from tapeworks.serve.servable import RequestError, Servable

logger = logging.getLogger("tapeworks.serve")


@dataclasses.dataclass(frozen=True)
class ModelState:
    name: str
    versions: dict          # version -> Servable (loaded and warmed)
    labels: dict            # label -> version
    default: int            # the version a request without version or label gets
    failures: dict          # version -> error message (the last load that failed)
    wanted: int = None      # the version that should be the default (promoted, or newest)

    @property
    def degraded(self):
        """Whether the wanted version failed to load while another version serves."""
        return self.wanted is not None and self.wanted in self.failures and \
            self.default != self.wanted and bool(self.versions)

    def resolve(self, version=None, label=None):
        if version is not None and label is not None:
            raise RequestError(f"Both model version ({version}) and model version label "
                               f"({label}) cannot be supplied.")
        if label is not None:
            if label not in self.labels:
                raise RequestError(f"Unrecognized servable version label: {label}")
            version = self.labels[label]
            if version not in self.versions:
                raise RequestError(f"Servable not found for request: Specific({self.name}, "
                                   f"{version})", 404)
            return self.versions[version]
        if version is None:
            if self.default is None or self.default not in self.versions:
                raise RequestError(f"Servable not found for request: Latest({self.name})", 404)
            return self.versions[self.default]
        if version not in self.versions:
            raise RequestError(f"Servable not found for request: Specific({self.name}, "
                               f"{version})", 404)
        return self.versions[version]


def stamp(path):
    """What changes when a version folder's content changes: every file's path, size and mtime.

    None when the folder cannot be read. Cheap (no file is read but the
    registry's record): a version folder holds few files.
    """
    from tapeworks.deploy.registry import recorded

    entries = []
    try:
        for base, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                info = os.stat(os.path.join(base, name))
                entries.append((os.path.relpath(os.path.join(base, name), path),
                                info.st_size, info.st_mtime_ns))
    except OSError:
        return None
    if not entries:
        return None
    return (tuple(entries), recorded(path).get("sha256"))


class ModelManager:
    def __init__(self, source, *, warm_batch_sizes=(1,), on_switch=None, allow_ops=()):
        self.source = source
        self.allow_ops = tuple(allow_ops)   # graph_ops.OUTSIDE_OPS the operator allows
        self.warm_batch_sizes = tuple(warm_batch_sizes)
        self.on_switch = on_switch       # called with (name, ModelState) after each switch
        self.after_load = None           # called after a sync that loaded a version
        self.states = {}                 # name -> ModelState (replaced, never mutated)
        self._failed = {}                # (name, version) -> (stamp, message)
        self._stamps = {}                # (name, version) -> stamp of the loaded copy
        self._lock = threading.Lock()    # one sync at a time
        self.plan_error = None           # why the last plan could not be read

    def get(self, name):
        state = self.states.get(name)
        if state is None:
            raise RequestError(f"Servable not found for request: Latest({name})", 404)
        return state

    def sync(self):
        """Reads the plan; loads what is new, switches, drops what is no longer wanted."""
        with self._lock:
            try:
                plans = self.source.plan()
                self.plan_error = None
            except Exception as error:   # noqa: BLE001 - keep serving what is loaded
                self.plan_error = f"{type(error).__name__}: {error}"
                logger.error("could not read %s: %s", self.source.describe(), error)
                return
            loaded = sum(self._sync_model(name, plan) for name, plan in plans.items())
            for name in set(self.states) - set(plans):
                del self.states[name]   # removed from the config: unloaded, as TF Serving does
            if loaded and self.after_load is not None:
                self.after_load()

    def _sync_model(self, name, plan):
        old = self.states.get(name)
        newly = 0
        loaded = dict(old.versions) if old else {}
        failures = {v: m for v, m in (old.failures if old else {}).items()
                    if v in plan.versions}
        for version, folder in sorted(plan.versions.items()):
            path = os.path.join(plan.base_path, folder)
            current = stamp(path)
            if version in loaded and loaded[version].path == path and \
                    self._stamps.get((name, version)) == current:
                continue
            failed = self._failed.get((name, version))
            if failed is not None and failed[0] == current:
                continue
            if version in loaded:
                logger.info("model %s version %s changed on disk: loading it again", name,
                            version)
            started = time.perf_counter()
            try:
                servable = Servable(name, version, path, self.allow_ops)
                warmed = servable.warm_up(self.warm_batch_sizes)
            except Exception as error:   # noqa: BLE001 - a bad version must not stop serving
                message = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:500]}"
                self._failed[(name, version)] = (current, message)
                failures[version] = message
                logger.error("model %s version %s failed to load: %s", name, version, message)
                continue
            self._failed.pop((name, version), None)
            self._stamps[(name, version)] = current
            failures.pop(version, None)
            loaded[version] = servable
            newly += 1
            logger.info("model %s version %s loaded in %.2f s (warmed up with %s)", name,
                        version, time.perf_counter() - started, warmed)
        wanted_available = [v for v in plan.versions if v in loaded]
        if wanted_available:
            loaded = {v: s for v, s in loaded.items() if v in plan.versions}
        default = plan.current if plan.current in loaded else (
            max(wanted_available) if wanted_available else (old.default if old else None))
        labels = {k: v for k, v in plan.labels.items() if v in loaded}
        wanted = plan.current if plan.current is not None else max(plan.versions, default=None)
        state = ModelState(name, loaded, labels, default, failures, wanted)
        if old != state:
            self.states[name] = state     # the switch: one assignment
            if self.on_switch is not None:
                self.on_switch(name, state)
        return newly

    def status(self, name, version=None, label=None):
        """TF Serving's GetModelStatusResponse for the model (or one version / label)."""
        state = self.get(name)
        if version is not None or label is not None:
            servable = state.resolve(version, label)
            chosen = {servable.version}
        else:
            chosen = set(state.versions) | set(state.failures)
        entries = []
        for v in sorted(chosen, reverse=True):
            if v in state.versions:
                entries.append({"version": str(v), "state": "AVAILABLE",
                                "status": {"error_code": "OK", "error_message": ""}})
            else:
                entries.append({"version": str(v), "state": "END",
                                "status": {"error_code": "UNKNOWN",
                                           "error_message": state.failures[v]}})
        return {"model_version_status": entries}

    def poll_forever(self, seconds, stop):
        while not stop.wait(seconds):
            try:
                self.sync()
            except Exception:   # noqa: BLE001 - the poller must outlive any one poll
                logger.exception("reading %s failed; serving what is loaded",
                                 self.source.describe())
