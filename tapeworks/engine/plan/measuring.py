"""`TrialRun`: running a trainer's own compiled loop without leaving a trace.

`Trainer.diagnose_input` and `Trainer.explain` time real training calls; a
trial run saves every variable training can change (`TrainingState.
everything()`: weights, optimizer, counters, accumulators, loss trackers and
metrics, the guard's count, the dead-gradient sums, the monitor's slots, the
captures) on entry and puts each back on exit, so the trainer is left bit for
bit as it was found.
"""

import time

import tensorflow as tf

from tapeworks.data import diagnose as diagnose_lib
from tapeworks.engine.step import guards


class TrialRun:
    """A context manager: the trainer's loops, for timing; every variable restored on exit."""

    def __init__(self, state, compiled, plan, data_stage, iterate, precision, retraces):
        self.state = state
        self.compiled = compiled
        self.data_stage = data_stage
        self.iterate = iterate            # Replication.iterate
        self.precision_policy = precision.policy
        self.precision_reason = precision.reason
        self.precision_measured = precision.measured   # "auto", measured or still to be
        self.models = state.task.models
        self.mode = plan.mode if plan.mode is not None else False
        self.steps_per_call = plan.steps or 1
        self.retraces = list(retraces)    # the user's functions that retraced in the last fit
        self.run_eagerly = compiled.config.run_eagerly
        self._saved = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # The metrics' totals and counts are put back too, not reset: a trial
        # run between two epochs leaves the running epoch's values as they were.
        if self._saved is not None:
            self.state.put_back(self._saved)
        return False

    def prepare(self, data, batch_size=None):
        """`data` as checked `PreparedData`, every variable built, and saved from here on."""
        prepared = self.data_stage.prepare(data, batch_size=batch_size, purpose="evaluate")
        self.use(prepared.dataset)
        return prepared

    def use(self, dataset):
        """Builds every variable for `dataset`'s batches and saves them (once)."""
        self.state.build(dataset.element_spec)
        if self._saved is None:
            self._saved = self.state.values_of(self.state.everything())

    def restore(self):
        """Every variable back to the values saved on entry."""
        self.state.put_back(self._saved)

    @property
    def traces(self):
        return sum(self.compiled.traces.values())

    def loop(self, mode):
        return self.compiled.train_loop(mode)


def input_report(trial, dataset, batches=30):
    """Whether training waits for `dataset`: a `tapeworks.data.InputReport` (trains nothing).

    The train loop's rate on `batches` batches held in memory against its
    rate fed by `dataset`, and the pipeline's own rate; see
    `tapeworks/data/diagnose.py`.
    """
    trial.use(dataset)
    loop = trial.loop(trial.mode)
    pipeline = diagnose_lib.pipeline_rate(dataset, batches)
    in_memory = dataset.take(batches).cache()
    for _ in in_memory:  # fill the cache
        pass

    def rate(source):
        iterator = trial.iterate(source)
        with guards.inside_step():
            int(loop(iterator, tf.constant(1, tf.int64))[0])   # traced and warm
            start = time.perf_counter()
            ran = int(loop(iterator, tf.constant(batches - 1, tf.int64))[0])
        return ran / max(time.perf_counter() - start, 1e-9)

    compute = rate(in_memory)
    trial.restore()
    training = rate(dataset)
    return diagnose_lib.report(dataset, pipeline, compute, training)
