"""`TrainerConfig`: the Trainer's keyword options, checked once, with the rules between them.

Every `ConfigError` a constructor argument can raise is raised here, before
anything is built; the rest of the engine reads the frozen result. "auto"
settings stay "auto" here: the planner (`call_plan.py`) resolves them.
"""

import dataclasses
import re

import keras
import tensorflow as tf

from tapeworks.engine.checks import nonfinite
from tapeworks.engine.step import model_step, step
from tapeworks.engine.step import precision as precision_lib
from tapeworks.engine.step import task as task_lib
from tapeworks.errors import ConfigError


def _pruning_class():
    # Imported only when a `pruning` is given: tapeworks.prune is built on the
    # engine (a layer above it), and importing it in every Trainer() cost 3 ms
    # of the timed fit where Python keeps no bytecode (PYTHONDONTWRITEBYTECODE).
    from tapeworks.prune import Pruning
    return Pruning


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The options of one Trainer, as given (and checked)."""

    jit_compile: object = "auto"          # True, False, "update" or "auto"
    steps_per_call: object = "auto"       # an int >= 1 or "auto"
    seed: object = None
    run_eagerly: bool = False
    allow_missing_gradients: bool = False
    accumulate: int = 1
    clip_norm: object = None
    clip_value: object = None
    capture_every: object = None
    check_data: bool = True
    diagnose_input: bool = False
    deterministic: bool = False
    on_nonfinite: object = "raise"
    nonfinite_dir: object = None
    fine_tune_in_inference_mode: bool = False
    dead_gradient_steps: object = 50
    monitor_every: object = None
    pruning: object = None
    sync_batchnorm: bool = False
    split_xla_step_bytes: float = step.SPLIT_MIN_GRADIENT_BYTES
    # Why the step runs eagerly when nobody asked this Trainer to (one line, said at fit).
    run_eagerly_reason: object = None

    @property
    def auto(self):
        """Whether "auto" decides the mode or the steps per call."""
        return self.jit_compile == "auto" or self.steps_per_call == "auto"


def from_arguments(model, *, optimizer, loss, metrics, loss_weights, weighted_metrics,
                   replicated, strategy_name, **options):
    """Checks the Trainer's arguments; returns the `TrainerConfig`.

    `replicated`: the strategy has several replicas (`strategy_name` names it).
    """
    if isinstance(model, task_lib.Task):
        given = [n for n, v in (("optimizer", optimizer), ("loss", loss),
                                ("metrics", metrics), ("loss_weights", loss_weights),
                                ("weighted_metrics", weighted_metrics))
                 if v is not None]
        if given:
            raise ConfigError(
                f"{', '.join(f'`{n}`' for n in given)} given with a Task. A Task declares "
                "its own losses and optimizers (`add_update`). Fix: pass them there.")
    elif not isinstance(model, keras.Model):
        raise ConfigError(
            f"`model` must be a keras.Model or a tapeworks.Task. Received: "
            f"{type(model).__name__}. Fix: wrap layers in keras.Sequential or a "
            "Functional model."
        )
    run_eagerly = options["run_eagerly"]
    if run_eagerly is None:
        # A model compiled with run_eagerly=True is debugged eagerly here too.
        run_eagerly = bool(isinstance(model, keras.Model)
                           and getattr(model, "compiled", False) and model.run_eagerly)
        if not run_eagerly and tf.config.functions_run_eagerly():
            # The script switched every tf.function to eager (a debugging
            # switch): Keras' fit then runs its step eagerly, XLA or not, and
            # so does this one, saying so, instead of measuring "compiled"
            # modes that would all run eagerly.
            run_eagerly = True
            options["run_eagerly_reason"] = (
                "tf.config.run_functions_eagerly(True) is set: the step runs eagerly, as in "
                "Keras' fit (no XLA, nothing measured); call it with False to compile")
            if options["jit_compile"] in (True, "update"):
                options["jit_compile"] = False
    options["run_eagerly"] = run_eagerly
    if isinstance(model, keras.Model) and getattr(model, "compiled", False) and not run_eagerly:
        # What the model's compile() asked for, as Keras' fit runs it; the
        # Trainer's own argument, when given, wins. (On TensorFlow, Keras'
        # "auto" resolves to jit_compile=False: True is the user's.)
        if (options["jit_compile"] == "auto" and model.jit_compile is True
                and not replicated and not options["deterministic"]):
            options["jit_compile"] = True
        asked = getattr(model, "steps_per_execution", 1)
        if (options["steps_per_call"] == "auto" and isinstance(asked, int)
                and not isinstance(asked, bool) and asked > 1):
            options["steps_per_call"] = asked
    if run_eagerly and options["steps_per_call"] == "auto":
        # Debugging, as Keras' eager fit runs: one step a call, so every
        # batch hook fires (nothing to gain from longer eager calls), no XLA:
        # nothing left for "auto" to measure or announce.
        options["steps_per_call"] = 1
        if options["jit_compile"] == "auto":
            options["jit_compile"] = False
    jit_compile, steps_per_call = options["jit_compile"], options["steps_per_call"]
    if jit_compile not in (True, False, "update", "auto"):
        raise ConfigError(
            "`jit_compile` must be True, False, \"update\" or \"auto\". Received: "
            f"jit_compile={jit_compile!r}"
        )
    if steps_per_call != "auto" and not (
            isinstance(steps_per_call, int) and steps_per_call >= 1):
        raise ConfigError(
            "`steps_per_call` must be an integer >= 1 or \"auto\". "
            f"Received: steps_per_call={steps_per_call!r}"
        )
    if run_eagerly and jit_compile in (True, "update"):
        raise ConfigError(
            "`run_eagerly=True` runs plain Python, which XLA cannot compile. "
            "Fix: pass jit_compile=False (or \"auto\") with run_eagerly=True."
        )
    accumulate = options["accumulate"]
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise ConfigError(
            f"`accumulate` must be an integer >= 1. Received: accumulate={accumulate!r}")
    check_count("capture_every", options["capture_every"],
                "Every this many steps, the task's captured tensors are copied out.",
                steps_per_call, "a call would hold several captures and keep only the last")
    for name in ("clip_norm", "clip_value"):
        value = options[name]
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ConfigError(
                f"`{name}` must be None or a number > 0. Received: {name}={value!r}")
    options["on_nonfinite"] = nonfinite.check_policy(options["on_nonfinite"])
    options["fine_tune_in_inference_mode"] = bool(options["fine_tune_in_inference_mode"])
    check_count("dead_gradient_steps", options["dead_gradient_steps"],
                "It is how many consecutive steps of exactly zero gradient make a "
                "variable reported as not training.")
    check_count("monitor_every", options["monitor_every"],
                "Fix: e.g. monitor_every=100 computes the per-layer gradient statistics "
                "on every 100th step.")
    pruning = options["pruning"]
    if pruning is not None and not isinstance(pruning, _pruning_class()):
        raise ConfigError(
            f"`pruning` must be None or a tapeworks.prune.Pruning. Received: "
            f"{type(pruning).__name__}. Fix: pruning=tapeworks.prune.Pruning(schedule).")
    deterministic = options["deterministic"]
    if not isinstance(deterministic, bool):
        raise ConfigError(f"`deterministic` must be True or False. Received: "
                          f"deterministic={deterministic!r}")
    if jit_compile in (True, "update") and replicated:
        raise ConfigError(
            f"jit_compile={jit_compile!r} under {strategy_name}: tapeworks "
            "compiles a replicated step with tf.function only (the optimizer's all-reduce "
            "runs through merge_call, which XLA cannot take inside the step). Fix: pass "
            "jit_compile=False or \"auto\" (which then measures steps per call only).")
    if deterministic and jit_compile in (True, "update"):
        raise ConfigError(
            f"`deterministic=True` keeps to tf.function's numerics, which "
            f"jit_compile={jit_compile!r} (XLA) changes. Fix: pass jit_compile=False "
            "or \"auto\" with deterministic=True.")
    if not isinstance(options["sync_batchnorm"], bool):
        raise ConfigError(f"`sync_batchnorm` must be True or False. Received: "
                          f"sync_batchnorm={options['sync_batchnorm']!r}")
    split = options["split_xla_step_bytes"]
    if split is None:
        options["split_xla_step_bytes"] = split = step.SPLIT_MIN_GRADIENT_BYTES
    if not isinstance(split, (int, float)) or isinstance(split, bool) or split < 0:
        raise ConfigError(
            f"`split_xla_step_bytes` must be None or a number of bytes >= 0. Received: "
            f"split_xla_step_bytes={split!r}. Fix: e.g. 16 * 2**20 splits XLA steps whose "
            "gradients reach 16 MiB; None never splits.")
    if model_step.has_own_train_step(model):
        model_step.check_options(options)
        # Its gradients never pass through tapeworks: nothing to count.
        options["dead_gradient_steps"] = None
    return TrainerConfig(**options)


def check_count(name, value, meaning, steps_per_call=None, too_many=None):
    """Raises `ConfigError` unless `value` is None or an integer >= 1 (not a bool).

    With `too_many`, a fixed `steps_per_call` above `value` is refused too
    (`too_many` says what would go wrong).
    """
    if value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"`{name}` must be None or an integer >= 1. Received: "
                          f"{name}={value!r}. " + meaning)
    if too_many and value and isinstance(steps_per_call, int) and steps_per_call > value:
        raise ConfigError(
            f"`steps_per_call` ({steps_per_call}) is larger than `{name}` ({value}): "
            f"{too_many}. Expected steps_per_call <= {name}. Fix: lower steps_per_call or "
            "use \"auto\".")


def resolve_precision(model, precision):
    """The precision plugin for `precision`, as `model`'s own policy requires."""
    plugin = precision_lib.resolve(precision)
    policy = model.dtype_policy.name
    if policy == "mixed_float16" and plugin.policy != "mixed_float16":
        # A model built under mixed_float16 needs loss scaling to train
        # correctly, whatever was asked. Its History keeps the keys Keras' fit
        # gives it (Keras' LossScaleOptimizer logs neither the scale nor skips).
        return precision_lib.MixedFloat16("the model was built with mixed_float16",
                                          in_logs=False)
    return plugin


def supports_xla(models):
    """Whether every layer of `models` can be compiled by XLA (Keras' `supports_jit`)."""
    return all(getattr(layer, "supports_jit", True)
               for model in models for layer in model._flatten_layers())


def describe_xla_failure(error):
    """A one-line reason from XLA's long compile error."""
    ops = re.findall(r"JIT: ([\w, ]+?) \(No registered", str(error))
    if ops:
        return f"no XLA kernel for {ops[0]}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:160] if lines else type(error).__name__
