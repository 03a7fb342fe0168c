"""Python numbers a Task's step read while it was traced, and changed since.

A compiled step holds every Python number it read while tracing as a
constant: a loss weight or a KL `beta` kept as a plain float attribute of the
Task, changed later by a callback, never reaches the step (it keeps the
value it was traced with) and nothing says so. `TracedNumbers` records which
of the Task's own number attributes a train step's trace reads (only those,
and only while a trace runs: never on a step that executes), and at an
epoch's end compares them with their values now.
"""

import numbers
import os
import sys
import threading

import tensorflow as tf

from tapeworks.engine.step.task import SupervisedTask
from tapeworks.errors import CorrectnessWarning, warn

# One recording subclass per Task class, made on first use (see `recording`).
_RECORDING_CLASSES = {}
_lock = threading.Lock()
# id(task) -> [the task's own class, open recordings' sets of names]: nested traces
# and the per-replica threads of one replicated trace share one swap.
_active = {}


def is_number(value):
    """A Python (or NumPy) scalar number or bool: what a trace turns into a constant."""
    return isinstance(value, numbers.Number)


class recording:
    """Context manager: the names of `task`'s own number attributes read inside it.

    The task's class is swapped for a subclass whose `__getattribute__`
    notes reads of instance attributes holding numbers; the class is put back
    on exit (when the last open recording of that task closes). `reads`:
    name -> the value it had when first read; `where`: name -> "file.py:line"
    of that first read.
    """

    def __init__(self, task):
        self.task = task
        self.reads = {}
        self.where = {}

    def __enter__(self):
        task = self.task
        with _lock:
            entry = _active.get(id(task))
            if entry is None:
                original = type(task)
                try:
                    task.__class__ = _recording_class(original)
                except TypeError:   # a class whose layout forbids it (__slots__): not watched
                    return self
                entry = _active[id(task)] = [original, []]
            entry[1].append(self)
        return self

    def __exit__(self, *exc):
        task = self.task
        with _lock:
            entry = _active.get(id(task))
            if entry is None or not any(r is self for r in entry[1]):
                return False
            entry[1] = [r for r in entry[1] if r is not self]
            if not entry[1]:
                task.__class__ = entry[0]
                del _active[id(task)]
        return False

    def note(self, name, value, frame):
        if name not in self.reads:
            self.reads[name] = value
            self.where[name] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _recording_class(cls):
    recorder = _RECORDING_CLASSES.get(cls)
    if recorder is not None:
        return recorder

    def __getattribute__(self, name):
        value = super(recorder, self).__getattribute__(name)
        if not name.startswith("__") and is_number(value):
            own = object.__getattribute__(self, "__dict__")
            if name in own:
                entry = _active.get(id(self))
                for open_recording in entry[1] if entry is not None else ():
                    open_recording.note(name, value, sys._getframe(1))
        return value

    recorder = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__,
                                           "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__})
    _RECORDING_CLASSES[cls] = recorder
    return recorder


class TracedNumbers:
    """The Task's number attributes its train step was traced with, checked at epoch ends.

    `watch(train_step)` wraps a step function: while it is traced (never
    when it runs), the Task's number attributes it reads are noted with
    their values at the first trace's end (so a counter the trace itself
    bumps is not taken for a change). `after_epoch()` warns, once per attribute,
    about each one whose value has changed since: the compiled step still
    computes with the traced value.
    """

    def __init__(self, task):
        self.task = task
        self.traced = {}    # attribute name -> its value when the step was first traced
        self.where = {}     # attribute name -> "file.py:line" where the trace read it
        self.warned = set()
        self.ignored = set()   # attributes the trace itself changes

    def watch(self, train_step):
        if isinstance(self.task, SupervisedTask):
            return train_step   # Keras' compute_loss: no number attribute of the user's

        def watched(batch):
            if tf.executing_eagerly():
                return train_step(batch)   # run_eagerly: Python runs every step
            with recording(self.task) as seen:
                result = train_step(batch)
            for name, read in seen.reads.items():
                now = vars(self.task).get(name)
                if not _same(now, read):
                    # Changed by the trace itself (a Python counter of traces): what it
                    # does later is the trace's own doing, not a change the step misses.
                    self.ignored.add(name)
                elif name not in self.ignored:
                    # The first trace's value: a variant traced later (another mode,
                    # the monitored step) does not make the first one follow a change.
                    self.traced.setdefault(name, now)
                    self.where.setdefault(name, seen.where[name])
            for name in self.ignored:
                self.traced.pop(name, None)
            return result

        return watched

    def changed(self):
        """`[(name, traced value, value now)]` for the attributes changed since the trace."""
        found = []
        for name, then in self.traced.items():
            now = vars(self.task).get(name)
            if not _same(now, then):
                found.append((name, then, now))
        return found

    def messages(self):
        """`[(name, message)]` for each attribute changed since the trace (`explain` shows them)."""
        owner = type(self.task).__name__
        return [(name, f"tapeworks: `{owner}.{name}` (read at {self.where.get(name, '?')}) was "
                       f"{_text(then)} when the training step was traced and is now "
                       f"{_text(now)}, but the compiled step still "
                       f"computes with {_text(then)}: a Python number read in "
                       "`compute_losses` is a constant of the traced graph, so changing it "
                       "later (from a callback, or between fits) never reaches the step. "
                       "Fix: hold it in a variable, "
                       f"e.g. `self.{name} = keras.Variable({_text(then)}, trainable=False)` in "
                       f"__init__, and change it with `task.{name}.assign(new_value)`.")
                for name, then, now in self.changed()]

    def after_epoch(self):
        """Warns about each attribute changed since the trace, once per attribute."""
        for name, message in self.messages():
            if name not in self.warned:
                self.warned.add(name)
                warn(message, CorrectnessWarning, section="task-losses")


def _same(a, b):
    return a is b or (a == b) is True   # (an array compared gives an array: not the same)


def _text(value):
    """A number as a message shows it: 0.333333, not 0.3333333333333333."""
    text = repr(value)
    return f"{value:.6g}" if isinstance(value, float) and len(text) > 8 else text
