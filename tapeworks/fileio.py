"""Durable file writes shared by the run checkpoints, exports and the model registry.

No TensorFlow here: `tapeworks registry list` and friends stay fast.
"""

import os
import re
import shutil


def fsync_folder(path):
    """Makes a rename inside `path` durable (fsync of the folder itself), where the OS allows."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:
        return   # not possible on every platform; the rename is still atomic
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def process_alive(pid):
    """Whether process `pid` exists (a process of another user counts as alive)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


# What an export writes beside its path while it works (`deploy/artefact.py`): the
# artefact being verified, `.NAME.partial-PID[.suffix]`, and the replaced one
# during the swap, `.NAME.old-PID`. Hidden names with the writer's PID: a
# process killed mid-way leaves them, and nothing else is named so.
ABANDONED = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>\d+)(?:\.[A-Za-z0-9]+)?$")


def remove_abandoned(folder):
    """Removes the partial and replaced artefacts in `folder` of writers that died.

    Returns the names removed. A live writer's are kept, whoever it is.
    """
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        match = ABANDONED.match(entry)
        if match is None or process_alive(match.group("pid")):
            continue
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                continue
        removed.append(entry)
    return removed
