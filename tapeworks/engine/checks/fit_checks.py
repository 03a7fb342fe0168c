"""Warnings about how training is set up, at a fit's start and at its epochs' ends.

They read what already exists (the task's declared updates, an optimizer's
learning rate once an epoch), so they cost no step anything.
"""

import keras

from tapeworks.engine.step import guards
from tapeworks.engine.step import task as task_lib
from tapeworks.errors import CorrectnessWarning, warn


def check_something_trains(task):
    """Mistakes in how the model and its loss are set up (warnings; once per trainer)."""
    if not any(update.variables() for update in task.updates):
        names = ", ".join(f"`{m.name}`" for m in task.models)
        warn(f"tapeworks: nothing is trainable: every weight of {names} is frozen "
             "(trainable=False), so fit changes no weight, only the metrics. Fix: set "
             "`model.trainable = True` (or on the layers to fine-tune) before creating "
             "the Trainer.", CorrectnessWarning, section="setup-mistakes")
    if isinstance(task, task_lib.SupervisedTask):
        guards.check_output_matches_loss(task.model)
    for model in task.models:
        check_softmax_over_one_unit(model)


def check_softmax_over_one_unit(model):
    """Warns about an output that is a softmax over one unit: it is 1.0 whatever the input.

    A `Dense(1, activation="softmax")` head (a two-class model written with
    one unit) predicts 1.0 for every sample; a loss computed from the logits
    still falls, so nothing looks wrong until the predictions are read.
    """
    for tensor in getattr(model, "outputs", None) or []:
        history = getattr(tensor, "_keras_history", None)
        layer = history[0] if history is not None else None
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        softmax = activation == "softmax" or isinstance(layer, keras.layers.Softmax)
        if softmax and tensor.shape[-1] == 1:
            warn(f"tapeworks: `{layer.name}`, an output of `{model.name}`, is a softmax over 1 "
                 "unit: it outputs 1.0 for every input, so its predictions never change "
                 "(a loss computed from its logits can still fall). Fix: for two classes, "
                 "`Dense(1, activation=\"sigmoid\")` with binary cross-entropy, or "
                 "`Dense(2, activation=\"softmax\")` with sparse categorical cross-entropy.",
                 CorrectnessWarning, section="setup-mistakes")


def check_batch_statistics(task, train):
    """Warns when BatchNormalization will train on a batch of one sample.

    In training mode a BatchNormalization layer normalises each feature over
    the batch: over one sample every value is its batch's mean, so the layer
    outputs its offset (beta) whatever the input, and its moving statistics
    learn from that. Known before the first step for arrays (every batch, or
    the last of an epoch) and for datasets batched to a fixed size of 1.
    """
    layers = [layer for layer in task_lib.layers_of(task.models)
              if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable]
    if not layers or not train.batch_size:
        return
    names = ", ".join(f"`{layer.name}`" for layer in layers[:3])
    samples = len(first_input_array(train.arrays)) if train.arrays is not None else None
    if train.batch_size == 1:
        where = "every batch holds one sample"
    elif samples is not None and samples % train.batch_size == 1:
        where = (f"the last batch of each epoch holds one sample ({samples} samples in "
                 f"batches of {train.batch_size})")
    else:
        return
    warn(f"tapeworks: {where}, and BatchNormalization {names} normalises over the batch: "
         "over one sample it outputs its offset (beta) for every input, and its moving "
         "statistics learn from that. Fix: a batch size of 2 or more (for the last batch, "
         "one that does not leave a single sample, or drop it: `dataset.batch(n, "
         "drop_remainder=True)`).", CorrectnessWarning, section="setup-mistakes")


def first_input_array(arrays):
    """The first array of (x, y, sample_weight) as passed (x may be a list or dict of them)."""
    x = arrays[0]
    if isinstance(x, dict):
        return next(iter(x.values()))
    if isinstance(x, (list, tuple)):
        return x[0]
    return x


def check_schedule_horizons(task, optimizer_steps):
    """Warns when a learning-rate warm-up cannot end within the optimizer steps this fit runs.

    Keras' schedules count optimizer steps; a warm-up written in epochs or in
    samples ends far beyond the run, so the learning rate never reaches its
    peak. `optimizer_steps`: the updates this fit will apply (None: unknown).
    """
    if not optimizer_steps:
        return
    for update in task.updates:
        optimizer = update.optimizer
        schedule = getattr(optimizer, "_learning_rate", None)
        warmup = getattr(schedule, "warmup_steps", None)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule) \
                or not isinstance(warmup, (int, float)) or warmup <= 0:
            continue
        end = int(optimizer.iterations) + optimizer_steps
        if end < warmup:
            peak = getattr(schedule, "warmup_target", None)
            warn(f"tapeworks: the learning rate of update {update.name!r} warms up over "
                 f"{warmup:g} optimizer steps, but this fit ends at step {end} "
                 f"({optimizer_steps} updates): it never reaches its peak"
                 + (f" of {peak:g}" if isinstance(peak, (int, float)) else "")
                 + ". Keras' schedules count optimizer steps (batches), not epochs or "
                 "samples. Fix: `warmup_steps` in steps, e.g. epochs x steps per epoch "
                 "(with accumulation, divided by `accumulate`).", CorrectnessWarning,
                 section="setup-mistakes")


class LearningRateWatch:
    """At an epoch's end: a schedule that has decayed the learning rate to about nothing.

    A Keras schedule counts optimizer steps, so a `decay_steps` meant in
    epochs decays hundreds of times too fast; training then stops moving
    with no error. One read per optimizer per epoch; warned once per update.
    """

    def __init__(self, updates):
        self.updates = updates
        self.warned = set()   # updates whose decayed learning rate was reported

    def after_epoch(self, epochs_left):
        if epochs_left <= 0:
            return
        for update in self.updates:
            optimizer = update.optimizer
            schedule = getattr(optimizer, "_learning_rate", None)
            if (not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
                    or update.name in self.warned):
                continue
            start = float(schedule(0))
            now = float(optimizer.learning_rate)
            if start > 0 and now < 1e-3 * start:
                self.warned.add(update.name)
                warn(f"tapeworks: the learning rate of update {update.name!r} has decayed to "
                     f"{now:.3g} from {start:.3g} after {int(optimizer.iterations)} optimizer "
                     f"steps, with {epochs_left} epoch(s) still to run: training has all but "
                     f"stopped. Keras' schedules count optimizer steps (batches), not epochs. "
                     f"Fix: check `decay_steps` of the {type(schedule).__name__} (e.g. "
                     "epochs x steps per epoch).", CorrectnessWarning, section="setup-mistakes")
