"""Choosing how a built input pipeline runs, by measurement on epochs that train anyway.

`tapeworks.data.pipeline` returns a pipeline that can run several ways
(`tapeworks.data.pipeline.PARALLELISM`: tf.data's autotuning model on or off,
single-threaded ops, one thread for all of it). Which is fastest depends on
the machine and on what else uses its cores: on 2 cores, where the training
step and the pipeline compete, fixed parallelism with single-threaded ops
trained at 6,263 samples/s and tf.data's autotune at 5,461 while the Trainer
measured (benchmarks/input.md); with the step on an accelerator the cores are
the pipeline's alone, and tf.data's model may win there.
So the Trainer measures: each way runs one whole epoch (a new iterator every
epoch, so switching costs nothing and loses no data; all ways share the
shuffle state, so the data and its order are the same), and the fastest is
kept. A way's first epoch is not timed (its first iterator instantiates its
functions and thread pools, a cost paid once); then it is timed over whole
epochs until it has `MIN_SECONDS` of them, so that short epochs are not
judged by scheduler noise.

Measuring pays for itself as the step planner's does (`autotune.CallPlanner`):
an epoch in a slower way loses at most what the same epoch in a faster way
wins, so the untried ways are tried only while at least as many epochs are
expected after the trials as the trials take. Epochs expected: the rest of
this `fit`, or, across `fit` calls on the same data, as many as have run so
far. Epochs count only while the step's mode is settled and nothing was
traced or compiled in them: a rate measured while the step planner changes
the step, or with a compile inside, compares nothing.
"""

import dataclasses
import math

MIN_SECONDS = 1.0   # of epochs per way: tf.data's autotuning runs at one of two speeds from
                    # epoch to epoch on a busy machine; a second of epochs sees both


@dataclasses.dataclass
class InputChoice:
    """What the input planner chose: the way's name and the rates it measured."""

    name: str
    rates: dict


class InputPlanner:
    """Picks one of `choices` [(name, dataset)] for each epoch, then keeps the fastest."""

    def __init__(self, choices):
        self._choices = list(choices)
        self._rates = {}
        self._timed = {}      # name -> [samples, seconds] of comparable epochs so far
        self._warmed = set()  # names of the ways that have run an epoch
        self._epoch_seconds = None
        self._index = 0
        self._measuring = False
        self.epochs_trained = 0
        self.choice = None
        self.announced = False

    def use(self, choices):
        """The same ways on a new fit's prepared dataset; what was measured stays."""
        self._choices = list(choices)

    @property
    def dataset(self):
        """The dataset to iterate in the coming epoch."""
        return self._choices[self._index][1]

    @property
    def dataset_of_first_way(self):
        """The pipeline as built (the first way runs it as it is)."""
        return self._choices[0][1]

    @property
    def name(self):
        return self._choices[self._index][0]

    @property
    def tuning(self):
        return self.choice is None

    def start_epoch(self, epochs_left, step_settled):
        """Chooses the way the coming epoch runs.

        Args:
            epochs_left: epochs left in this fit, the coming one included.
            step_settled: whether the step's mode is final (only then does an
                epoch's rate compare the input ways alone).
        """
        self._measuring = False
        if self.choice is not None:
            return
        untried = [i for i, (name, _) in enumerate(self._choices) if name not in self._rates]
        expected = max(epochs_left, self.epochs_trained)
        if step_settled and expected >= 2 * self._trial_epochs(len(untried)):
            self._index = untried[0]
            self._measuring = True
        else:
            self._index = self._best_so_far()

    def end_epoch(self, samples, seconds, comparable):
        """Records the epoch just trained: `samples` in `seconds`.

        `comparable`: the step's mode stayed settled and nothing was traced or
        compiled during the epoch.
        """
        self.epochs_trained += 1
        first_epoch_of_way = self.name not in self._warmed
        self._warmed.add(self.name)
        if first_epoch_of_way or not (self._measuring and comparable and seconds > 0):
            return
        self._epoch_seconds = seconds if self._epoch_seconds is None else min(
            self._epoch_seconds, seconds)
        timed = self._timed.setdefault(self.name, [0, 0.0])
        timed[0] += samples
        timed[1] += seconds
        if timed[1] < MIN_SECONDS:
            return
        self._rates[self.name] = timed[0] / timed[1]
        if len(self._rates) == len(self._choices):
            self._index = self._best_so_far()
            self.choice = InputChoice(self.name, dict(self._rates))

    def _trial_epochs(self, ways):
        """Epochs that timing `ways` more ways takes: a warm-up epoch each, then the timed ones."""
        if self._epoch_seconds is None:
            return 2 * ways
        return ways * (1 + math.ceil(MIN_SECONDS / max(self._epoch_seconds, 1e-6)))

    def _best_so_far(self):
        if not self._rates:
            return 0
        best = max(self._rates, key=self._rates.get)
        return next(i for i, (name, _) in enumerate(self._choices) if name == best)

    def report(self):
        """{"choice", "rates" (samples/s per way measured), "tuning"} for `trainer.tuning`."""
        return {"choice": self.choice.name if self.choice else None,
                "in_use": self.name, "rates": dict(self._rates), "tuning": self.tuning}

    def summary(self):
        """One line for the user: the way chosen and what each measured."""
        rates = ", ".join(f"{name} {rate:,.0f}" for name, rate in sorted(
            self.choice.rates.items(), key=lambda item: -item[1]))
        return f"tapeworks: input pipeline runs with {self.choice.name} (samples/s: {rates})"
