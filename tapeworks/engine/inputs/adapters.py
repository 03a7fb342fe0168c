"""The data stage: what users pass to `fit`/`evaluate`/`predict` in, one ready dataset out.

Keras gathers this in its data adapters and `EpochIterator`; tapeworks does the
same in one place, so `Trainer.fit` reads as prepare data -> build -> plan ->
loop -> validate. `prepare` takes Keras' own arguments (`x`, `y`,
`sample_weight`, `batch_size`, `shuffle`, `class_weight`, `steps`) and
returns a `PreparedData`: a batched `tf.data.Dataset` plus what is known
about it (its kind, batches per pass, whether it can be read twice, whether
it only slices memory).

Accepted, as in Keras: NumPy arrays, tensors and anything with `__array__`
(pandas), alone or in lists/tuples/dicts for multi-input models; a
`tf.data.Dataset`; a `keras.utils.PyDataset`; a Python generator. tapeworks
also takes a generator *function* (re-read every epoch) and, for backward
compatibility, `fit((x, y))` / `evaluate((x, y))`.

Keras' helpers are used where they define the semantics users rely on:
`train_validation_split` (the last part becomes validation data, before any
shuffle), `class_weight_to_sample_weights` and the class-weight map of
`tf.data` inputs, and `PyDatasetAdapter` (workers, `on_epoch_end`). They live
under `keras.src`, Keras' implementation package; this module is the one place
that imports them.
"""

import dataclasses
import inspect
import itertools
import math
import os
import types

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDataset, PyDatasetAdapter
from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

from tapeworks.data.pipeline import is_built, parallelism_choices, without_autotuning
from tapeworks.engine.inputs import iterator_release
from tapeworks.errors import ConfigError, DataSpecError

DEFAULT_BATCH_SIZE = 32   # Keras' default for arrays

ARRAYS, DATASET, PYDATASET, GENERATOR, GENERATOR_FUNCTION = (
    "arrays", "tf.data.Dataset", "keras.utils.PyDataset", "generator", "generator function")


@dataclasses.dataclass
class PreparedData:
    """A batched dataset ready for the compiled loop, and what is known about it.

    Attributes:
        dataset: batched `tf.data.Dataset` of (x, y[, sample_weight]) or (x,).
        kind: what the user passed (`ARRAYS`, `DATASET`, ...), for messages.
        steps: batches in one pass, when known.
        reusable: False for a generator object, which can be read only once.
        arrays: for array inputs, the (x, y, sample_weight) as passed (after
            the validation split), for checks that read values.
        name: how messages call the argument (`x`, `validation_data`).
        parallelism: for a pipeline `tapeworks.data.pipeline` built, the ways
            it can run [(name, dataset)], for the Trainer to choose from by
            measurement (`input_planner`); None for other data.
        rebuild: a function that gives `dataset` again, to draw the same
            batches in the same orders over its passes: for array inputs it
            builds it anew (its shuffle has an explicit seed); for an
            in-memory pipeline with nothing random in it (set by the data
            stage) it is the pipeline itself. None for other data, whose
            batches cannot be drawn again.
    """

    dataset: tf.data.Dataset
    kind: str
    steps: int = None
    reusable: bool = True
    arrays: tuple = None
    name: str = "x"
    batch_size: int = None
    parallelism: list = None
    rebuild: object = None
    _adapter: object = None

    def on_epoch_begin(self):
        if self._adapter is not None:
            self._adapter.on_epoch_begin()

    def on_epoch_end(self):
        if self._adapter is not None:
            self._adapter.on_epoch_end()

    def empty_message(self, epoch, steps_done, steps_per_epoch):
        """Why a pass gave fewer batches than asked, and the fix, for this kind of data."""
        wanted = f"{steps_per_epoch} steps" if steps_per_epoch else "at least one step"
        where = f"The training data ran out in epoch {epoch + 1} after {steps_done} step(s); " \
                f"expected {wanted}."
        if self.kind == GENERATOR:
            cause = ("A Python generator object can be read only once. Fix: pass a "
                     "tf.data.Dataset or NumPy arrays, a function that returns a fresh "
                     "generator, or an endless generator with `steps_per_epoch`.")
        elif self.kind == DATASET and steps_done == 0 and not steps_per_epoch:
            cause = ("The tf.data.Dataset yielded no element: it is empty (a `.filter()` "
                     "that removes every element, `.take(0)`, `.skip()` past its end, or a "
                     "file pattern that matches nothing). Fix: check the pipeline with "
                     "`for batch in dataset.take(1): print(batch)`.")
        else:
            cause = (f"The {self.kind} has fewer batches than `steps_per_epoch` asks for. "
                     "Fix: lower `steps_per_epoch`, leave it None to stop at the end of the "
                     "data, or `.repeat()` the dataset.")
        return f"{where} {cause}"


def prepare(x, y=None, sample_weight=None, *, batch_size=None, shuffle=False, seed=None,
            class_weight=None, steps=None, purpose="fit", name="x", bare_x=False):
    """Returns the `PreparedData` for Keras-style inputs.

    Args:
        x, y, sample_weight: as in `keras.Model.fit`.
        batch_size: for array inputs (default 32); ignored for datasets,
            PyDatasets and generators, which come batched (as in Keras).
        shuffle: True (reshuffle every epoch), "batch" (shuffle the order of
            batch-sized chunks) or False; for array inputs only.
        seed: seed of that shuffle, so that runs repeat.
        class_weight: `{class id: weight}`, turned into sample weights.
        steps: read at most this many batches per pass (`evaluate(steps=)`,
            `predict(steps=)`, `validation_steps`).
        purpose: "fit", "evaluate" or "predict" (predict needs no targets).
        name: how messages call the argument.
        bare_x: arrays without `y` (nor `sample_weight`) make batches of `x`
            itself, as a dataset of single tensors does, instead of the 1-tuple
            `(x,)` Keras' unpacking expects: a `Task`'s `compute_losses` then
            gets the same batch from arrays and from a dataset. Not for predict.
            "keras": as Keras packs arrays for every purpose
            (`keras.utils.pack_x_y_sample_weight`), for a model's own steps.
    """
    if purpose != "predict" and y is None and sample_weight is None and _is_legacy_tuple(x):
        # tapeworks' original `fit((x, y))`: still accepted.
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(x)
    if steps is not None and not (isinstance(steps, int) and steps >= 1):
        raise ConfigError(f"`steps` must be None or an integer >= 1. Received: steps={steps!r}")
    if class_weight is not None and not isinstance(class_weight, dict):
        raise ConfigError(
            "`class_weight` must be a dict {class id: weight}. Received: "
            f"class_weight={type(class_weight).__name__}. Fix: e.g. "
            "class_weight={0: 1.0, 1: 5.0}.")

    if isinstance(x, tf.data.Dataset):
        _no_separate_targets(y, sample_weight, DATASET, name)
        dataset = x
        if class_weight is not None:
            dataset = dataset.map(make_class_weight_map_fn(class_weight))
        prepared = PreparedData(dataset, DATASET, cardinality(dataset), name=name,
                                batch_size=_static_batch(dataset))
    elif isinstance(x, PyDataset):
        _no_separate_targets(y, sample_weight, PYDATASET, name)
        adapter = PyDatasetAdapter(x, class_weight=class_weight, shuffle=bool(shuffle))
        prepared = PreparedData(adapter.get_tf_dataset(), PYDATASET, adapter.num_batches,
                                name=name, _adapter=adapter)
    elif isinstance(x, types.GeneratorType) or _is_generator_function(x):
        kind = GENERATOR if isinstance(x, types.GeneratorType) else GENERATOR_FUNCTION
        _no_separate_targets(y, sample_weight, kind, name)
        if class_weight is not None:
            raise ConfigError(
                f"`class_weight` is not supported for a {kind} (as in Keras). Fix: yield "
                "(x, y, sample_weight) batches, or pass arrays or a tf.data.Dataset.")
        prepared = PreparedData(_from_generator(x, name), kind, None,
                                reusable=kind == GENERATOR_FUNCTION, name=name)
    elif _all_arrays((x, y, sample_weight)) and x is not None:
        prepared = _from_arrays(x, y, sample_weight, batch_size, shuffle, seed, class_weight,
                                purpose, name, bare_x)
    else:
        raise ConfigError(
            f"`{name}` has a type tapeworks cannot read: {_type_name(x)}. Expected NumPy "
            "arrays or tensors (alone, or in a list/tuple/dict for several inputs) with `y=`, "
            "a tf.data.Dataset of (x, y) or (x, y, sample_weight) batches, a "
            "keras.utils.PyDataset, or a Python generator yielding such batches.")
    if steps is not None:
        prepared.dataset = prepared.dataset.take(steps)
        prepared.steps = min(steps, prepared.steps) if prepared.steps else steps
        if prepared.rebuild is not None:
            rebuild = prepared.rebuild
            prepared.rebuild = lambda: rebuild().take(steps)
    if purpose == "fit" and is_built(x):
        # The stages after the built pipeline are tapeworks' own (a class-weight
        # map, a take), which set no options: the choice may cover them too.
        prepared.parallelism = parallelism_choices(prepared.dataset)
    return prepared


def split_validation(x, y, sample_weight, validation_split):
    """Keras' `validation_split`: the last part of the arrays, taken before any shuffle.

    Returns ((x, y, sample_weight), (x_val, y_val, sample_weight_val)).
    """
    if not isinstance(validation_split, (int, float)) or not 0 <= validation_split < 1:
        raise ConfigError("`validation_split` must be a number in [0, 1). Received: "
                          f"validation_split={validation_split!r}")
    if y is None and sample_weight is None and _is_legacy_tuple(x):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(x)
    if not _all_arrays((x, y, sample_weight)):
        raise ConfigError(
            "`validation_split` only works with arrays or tensors (as in Keras): the last "
            f"part of them becomes the validation data. `x` is {_type_name(x)}. Fix: pass "
            "`validation_data=` (for a tf.data.Dataset: `dataset.take(n)` / `.skip(n)`).")
    try:
        return array_slicing.train_validation_split(
            (x, y, sample_weight), validation_split=validation_split)
    except ValueError as error:
        # Keras' own message says what was wrong (too few samples for both
        # parts, or an array it cannot slice).
        raise ConfigError(f"`validation_split={validation_split}` could not split the "
                          f"arrays: {error}") from None


def unpack_validation_data(validation_data):
    """(x, y, sample_weight) from `validation_data`, as Keras reads it."""
    if isinstance(validation_data, (tuple, list)) and _is_legacy_tuple(tuple(validation_data)):
        return keras.utils.unpack_x_y_sample_weight(tuple(validation_data))
    if isinstance(validation_data, (tuple, list)):
        raise ConfigError(
            f"`validation_data` is a {type(validation_data).__name__} of "
            f"{len(validation_data)} item(s). Expected (x_val, y_val) or (x_val, y_val, "
            "sample_weight_val), or a tf.data.Dataset / PyDataset / generator.")
    return validation_data, None, None


class EpochBatches:
    """The training iterator across epochs.

    A new iterator every epoch; with `steps_per_epoch` it carries over
    between epochs and restarts when the data runs out. When the number of
    batches is known, a used-up iterator is replaced before the next call,
    so no batch hook fires for a call that would find no data.
    """

    def __init__(self, prepared, steps_per_epoch, input_planner=None, make_iterator=iter):
        self.prepared = prepared
        # `iter`, or the Trainer's: distributed across replicas under a strategy.
        self.make_iterator = make_iterator
        self.steps_per_epoch = steps_per_epoch
        self.input_planner = input_planner
        self._batches = cardinality(prepared.dataset)
        self._iterator = None
        self._used = 0
        self.passes = 0          # iterators started over the data (a resumed run replays them)
        self._resume = None

    @property
    def drawn(self):
        """Batches drawn from the current pass."""
        return self._used

    @property
    def current(self):
        """The iterator of the current pass (for a checkpoint of its position)."""
        return self._iterator

    def resume(self, passes, drawn, mid_pass, restore_iterator=None):
        """Puts the data where a saved run was: `passes` started, `drawn` batches into the last.

        `restore_iterator(iterator)` (tf.data pipelines) restores the last
        pass's iterator from its checkpoint: its position, shuffle buffer and
        random state, and the reshuffling state of the dataset's shuffles,
        which tf.data saves with the iterator (tested), so the next pass
        comes in the uninterrupted order. Replayed data (arrays, or
        `checkpoint_data="skip"`) has no checkpoint: the passes before are
        started and dropped unread, which advances each reshuffling seed as
        the uninterrupted run did, then `drawn` batches are drawn again.
        """
        self._resume = (passes, drawn, mid_pass, restore_iterator)

    def start_epoch(self):
        if self._resume is not None:
            passes, drawn, mid_pass, restore_iterator = self._resume
            self._resume = None
            if passes:
                if restore_iterator is None:
                    for _ in range(passes - 1):
                        self.make_iterator(self.prepared.dataset)
                    self.restart()
                    for index in range(drawn if mid_pass else 0):
                        if self._iterator.get_next_as_optional().has_value():
                            continue
                        raise DataSpecError(
                            f"The checkpoint was saved {drawn} batches into a pass over the "
                            f"training data; this data ends after {index}. Expected the data "
                            "of the run that saved it (same arrays, batch size and seed); "
                            "nothing was trained and the model is as it was before fit. "
                            "Fix: pass that data, or start over with resume=False, "
                            "overwrite=True.")
                else:
                    self.restart()
                    try:
                        restore_iterator(self._iterator)
                    except (tf.errors.OpError, AssertionError, ValueError) as error:
                        raise DataSpecError(
                            "The data position in the checkpoint does not fit this pipeline "
                            f"({type(error).__name__}: {str(error)[:200]}). Expected the "
                            "pipeline of the run that saved it; nothing was trained and the "
                            "model is as it was before fit. Fix: build the same pipeline, "
                            "or start over with resume=False, overwrite=True.") from None
                self.passes, self._used = passes, drawn
                if mid_pass:
                    return
        if self._iterator is None or self.steps_per_epoch is None:
            self.restart()

    def restart(self):
        # The input planner's way for this epoch: the same data, run its way.
        dataset = (self.input_planner.dataset if self.input_planner is not None
                   else self.prepared.dataset)
        self.close()
        self._iterator = self.make_iterator(dataset)
        self._used = 0
        self.passes += 1

    def used_up(self):
        """Whether every batch of data of known length was drawn in this pass."""
        return bool(self._batches) and self._used >= self._batches

    def iterator(self):
        if self.steps_per_epoch is not None and self.used_up() and self.prepared.reusable:
            self.restart()
        return self._iterator

    def consumed(self, batches):
        self._used += batches

    @property
    def replayable(self):
        """Whether the batches drawn can be drawn again (`replay`)."""
        return self.prepared.rebuild is not None and self.input_planner is None

    def replay(self):
        """The current pass again, from the data rebuilt, after the batches drawn before now.

        The data is built anew (`PreparedData.rebuild`) and the passes before
        are started and dropped unread, as a resumed run does (`resume`), so
        the iterator returned yields this pass's next batch and those after
        it, in the same order. It replaces the pass's iterator (`adopt`).
        """
        dataset = self.prepared.rebuild()
        for _ in range(self.passes - 1):
            self.make_iterator(dataset)
        # Skipped inside tf.data, not drawn one by one from Python: an
        # endless pipeline with `steps_per_epoch` may be millions of batches
        # in. A skip shares the shuffle's reshuffling state with `dataset`.
        return self.make_iterator(dataset.skip(self._used))

    def adopt(self, iterator):
        """Goes on with `iterator` (from `replay`) in place of the pass's own."""
        self.close()
        self._iterator = iterator

    def close(self):
        """Lets go of the pass's iterator off this thread (`iterator_release`)."""
        old, self._iterator = self._iterator, None
        iterator_release.release(old)


# Arrays -------------------------------------------------------------------

def _from_arrays(x, y, sample_weight, batch_size, shuffle, seed, class_weight, purpose, name,
                 bare_x=False):
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(
            f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}")
    if shuffle not in (True, False, "batch"):
        raise ConfigError(
            f"`shuffle` must be True, False or \"batch\". Received: shuffle={shuffle!r}")
    x, y, sample_weight = (_as_sliceable(v) for v in (x, y, sample_weight))
    if purpose == "predict":
        y = sample_weight = None
    if class_weight is not None:
        if sample_weight is not None:
            raise ConfigError("`class_weight` and `sample_weight` were both given. Expected "
                              "one of them (as in Keras). Fix: fold the class weights into "
                              "`sample_weight`.")
        if y is None or len(tf.nest.flatten(y)) != 1:
            raise ConfigError("`class_weight` needs one array of labels `y` (a model with "
                              "one output, as in Keras). Fix: pass `sample_weight` instead.")
        sample_weight = data_adapter_utils.class_weight_to_sample_weights(
            tf.nest.flatten(y)[0], class_weight)
    arrays = (x, y, sample_weight)
    lengths = {_length(v) for v in tf.nest.flatten(arrays) if v is not None}
    if -1 in lengths:
        raise DataSpecError(
            f"`{name}` holds a scalar where arrays of samples were expected. Expected arrays "
            "whose first axis indexes the samples. Fix: for one sample add the batch axis, "
            "e.g. `x[None]`.")
    if len(lengths) != 1:
        raise DataSpecError(
            f"The arrays given as `{name}`, y and sample_weight have different numbers of "
            f"samples: {sorted(lengths)}. Expected the same first dimension everywhere; "
            "check that they were sliced alike.")
    (num_samples,) = lengths
    if num_samples == 0:
        raise DataSpecError(
            f"`{name}` has 0 samples. Expected at least one. Fix: check the slicing or "
            "filtering that produced it.")
    if bare_x == "keras":
        # What Keras' fit and predict give a model's own steps: x alone, unless
        # it is a list or tuple of inputs ((x,) then), (x, y), (x, y, weights).
        element = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    elif purpose == "predict":
        element = (x,)   # (x,): a tuple x of several inputs stays one x
    elif bare_x and y is None and sample_weight is None:
        element = x
    else:
        element = tuple(v for v in arrays if v is not None) if y is not None else (x,)
    if shuffle and seed is None:
        seed = shuffle_seed()

    def build():
        dataset = tf.data.Dataset.from_tensor_slices(element)
        if shuffle is True:
            # Reshuffled every epoch; a fixed seed makes the sequence repeat.
            dataset = dataset.shuffle(num_samples, seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.batch(batch_size)
        if shuffle == "batch":
            dataset = _rows_shuffled(dataset, seed)
        # In memory: nothing for tf.data's autotuning model to tune, and it
        # slows compute-bound steps on small CPU machines (see the function).
        return without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))

    return PreparedData(build(), ARRAYS, math.ceil(num_samples / batch_size), arrays=arrays,
                        name=name, batch_size=min(batch_size, num_samples), rebuild=build)


def _rows_shuffled(dataset, seed):
    """Keras 3's `shuffle="batch"`: the batches in order, the rows of each in a new order.

    (Keras' array adapters permute each batch's indices on every backend.) Left
    in order where a component is sparse or ragged: a mean loss does not see it.
    """
    spec = dataset.element_spec
    if not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
        return dataset
    several = isinstance(spec, tuple)

    def permute(*parts):
        batch = parts if several else parts[0]
        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        order = tf.random.shuffle(tf.range(rows), seed=seed)
        return tf.nest.map_structure(lambda t: tf.gather(t, order), batch)

    return dataset.map(permute)


def shuffle_seed():
    """The seed tf.data's shuffle would draw for itself, drawn here to be kept.

    With a seed of its own a shuffle can be built again in the same order
    (`PreparedData.rebuild`). Under a global seed (`tf.random.set_seed`,
    `keras.utils.set_random_seed`) this is the very seed the shuffle would
    have drawn: TensorFlow's operation-seed counter advances once, as it
    would for the shuffle, and `get_seed` pairs the global seed with it
    either way. Without one, a random seed, as the shuffle's own would be.
    """
    global_seed, op_seed = tf.compat.v1.get_seed(None)
    if global_seed is None:
        return int.from_bytes(os.urandom(4), "little") % 2 ** 31
    return op_seed


def _length(value):
    """Samples along the first axis (-1 for a scalar); ragged and sparse tensors included."""
    if isinstance(value, tf.RaggedTensor):
        return int(value.nrows())
    if isinstance(value, tf.SparseTensor):
        return int(value.dense_shape[0]) if value.shape.rank else -1
    return int(np.shape(value)[0]) if np.ndim(value) else -1


def _as_sliceable(value):
    """Lists become tuples (several inputs, not one stacked array); pandas becomes NumPy."""
    if value is None:
        return None
    if isinstance(value, list):
        value = tuple(value)
    return tf.nest.map_structure(_as_tensor_or_array, value)


def _as_tensor_or_array(value):
    if data_adapter_utils.is_scipy_sparse(value):   # as Keras' array adapter reads it
        return data_adapter_utils.scipy_sparse_to_tf_sparse(value)
    return value if isinstance(value, (np.ndarray, tf.Tensor, tf.RaggedTensor,
                                       tf.SparseTensor)) else np.asarray(value)


def _is_array(value):
    return isinstance(value, (np.ndarray, tf.Tensor, tf.RaggedTensor, tf.SparseTensor)) or (
        data_adapter_utils.is_scipy_sparse(value)) or (
        hasattr(value, "__array__") and not isinstance(value, (str, bytes)))


def _all_arrays(values):
    flat = [v for v in tf.nest.flatten(values) if v is not None]
    return bool(flat) and all(_is_array(v) for v in flat)


def _is_legacy_tuple(x):
    return (isinstance(x, tuple) and len(x) in (2, 3) and _all_arrays(x[:2])
            and x[1] is not None)


def _no_separate_targets(y, sample_weight, kind, name):
    for arg, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None:
            raise ConfigError(
                f"`{arg}` was given but `{name}` is a {kind}, which yields its own batches. "
                f"Expected the {arg} inside the batches, as in Keras. Fix: yield (x, y) or "
                "(x, y, sample_weight) from it.")


def cardinality(dataset):
    """Batches in one pass of `dataset`, or None when unknown or infinite."""
    count = int(dataset.cardinality())
    return count if count > 0 else None


def _static_batch(dataset):
    """The batch size a dataset's element spec fixes (drop_remainder=True), or None."""
    flat = [s for s in tf.nest.flatten(dataset.element_spec) if isinstance(s, tf.TensorSpec)]
    if flat and flat[0].shape.rank:
        return flat[0].shape[0]
    return None


def _type_name(value):
    return "None" if value is None else type(value).__name__


# Generators -----------------------------------------------------------------

def _is_generator_function(value):
    return callable(value) and inspect.isgeneratorfunction(value)


def _from_generator(data, name):
    """Wraps a generator; the first batch is read to learn the signature."""
    if _is_generator_function(data):
        make = data
        probe = make()
    else:
        # A generator object can be read once only: a later pass goes on
        # where the last one stopped, as Keras reads it (an endless generator
        # as validation_data with validation_steps, or x with steps_per_epoch);
        # the Trainer refuses a second epoch of one without steps_per_epoch
        # before training (see `Trainer.fit`).
        probe = data
        consumed = [False]

        def make():
            # Through `chain`, which has no `close`: a pass that stops early
            # (`yield from` closes what it delegates to) leaves it open.
            if consumed[0]:
                return itertools.chain(probe)
            consumed[0] = True
            return itertools.chain([first], probe)

    try:
        first = next(probe)
    except StopIteration:
        raise DataSpecError(
            f"`{name}` is a generator that yielded nothing. Expected it to yield batches: "
            "x, (x, y) or (x, y, sample_weight).") from None
    first = _list_as_tuple(first)
    signature = tf.nest.map_structure(_spec_with_open_batch, first)

    if _is_generator_function(data):
        started = [False]

        def generate():
            if not started[0]:
                started[0] = True
                yield from itertools.chain([first], probe)
            else:
                yield from make()
    else:
        def generate():
            yield from make()

    def batches():
        # Keras accepts [x, y] as well as (x, y); tf.data matches structures
        # exactly, so every batch, not only the first, becomes a tuple.
        return (_list_as_tuple(batch) for batch in generate())

    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _list_as_tuple(batch):
    return tuple(batch) if isinstance(batch, list) else batch


def _spec_with_open_batch(value):
    value = tf.convert_to_tensor(value)
    shape = [None] + value.shape.as_list()[1:] if value.shape.rank else []
    return tf.TensorSpec(shape, value.dtype)
