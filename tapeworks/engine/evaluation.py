"""The test and predict loops over prepared data, with Keras' batch hooks.

Keras' test and predict batch hooks fire once per `steps_per_execution`
batches. Here a call runs `STEPS_PER_CALL` batches unless a callback
implements a batch hook of that loop: then one batch per call, so each hook
sees every batch, as in `model.evaluate` with its default of one step per
execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Union

import keras
import numpy as np
import tensorflow as tf

from tapeworks.engine import callback_bridge
from tapeworks.engine.step import guards
from tapeworks.engine.inputs import adapters, iterator_release
from tapeworks.engine.step import task as task_lib
from tapeworks.engine.progress import resolve_verbose
from tapeworks.errors import ConfigError, DataSpecError

STEPS_PER_CALL = 32
# Data of at most this many batches (a count known in advance) is evaluated
# one step a call, without the loop (`step.make_single_call`): the loop's
# start-up (about 0.15 s) is worth 400 later steps, and a validation set this
# small pays at most 8 x 0.4 ms more per evaluation without it.
FEW_BATCHES = 8
# So is a fit's validation data when all its evaluations, together, are at
# most this many batches. Measured one-off (AMD EPYC, AVX-512, a 5-layer
# MLP, 10 and 40 batches, fresh processes): the loop's start-up cost 0.05-0.06 s
# more than the single call's, and each later batch 0.35-0.6 ms less, so the
# loop repays its start-up from about 120 batches; 96 stays below that.
FEW_BATCHES_IN_FIT = 96


class EvaluateAndPredict:
    """`Trainer.evaluate` and `Trainer.predict`: Keras' signatures over the loops below.

    A part of the Trainer's public API kept beside the loops it runs; it reads
    the Trainer's `task`, `model`, `data_stage`, `training_state`, `compiled`,
    `replication` and `jit_compile`.
    """

    # What it reads of the Trainer, declared for type checkers (the Trainer sets them).
    task: Any
    model: Any
    data_stage: Any
    training_state: Any
    compiled: Any
    replication: Any

    @property
    def jit_compile(self) -> bool | str | None:
        raise NotImplementedError("the Trainer defines it")

    def _prepare(self, x: Any, y: Any = None, sample_weight: Any = None,
                 batch_size: int | None = None, steps: int | None = None) -> Any:
        raise NotImplementedError("the Trainer defines it")

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: Union[int, Literal["auto"]] = "auto", sample_weight: Any = None,
                 steps: int | None = None,
                 callbacks: Sequence[keras.callbacks.Callback] | None = None,
                 return_dict: bool = False,
                 **kwargs: Any) -> float | list[float] | dict[str, float]:
        """The loss and metrics over `x`; Keras' `Model.evaluate` signature.

        Returns:
            With `return_dict=True` a dict `{"loss": ..., <metric>: ...}`;
            otherwise, as Keras, the loss alone when it is the only value, or
            the list of values in the order of `model.metrics_names`.
        """
        if kwargs:
            raise ConfigError(f"Arguments not recognized by evaluate: {sorted(kwargs)}. "
                              "Expected Keras' evaluate arguments.")
        self.task.check_unchanged()
        prepared = self._prepare(x, y, sample_weight, batch_size, steps)
        verbose = resolve_verbose(verbose)
        logs = self._evaluate(prepared, callback_list(
            callbacks, verbose, prepared.steps, self.model))
        return logs if return_dict else flatten_logs(self.task, logs)

    def _evaluate(self, prepared, callback_list, evaluations=None):
        """`evaluations`: in a fit, how many times it evaluates `prepared` in all.

        None (`evaluate`): unknown, the user may call it again and again.
        """
        # Keras' evaluate (fit's validation included) resets its epoch iterator
        # first, which ends an epoch of a PyDataset: its `on_epoch_end` runs.
        prepared.on_epoch_end()
        mode = self.compiled.inference_mode(self.jit_compile)
        batches = adapters.cardinality(prepared.dataset)
        few = batches is not None and (
            batches <= FEW_BATCHES
            or (evaluations is not None and batches * evaluations <= FEW_BATCHES_IN_FIT))
        if few and not self.config.run_eagerly and not self.compiled.replicated:
            return evaluate(prepared, callback_list, self.compiled.test_call(mode),
                            self.training_state, self.replication.iterate, batches=batches)
        return evaluate(prepared, callback_list, self.compiled.test_loop(mode),
                        self.training_state, self.replication.iterate)

    def predict(self, x: Any, batch_size: int | None = None,
                verbose: Union[int, Literal["auto"]] = "auto", steps: int | None = None,
                callbacks: Sequence[keras.callbacks.Callback] | None = None) -> Any:
        """The model's outputs on `x` as NumPy (a dict/list for several outputs).

        Keras' `Model.predict` signature; `on_predict_batch_end` gets
        `{"outputs": ...}` as in Keras.
        """
        prepared = self.data_stage.prepare(x, batch_size=batch_size, steps=steps,
                                           purpose="predict")
        self.training_state.build(prepared.dataset.element_spec, targets=False)
        verbose = resolve_verbose(verbose)
        loop = self.compiled.predict_loop(prepared.dataset.element_spec,
                                          self.compiled.inference_mode(self.jit_compile))
        return predict(
            prepared, callback_list(callbacks, verbose, prepared.steps, self.model),
            loop, self.replication.iterate)


def callback_list(callbacks, verbose, steps, model):
    """The CallbackList of an evaluate or predict call (a progress bar unless silent)."""
    return keras.callbacks.CallbackList(callbacks, add_progbar=verbose != 0, verbose=verbose,
                                        epochs=1, steps=steps, model=model)


def _calls(loop, prepared, callbacks, kind, iterate, batches=None):
    """Runs `loop` over `prepared` call by call; yields (steps before, steps run, outputs).

    With `batches` (the exact count), `loop` is a call of one step without a
    loop (`step.make_single_call`), called that many times.
    """
    prepared.on_epoch_begin()
    iterator = iterate(prepared.dataset)
    if batches is not None:
        for done in range(batches):
            with guards.inside_step():
                ran, *outputs = loop(iterator)
            yield done, int(ran), outputs
        iterator_release.release(iterator)   # its destructor may wait: not here
        del iterator
        prepared.on_epoch_end()
        return
    per_call = 1 if callback_bridge.wants_batch_hooks(callbacks, kind) else STEPS_PER_CALL
    done = 0
    while True:
        with guards.inside_step():
            ran, *outputs = loop(iterator, tf.constant(per_call, tf.int64))
        ran = int(ran)
        if ran:
            yield done, ran, outputs
            done += ran
        if ran < per_call:
            break
    iterator_release.release(iterator)
    del iterator
    prepared.on_epoch_end()


def flatten_logs(task, logs):
    """`evaluate`'s value without `return_dict`, as Keras: the loss alone, or a list."""
    if isinstance(task, task_lib.SupervisedTask):
        # Keras' own ordering (loss, then compiled metrics, then the rest).
        return task.model._flatten_metrics_in_order(logs)
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def evaluate(prepared, callbacks, loop, state, iterate, batches=None):
    """Runs the test loop over `prepared`; returns the logs (loss and metrics).

    `batches`: `loop` is a one-step call, run that many times (see `_calls`).
    """
    state.reset_metrics()
    callbacks.on_test_begin()
    logs = {}
    for done, ran, (_, call_logs) in _calls(loop, prepared, callbacks, "test", iterate,
                                            batches):
        callbacks.on_test_batch_begin(done)
        logs = callback_bridge.python_logs(call_logs)
        callbacks.on_test_batch_end(done + ran - 1, logs)
    callbacks.on_test_end(logs)
    return logs


def predict(prepared, callbacks, loop, iterate):
    """Runs the predict loop over `prepared`; the outputs as NumPy, batches joined."""
    callbacks.on_predict_begin()
    chunks = []
    for done, ran, (outputs,) in _calls(loop, prepared, callbacks, "predict", iterate):
        outputs = tf.nest.map_structure(lambda t: t.numpy(), outputs)
        chunks.append(outputs)
        callbacks.on_predict_batch_begin(done)
        callbacks.on_predict_batch_end(done + ran - 1, {"outputs": outputs})
    callbacks.on_predict_end()
    if not chunks:
        raise DataSpecError(
            f"`x` gave no batch to predict on (a {prepared.kind} that is empty). Expected "
            "at least one sample. Fix: check the data (and `steps`).")
    return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *chunks)
