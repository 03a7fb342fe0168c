"""A Keras model's own `train_step`/`test_step`/`predict_step`, run inside tapeworks' loop.

Keras documents overriding `train_step(self, data)` as the way to customise
`fit` (a VAE, a GAN, a contrastive model): the step computes its losses,
applies its optimizer(s) and returns a dict of logs. `ModelStepTask` runs that
step as it is written, as one step of tapeworks' compiled loop: several steps
per call, tf.function or whole-step XLA as the planner chooses, the returned
logs reported as `model.fit` reports them (`OwnLogs`).

What needs the inside of tapeworks' own step cannot reach into a step the
model applies itself: gradient accumulation, tapeworks' loss scaling and
clipping, the monitor, pruning, the XLA-fused update, and withholding a
non-finite update. Asked for, they are refused by `check_options`, naming the
Keras setting that does the same inside the model's step. The non-finite
guard still watches: a step whose loss logs turn NaN or Inf stops training
("raise") or is counted ("warn"), after the step applied its update.
"""

import keras
import tensorflow as tf

from tapeworks.engine.step import precision as precision_lib
from tapeworks.engine.step import task as task_lib
from tapeworks.engine.step.returned_logs import OwnLogs, flattened
from tapeworks.errors import ConfigError

STEPS = ("train_step", "test_step", "predict_step")


def overrides(model, name):
    """Whether `model`'s class overrides Keras' `Model.<name>` (e.g. "train_step")."""
    return (isinstance(model, keras.Model)
            and getattr(type(model), name) is not getattr(keras.Model, name))


def has_own_train_step(model):
    """Whether `model` is a Keras model with its own `train_step` (Keras' way to customise fit)."""
    return overrides(model, "train_step")


def task_class(model):
    """The Task for a Keras model: `ModelStepTask` when it overrides a step, else SupervisedTask."""
    if any(overrides(model, name) for name in STEPS):
        return ModelStepTask
    return task_lib.SupervisedTask


def check_options(options):
    """Raises `ConfigError` for a Trainer option a custom `train_step` cannot honour.

    `options`: the Trainer's keyword options (`config.from_arguments`). Each
    message names the Keras setting that does the same inside the model's
    own step, or the tapeworks way to keep the option (a `Task`).
    """
    refused = {
        "accumulate": (options["accumulate"] != 1,
                       "pass the optimizer `gradient_accumulation_steps=N` (Keras "
                       "optimizers accumulate inside `apply_gradients`)"),
        "clip_norm": (options["clip_norm"] is not None,
                      "pass the optimizer `global_clipnorm=` (or `clipnorm=`)"),
        "clip_value": (options["clip_value"] is not None,
                       "pass the optimizer `clipvalue=`"),
        "monitor_every": (options["monitor_every"] is not None,
                          "drop monitor_every, or write the step as a `tapeworks.Task` "
                          "(`compute_losses`), whose gradients tapeworks computes"),
        "pruning": (options["pruning"] is not None,
                    "write the step as a `tapeworks.Task`, whose updates tapeworks applies"),
        "capture_every": (options["capture_every"] is not None,
                          "write the step as a `tapeworks.Task` and `self.capture` there"),
        "jit_compile": (options["jit_compile"] == "update",
                        "pass jit_compile=True (the whole step through XLA), False or "
                        "\"auto\""),
        "on_nonfinite": (options["on_nonfinite"] == "skip",
                         "pass on_nonfinite=\"raise\" (stops after the bad step), \"warn\" "
                         "or None; or write the step as a `tapeworks.Task`, whose updates "
                         "tapeworks can withhold"),
    }
    for name, (asked, way_out) in refused.items():
        if asked:
            raise ConfigError(
                f"`{name}={options[name]!r}` needs the inside of tapeworks' own step, but the "
                "model has a custom `train_step`, which computes its gradients and applies "
                "its optimizer itself. Expected the default "
                f"({name}={_DEFAULTS[name]!r}) with a custom `train_step`. Fix: {way_out}.")


_DEFAULTS = {"accumulate": 1, "clip_norm": None, "clip_value": None, "monitor_every": None,
             "pruning": None, "capture_every": None, "jit_compile": "auto",
             "on_nonfinite": "raise"}


def resolve_precision(model, precision):
    """The precision plugin for a model with its own `train_step`.

    tapeworks' loss scale lives in its own step, so float16 is refused; a
    model built under mixed_float16 scales its loss itself (Keras' compile
    wraps its optimizer in a `LossScaleOptimizer`), so tapeworks adds nothing.
    """
    plugin = precision_lib.resolve(precision)
    if plugin.policy == "mixed_float16":
        raise ConfigError(
            f"precision={precision!r} resolves to mixed_float16, whose loss scaling tapeworks "
            "applies inside its own step, but the model has a custom `train_step`, which "
            "takes its gradients itself. Expected \"float32\" or \"mixed_bfloat16\" with a "
            "custom `train_step`. Fix: set `keras.mixed_precision.set_global_policy("
            "\"mixed_float16\")` before building the model, compile it (Keras wraps its "
            "optimizer in a LossScaleOptimizer), and in `train_step` take the gradients "
            "of `self.optimizer.scale_loss(loss)`; or pass precision=\"mixed_bfloat16\".")
    if model.dtype_policy.name == "mixed_float16":
        return precision_lib.resolve("float32")
    return plugin


class ModelStepTask(task_lib.SupervisedTask):
    """A compiled Keras model that overrides `train_step`, `test_step` or `predict_step`.

    With its own `train_step`, that step trains (and Keras' or its own
    `test_step` evaluates); its update is declared as the model's compiled
    optimizer over its trainable variables (for the checkpoint and the
    callbacks that read `model.optimizer`), the step applies whatever
    optimizers it holds. Without, tapeworks' own step trains, and only the
    overridden `test_step`/`predict_step` replace tapeworks' own.
    """

    def __init__(self, model, optimizer=None, loss=None, metrics=None, loss_weights=None,
                 weighted_metrics=None):
        if has_own_train_step(model) and optimizer is not None \
                and not getattr(model, "compiled", False):
            # Its own step needs no compiled loss (a VAE's is in the step):
            # Keras compiles it with an optimizer alone, and so does this.
            given = dict(loss=loss, metrics=metrics, loss_weights=loss_weights,
                         weighted_metrics=weighted_metrics)
            model.compile(optimizer=optimizer,
                          **{name: value for name, value in given.items() if value is not None})
            optimizer = loss = metrics = loss_weights = weighted_metrics = None
        super().__init__(model, optimizer, loss, metrics, loss_weights, weighted_metrics)
        self.own_train_step = has_own_train_step(model)
        self.own_test_step = self.own_train_step or overrides(model, "test_step")
        self.own_predict_step = overrides(model, "predict_step")
        if self.own_train_step:
            # The step applies `model.optimizer` as compiled, a LossScaleOptimizer
            # included (SupervisedTask takes the inner one: it scales itself).
            self._updates[0] = task_lib.Update("model", "loss", [model], model.optimizer)
        self.logs = OwnLogs(model)

    def build_steps(self, element_spec, trace=None):
        """Creates every variable the model's `train_step` creates, by tracing it with `tf.function`.

        Keras' own fit builds a model with a custom step the same way: by
        tracing its train function (the model, its optimizers' slots, the
        compiled metrics). The trace runs nothing: no update is applied.
        `tf.function` traces a step that creates variables twice; the
        training state first tries one trace in a scratch graph
        (`training_state.trace_lifted`) and comes here where that cannot.
        `trace`: what to trace (default `trace_train_step`; the training state
        passes it wrapped in its strategy's `run`).
        """
        if not self.needs_build():
            return
        tf.function(trace or self.trace_train_step,
                    autograph=False).get_concrete_function(element_spec)
        self.reset_metrics()

    def needs_build(self):
        """Whether layers, compiled losses or metrics are unbuilt: what only a trace can build."""
        model = self.network
        compiled = [getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None)]
        return (not all(layer.built for layer in model._flatten_layers(include_self=False))
                or any(part is not None and not part.built for part in compiled))

    def trace_train_step(self, batch):
        """The model's `train_step` on `batch`, its logs kept: what a build traces."""
        self.logs.keep("train", self.network.train_step(batch))
        return tf.constant(0)

    def check_data(self, element_spec, name, needs_targets=True, arrays=None):
        # The model's own step reads its batches as it likes (x alone, (x, y),
        # a dict): nothing here knows what it expects.
        if not self.own_train_step:
            super().check_data(element_spec, name, needs_targets, arrays)

    def metric_results(self):
        if not self.own_train_step:
            return super().metric_results()
        return self.logs.results("train")

    def predict_step(self, batch):
        if not self.own_predict_step:
            return super().predict_step(batch)
        if not self.own_train_step and isinstance(batch, tuple) and len(batch) == 1 \
                and not isinstance(batch[0], (list, tuple)):
            # Batched as tapeworks' own step takes them, (x,): Keras gives x.
            batch = batch[0]
        return self.network.predict_step(batch)


def make_train_step(task, counters, guard=None):
    """Returns `step(batch) -> batch size`: the model's own `train_step` on one batch.

    `guard`: the non-finite guard ("raise" or "warn"); it judges the step's
    loss logs (every log whose name holds "loss") after the step applied its
    update.
    """
    def train_step(batch):
        logs = task.network.train_step(batch)
        task.logs.keep("train", logs)
        if guard is not None:
            losses = [tf.cast(tf.reduce_sum(value), tf.float32)
                      for key, value in flattened(logs).items()
                      if "loss" in key and tf.as_dtype(
                          tf.convert_to_tensor(value).dtype).is_floating]
            if losses:
                guard.verdict(tf.add_n(losses), [], loss_scaled=False)
        counters.step.assign_add(1)
        return task_lib.batch_size(batch)

    return train_step


def make_test_step(task):
    """Returns `step(batch) -> batch size`: the model's `test_step` (its own or Keras')."""
    def test_step(batch):
        task.logs.keep("test", task.network.test_step(batch))
        return task_lib.batch_size(batch)

    return test_step


def nonfinite_message(logs, step, epoch, batch_index, batch_file):
    """The message of a non-finite loss log of a custom `train_step` ("raise")."""
    bad = ", ".join(f"{key}={value}" for key, value in logs.items()
                    if "loss" in key) or "its loss"
    saved = f" The batch is saved in {batch_file}." if batch_file else ""
    return (f"Non-finite loss at step {step} (epoch {epoch + 1}, batch {batch_index}) of the "
            f"model's custom `train_step`: {bad}. A custom `train_step` applies its update "
            "itself, so tapeworks could not withhold it: the weights are those after this "
            f"step.{saved} Fix: look at what the step computes (a log or sqrt of values <= "
            "0, an exp that overflows), lower the learning rate, or clip with the "
            "optimizer's `global_clipnorm=`; to have bad updates withheld, write the step "
            "as a `tapeworks.Task`.")
