"""XLA's own persistent compilation cache, switched on for CPU at `import tapeworks`.

TensorFlow can save the executables XLA compiles for `jit_compile=True`
functions and load them in later processes
(`--tf_xla_persistent_cache_directory` in `TF_XLA_FLAGS`), but leaves it off.
On a CPU, compiling is most of what starting an XLA mode costs: the digits
CNN's whole-step XLA started in 3.5-3.8 s without it and 1.5 s with it (first
epochs of fixed-mode fits in fresh processes, one-off, 2026-12-01). That is
what a second run of a script pays for XLA, and what "auto" pays for trying
an XLA mode in runs after the first.

TensorFlow reads the flag once, when its runtime starts (the first
TensorFlow op), so it is set here, at `import tapeworks`, which imports no
TensorFlow: a script that imports tapeworks before it builds its model gets
the cache; one that runs TensorFlow ops first trains as before, without it.

- Where: `$TAPEWORKS_CACHE_DIR/xla/<machine>`, by default
  `~/.cache/tapeworks/xla/<machine>`; `<machine>` is a digest of the host
  name, the CPU model and its feature flags and TensorFlow's version, since
  an executable compiled for one CPU's instructions must not be loaded on
  another (a home folder shared by several machines) or by another XLA.
- CPU only (`--tf_xla_persistent_cache_device_types=CPU`): GPU executables
  also depend on the driver and the GPU model, which cannot be read here
  without starting TensorFlow, and no GPU is at hand to test them.
- Safe under concurrent processes: TensorFlow writes each entry to a
  temporary file and renames it (atomic on a local file system).
- Every entry carries a checksum of its own: `NAME.pb.sha256` beside it,
  written by the process that compiled it (at the end of each fit and at
  exit) or, for an entry whose process was killed first, when the next
  process starts. At each start an entry whose bytes no longer match is
  removed with a warning and compiled again: TensorFlow loads an entry with
  two bytes flipped (it still parses) and fails the whole XLA call with an
  `InternalError`, in every later run.
- Off with `TAPEWORKS_XLA_CACHE=0`; left alone when `TF_XLA_FLAGS` already
  names a persistent cache directory. `tapeworks cache show | clear` lists
  and empties it with the plans.
"""

import atexit
import hashlib
import importlib.metadata
import logging
import os
import platform
import tempfile

logger = logging.getLogger("tapeworks")

ENV_SWITCH = "TAPEWORKS_XLA_CACHE"
FLAG = "--tf_xla_persistent_cache_directory"
enabled_folder = None   # the folder `enable` pointed TensorFlow at, in this process
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos",
                     "tf-nightly", "tf-nightly-cpu")


def enabled_by_environment():
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def root():
    """The folder that holds every machine's XLA cache."""
    base = os.environ.get("TAPEWORKS_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tapeworks")
    return os.path.join(base, "xla")


def folder():
    """This machine's and TensorFlow's cache folder, or None when TensorFlow's version is unknown.

    Without the version, executables of an older XLA could be loaded by a
    newer one: no cache then.
    """
    version = _tensorflow_version()
    if version is None:
        return None
    model, flags = _cpu()
    text = "\n".join([platform.node(), platform.machine(), model, flags, version])
    return os.path.join(root(), hashlib.sha256(text.encode()).hexdigest()[:16])


def enable():
    """Points TensorFlow's persistent XLA cache at `folder()`; returns the folder, or None.

    None when switched off, when the user's `TF_XLA_FLAGS` already set a
    cache directory (theirs is used), when TensorFlow's version is unknown,
    or when the folder cannot be written.
    """
    current = os.environ.get("TF_XLA_FLAGS", "")
    if not enabled_by_environment() or FLAG in current:
        return None
    path = folder()
    if path is None:
        return None
    # TensorFlow splits TF_XLA_FLAGS on spaces: a path with one cannot be passed.
    if " " in path:
        return None
    if not _writable(path):
        return None
    _remove_unreadable(path)
    check_checksums(path)
    global enabled_folder
    enabled_folder = path
    atexit.register(record_checksums, path)
    extra = f"{FLAG}={path} --tf_xla_persistent_cache_device_types=CPU"
    os.environ["TF_XLA_FLAGS"] = f"{current} {extra}".strip()
    return path


def _writable(path):
    """Creates `path` and checks that a file can be written there.

    TensorFlow fails the XLA call itself when it cannot write its entry (a
    read-only home, a cache folder that cannot be created): then there is
    no cache, and training goes on without it.
    """
    try:
        os.makedirs(path, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=path, suffix=".tmp")
        os.close(handle)
        os.remove(probe)
        return True
    except OSError as error:
        logger.warning("the XLA cache is off: %s cannot be written (%s)", path, error)
        return False


def _remove_unreadable(path):
    """Removes entries that are not even well-formed protocol buffers.

    TensorFlow fails the whole XLA call on an entry it cannot read ("Read
    less bytes than requested", an `OutOfRangeError`), in every later run,
    instead of compiling again. It writes entries atomically, so a bad one
    means damage from outside (a full disk, a copy cut short); parsing each
    file against the empty message checks its wire format (truncation,
    garbage) in about a millisecond per megabyte. The entry's own message
    type is not in TensorFlow's Python package, so its fields go unchecked.
    """
    if not os.path.isdir(path):
        return
    names = [n for n in os.listdir(path) if n.endswith(".pb")]
    if not names:
        return
    from google.protobuf import empty_pb2, message

    for name in names:
        file = os.path.join(path, name)
        try:
            with open(file, "rb") as f:
                data = f.read()
            if not data:
                raise message.DecodeError("empty file")
            empty_pb2.Empty().ParseFromString(data)
        except OSError:
            continue   # removed by another process meanwhile
        except message.DecodeError as error:
            logger.warning("removing the unreadable XLA cache entry %s (%s); it will be "
                           "compiled again", file, error)
            _remove(file)
            _remove(file + CHECKSUM)


CHECKSUM = ".sha256"


def digest(file):
    """The SHA-256 of a file's bytes, as its checksum file holds it."""
    sha = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def record_checksums(path=None):
    """Writes the checksum of every entry in `path` (default: the enabled cache's) without one.

    Called at the end of each fit and at exit: the entries this process
    compiled get theirs while their bytes are as XLA wrote them.
    """
    path = path or enabled_folder
    if path is None or not os.path.isdir(path):
        return
    try:
        names = set(os.listdir(path))
    except OSError:
        return
    for name in names:
        if not name.endswith(".pb") or name + CHECKSUM in names:
            continue
        file = os.path.join(path, name)
        try:
            checksum = digest(file)
            handle, temporary = tempfile.mkstemp(dir=path, suffix=".tmp")
            with os.fdopen(handle, "w") as f:
                f.write(checksum + "\n")
            os.replace(temporary, file + CHECKSUM)
        except OSError:
            continue   # removed meanwhile, or a read-only folder: checked next time


def check_checksums(path):
    """Removes, with a warning, every entry whose bytes do not match its checksum.

    An entry without a checksum (its process was killed before writing one)
    gets one now; a checksum without its entry is removed.
    """
    try:
        names = set(os.listdir(path))
    except OSError:
        return
    for name in sorted(names):
        file = os.path.join(path, name)
        if name.endswith(".pb" + CHECKSUM) and name[:-len(CHECKSUM)] not in names:
            _remove(file)
            continue
        if not name.endswith(".pb") or name + CHECKSUM not in names:
            continue
        try:
            with open(file + CHECKSUM, encoding="ascii") as f:
                expected = f.read().strip()
            actual = digest(file)
        except (OSError, UnicodeDecodeError):
            continue
        if actual != expected:
            from tapeworks.errors import TapeworksWarning, warn

            warn(f"tapeworks: removed the damaged XLA cache entry {file} (its bytes no longer "
                 "match the checksum written when it was compiled); it will be compiled "
                 "again.", TapeworksWarning)
            _remove(file)
            _remove(file + CHECKSUM)
    record_checksums(path)


def _remove(file):
    try:
        os.remove(file)
    except OSError:
        pass


def entries():
    """[(path, bytes)] of every cached executable, all machines' folders together."""
    found = []
    base = root()
    if not os.path.isdir(base):
        return found
    for machine in sorted(os.listdir(base)):
        path = os.path.join(base, machine)
        if not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith(".pb"):
                file = os.path.join(path, name)
                try:
                    found.append((file, os.path.getsize(file)))
                except OSError:
                    pass   # removed by another process meanwhile
    return found


def clear():
    """Removes every cached executable (and TensorFlow's temporary files); returns how many."""
    removed = 0
    base = root()
    if not os.path.isdir(base):
        return 0
    for machine in os.listdir(base):
        path = os.path.join(base, machine)
        if not os.path.isdir(path):
            continue
        for name in os.listdir(path):
            try:
                os.remove(os.path.join(path, name))
                removed += name.endswith(".pb")
            except OSError:
                pass
    return removed


def _tensorflow_version():
    for name in _TF_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu():
    """(model name, feature flags) from /proc/cpuinfo, or what `platform` knows."""
    model = flags = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and flags is None:   # x86, ARM
                    flags = " ".join(sorted(value.split()))
                if model is not None and flags is not None:
                    break
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags or ""
