"""A training length given in seconds: a Keras callback that stops `fit` and anneals the rate.

The demo must finish in about the same time on a fast and on a slow machine
(the step time of its network differs by 5x between two 2-core CPUs), so its
length is a time budget rather than a number of epochs. A cosine learning-rate
schedule written in steps would be cut off half-way on a slow machine, at a
high rate; this one follows whichever runs out first, the steps or the
seconds, so every run ends annealed, however far it got.
"""

import math
import sys
import time

import keras


class TimeBudget(keras.callbacks.Callback):
    """Stops training after `seconds` (or `steps`), with a cosine rate over that length.

    The clock starts when `fit` starts (tracing and the execution-mode
    measuring count: they are part of what a user waits for). Batch hooks fire
    once per compiled call of several steps, so training stops at the end of
    the call that passes the budget (calls last about a second at most).

    Args:
        optimizer: the optimizer whose `learning_rate` (a float, not a
            schedule) follows the cosine.
        learning_rate: the rate at the start.
        seconds: the budget of training time, or None for no time limit.
        steps: the number of steps `fit` will run at most (epochs x steps per
            epoch), or None when only the time limits it.
        verbose: draw a progress line showing the budget.

    Raises:
        ValueError: when neither `seconds` nor `steps` is given.
    """

    # Its batch hook counts the steps each call ran: calls of several steps
    # keep their speed (`callback_bridge.needs_every_train_batch`).
    batch_hooks_per_call = True

    def __init__(self, optimizer, learning_rate, seconds=None, steps=None, verbose=True):
        super().__init__()
        if seconds is None and steps is None:
            raise ValueError("TimeBudget needs `seconds` or `steps` (or both) to know when "
                             "training ends. Received: seconds=None, steps=None.")
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.seconds = seconds
        self.steps = steps
        self.verbose = verbose
        self.steps_done = 0
        self.elapsed = 0.0
        self._start = None
        self._epoch = 0
        self._batch_in_epoch = -1    # the last step's index in this epoch
        self._last_line = 0.0
        self._terminal = sys.stdout.isatty()

    def fraction(self):
        """How much of the budget is spent, 0..1: the larger of the time's and the steps' share."""
        shares = []
        if self.seconds is not None:
            shares.append(self.elapsed / self.seconds)
        if self.steps is not None:
            shares.append(self.steps_done / self.steps)
        return min(1.0, max(shares))

    def start_clock(self):
        """Starts the budget now, before `fit` is called: its set-up (the data checks, the
        Trainer's first decisions) is spent from the budget too, as the user waits for it.
        Without it the clock starts at `on_train_begin`."""
        self._start = time.perf_counter()

    def on_train_begin(self, logs=None):
        if self._start is None:
            self._start = time.perf_counter()
        self.optimizer.learning_rate = self.learning_rate

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._batch_in_epoch = -1

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the index of the call's last step in this epoch.
        self.steps_done += batch - self._batch_in_epoch
        self._batch_in_epoch = batch
        self.elapsed = time.perf_counter() - self._start
        done = self.fraction()
        self.optimizer.learning_rate = self.learning_rate * 0.5 * (1 + math.cos(math.pi * done))
        if self.seconds is not None and self.elapsed >= self.seconds:
            self.model.stop_training = True
        if self.verbose:
            self._show(done, logs or {})

    def on_train_end(self, logs=None):
        if self.verbose and self._terminal:
            print(flush=True)

    def _show(self, done, logs):
        # Off a terminal a redrawn line fills log files: one line per tenth
        # of the budget instead.
        if not self._terminal and self.elapsed - self._last_line < self._line_every():
            return
        self._last_line = self.elapsed
        width = 24
        bar = "=" * int(done * width) + ">" + "." * (width - int(done * width))
        budget = f"{self.elapsed:5.1f} s of {self.seconds:.0f} s" if self.seconds else \
            f"step {self.steps_done}/{self.steps}"
        loss = f" - loss {logs['loss']:.5f}" if "loss" in logs else ""
        line = (f"training [{bar[:width + 1]}] {budget} - epoch {self._epoch + 1}, "
                f"{self.steps_done} steps{loss}")
        print(("\r" + line) if self._terminal else line, end="" if self._terminal else "\n",
              flush=True)

    def _line_every(self):
        return self.seconds / 10 if self.seconds else 10.0
