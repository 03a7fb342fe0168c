"""Between the compiled loop and Keras callbacks: log values, batch hooks, the epoch's last line.

Keras callbacks are used as they are; this module holds what the loop needs
to call them the way Keras' own loop does.
"""

import keras
import numpy as np
from keras.src.utils.python_utils import is_default


def python_logs(logs):
    """Log tensors as Python floats; a metric whose result is an array stays a NumPy array.

    A metric whose result is a dict (a custom `keras.metrics.Metric`) gives
    its keys, merged into the logs as Keras' `pythonify_logs` merges them.
    """
    values = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            values.update(python_logs(value))
            continue
        value = np.asarray(value)
        values[name] = float(value) if value.ndim == 0 else value
    return values


def wants_batch_hooks(callback_list, kind):
    """True when a callback other than Keras' progress bar implements `kind`'s batch hooks."""
    return any(
        _implements(callback, f"on_{kind}_batch_begin", f"on_{kind}_batch_end")
        for callback in callback_list.callbacks
        if not isinstance(callback, (keras.callbacks.ProgbarLogger, keras.callbacks.History)))


def _implements(callback, *hooks):
    """Whether `callback` overrides any of `hooks` (Keras marks its no-op ones `default`)."""
    for hook in hooks:
        method = getattr(callback, hook, None)
        if method is not None and not is_default(method):
            return True
    return False


def needs_every_train_batch(callback_list):
    """True when a callback of the user's own implements a training batch hook.

    Keras' fit calls those hooks after every batch (steps_per_execution=1 is
    its default), and a user's hook may count on it: one that sets
    `stop_training` at batch 2, or logs each batch. Keras' own callbacks are
    written for calls of several steps (ModelCheckpoint's `save_freq` counts
    batch indices, not calls), as is `LambdaCallback`'s only when it wraps no
    batch hook. A callback that handles calls of several steps says so with a
    class attribute `batch_hooks_per_call = True`.
    """
    return any(
        _implements(callback, "on_train_batch_begin", "on_train_batch_end", "on_batch_begin",
                    "on_batch_end")
        for callback in callback_list.callbacks
        if not getattr(callback, "batch_hooks_per_call", False)
        and (isinstance(callback, keras.callbacks.LambdaCallback)
             or not type(callback).__module__.startswith("keras.")))


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
