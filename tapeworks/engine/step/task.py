"""Tasks: what one training step computes, for one model or several.

A `Task` names its models, declares its updates (each: a loss, the variables
it trains, its own optimizer, how often) and computes every loss of a step
from one forward pass in `compute_losses`. The Trainer turns that into one
compiled step. `SupervisedTask` is the plain `Trainer(model, optimizer, loss)`
case: one model, one update, Keras' own `compute_loss`/`compute_metrics`.

Example: a GAN whose generator output is computed once and used by both
losses.

```python
class GAN(tapeworks.Task):
    def __init__(self, generator, discriminator, noise_dim):
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        self.noise_dim = noise_dim
        bce = keras.losses.BinaryCrossentropy(from_logits=True)
        self.bce = bce
        self.add_update("discriminator", loss="d_loss", trains=discriminator,
                        optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5))
        self.add_update("generator", loss="g_loss", trains=generator,
                        optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5))

    def compute_losses(self, batch, training):
        real = batch
        noise = self.random.normal((tf.shape(real)[0], self.noise_dim))
        fake = self.generator(noise, training=training)
        real_logits = self.discriminator(real, training=training)
        fake_logits = self.discriminator(fake, training=training)
        d_loss = (self.bce(tf.ones_like(real_logits), real_logits)
                  + self.bce(tf.zeros_like(fake_logits), fake_logits))
        g_loss = self.bce(tf.ones_like(fake_logits), fake_logits)
        self.capture("fake", fake)
        return {"d_loss": d_loss, "g_loss": g_loss}
```
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tapeworks.engine.step import graph_outputs, guards
from tapeworks.engine.step import precision as precision_lib
from tapeworks.engine.step import returned_logs
from tapeworks.errors import ConfigError, DataSpecError


@dataclasses.dataclass
class Update:
    """One optimizer update inside a step.

    Attributes:
        name: shown in errors and logs.
        loss: the name of a loss returned by `compute_losses`, a function
            `(losses, counters) -> scalar`, or a weighting object from
            `tapeworks.weighting` (static, scheduled, uncertainty, GradNorm).
        trains: models, layers or variables whose trainable variables this
            update changes.
        optimizer: a Keras optimizer (or its name).
        every: apply this update on every k-th step only (k discriminator
            updates per generator update: the generator's `every=k`).
        shared: this update may train variables another update trains too
            (two losses on a shared backbone, each with its own optimizer).
            Without it, such an overlap is refused: it is usually a GAN's
            generator update listing the stacked model, which then trains the
            discriminator on the generator's loss too.
        untrained: variables of `trains` left out: they feed only outputs
            compiled without a loss, so no loss has a gradient for them
            (Keras' fit skips them too).
    """

    name: str
    loss: object
    trains: list
    optimizer: object
    every: int = 1
    shared: bool = False
    untrained: list = dataclasses.field(default_factory=list)

    def variables(self):
        found, seen = [], {id(v) for v in self.untrained}
        for item in self.trains:
            if isinstance(item, tf.Variable) or hasattr(item, "assign"):
                candidates = [item]
            else:
                candidates = list(item.trainable_variables)
            for variable in candidates:
                if id(variable) not in seen:
                    seen.add(id(variable))
                    found.append(variable)
        for extra in getattr(self.loss, "trainable_variables", ()):
            if id(extra) not in seen:
                seen.add(id(extra))
                found.append(extra)
        return found

    def objective(self, losses, counters):
        """This update's scalar loss, from the step's dict of losses."""
        if isinstance(self.loss, str):
            if self.loss not in losses:
                raise ConfigError(
                    f"Update {self.name!r} trains on loss {self.loss!r}, but "
                    f"`compute_losses` returned {sorted(losses)}. Expected one of those "
                    "names. Fix: return it from `compute_losses` or name another loss.")
            return losses[self.loss]
        if hasattr(self.loss, "combine"):
            return self.loss.combine(losses, counters)
        return self.loss(losses, counters)


class Frozen:
    """A pretrained helper model (critic, teacher), frozen by `Task.freeze`.

    Calling it always runs the model with `training=False`. Its weights are
    not trainable, so no update can change them and no optimizer holds
    slots for them, yet gradients still flow *through* it to whatever
    produced its input.
    """

    def __init__(self, model):
        self.model = model
        model.trainable = False

    def __call__(self, *args, **kwargs):
        kwargs["training"] = False
        return self.model(*args, **kwargs)

    @property
    def weights(self):
        return self.model.weights


class Counters(tf.Module):
    """Step and epoch as variables: scheduled weights read them in the graph."""

    def __init__(self):
        super().__init__(name="counters")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")


class Task:
    """Several models trained in one compiled step. Subclass it.

    In `__init__`, assign the models as attributes, call `add_update` for
    each update and `freeze` for each pretrained helper; override
    `compute_losses`. Optionally override `update_metrics`,
    `metric_results`, `reset_metrics` and `predict_step`.
    """

    # True for a Keras model whose own `train_step` runs as the step
    # (`model_step.ModelStepTask`): the step applies its updates itself.
    own_train_step = False
    # True where the model's `test_step` (its own, or Keras' with its own
    # `train_step`) runs as the test step; its logs are `logs.results("test")`.
    own_test_step = False

    def __init__(self) -> None:
        self._updates: list[Update] = []
        self._frozen: list[Frozen] = []
        # Per thread: MirroredStrategy traces each replica's step in a thread
        # of its own, and each replica returns its own captured tensors.
        self._capture_local = threading.local()
        # The captured tensors' specs, as the compiled step sees them
        # (`remember_capture_specs`, after the step's losses were traced).
        self.capture_specs: dict[str, tf.TensorSpec] = {}

    @property
    def _captures(self):
        """This thread's (this replica's) tensors marked by `capture` in the running step."""
        captures = getattr(self._capture_local, "captures", None)
        if captures is None:
            captures = self._capture_local.captures = {}
        return captures

    @_captures.setter
    def _captures(self, value):
        self._capture_local.captures = value

    def captures(self) -> dict[str, tf.Tensor]:
        """The tensors `capture` marked in this replica's running step (name -> tensor)."""
        return self._captures

    def remember_capture_specs(self) -> None:
        """Keeps the specs of what the last traced step captured (`capture_specs`)."""
        self.capture_specs = {name: tf.TensorSpec(t.shape, t.dtype)
                              for name, t in self._captures.items()}

    # Declaring ------------------------------------------------------------

    def add_update(self, name: str, loss: str, trains: keras.Model | Sequence[keras.Model],
                   optimizer: keras.optimizers.Optimizer | str, every: int = 1,
                   shared: bool = False) -> Update:
        if not isinstance(every, int) or every < 1:
            raise ConfigError(f"`every` must be an integer >= 1. Received: every={every!r}")
        trains = list(trains) if isinstance(trains, (list, tuple)) else [trains]
        optimizer = keras.optimizers.get(optimizer)
        same_optimizer = next((u for u in self._updates if u.optimizer is optimizer), None)
        if same_optimizer is not None:
            raise ConfigError(
                f"Update {name!r} was given the optimizer instance that update "
                f"{same_optimizer.name!r} already uses. A Keras optimizer keeps state (moments, step "
                "count) for the variables it was built with, so two updates cannot share "
                "one. Expected one optimizer per update. Fix: pass a new instance to each, "
                "e.g. `keras.optimizers.Adam(2e-4)` twice, or the name (\"adam\").")
        update = Update(name, loss, trains, optimizer, every, bool(shared))
        self._updates.append(update)
        return update

    def freeze(self, model: keras.Model) -> Frozen:
        """Declares `model` a frozen helper; returns the callable to use in the losses."""
        frozen = Frozen(model)
        self._frozen.append(frozen)
        return frozen

    def capture(self, name: str, tensor: tf.Tensor) -> None:
        """Marks `tensor` for copying out of the step (see `Trainer(capture_every=)`)."""
        self._captures[name] = tensor

    # Overridden by subclasses ---------------------------------------------

    def compute_losses(self, batch: Any, training: bool
                       ) -> dict[str, tf.Tensor] | tuple[dict[str, tf.Tensor], dict[str, Any]]:
        """Returns a dict of scalar losses (and may `capture` tensors)."""
        raise NotImplementedError("Subclasses of tapeworks.Task implement compute_losses.")

    def update_metrics(self, batch: Any, outputs: Mapping[str, Any]) -> None:
        """Updates metric state after a step; `outputs` is what compute_losses kept."""

    def metric_results(self) -> dict[str, Any]:
        """The task's metric values (name -> tensor); none unless a subclass keeps metrics."""
        return {}

    def loss_tracker(self, name: str) -> Any:
        """A Keras metric of the task's own to track loss `name` in, or None (a new Mean)."""
        return None

    def hidden_losses(self) -> frozenset[str]:
        """Names of losses the logs leave out (Keras' rule for a model's own `metrics`); none."""
        return frozenset()

    def reset_metrics(self) -> None:
        """Resets the task's metrics at an epoch's start; nothing unless a subclass keeps some."""

    def predict_step(self, batch: Any) -> Any:
        """The outputs `Trainer.predict` returns for a batch: the first trainable model's."""
        x = batch[0] if isinstance(batch, tuple) else batch
        return self.model(x, training=False)

    @property
    def random(self):
        """The Task's own random generator (`tf.random.Generator`) for its noise.

        Draw from it in `compute_losses` (`self.random.normal(shape)`): its
        state is a variable, seeded from `Trainer(seed=)` and held in
        `trainer.checkpoint`, so a resumed run draws what the uninterrupted
        run would have drawn. A global op such as `tf.random.normal` keeps
        its state outside any variable: no checkpoint can restore it.
        """
        generator = getattr(self, "_random", None)
        if generator is None:
            seed = getattr(self, "_random_seed", None)
            generator = self._random = (
                tf.random.Generator.from_seed(seed) if seed is not None
                else tf.random.Generator.from_non_deterministic_state())
        return generator

    # Whether `compute_losses` may draw from `random`: its generator is then
    # made before any tracing (a variable made inside a trace is lost). A task
    # that never draws from it gets it when a checkpoint asks for it: making it
    # was 3 ms of every fit's start (from the non-deterministic state).
    draws_random = True

    def seed_random(self, seed: int | None) -> None:
        """Seeds `random` (`Trainer(seed=)`); made now when the task draws from it."""
        self._random_seed = seed
        if self.draws_random:
            self.random  # noqa: B018  (made here, outside any trace)

    def check_unchanged(self) -> None:
        """Raises `ConfigError` when the task changed in a way its compiled step cannot follow."""

    def check_data(self, element_spec: Any, name: str, needs_targets: bool = True,
                   arrays: tuple[Any, Any, Any] | None = None) -> None:
        """Raises `DataSpecError` when batches of `element_spec` cannot feed this task.

        Args:
            element_spec: the batched dataset's element spec.
            name: how messages call the data (`x`, `validation_data`).
            needs_targets: False for `predict`.
            arrays: (x, y, sample_weight) as passed, when the data are arrays
                in memory (their values and shapes as given can be checked).
        """

    # Used by the Trainer ----------------------------------------------------

    @property
    def updates(self):
        if not self._updates:
            raise ConfigError(
                f"{type(self).__name__} declares no update. Expected at least one "
                "`self.add_update(name, loss=..., trains=model, optimizer=...)` in __init__.")
        return self._updates

    @property
    def models(self):
        """Every Keras model the task holds as an attribute, frozen helpers included."""
        found = []
        for value in vars(self).values():
            model = value.model if isinstance(value, Frozen) else value
            if isinstance(model, keras.Model) and all(model is not m for m in found):
                found.append(model)
        return found

    @property
    def model(self):
        """The model Keras callbacks see as `self.model`: the first trainable one."""
        frozen = {id(f.model) for f in self._frozen}
        trainable = [m for m in self.models if id(m) not in frozen]
        if not trainable:
            raise ConfigError(f"{type(self).__name__} holds no trainable keras.Model.")
        return trainable[0]

    @property
    def frozen_models(self):
        return [f.model for f in self._frozen]

    def run_losses(self, batch: Any,
                   training: bool) -> tuple[dict[str, tf.Tensor], dict[str, Any]]:
        """compute_losses, normalised to (losses, outputs) with float32 scalars."""
        self._captures = {}
        result = self.compute_losses(batch, training=training)
        losses, outputs = result if isinstance(result, tuple) else (result, {})
        if not isinstance(losses, dict) or not losses:
            raise ConfigError(
                f"{type(self).__name__}.compute_losses returned {type(losses).__name__}. "
                "Expected a non-empty dict of scalar losses, e.g. {\"loss\": loss}.")
        losses = {name: guards.check_loss(value, where=f"the loss {name!r}")
                  for name, value in losses.items()}
        return {k: tf.cast(v, tf.float32) for k, v in losses.items()}, outputs

    def check_helpers(self) -> None:
        """Warns about a trainable model that no update trains (a forgotten freeze).

        And refuses two updates that train the same variables unless both say
        `shared=True`.
        """
        owners: dict[int, Update] = {}
        for update in self.updates:
            for variable in update.variables():
                other = owners.setdefault(id(variable), update)
                if other is not update and not (other.shared and update.shared):
                    layer = variable.path.rsplit("/", 1)[0] if hasattr(variable, "path") \
                        else variable.name
                    raise ConfigError(
                        f"Updates {other.name!r} and {update.name!r} both train `{layer}` "
                        f"(variable {variable.path if hasattr(variable, 'path') else ''}): "
                        f"{update.name!r}'s loss would also change what {other.name!r} "
                        "trains (a GAN's generator update that lists the stacked model "
                        "trains the discriminator too). Expected each variable in one "
                        f"update. Fix: pass {update.name!r} only the model it should train "
                        "(e.g. trains=generator, not the stacked model); if both updates "
                        "are meant to train it, say so with `shared=True` on both.")
        trained = set(owners)
        frozen = {id(m) for m in self.frozen_models}
        for model in self.models:
            if id(model) in frozen or not model.trainable_variables:
                continue
            if not any(id(v) in trained for v in model.trainable_variables):
                warnings.warn(
                    f"`{model.name}` is trainable but no update trains it: its "
                    "gradients are computed for nothing and Dropout/BatchNorm run in "
                    "whatever mode its calls ask for. Fix: declare it with "
                    "`self.<name> = self.freeze(model)` (or add an update for it).",
                    stacklevel=3)


class SupervisedTask(Task):
    """One Keras model, one loss, one optimizer: `Trainer(model, optimizer, loss)`.

    The model's `compile()` configuration is used as it is. Arguments given
    here override it: the model is then compiled with them (as
    `model.compile` would, so `model.evaluate` and saving see them too),
    keeping every setting not given (metrics, `jit_compile`,
    `steps_per_execution`, `run_eagerly`, ...).
    """

    # Its losses are the model's and the compiled loss': nothing draws from
    # `random` (a subclass whose `compute_losses` does sets this True).
    draws_random = False

    def __init__(self, model, optimizer=None, loss=None, metrics=None, loss_weights=None,
                 weighted_metrics=None):
        super().__init__()
        self.network = model
        _compile(model, optimizer=optimizer, loss=loss, metrics=metrics,
                 loss_weights=loss_weights, weighted_metrics=weighted_metrics)
        optimizer = model.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            # Keras wraps the optimizer of a mixed_float16 model; tapeworks
            # scales the loss itself (per accumulation window), so it applies
            # the inner optimizer. `model.optimizer` stays the wrapper, which
            # hands `learning_rate` through to the inner one for callbacks.
            optimizer = optimizer.inner_optimizer
        self._updates.append(Update("model", "loss", [model], optimizer,
                                    untrained=only_without_loss(model)))
        self._compiled_as = getattr(model, "_compile_config", None)
        self._logs = returned_logs.CompiledLogs(model)
        self._kind = "train"
        self._loss_takes_training = (
            "training" in inspect.signature(model.compute_loss).parameters)
        # Output specs the next `compute_losses` makes placeholders of instead
        # of calling the model: the build's scratch trace only
        # (`training_state.trace_losses_once`).
        self.stand_in_outputs = None

    def check_unchanged(self):
        """Raises `ConfigError` when the model was compiled again after the Trainer took it.

        Keras rebuilds its train function on every compile(); a Trainer has
        built its step, optimizer state and metrics for the compile it saw.
        """
        if getattr(self.network, "_compile_config", None) is not self._compiled_as:
            raise ConfigError(
                f"`{self.network.name}` was compiled again after the Trainer was created, so "
                "the Trainer's step no longer matches its optimizer, loss and metrics. "
                "Expected one compile per Trainer. Fix: create a new "
                "`tapeworks.Trainer(model)` after `model.compile(...)`.")

    def compute_losses(self, batch, training):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        y_pred = (graph_outputs.placeholders(self.stand_in_outputs)
                  if self.stand_in_outputs is not None else self.network(x, training=training))
        precision_lib.warn_low_precision_outputs(self.network, y_pred)
        y_pred = precision_lib.to_float32(y_pred)
        # Keras' losses already divide by the number of replicas, so the sum
        # of per-replica gradients is the gradient of the global-batch mean.
        # An override of `compute_loss` written before Keras 3.3 has no
        # `training`; Keras' fit calls it without, and so does this.
        given = {"training": training} if self._loss_takes_training else {}
        loss = self.network.compute_loss(x=x, y=y, y_pred=y_pred,
                                         sample_weight=sample_weight, **given)
        guards.check_loss(loss)
        self._kind = "train" if training else "test"   # of the metrics' next update
        return {"loss": loss}, {"x": x, "y": y, "y_pred": y_pred,
                                "sample_weight": sample_weight}

    def update_metrics(self, batch, outputs):
        self._logs.update(outputs, self._kind)

    def metric_results(self):
        return self._logs.results()

    def hidden_losses(self):
        return self._logs.hidden_losses()

    def loss_tracker(self, name):
        # The model's own tracker, so that `model.metrics` (read by callbacks,
        # `get_metrics_result`) holds the loss as in Keras' fit; under the
        # strategy it was made in only.
        tracker = getattr(self.network, "_loss_tracker", None)
        same_strategy = tf.distribute.get_strategy() is getattr(
            self.network, "distribute_strategy", None)
        return tracker if name == "loss" and same_strategy else None

    def reset_metrics(self):
        self.network.reset_metrics()

    def predict_step(self, batch):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        return self.network(x, training=False)

    def check_data(self, element_spec, name, needs_targets=True, arrays=None):
        # A model compiled without a loss takes its loss from `add_loss` (endpoint
        # layers): Keras' fit trains it on inputs alone, and so does this.
        needs_targets = needs_targets and self.network.loss is not None
        if arrays is not None:
            if needs_targets and arrays[1] is None:
                raise DataSpecError(
                    f"`{name}` was given as arrays without targets. Expected `y` for a model "
                    f"compiled with a loss ({_loss_name(self.network.loss)}). Fix: pass "
                    "them, e.g. `fit(x, y, ...)` (or a dataset of (x, y) batches); or, if "
                    "the model's loss comes from `add_loss` (an endpoint layer), compile it "
                    "without one: `model.compile(optimizer)`.")
            guards.check_array_inputs(arrays[0], self.network, name=name)
        guards.check_data_spec(element_spec, self.network, needs_targets=needs_targets,
                               name=name)
        if needs_targets:
            labels = "y" if arrays is not None else f"the labels in `{name}`"
            guards.check_targets(element_spec[1], self.network, self.network.loss,
                                 name=labels, values=arrays[1] if arrays else None)


def only_without_loss(model):
    """The trainable variables of `model` that feed only outputs compiled without a loss.

    A Functional model with several outputs may leave some without a loss
    (a loss dict without their name, None in a loss list): Keras' fit trains
    the others, and the layers that serve only those outputs get no gradient.
    """
    outputs, loss = getattr(model, "output", None), model.loss
    if isinstance(outputs, dict) and isinstance(loss, dict):
        pairs = [(tensor, loss.get(name)) for name, tensor in outputs.items()]
    elif isinstance(outputs, (list, tuple)) and isinstance(loss, (list, tuple)) \
            and len(outputs) == len(loss):
        pairs = list(zip(outputs, loss))
    else:
        return []
    with_loss = [tensor for tensor, one in pairs if one is not None]
    if len(with_loss) == len(pairs):
        return []
    used = set()
    for tensor in with_loss:
        used.update(id(v) for layer in _layers_behind(tensor) for v in layer.trainable_variables)
    return [v for tensor, one in pairs if one is None
            for layer in _layers_behind(tensor) for v in layer.trainable_variables
            if id(v) not in used]


def _layers_behind(tensor):
    """Every layer on the paths from the model's inputs to `tensor` (Keras' node history)."""
    found, seen, stack = {}, set(), [tensor]
    while stack:
        history = getattr(stack.pop(), "_keras_history", None)
        if history is None:
            continue
        layer, node_index = history[0], history[1]
        if (id(layer), node_index) in seen:   # a shared layer: each of its calls
            continue
        seen.add((id(layer), node_index))
        found[id(layer)] = layer
        stack.extend(layer._inbound_nodes[node_index].input_tensors)
    return list(found.values())


def _loss_name(loss):
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)


def _compile(model, **given):
    """Compiles `model` only when arguments were given, keeping its other settings."""
    given = {k: v for k, v in given.items() if v is not None}
    compiled = getattr(model, "compiled", False)
    if compiled and not given:
        return
    if not compiled and ("optimizer" not in given or "loss" not in given):
        raise ConfigError(
            f"`{model.name}` is not compiled, and `optimizer` and `loss` were not both given. "
            "Expected a compiled model (`model.compile(optimizer, loss, metrics=...)`), or "
            "`Trainer(model, optimizer, loss)` with a Keras optimizer (or its name, "
            "\"adam\") and a Keras loss, its name (\"mse\") or a function "
            "loss(y_true, y_pred).")
    config = {}
    if compiled:
        # What the user passed to compile(), as passed (Keras keeps it to
        # save and restore the compile configuration).
        config = dict(getattr(getattr(model, "_compile_config", None), "config", {}) or {})
    config.update(given)
    model.compile(**config)


def layers_of(models, include_self=False):
    """Every layer of `models`, nested ones included, each once, in Keras' walk order.

    `_flatten_layers` is Keras' own walk over nested layers; there is no
    public equivalent that includes the layers of nested models.
    """
    found, seen = [], set()
    for model in models:
        for layer in model._flatten_layers(include_self=include_self, recursive=True):
            if id(layer) not in seen:
                seen.add(id(layer))
                found.append(layer)
    return found


def batch_size(batch):
    """The (dynamic) number of samples in `batch`: `x` or an `(x, y, ...)` tuple."""
    x = batch[0] if isinstance(batch, tuple) else batch
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first, out_type=tf.int64)[0]
