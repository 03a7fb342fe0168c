"""The Trainer's data stage: user inputs in, checked datasets out, before any weight changes.

For each of `fit`, `evaluate` and `predict`, `DataStage` turns Keras-style
arguments into `adapters.PreparedData`, reads each `tf.data` pipeline the user
built once (`tapeworks.data.check`: its findings become warnings, shown once
per dataset, correctness first; in-memory pipelines train with tf.data's
autotuning model off), and checks the batches against the task: inputs,
then labels. Every problem is raised here, before the first step.
"""

import dataclasses
import logging
import time
import weakref

import tensorflow as tf

from tapeworks.data import pipeline_check
from tapeworks.data.pipeline import without_autotuning
from tapeworks.engine.inputs import adapters
from tapeworks.engine.step import task as task_lib
from tapeworks.engine.inputs import input_planner as input_planner_lib
from tapeworks.engine.checks import value_checks
from tapeworks.errors import (ConfigError, CorrectnessWarning, DataSpecError, PerformanceWarning,
                              warn)

logger = logging.getLogger("tapeworks")

_WARNING = {"correctness": CorrectnessWarning, "performance": PerformanceWarning}


@dataclasses.dataclass
class FitData:
    """What `fit` trains and validates on, prepared and checked once.

    Attributes:
        train: the training data (`adapters.PreparedData`).
        validation: the validation data, or None.
        input_planner: the `input_planner.InputPlanner` choosing how a
            `tapeworks.data.pipeline` runs (kept across fits on the same
            pipeline), or None.
    """

    train: adapters.PreparedData
    validation: adapters.PreparedData = None
    input_planner: object = None
    _epoch: tuple = None    # (settled, traces, start) of the running epoch, when planned

    def batches(self, steps_per_epoch, iterate, point=None, restore_iterator=None):
        """The `adapters.EpochBatches` walking `train` across epochs, at `point` when resumed.

        `iterate`: makes an iterator of a dataset (`Replication.iterate`);
        `restore_iterator`: reads a saved tf.data iterator back (or None).
        """
        batches = adapters.EpochBatches(self.train, steps_per_epoch, self.input_planner,
                                      make_iterator=iterate)
        if point is not None:
            batches.resume(point.passes, point.batches_drawn,
                           mid_pass=point.steps_in_epoch > 0 or steps_per_epoch is not None,
                           restore_iterator=restore_iterator)
        return batches

    def start_epoch(self, epochs_left, settled, traces):
        """Before an epoch: the input planner's way for it (`settled`: the call plan is chosen)."""
        if self.input_planner is not None:
            self.input_planner.start_epoch(epochs_left, settled)
            self._epoch = (settled, sum(traces.values()), time.perf_counter())

    def end_epoch(self, samples, settled, traces):
        """After an epoch: its rate, comparable when nothing was measured or traced in it."""
        if self.input_planner is not None:
            was_settled, traced, start = self._epoch
            self.input_planner.end_epoch(
                samples, time.perf_counter() - start,
                comparable=was_settled and settled and sum(traces.values()) == traced)

    def announce_input_choice_once(self, verbose):
        planner = self.input_planner
        if planner is None or planner.choice is None or planner.announced:
            return
        planner.announced = True
        if verbose:
            print(planner.summary())
        logger.info("%s", planner.summary())


# The guide's section of each finding on the data's values (docs/warnings.md).
VALUE_SECTIONS = {"majority": "majority-class", "scale": "validation-scale"}


class DataStage:
    """Prepares and checks the data of one Trainer's task.

    Args:
        task: the `Task` whose `check_data` judges the batches.
        seed: seed of the shuffle of array inputs.
        check_pipelines: read user tf.data pipelines (`Trainer(check_data=)`).
    """

    def __init__(self, task, seed=None, check_pipelines=True):
        self.task = task
        self.seed = seed
        self.check_pipelines = check_pipelines
        self.findings = []   # the findings on the last dataset read
        # user dataset -> (findings, train it without tf.data's autotuning model?,
        # does every new iterator yield the same batches?, its values when it
        # slices arrays in memory (`value_checks.Values`) or None)
        self._read = weakref.WeakKeyDictionary()
        # The value checks' warnings given by this stage, each kind once per trainer.
        self.value_findings = {}
        # The input planner of the last built pipeline fitted on (a weak reference
        # to that pipeline, the planner): measuring goes on across fit calls.
        self._input_planning = (None, None)
        # Epochs the fit being prepared runs (1: a finding about epochs is not said).
        self._epochs_to_run = None

    @property
    def input_planner(self):
        """The input planner of the last pipeline fitted on, or None."""
        return self._input_planning[1]

    def for_fit(self, x, y, sample_weight, *, batch_size, shuffle, class_weight,
                steps_per_epoch, validation_split, validation_data, validation_batch_size,
                validation_steps, epochs_to_run, plan_input):
        """`FitData` for `fit`'s arguments.

        `epochs_to_run`: epochs this fit runs (a generator object is read
        once); `plan_input`: choose how a `tapeworks.data.pipeline` runs by
        measurement (not when resuming: the data position is the checkpoint's).
        """
        self._epochs_to_run = epochs_to_run
        train, validation = self._for_fit(
            x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
            class_weight=class_weight, steps_per_epoch=steps_per_epoch,
            validation_split=validation_split, validation_data=validation_data,
            validation_batch_size=validation_batch_size, validation_steps=validation_steps)
        self._check_values(x, train, validation_data, validation, class_weight)
        if not train.reusable and steps_per_epoch is None and epochs_to_run > 1:
            raise DataSpecError(
                f"`x` is a generator object, which can be read only once, and fit was asked "
                f"for {epochs_to_run} epochs. Expected data that can be read again "
                "each epoch. Fix: pass the generator *function* (tapeworks calls it every "
                "epoch), a keras.utils.PyDataset or a tf.data.Dataset; or make the "
                "generator endless and set `steps_per_epoch`.")
        planner = self._input_planner_for(x, train, steps_per_epoch) if plan_input else None
        return FitData(train, validation, planner)

    def _values(self, x, prepared):
        """`value_checks.Values` of data in memory (arrays, in-memory pipelines), else None."""
        if prepared.arrays is not None:
            return value_checks.Values.of_arrays(prepared.arrays)
        if isinstance(x, tf.data.Dataset):
            return self._read.get(x, (None,) * 4)[3]
        return None

    def _check_values(self, x, train, validation_data, validation, class_weight):
        """The value checks of fit's data (`value_checks`): warnings, each kind once."""
        values = self._values(x, train)
        labels = "`y`" if train.arrays is not None else f"in `{train.name}`"
        found = {"majority": value_checks.majority_message(self.task, values, labels,
                                                           class_weight)}
        if validation is not None and validation_data is not None:
            # Not for validation_split: both parts are the same arrays, prepared alike.
            found["scale"] = value_checks.scale_message(
                values, self._values(validation_data, validation), f"`{train.name}`",
                "`validation_data`")
        for kind, message in found.items():
            if message is not None and kind not in self.value_findings:
                self.value_findings[kind] = message
                warn(message, CorrectnessWarning, section=VALUE_SECTIONS[kind])

    def _input_planner_for(self, x, train, steps_per_epoch):
        """The input planner for a built pipeline (kept across fits on it), else None.

        Only whole passes are measured: with `steps_per_epoch` the iterator
        carries over between epochs, so an epoch has no way of its own.
        """
        if train.parallelism is None or steps_per_epoch is not None:
            return None
        reference, planner = self._input_planning
        if planner is None or reference() is not x:
            planner = input_planner_lib.InputPlanner(train.parallelism)
            self._input_planning = (weakref.ref(x), planner)
        elif planner.dataset_of_first_way is not train.dataset:
            # The same ways on this fit's own prepared dataset (a class-weight
            # map, a take); the rates stay. Otherwise the ways are kept: a new
            # copy would pay its first iterator's set-up again.
            planner.use(train.parallelism)
        return planner

    def _for_fit(self, x, y, sample_weight, *, batch_size, shuffle, class_weight,
                 steps_per_epoch, validation_split, validation_data, validation_batch_size,
                 validation_steps):
        """(training data, validation data or None) for `fit`'s arguments."""
        split = None   # (x_val, y_val, sample_weight_val); y_val is None for x alone
        if validation_split and validation_data is None:
            (x, y, sample_weight), split = adapters.split_validation(
                x, y, sample_weight, validation_split)
        train = self.prepare(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                             class_weight=class_weight, purpose="fit", name="x",
                             training=True)
        if steps_per_epoch is not None:
            train.steps = steps_per_epoch
        validation = None
        if validation_data is not None or split is not None:
            val_x, val_y, val_weight = (split if split is not None
                                        else adapters.unpack_validation_data(validation_data))
            validation = self.prepare(
                val_x, val_y, val_weight, batch_size=validation_batch_size or batch_size,
                steps=validation_steps, purpose="evaluate", name="validation_data",
                batch_size_ignored_quietly=True)
        return train, validation

    def prepare(self, x, y=None, sample_weight=None, *, batch_size=None, shuffle=False,
                class_weight=None, steps=None, purpose="evaluate", name="x", training=False,
                batch_size_ignored_quietly=False):
        """One checked `PreparedData`; raises `ConfigError`/`DataSpecError` before any step."""
        prepared = adapters.prepare(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                                  seed=self.seed, class_weight=class_weight, steps=steps,
                                  purpose=purpose, name=name,
                                  # A Task gets from arrays what a dataset of them gives.
                                  # A model's own steps get Keras' packing.
                                  bare_x="keras" if self.task.own_train_step else
                                  not isinstance(self.task, task_lib.SupervisedTask))
        if batch_size is not None and prepared.kind != adapters.ARRAYS \
                and not batch_size_ignored_quietly:
            # Keras ignores it too; saying so costs nothing.
            warn(f"`batch_size={batch_size}` is ignored: `{name}` is a {prepared.kind}, which "
                 "yields batches already (as in Keras). Fix: batch it there, or drop "
                 "batch_size.", CorrectnessWarning)
        findings = []
        if isinstance(x, tf.data.Dataset):
            read, findings = self._read_pipeline(x, prepared.dataset, training)
            if read is not prepared.dataset:
                # Sliced from memory, tf.data's model now off: nothing left to choose.
                prepared.parallelism = None
            prepared.dataset = read
            if self._read.get(x, (None, None, False, None))[2]:
                # Nothing random in it: a new iterator draws the same batches.
                prepared.rebuild = lambda: read
        self._check(prepared, findings, needs_targets=purpose != "predict")
        if isinstance(x, tf.data.Dataset) and purpose != "predict":
            value_checks.check_pipeline_targets(self.task, prepared.dataset.element_spec,
                                                self._values(x, prepared), name)
        return prepared

    def _check(self, prepared, findings, needs_targets):
        arrays = prepared.arrays
        try:
            self.task.check_data(prepared.dataset.element_spec, prepared.name,
                                 needs_targets=needs_targets, arrays=arrays)
        except DataSpecError as error:
            unbatched = next((f for f in findings if f.code == "TD008"), None)
            if unbatched is None:
                raise
            raise DataSpecError(
                f"{error.message} The dataset is not batched ({unbatched.code}): each element "
                "is one example. Did you forget `.batch(batch_size)`?") from None

    def _read_pipeline(self, user_dataset, dataset, training):
        """Reads a user's tf.data pipeline once: its findings, and whether it is in memory.

        Serializing a graph that holds large arrays is not free, so each
        dataset is read once per Trainer and its findings are shown once.
        Returns the dataset to use (with tf.data's autotuning model off when
        it only slices tensors in memory and its options leave that unset;
        see `data.without_autotuning`) and the findings.
        """
        if not self.check_pipelines:
            return dataset, []
        if user_dataset not in self._read:
            try:
                graph = pipeline_check.dataset_graph(user_dataset)
            except (tf.errors.OpError, NotImplementedError) as error:
                # A pipeline tf.data cannot serialize (some stateful sources): say so, go on.
                logger.info("the data pipeline could not be checked (%s)", error)
                self._read[user_dataset] = ([], False, False, None)
                return dataset, []
            findings = pipeline_check.check_graph(graph, training=training)
            in_memory = pipeline_check.in_memory(graph)
            untuned = in_memory and user_dataset.options().autotune.enabled is None
            arrays = pipeline_check.source_arrays(graph)
            self._read[user_dataset] = (
                findings, untuned, pipeline_check.replays_identically(graph),
                None if arrays is None else value_checks.Values.of_elements(
                    user_dataset.element_spec, arrays))
            for finding in findings:
                if finding.category == "performance" and in_memory:
                    # Slicing tensors held in memory costs microseconds a batch:
                    # a prefetch or parallel hint cannot matter there.
                    continue
                if finding.code == "TD009" and self._epochs_to_run == 1:
                    # "Every epoch sees them in their stored order" says nothing
                    # about a fit of one epoch, whose order may well be shuffled
                    # already (Keras' CTC example shuffles with pandas first):
                    # kept in the findings, not warned.
                    continue
                warn(f"tapeworks data check: {finding}", _WARNING[finding.category])
            if untuned:
                logger.info("the data is sliced from memory; tf.data's autotuning model is "
                            "off for it (nothing to tune)")
        findings, untuned, _, _ = self._read[user_dataset]
        self.findings = findings
        return (without_autotuning(dataset) if untuned else dataset), findings


def check_epochs(epochs, initial_epoch, steps_per_epoch):
    """Keras' rules: any `epochs >= 0`; `initial_epoch >= epochs` trains nothing."""
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
        raise ConfigError(
            f"`epochs` must be an integer >= 0. Received: epochs={_short(epochs)}. "
            "Fix: pass it by keyword, `fit(x, y, epochs=5)`: the second positional argument "
            "of fit is `y`, as in Keras.")
    if not isinstance(initial_epoch, int) or isinstance(initial_epoch, bool) \
            or initial_epoch < 0:
        raise ConfigError(
            "`initial_epoch` must be an integer >= 0. Received: "
            f"initial_epoch={_short(initial_epoch)}")
    if steps_per_epoch is not None and not (
            isinstance(steps_per_epoch, int) and steps_per_epoch >= 1):
        raise ConfigError(
            "`steps_per_epoch` must be None or an integer >= 1. Received: "
            f"steps_per_epoch={_short(steps_per_epoch)}")


def check_validation_freq(validation_freq):
    if isinstance(validation_freq, int) and not isinstance(validation_freq, bool) \
            and validation_freq >= 1:
        return
    if isinstance(validation_freq, (list, tuple)) and all(
            isinstance(e, int) for e in validation_freq):
        return
    raise ConfigError(
        "`validation_freq` must be an integer >= 1 (validate every that many epochs) or a "
        f"list of epoch numbers (1-based). Received: validation_freq={_short(validation_freq)}")


def should_validate(epoch, validation_freq):
    """Keras' rule: `epoch` is 0-based; `validation_freq` counts epochs from 1."""
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__name__}>"
