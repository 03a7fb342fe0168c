"""The plan cache: what "auto" chose, kept on disk so the next run starts there.

cuDNN's and XLA's autotune caches are the model: the choice (execution mode,
steps per call) is stored under a fingerprint of everything that decides it:
the models' structure and weight shapes, the batch (shapes, dtypes, size),
precision, optimizers, accumulation and clipping, the device and CPU/GPU
model, and the TensorFlow, Keras and tapeworks versions. A second run of the
same script finds its plan after its first step and measures nothing. A
plan may also carry the XLA modes its run could not yet afford to try
(`CallPlanner.memory`): a later run tries them once the runs together can
repay it, and stores what it found.

Location: `$TAPEWORKS_CACHE_DIR/plans`, by default `~/.cache/tapeworks/plans`;
`TAPEWORKS_PLAN_CACHE=0` (or `Trainer(plan_cache=False)`) turns it off. One
JSON file per plan, written to a temporary file in the same folder and
renamed over the old one (atomic on POSIX and Windows), so concurrent
processes never read half a file; a file that does not parse is ignored,
removed and rebuilt. `tapeworks cache show | clear` lists and empties it.
"""

import datetime
import hashlib
import json
import logging
import math
import os
import platform
import tempfile

logger = logging.getLogger("tapeworks")

ENV_DIR = "TAPEWORKS_CACHE_DIR"
ENV_SWITCH = "TAPEWORKS_PLAN_CACHE"
FORMAT = 1


def default_folder():
    root = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "tapeworks")
    return os.path.join(root, "plans")


def enabled_by_environment():
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


class PlanCache:
    """Plans on disk, one JSON file per fingerprint."""

    def __init__(self, folder=None):
        self.folder = folder or default_folder()

    def _path(self, key):
        return os.path.join(self.folder, f"{key}.json")

    def get(self, key):
        """The stored plan for `key`, or None (absent, unreadable, invalid, another format).

        Every field read from disk is checked (`check_plan`): an entry that a
        crash, another program or a hand edit left invalid is removed with a
        warning naming the file and the field, and the plan is measured again.
        """
        return self._read(self._path(key), check_plan)

    def put(self, key, jit_compile, steps_per_call, reason, description, memory=None):
        """Stores a plan atomically (write a temporary file, then rename it over the old).

        `memory` (`CallPlanner.memory`): the XLA modes not tried yet and what
        the next run needs to decide on them, or None.
        """
        plan = {"jit_compile": jit_compile, "steps_per_call": steps_per_call,
                "reason": reason, "what": description}
        if memory:
            plan["memory"] = memory
        self._write(self._path(key), plan)

    def get_record(self, kind, key):
        """The JSON object stored by `put_record(kind, key, ...)`, or None (absent, unreadable).

        A record that does not parse, or is not an object, is removed with a
        warning; the caller validates its fields.
        """
        return self._read(self._record_path(kind, key), _check_record)

    def put_record(self, kind, key, record):
        """Stores another kind of choice (`kind`: "precision") beside the plans, atomically."""
        self._write(self._record_path(kind, key), record)

    def _record_path(self, kind, key):
        return os.path.join(self.folder, f"{kind}-{key}.json")

    @staticmethod
    def _read(path, check):
        try:
            with open(path, encoding="utf-8") as f:
                content = json.load(f)
            check(content)
            return content
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as error:
            _discard(path, error)
            return None

    def _write(self, path, content):
        content = dict(content, format=FORMAT,
                       created=datetime.datetime.now().isoformat(timespec="seconds"))
        try:
            os.makedirs(self.folder, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as f:
                json.dump(content, f, indent=1, default=str)
            os.replace(temporary, path)
        except OSError as error:
            # A read-only home or a full disk must not stop training.
            logger.warning("could not write the plan cache in %s (%s)", self.folder, error)

    def entries(self):
        """[(key, plan)] of every readable plan, newest first (other records left out)."""
        found = []
        if not os.path.isdir(self.folder):
            return found
        for name in sorted(os.listdir(self.folder)):
            if name.endswith(".json") and "-" not in name:
                plan = self.get(name[:-len(".json")])
                if plan is not None:
                    found.append((name[:-len(".json")], plan))
        return sorted(found, key=lambda e: e[1].get("created", ""), reverse=True)

    def clear(self):
        """Removes every entry (and stray temporary files); returns how many plans went."""
        if not os.path.isdir(self.folder):
            return 0
        removed = 0
        for name in os.listdir(self.folder):
            if name.endswith((".json", ".tmp")):
                os.remove(os.path.join(self.folder, name))
                removed += name.endswith(".json") and "-" not in name
        return removed


def _discard(path, error):
    from tapeworks.errors import TapeworksWarning, warn

    warn(f"tapeworks: ignoring the plan cache entry {path}: {error}. It is removed, and the "
         "plan is measured again and stored anew.", TapeworksWarning)
    try:
        os.remove(path)
    except OSError:
        pass


def _is_int(value, low, high=None):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (
        high is None or value <= high)


def _is_number(value, low=0.0):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= low


def _is_mode(value, modes=(True, False, "update")):
    # JSON's 1 and 0 are not true and false: `1 in (True, False)` is, so compare types.
    return any(type(value) is type(m) and value == m for m in modes)


def _check_record(record):
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError("not a record of this format")


def check_plan(plan):
    """Raises ValueError naming the first field of `plan` (read from disk) that is invalid."""
    from tapeworks.engine.plan.autotune import MAX_STEPS_PER_CALL, XLA_START_RATIO

    if not isinstance(plan, dict):
        raise ValueError(f"expected a JSON object, found {type(plan).__name__}")
    if plan.get("format") != FORMAT:
        raise ValueError(f"format {plan.get('format')!r}, expected {FORMAT}")
    if not _is_mode(plan.get("jit_compile")):
        raise ValueError(f"jit_compile={plan.get('jit_compile')!r}, expected true, false or "
                         "\"update\"")
    if not _is_int(plan.get("steps_per_call"), 1, MAX_STEPS_PER_CALL):
        raise ValueError(f"steps_per_call={plan.get('steps_per_call')!r}, expected an integer "
                         f"from 1 to {MAX_STEPS_PER_CALL}")
    if not isinstance(plan.get("reason"), str):
        raise ValueError(f"reason={plan.get('reason')!r}, expected a string")
    memory = plan.get("memory")
    if memory is None:
        return
    try:
        valid = (isinstance(memory, dict)
                 and all(_is_mode(m, tuple(XLA_START_RATIO)) for m in memory["waiting"])
                 and all(len(c) == 4 and _is_mode(c[0]) and _is_int(c[1], 1)
                         and _is_number(c[2]) and _is_number(c[3]) for c in memory["calls"])
                 and all(len(s) == 2 and _is_mode(s[0]) and _is_number(s[1])
                         for s in memory["start_seconds"])
                 and _is_number(memory["reference_batch"], 1e-9)
                 and _is_int(memory["steps_seen"], 0))
    except (KeyError, TypeError):
        valid = False
    if not valid:
        raise ValueError("its memory of the modes still to try is not what a run writes")


def fingerprint(config, task, precision, element_spec, batch_size):
    """(key, description): what decides the plan of a Trainer on batches of `batch_size`.

    `config`: its `TrainerConfig`; `element_spec`: of its training batches.
    """
    import keras
    import tensorflow as tf

    import tapeworks

    def model_summary(model):
        return [[type(layer).__name__, [list(w.shape) for w in layer.weights],
                 layer.dtype_policy.name, bool(layer.trainable)]
                for layer in model._flatten_layers(include_self=False)]

    spec = element_spec
    what = {
        "task": type(task).__name__,
        "models": [[type(m).__name__, model_summary(m)] for m in task.models],
        "updates": [[type(u.optimizer).__name__, u.every, len(u.variables())]
                    for u in task.updates],
        "batch": [batch_size, str(tf.nest.map_structure(
            lambda s: f"{s.dtype.name}{s.shape.as_list()[1:]}", spec))],
        "precision": precision.policy,
        "accumulate": config.accumulate,
        "clip": [config.clip_norm is not None, config.clip_value is not None],
        # Pruning adds work after each update (a mask per kernel, and a cond).
        "pruning": (None if config.pruning is None else
                    [config.pruning.scope, config.pruning.structure,
                     [layer.name for layer in config.pruning.layers]]),
        "settings": [str(config.jit_compile), str(config.steps_per_call),
                     config.capture_every, config.run_eagerly, config.deterministic],
        "device": _device(),
        "versions": [tf.__version__, keras.__version__, tapeworks.__version__],
    }
    text = json.dumps(what, sort_keys=True, default=str)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    description = {"models": [m.name for m in task.models],
                   "batch": what["batch"], "precision": what["precision"],
                   "device": what["device"], "versions": what["versions"]}
    return key, description


def _device():
    import tensorflow as tf

    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append([details.get("device_name", gpu.name),
                     str(details.get("compute_capability", ""))])
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "gpus": gpus,
            "machine": platform.machine()}


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
