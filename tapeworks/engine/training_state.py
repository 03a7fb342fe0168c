"""`TrainingState`: every variable training creates, named once.

One structure owns what a Trainer adds to the user's models and optimizers
(optax keeps a transformation's state the same way: one named structure):
the accumulators (`update_states`), the step and epoch `counters`, the loss
trackers, the non-finite guard, the dead-gradient sums, the monitors and the
capture buffers. Every set of variables the engine saves or puts back derives
from it here, so no two copies of the list can drift apart:

- `checkpoint()`: the user's `trainer.checkpoint` (its object names are the
  on-disk format: `model_i`, `optimizer_i`, `update_state_i`, `weighting_i`,
  `random_states`, `task_random`, `pruning`, `precision`, `counters`);
- `run_checkpoint()`: that plus the running metrics, for `fit(checkpoint_dir=)`;
- `mutable_variables()`: everything a step can change (the rollback snapshot,
  the put-back after a failed read);
- `everything()`: that plus the capture buffers: what a trial run
  (`measuring.TrialRun`: `diagnose_input`, `explain`) saves and restores.
"""

import keras
import tensorflow as tf
# Internal to Keras (no public name): the scope `compute_output_spec` traces in.
from keras.src.backend.common import symbolic_scope

from tapeworks import distribute as distribute_lib
from tapeworks.engine.step import capture as capture_lib
from tapeworks.engine.checks import gradient_health
from tapeworks.engine.step import graph_outputs, guards, replicas, step, updater
from tapeworks.engine.checks import monitor as monitor_lib
from tapeworks.engine.checks import nonfinite as nonfinite_lib
from tapeworks.engine.step import task as task_lib
from tapeworks.errors import ConfigError


class TrainingState:
    """The variables one Trainer creates, and every view of them the engine needs."""

    def __init__(self, task, config, precision, strategy):
        self.task = task
        self.config = config
        self.precision = precision
        self.strategy = strategy
        self.update_states = []       # one updater.UpdateState per update
        self.counters = None          # task.Counters: step and epoch
        self.loss_trackers = {}       # loss name -> keras.metrics.Mean
        self.guard = None             # nonfinite.NonFiniteGuard
        self.dead_gradients = []      # one gradient_health.DeadGradients per update
        self.monitors = []            # one monitor.GradientMonitor per update
        self.capture = None           # capture.Capture buffers
        self.element_spec = None      # of the training batches it was built for
        self.built = False
        self._run_checkpoint = None   # made once: TensorFlow keeps its save function on it
        self._owners = None

    # Building -------------------------------------------------------------

    def build(self, element_spec, targets=True, lazy_losses=False):
        """Creates every variable (models, optimizers, metrics, state) before compiling.

        A `tf.function` that creates variables is traced twice; creating them
        up front keeps the training loop at one trace, which also makes
        retracing visible in `Trainer.traces`. With `run_eagerly` the model is
        built by an eager call on a batch of zeros shaped like the data, so a
        model whose `call` reads `.numpy()` builds as it runs. `targets=False`
        (predict) builds the model only. `lazy_losses` (fit without a
        checkpoint to restore): with `run_eagerly` and a built Keras model,
        the loss trackers and compiled metrics are made by the first step,
        as Keras' eager fit makes them, not by a run on zeros.
        """
        if self.built:
            return
        with self.strategy.scope(), replicas.state_variables():
            self._build_in_scope(element_spec, targets, lazy_losses)

    def _build_own_step(self, element_spec):
        """Builds what the model's own `train_step` creates: one scratch trace, else `tf.function`'s.

        The step is traced in a replica context (`strategy.run`), as the
        compiled step runs it: an optimizer's update asks for one
        (`merge_call`). Under a replicated strategy the optimizer is built
        first, in the strategy's scope, as Keras builds it.
        """
        task, failures = self.task, []
        model = task.network
        if (replicas.is_replicated(self.strategy) and model.optimizer is not None
                and not model.optimizer.built and model.built):
            # As Keras' fit does under a strategy (`_symbolic_build`): its
            # optimizer cannot build inside a replica's step.
            model.optimizer.build(model.trainable_variables)

        def in_replica(batch):
            return self.strategy.run(task.trace_train_step, args=(batch,))

        if trace_lifted(in_replica, element_spec, failures) is None:
            half_built = _half_built(task.models)
            if half_built:
                raise _half_built_error(half_built, failures)
            task.build_steps(element_spec, in_replica)
        task.reset_metrics()

    def _build_in_scope(self, element_spec, targets, lazy_losses=False):
        task, config = self.task, self.config
        if targets:
            self.element_spec = element_spec
        x_spec = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        task.seed_random(config.seed)
        # Under a replicated strategy the variables are created eagerly too:
        # a mirrored variable's initial value cannot be lifted out of a
        # function being traced (Keras builds there eagerly, symbolically).
        eagerly = config.run_eagerly or replicas.is_replicated(self.strategy)
        with guards.inside_step():
            if task.own_train_step:
                # The model's own step creates what it needs as it traces
                # (Keras builds such a model the same way).
                if not targets:
                    if not task.model.built:
                        tf.function(task.model.predict_step).get_concrete_function(
                            element_spec)
                    return
                if task.needs_build():
                    self._build_own_step(element_spec)
            elif isinstance(task, task_lib.SupervisedTask) and not task.model.built:
                if eagerly:
                    task.model(zeros_like(x_spec), training=False)
                elif not targets:
                    _build_by_tracing(task.model, x_spec)
                # Compiled, for training: built by the losses' scratch trace below,
                # as Keras' symbolic build does, instead of a trace of its own
                # (which `tf.function` runs twice as it creates the variables:
                # 0.1-0.13 s before the first step of a small unbuilt model).
            if not targets:
                return

            def trace_losses(batch):
                losses, outputs = task.run_losses(batch, training=False)
                task.update_metrics(batch, outputs)
                return losses

            if task.own_train_step:
                loss_names = []   # its logs are its own (`model_step.OwnLogs`)
            elif (lazy_losses and config.run_eagerly
                  and not replicas.is_replicated(self.strategy)
                  and isinstance(task, task_lib.SupervisedTask) and task.model.built):
                # run_eagerly, a built Keras model, nothing to restore before
                # the first step (`lazy_losses`: fit without checkpoint_dir):
                # the first step names the losses and builds the compiled
                # metrics as it runs, as Keras' eager fit does, instead of a
                # run of the model, loss and metrics on zeros before it (the
                # tf_preprocessing_layers corpus script: about 0.02-0.03 s of
                # a 0.8 s fit; see benchmarks/examples.md, "Fifth run").
                loss_names = None
            elif eagerly:
                loss_names = list(trace_losses(zeros_like(element_spec)))
                task.reset_metrics()
                if not config.run_eagerly and task.captures():
                    # The captures' shapes as the compiled step sees them (an
                    # unknown batch size, not the probe's 1): traced now that
                    # every variable exists, so the trace creates none.
                    tf.function(trace_losses, autograph=False).get_concrete_function(
                        element_spec)
                    task.reset_metrics()
            else:
                failures = []
                traced = trace_losses_once(task, trace_losses, element_spec, failures)
                if traced is None:
                    half_built = _half_built(task.models)
                    if half_built:
                        raise _half_built_error(half_built, failures)
                    if isinstance(task, task_lib.SupervisedTask) and not task.model.built:
                        _build_by_tracing(task.model, x_spec)
                    traced = (tf.function(trace_losses, autograph=False)
                              .get_concrete_function(element_spec).structured_outputs)
                loss_names = list(traced)
            task.remember_capture_specs()
            self.loss_trackers = LossTrackers(task, loss_names or ())
            self.update_states = []
            for update in task.updates:
                variables = update.variables()
                update.optimizer.build(variables)
                self.update_states.append(updater.UpdateState(variables, config.accumulate))
            self.counters = task_lib.Counters()
            if config.pruning is not None:
                config.pruning.build(task.models,
                                     {id(v) for u in task.updates for v in u.variables()})
            self.guard = nonfinite_lib.NonFiniteGuard(config.on_nonfinite)
            if config.monitor_every:
                self.monitors = [monitor_lib.GradientMonitor(u.variables())
                                 for u in task.updates]
            if config.dead_gradient_steps:
                self.dead_gradients = [gradient_health.DeadGradients(u.variables())
                                       for u in task.updates]
            if config.capture_every:
                if not task.capture_specs:
                    raise ConfigError(
                        "`capture_every` was given but the task captures nothing. Expected "
                        "`self.capture(name, tensor)` calls in `compute_losses`. Fix: add "
                        "them, or drop capture_every.")
                self.capture = capture_lib.Capture(task.capture_specs, config.capture_every)
            if not isinstance(task, task_lib.SupervisedTask):
                task.check_helpers()
            distribute_lib.check_in_scope(self.strategy, task.models,
                                          [u.optimizer for u in task.updates])
            self.built = True

    # The sets of variables ---------------------------------------------------

    def checkpoint(self):
        """A new `tf.train.Checkpoint` of everything training changes (`Trainer.checkpoint`)."""
        if not self.built:
            raise ConfigError(
                "The trainer has not created its variables yet. Expected a call to "
                "`fit` first (or to `build_state(data)`), then `checkpoint`.")
        task = self.task
        parts = {f"model_{i}": m for i, m in enumerate(task.models)}
        parts.update({f"optimizer_{i}": u.optimizer for i, u in enumerate(task.updates)})
        parts.update({f"update_state_{i}": s for i, s in enumerate(self.update_states)})
        for i, update in enumerate(task.updates):
            if isinstance(update.loss, tf.Module):
                parts[f"weighting_{i}"] = update.loss
        # The random state of the step: Keras SeedGenerator states (Dropout's
        # draws; `Layer.variables` lists them, a checkpoint of the model
        # object does not) and the Task's generator.
        weights = {id(v) for m in task.models for v in m.weights}
        parts["random_states"] = [v for m in task.models for v in m.variables
                                  if id(v) not in weights]
        parts["task_random"] = task.random
        if self.config.pruning is not None:
            parts["pruning"] = self.config.pruning
        return tf.train.Checkpoint(precision=self.precision, counters=self.counters, **parts)

    def run_checkpoint(self):
        """`checkpoint()` plus the running metrics: what a resumed step also depends on.

        One object for every save of this trainer (TensorFlow keeps its save
        function on it: the first write of an object traces).
        """
        if self._run_checkpoint is None:
            state = self.checkpoint()
            state.metrics = self.metric_variables()
            self._run_checkpoint = state
        return self._run_checkpoint

    def structure(self):
        """What a traced write of `run_checkpoint()` depends on: it is traced again when this changes."""
        task, state = self.task, self.run_checkpoint()
        return (tuple(len(part.variables) for part in (
            *task.models, *(u.optimizer for u in task.updates), self.counters,
            self.precision, *self.update_states)), len(state.metrics), len(state.random_states))

    def structure_record(self):
        """What a run checkpoint records of the model (`run_checkpoint.structure_difference`).

        Per model and per optimizer, each variable's shape, dtype and path, in
        order: a checkpoint of another model (one layer more) is refused by it.
        """
        def listed(variables):
            return [[list(v.shape), str(getattr(v.dtype, "name", v.dtype)), v.path]
                    for v in variables]

        return {"models": [listed(m.variables) for m in self.task.models],
                "optimizers": [listed(u.optimizer.variables) for u in self.task.updates]}

    def metric_variables(self):
        """The loss trackers', the models' compiled metrics' and the Task's own metrics' variables."""
        found = [v for t in self.loss_trackers.values() for v in t.variables]
        for model in self.task.models:
            found.extend(model.metrics_variables)
        for value in vars(self.task).values():
            if isinstance(value, keras.metrics.Metric):
                found.extend(value.variables)
        return list({id(v): v for v in found}.values())   # a model's loss tracker is both

    def mutable_variables(self):
        """Every variable a training step can change, once each.

        What the rollback snapshot copies, and what a failed checkpoint read
        puts back.
        """
        task = self.task
        found = {}

        def add(variables):
            for variable in variables:
                found.setdefault(id(variable), variable)

        for model in task.models:
            add(model.variables)           # weights, and SeedGenerator states
        for update in task.updates:
            add(update.optimizer.variables)
            if isinstance(update.loss, tf.Module):
                add(update.loss.variables)  # a weighting's own state
        parts = [self.counters, self.precision, *self.update_states, self.guard,
                 *self.dead_gradients, *self.monitors]
        if self.config.pruning is not None:
            parts.append(self.config.pruning)
        for part in parts:
            add(part.variables)
        add(self.metric_variables())
        if task.draws_random:   # else a step never changes it (nor makes it)
            add([task.random.state])
        return list(found.values())

    def everything(self):
        """`mutable_variables()` and the capture buffers: all a trial run must leave as it found."""
        found = self.mutable_variables()
        if self.capture is not None:
            found.extend(self.capture.variables)
        return found

    @staticmethod
    def values_of(variables):
        """`[(variable, its value now)]`, for `put_back`."""
        return [(v, v.numpy()) for v in variables]

    @staticmethod
    def put_back(values):
        for variable, value in values:
            variable.assign(value)

    # Metrics and logs -----------------------------------------------------------

    def reset_metrics(self):
        for tracker in self.loss_trackers.values():
            tracker.reset_state()
        self.task.reset_metrics()

    def results(self):
        """The running losses and metrics (graph ops inside a step function)."""
        if self.task.own_test_step:
            return self.task.logs.results("test")
        return step.collect_logs(self.loss_trackers, self.task, self.precision)

    def train_results(self):
        if self.task.own_train_step:
            logs = self.task.logs.results("train")
        else:
            logs = step.collect_logs(self.loss_trackers, self.task, self.precision)
        logs.update(self.guard.logs())
        return logs

    def layer_owners(self):
        """`id(variable) -> its layer`, for the monitor's and the dead-gradient reports (cached)."""
        if self._owners is None:
            self._owners = gradient_health.owners(self.task.models)
        return self._owners

    def finalize(self):
        """At the end of a fit that trained: what Keras' fit does after the last epoch.

        EMA optimizers (use_ema=True) copy their averages into the weights,
        and pruning masks apply again (the averages of pruned weights are not
        zero).
        """
        for update in self.task.updates:
            update.optimizer.finalize_variable_values(update.variables())
        if self.config.pruning is not None:
            self.config.pruning.apply_masks()


class LossTrackers(dict):
    """Loss name -> `keras.metrics.Mean`, each made when the step first reports that loss.

    The task's own tracker where it has one (a compiled model's loss
    tracker, which callbacks read in `model.metrics`), else a new Mean. Made
    before the first step, or, for an eager state built without a run on
    zeros (`TrainingState.build`'s `lazy_losses`), as the first step's
    losses name them, in their order.
    """

    def __init__(self, task, names=()):
        super().__init__()
        self.task = task
        for name in names:
            self.__missing__(name)

    def __missing__(self, name):
        tracker = self[name] = self.task.loss_tracker(name) or keras.metrics.Mean(name=name)
        return tracker


class _NotKerasVariable(Exception):
    """A `tf.Variable` that Keras does not create was asked for in `trace_once`'s scratch graph."""


def trace_once(fn, spec, failures=None):
    """`fn`'s outputs, traced once in a scratch graph; None where only `tf.function` can.

    `failures`: a list that gets the exception that stopped the trace, if any.

    A `tf.function` that creates variables is traced twice by TensorFlow
    (once to create them, once more after): reading the loss names that way,
    while the compiled metrics and losses create theirs, traced the model
    twice (0.04-0.09 s a second time on a small CNN). This is how Keras' own
    `fit` builds its metrics before tracing its step
    (`backend.compute_output_spec`): one trace into a graph that is never
    run, inside a `keras.StatelessScope`, which holds back the variables
    Keras creates there and initialises them eagerly when it closes. Any
    other variable (a `tf.Variable` the user's code creates) would belong
    to the scratch graph: such a trace is stopped before the variable is
    made, and None tells the caller to trace with `tf.function` instead, as
    it does for inputs other than plain tensors and for a trace that fails
    (Keras refuses some variables in a stateless scope, e.g. an optimizer
    compiled inside a loss): `tf.function`'s trace then runs the same code
    and raises what it always raised.

    The trace also runs in Keras' symbolic scope, as
    `backend.compute_output_spec` does: there a layer's weight regularizer
    reads the variable itself, not its value in the stateless scope, which
    holds none for variables made before it (a model with an L2 kernel
    regularizer otherwise failed here and was traced twice).
    """
    if not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
        return None

    def refuse(next_creator, **kwargs):
        raise _NotKerasVariable()

    try:
        with keras.StatelessScope(), symbolic_scope.SymbolicScope():
            with tf.__internal__.FuncGraph("tapeworks_build").as_default(), \
                    tf.variable_creator_scope(refuse):
                return fn(_placeholders(spec))
    except Exception as error:   # noqa: BLE001 (see above: traced again, where it raises as before)
        if failures is not None:
            failures.append(error)
        return None


def trace_losses_once(task, trace_losses, element_spec, failures):
    """`trace_once(trace_losses, ...)`, without a forward pass where the model's graph gives its outputs.

    The scratch trace only creates the loss' and metrics' variables and
    names the losses; a built Functional model's outputs are known from its
    graph of layers (`graph_outputs.output_spec`), so the trace reads them
    there instead of tracing the model a first time before the step's own
    trace. A trace that fails that way is run again with the model's call.
    """
    spec = (graph_outputs.output_spec(task.network)
            if isinstance(task, task_lib.SupervisedTask) else None)
    if spec is not None:
        task.stand_in_outputs = spec
        try:
            traced = trace_once(trace_losses, element_spec)
        finally:
            task.stand_in_outputs = None
        if traced is not None:
            return traced
    return trace_once(trace_losses, element_spec, failures)


class _ComputedInitialValue(Exception):
    """A variable made from a tensor of `trace_lifted`'s scratch graph: only `tf.function` lifts it."""


def trace_lifted(fn, spec, failures=None):
    """`fn`'s outputs, traced once in a scratch graph that makes every variable eagerly; else None.

    For a model's own `train_step`, which `trace_once` cannot trace: Keras'
    stateless scope holds back its optimizers' updates, which read their
    variables' handles. Here each variable the step makes (its layers', its
    optimizers' slots, a `tf.Variable` of its own from a Python or NumPy
    value) is made outside the graph at once (`tf.init_scope`), as
    `tf.function`'s first trace lifts it out, and the graph is dropped:
    nothing runs. `tf.function` traces a step that makes variables twice
    (once making them, once more without), and the compiled step traced it
    a third time, where Keras' fit traces it twice (the SimCLR corpus
    script: 1.1 s a trace). A variable made from a tensor the step computed
    cannot be made outside the graph: the trace stops before making it, and
    None (with the reason in `failures`) tells the caller to trace with
    `tf.function`, as it does for inputs other than plain tensors and for a
    trace that fails (where `tf.function`'s trace raises what it always raised).
    """
    if not all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
        return None

    def lift(next_creator, **kwargs):
        if tf.is_symbolic_tensor(kwargs.get("initial_value")):
            raise _ComputedInitialValue()
        with tf.init_scope():
            return next_creator(**kwargs)

    try:
        with tf.__internal__.FuncGraph("tapeworks_build").as_default(), \
                tf.variable_creator_scope(lift):
            return fn(_placeholders(spec))
    except Exception as error:   # noqa: BLE001 (traced again by tf.function, where it raises)
        if failures is not None:
            failures.append(error)
        return None


def _placeholders(spec):
    """Graph inputs shaped like `spec` (`tf.TensorSpec`s), in the default graph."""
    return tf.nest.map_structure(lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), spec)


def _build_by_tracing(model, x_spec):
    """Builds `model` by tracing its call with `tf.function`, which lifts any variable out."""
    tf.function(lambda x: model(x, training=False)).get_concrete_function(x_spec)


def _half_built(models):
    """Names of the layers whose build stopped after making weights of their own."""
    names = []
    for layer in task_lib.layers_of(models, include_self=True):
        if layer.built:
            continue
        inner = {id(w) for sub in task_lib.layers_of([layer]) for w in sub.weights}
        if any(id(w) not in inner for w in layer.weights):
            names.append(layer.name)
    return names


def _half_built_error(names, failures):
    """The error when a scratch trace stopped inside a layer's build after it made weights.

    Tracing again would build that layer a second time, beside the weights
    it already made, so the build stops here instead.
    """
    failure = failures[0] if failures else None
    if isinstance(failure, _NotKerasVariable):
        what = "it created a `tf.Variable` of its own after weights made with `add_weight`"
        fix = ("make that variable with `self.add_weight(...)` (or `keras.Variable`), or "
               "build the model before the Trainer takes it (call it once on a batch)")
    elif isinstance(failure, _ComputedInitialValue):
        what = ("it created a `tf.Variable` from a tensor it computed, after weights made "
                "with `add_weight`")
        fix = ("make that variable with `self.add_weight(...)` and an initializer, or "
               "build the model before the Trainer takes it (call it once on a batch)")
    else:
        what = (f"it raised {type(failure).__name__}: {str(failure)[:300]}"
                if failure is not None else "it stopped")
        fix = ("make the build work on symbolic inputs (no `.numpy()` or Python branches on "
               "tensor values in `build`), or build the model before the Trainer takes it "
               "(call it once on a batch)")
    return ConfigError(
        f"Building the model stopped inside the build of {', '.join(names)}, after it had "
        f"made weights: {what}. tapeworks builds a model in a scratch graph before the first "
        "step, as Keras' symbolic build does, and building it again would make those weights "
        f"twice. Expected a layer whose `build` runs on symbolic inputs. Fix: {fix}.")


def zeros_like(spec):
    """A batch of one sample of zeros (empty strings) shaped like `spec`."""
    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        if s.dtype == tf.string:
            return tf.fill(shape, "")
        return tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)
