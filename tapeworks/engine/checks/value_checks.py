"""Checks that read the data's values at a fit's start: what a metric hides, what a loss cannot use.

They run once, on data already in memory: arrays as passed, or the arrays an
in-memory `tf.data` pipeline slices, read from its graph (never from an
iterator, which would advance its shuffle's seed). A pipeline that maps or
reads files is not read here. Each finding is a `CorrectnessWarning`:

- labels whose majority class holds `MAJORITY_SHARE` or more, with accuracy
  as the only metric and no class or sample weights: accuracy then reads as
  the majority share whatever the model learned;
- validation inputs on another scale than the training inputs (raw 0..255
  against [0, 1]): `SCALE_FACTOR` or more between their spreads, or their
  centres `SCALE_FACTOR` training spreads apart, on the median feature.

Large arrays are summarised from evenly spaced rows (`SAMPLE_VALUES` values
at most per tensor): on this project's 2-core Xeon, one-off, the scale check of
60000x784 training against 10000x784 validation floats took 41 ms and the
class counts of 60000 labels 0.5 ms; reading an in-memory pipeline's arrays
out of its graph (one copy of their bytes) took 178 ms for those 188 MB, beside
the 1.7 s the pipeline check's serialization of that graph already costs.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tapeworks.engine.step import guards
from tapeworks.engine.step import task as task_lib
from tapeworks.errors import CorrectnessWarning, warn

# A majority class this large makes accuracy meaningless on its own: a model
# that always predicts it scores 0.9. It is the edge of what Google's Machine
# Learning Crash Course calls a moderate imbalance (a minority of 1-20%);
# below it, accuracy still moves with what the model learns.
MAJORITY_SHARE = 0.9
# An order of magnitude between the spreads of training and validation
# inputs: ordinary splits of one data set differ by well under 2x (the
# tests' scikit-learn digits and breast-cancer splits), while a missing
# scaling step is 10x to 255x.
SCALE_FACTOR = 10.0
SAMPLE_VALUES = 500_000

_ACCURACY_NAMES = {"accuracy", "acc", "binary_accuracy", "categorical_accuracy",
                   "sparse_categorical_accuracy", "top_k_categorical_accuracy",
                   "sparse_top_k_categorical_accuracy"}
_ACCURACY_CLASSES = (keras.metrics.Accuracy, keras.metrics.BinaryAccuracy,
                     keras.metrics.CategoricalAccuracy, keras.metrics.SparseCategoricalAccuracy,
                     keras.metrics.TopKCategoricalAccuracy,
                     keras.metrics.SparseTopKCategoricalAccuracy)


@dataclasses.dataclass
class Values:
    """What is known of one data argument's values, as passed.

    Attributes:
        x: the inputs as arrays (one per model input, flat), or None.
        y: the labels as one array, or None.
        weighted: sample weights come with the data.
    """

    x: list = None
    y: np.ndarray = None
    weighted: bool = False

    @classmethod
    def of_arrays(cls, arrays):
        """From (x, y, sample_weight) arrays as passed to fit."""
        x, y, sample_weight = arrays
        return cls(x=_flat_arrays(x), y=_one_array(y), weighted=sample_weight is not None)

    @classmethod
    def of_elements(cls, element_spec, flat):
        """From an in-memory pipeline's source arrays (`pipeline_check.source_arrays`).

        None unless each component is a plain tensor (ragged and sparse ones
        are stored as several, or encoded).
        """
        specs = tf.nest.flatten(element_spec)
        if len(specs) != len(flat) or not all(
                isinstance(spec, tf.TensorSpec) for spec in specs):
            return None
        if not isinstance(element_spec, tuple) or len(element_spec) not in (2, 3):
            x = _flat_arrays(tf.nest.pack_sequence_as(element_spec, flat))
            return cls(x=x and [_rows(a) for a in x])
        x, y, *weights = tf.nest.pack_sequence_as(element_spec, flat)
        # Copies out of the graph: only what the checks read is kept.
        x = _flat_arrays(x)
        return cls(x=x and [_rows(a) for a in x], y=_one_array(y), weighted=bool(weights))


def _flat_arrays(x):
    flat = tf.nest.flatten(x)
    if not flat or not all(isinstance(a, (np.ndarray, tf.Tensor)) for a in flat):
        return None
    return [np.asarray(a) for a in flat]


def _one_array(y):
    if isinstance(y, (np.ndarray, tf.Tensor)):
        return np.asarray(y)
    return None


def _rows(array, values=SAMPLE_VALUES):
    """Evenly spaced rows of `array`, at most about `values` values in all."""
    per_row = max(1, int(np.prod(array.shape[1:], dtype=np.int64)))
    rows = max(1, min(len(array), values // per_row))
    if rows >= len(array):
        return array
    return array[np.linspace(0, len(array) - 1, rows).astype(np.int64)]


# The majority share --------------------------------------------------------------

def class_counts(y):
    """{class: count} of single-label classification labels, or None for other targets.

    Class ids of shape (N,) or (N, 1), integers or whole floats, or one-hot
    rows (N, C). Multi-label rows, values and per-pixel labels give None.
    """
    if y is None or y.size == 0 or y.dtype.kind not in "biuf" or y.ndim not in (1, 2):
        return None
    if y.ndim == 2 and y.shape[1] > 1:
        one_hot = np.all((y == 0) | (y == 1)) and np.all(y.sum(axis=1) == 1)
        if not one_hot:
            return None
        ids = y.argmax(axis=1)
    else:
        ids = y.reshape(-1)
        if y.dtype.kind == "f" and not np.all(np.mod(ids, 1) == 0):
            return None
    classes, counts = np.unique(ids, return_counts=True)
    return {int(c): int(n) for c, n in zip(classes, counts)}


def _metric_names(model):
    """Each metric the model was compiled with, as "accuracy" or "other"; None if unknown."""
    config = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    given = [config.get("metrics"), config.get("weighted_metrics")]
    if any(isinstance(m, dict) for m in given):
        return None   # metrics per output: several outputs, not looked at
    kinds = []
    for metric in tf.nest.flatten([m for m in given if m is not None]):
        if isinstance(metric, _ACCURACY_CLASSES):
            kinds.append("accuracy")
        elif isinstance(metric, str) and metric.lower() in _ACCURACY_NAMES:
            kinds.append("accuracy")
        elif getattr(metric, "__name__", None) in _ACCURACY_NAMES \
                and str(getattr(metric, "__module__", "")).startswith("keras"):
            kinds.append("accuracy")
        else:
            kinds.append("other")
    return kinds


def majority_message(task, values, name, class_weight):
    """The warning for labels whose majority hides behind accuracy, or None."""
    if not isinstance(task, task_lib.SupervisedTask) or class_weight is not None \
            or values is None or values.weighted:
        return None
    model = task.network
    kinds = _metric_names(model)
    if not kinds or any(kind != "accuracy" for kind in kinds) \
            or len(getattr(model, "outputs", None) or [None]) != 1:
        return None
    counts = class_counts(values.y)
    if not counts:
        return None
    total = sum(counts.values())
    majority, count = max(counts.items(), key=lambda item: item[1])
    share = count / total
    if share < MAJORITY_SHARE:
        return None
    weights = ", ".join(f"{c}: {total / (len(counts) * n):.3g}" for c, n in counts.items())
    others = ("the other class" if len(counts) == 2 else "the other classes") \
        if len(counts) > 1 else "any other class"
    return (f"tapeworks: {100 * share:.1f}% of the labels {name} are class {majority} "
            f"({count} of {total}), and accuracy is the only metric: a model that always "
            f"predicts class {majority} scores {share:.3f}, so accuracy cannot show whether "
            f"it learned anything about {others}. Fix: weigh the classes "
            f"(`fit(..., class_weight={{{weights}}})`, each class's weight "
            "total / (classes x its count)), and measure the rare classes: "
            "`metrics=[keras.metrics.AUC(), keras.metrics.Precision(), "
            "keras.metrics.Recall()]` (two classes), or per-class recall.")


# The validation inputs' scale ------------------------------------------------------

@dataclasses.dataclass
class Spread:
    """Per feature (the last axis), the 1st and 99th percentiles of one input's values."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, array):
        if array.dtype.kind not in "iuf" or array.ndim < 1 or array.size == 0:
            return None
        rows = _rows(array)
        features = rows.shape[-1] if rows.ndim > 1 else 1
        flat = rows.reshape(-1, features).astype(np.float32)
        if np.isfinite(flat).all():
            low, high = np.percentile(flat, [1, 99], axis=0)
        else:   # nanpercentile is several times slower: only where it is needed
            low, high = np.nanpercentile(np.where(np.isfinite(flat), flat, np.nan), [1, 99],
                                         axis=0)
        return cls(low.astype(np.float64), high.astype(np.float64))


def scale_message(train, validation, train_name, validation_name):
    """The warning for validation inputs on another scale than the training inputs, or None."""
    if train is None or validation is None or train.x is None or validation.x is None \
            or len(train.x) != len(validation.x):
        return None
    for index, (seen, checked) in enumerate(zip(train.x, validation.x)):
        if seen.shape[1:] != checked.shape[1:]:
            continue
        before, after = Spread.of(seen), Spread.of(checked)
        if before is None or after is None:
            continue
        width_before, width_after = before.high - before.low, after.high - after.low
        usable = (width_before > 0) & (width_after > 0)
        if not np.any(usable):
            continue
        ratio = float(np.median(width_after[usable] / width_before[usable]))
        shift = float(np.median(np.abs((after.high + after.low) - (before.high + before.low))[
            usable] / (2 * width_before[usable])))
        if 1 / SCALE_FACTOR < ratio < SCALE_FACTOR and shift < SCALE_FACTOR:
            continue
        which = f" (input {index})" if len(train.x) > 1 else ""
        span = (lambda s: f"[{np.median(s.low[usable]):.4g}, "
                          f"{np.median(s.high[usable]):.4g}]")
        how = (f"{ratio:.3g}x as wide" if not 1 / SCALE_FACTOR < ratio < SCALE_FACTOR
               else f"{shift:.3g} training spreads away")
        return (f"tapeworks: the inputs of {validation_name}{which} span {span(after)}, the "
                f"training inputs {train_name} {span(before)} (1st to 99th percentile, "
                f"median over {int(usable.sum())} feature(s)): {how}. Either the validation "
                "data was prepared differently from the training data (a scaling step applied "
                "to one only), or it lies where the training data never reached; either way "
                "val_loss and the validation metrics judge inputs unlike any the model trained "
                "on (accuracy may hide it while val_loss is far above loss). Fix: apply the "
                "training inputs' preprocessing to the validation inputs too (the same "
                "scaling, e.g. `x_val / 255.0`, or the same fitted scaler), or move it into "
                "the model (`keras.layers.Rescaling`, `keras.layers.Normalization`) so every "
                "input gets it; for data that grows over time, train on a scale both share "
                "(logs, differences).")
    return None


# Probability targets in a pipeline ----------------------------------------------------

class NegativeCrossEntropyWatch:
    """At an epoch's end: a cross-entropy below zero, which targets in [0, 1] cannot give.

    For data that is not read before training (a pipeline that maps or reads
    files): Keras' binary and categorical cross-entropies are at least 0 for
    every prediction when the targets are probabilities, so an epoch's mean
    loss below 0 means targets outside [0, 1] (masks of 0/255), and the loss
    falls without bound. One read of the epoch's logs, which the host holds
    anyway; models with regularisation or `add_loss` terms are not judged
    (their terms are part of the logged loss). Warned once.
    """

    def __init__(self, task, findings=None):
        self.task = task
        self.findings = findings   # a dict its warning is recorded in, by kind, or None
        self.warned = False

    def after_epoch(self, epoch, logs, name):
        task = self.task
        if self.warned or not isinstance(task, task_lib.SupervisedTask):
            return
        model = task.network
        loss = logs.get("loss")
        if loss is None or not np.isfinite(loss) or loss >= 0 \
                or not guards.expects_probability_targets(model.loss) or model.losses \
                or any(getattr(layer, attribute, None) is not None
                       for layer in task_lib.layers_of([model])
                       for attribute in ("kernel_regularizer", "bias_regularizer",
                                         "activity_regularizer")):
            return
        self.warned = True
        loss_name = getattr(model.loss, "name", None) or getattr(
            model.loss, "__name__", None) or str(model.loss)
        message = (
            f"tapeworks: the loss `{loss_name}` averaged {float(loss):.4g} over epoch "
            f"{epoch + 1}, below 0, which a cross-entropy never is for targets in [0, 1]: the "
            f"labels in `{name}` hold values outside [0, 1] (masks stored as 0/255?), so the "
            "loss falls without bound while the model learns nothing useful. Fix: scale the "
            "targets to [0, 1] in the pipeline (`.map(lambda x, y: (x, y / 255))`), or use "
            "a loss for values, such as `mse`.")
        if self.findings is not None:
            self.findings["negative cross-entropy"] = message
        warn(message, CorrectnessWarning, section="negative-cross-entropy")


def check_pipeline_targets(task, element_spec, values, name):
    """Raises `DataSpecError` for an in-memory pipeline's labels that its loss cannot take.

    The checks arrays get in `Task.check_data` (class ids against the output,
    probability targets in [0, 1]), on the arrays the pipeline slices.
    """
    if not isinstance(task, task_lib.SupervisedTask) or values is None or values.y is None \
            or task.network.loss is None or not isinstance(element_spec, tuple) \
            or len(element_spec) < 2:
        return
    guards.check_targets(element_spec[1], task.network, task.network.loss,
                         name=f"y` of `{name}", values=_rows(values.y))
