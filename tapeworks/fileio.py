"""Durable file writes shared by the run checkpoints and the model registry.

No TensorFlow here: `tapeworks registry list` and friends stay fast.
"""

import os


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
