"""Between the compiled loop and Keras callbacks: log values, batch hooks, the epoch's last line.

Keras callbacks are used as they are; this module holds what the loop needs
to call them the way Keras' own loop does.
"""

import keras
import numpy as np
from keras.src.utils.python_utils import is_default


def python_logs(logs):
    """Log tensors as Python floats; a metric whose result is an array stays a NumPy array."""
    values = {}
    for name, value in logs.items():
        value = np.asarray(value)
        values[name] = float(value) if value.ndim == 0 else value
    return values


def wants_batch_hooks(callback_list, kind):
    """True when a callback other than Keras' progress bar implements `kind`'s batch hooks."""
    for callback in callback_list.callbacks:
        if isinstance(callback, (keras.callbacks.ProgbarLogger, keras.callbacks.History)):
            continue
        for hook in (f"on_{kind}_batch_begin", f"on_{kind}_batch_end"):
            method = getattr(callback, hook, None)
            if method is not None and not is_default(method):
                return True
    return False


class EpochEndLine(keras.callbacks.Callback):
    """Writes each epoch's last progress line, from the logs the callbacks see.

    Keras' CallbackList hands callbacks a copy of the epoch logs; callbacks
    such as ReduceLROnPlateau add to that copy (`learning_rate`). Placed
    last in the list, as Keras places its ProgbarLogger, this callback shows
    what they added.
    """

    def __init__(self):
        super().__init__()
        self.progress = None
        self.steps = self.samples = 0

    def on_epoch_end(self, epoch, logs=None):
        if self.progress is not None:
            self.progress.finish(self.steps, self.samples, logs or {})
