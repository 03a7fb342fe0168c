"""Precision plugins: float32, mixed bfloat16, mixed float16 with dynamic loss scaling.

Each plugin answers the same few questions for the step (how to scale the
loss, how to unscale gradients, whether to check them for overflow, what to do
after an update or a skipped one). float32's answers are all no-ops, so the
step has no precision branches of its own (Lightning's precision plugins and
nanoGPT's disabled scaler work the same way).

Why tapeworks scales the loss itself instead of using Keras'
`LossScaleOptimizer`: with gradient accumulation, Keras' wrapper judges each
micro-batch alone and silently drops one that overflows, while the window it
belongs to is still applied. Here the verdict is per window: one non-finite
micro-batch skips the whole update (see `step.py`).
"""

import logging
import os
import re
import types

import keras
import tensorflow as tf

from tapeworks.errors import ConfigError

logger = logging.getLogger("tapeworks")

CHOICES = ("float32", "mixed_bfloat16", "mixed_float16", "auto")


class Float32(tf.Module):
    """Full precision: every hook is a no-op."""

    policy = "float32"
    checks_finite = False
    measured = False   # chosen by measurement (`Measured`), not by its name
    decided = True

    def __init__(self, reason="asked for"):
        super().__init__(name="precision")
        self.reason = reason

    def __repr__(self):
        return f"<precision {self.policy!r} ({self.reason})>"

    def apply_to(self, model):
        pass

    def scale_loss(self, loss):
        return loss

    def unscale(self, gradients):
        return gradients

    def on_applied(self):
        pass

    def on_skipped(self):
        pass

    def logs(self):
        return {}


class MixedBFloat16(Float32):
    """bfloat16 compute, float32 variables; bfloat16's range needs no loss scaling."""

    policy = "mixed_bfloat16"

    def apply_to(self, model):
        set_mixed_policy(model, self.policy)


class MixedFloat16(MixedBFloat16):
    """float16 compute with dynamic loss scaling.

    The loss is multiplied by `scale` before the gradient, and the gradients
    divided by it after. A window whose gradients are not all finite is
    skipped: the scale halves and `skipped_steps` counts it. After
    `growth_interval` applied updates in a row the scale doubles. The same
    constants as Keras' `LossScaleOptimizer`.
    """

    policy = "mixed_float16"
    checks_finite = True

    def __init__(self, reason="asked for", initial_scale=2.0 ** 15, growth_interval=2000,
                 in_logs=True):
        super().__init__(reason)
        self.growth_interval = growth_interval
        # Whether `loss_scale` and `skipped_steps` join the logs (and History).
        self.in_logs = in_logs
        self.scale = tf.Variable(initial_scale, dtype=tf.float32, trainable=False,
                                 name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="skipped_steps")

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale(self, gradients):
        inverse = 1.0 / self.scale
        return [None if g is None else g * tf.cast(inverse, g.dtype) for g in gradients]

    def on_applied(self):
        grow = self.good_steps + 1 >= self.growth_interval
        self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale))
        self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1))

    def on_skipped(self):
        self.scale.assign(tf.maximum(self.scale / 2.0, 1.0))
        self.good_steps.assign(0)
        self.skipped_steps.assign_add(1)

    def logs(self):
        if not self.in_logs:
            return {}
        return {"loss_scale": self.scale.read_value(),
                "skipped_steps": self.skipped_steps.read_value()}


def all_finite(gradients):
    """One boolean: are all the given gradients finite?"""
    checks = [tf.reduce_all(tf.math.is_finite(g)) for g in gradients if g is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


class Measured(Float32):
    """precision="auto" where the CPU computes bfloat16 natively: float32 until measured.

    Which of float32 and mixed bfloat16 trains faster here is a question of
    the model and the CPU (oneDNN runs bfloat16 matmuls on AVX512_BF16 or AMX;
    elementwise work and casts may eat the gain), so the first fit long
    enough to repay it measures both on its own batches
    (`engine/plan/precision_trial.py`) and `decide`s. Neither needs loss
    scaling, so every hook stays a no-op and the step is the same for both;
    only the layers' policy changes, and with it the compiled functions,
    which are keyed by `policy`.
    """

    measured = True
    # A class attribute: a tuple set on a tf.Module would be tracked, and would
    # add a node to the checkpoint Float32 does not have.
    candidates = ("float32", "mixed_bfloat16")

    def __init__(self, reason="asked for"):
        super().__init__(reason)
        self.policy = "float32"
        self.choice = None   # the PrecisionChoice, once decided
        self.waiting_said = False   # why it is not measured yet, said once
        # Not tracked by tf.Module (a plain namespace): the checkpoint's
        # "precision" entry must stay as Float32's, with no variables in it.
        self._held = types.SimpleNamespace(models=[], changed=[])

    @property
    def decided(self):
        return self.choice is not None

    def apply_to(self, model):
        self._held.models.append(model)
        if self.policy != "float32":
            self._held.changed += set_mixed_policy(model, self.policy)

    def switch(self, policy):
        """Puts the models' layers on `policy` (one of `candidates`), undoing the last switch."""
        for layer in self._held.changed:
            layer.dtype_policy = "float32"
        self._held.changed = []
        self.policy = policy
        if policy != "float32":
            for model in self._held.models:
                self._held.changed += set_mixed_policy(model, policy)

    def decide(self, choice):
        """Keeps `choice` (a `PrecisionChoice`): its policy from here on."""
        self.choice = choice
        self.reason = choice.reason
        self.switch(choice.policy)
        logger.info("precision=%s (%s)", choice.policy, choice.reason)


def resolve(precision):
    """Returns the plugin for `precision`, resolving "auto" from the hardware."""
    if precision not in CHOICES:
        raise ConfigError(
            f"`precision` must be one of {', '.join(repr(c) for c in CHOICES)}. "
            f"Received: precision={precision!r}"
        )
    if precision != "auto":
        return _PLUGINS[precision]()
    name, reason = auto_choice()
    if name == "mixed_bfloat16" and not tf.config.list_physical_devices("GPU"):
        return Measured(f"{reason}; float32 until the first long enough fit measures both")
    logger.info("precision=%s (%s)", name, reason)
    return _PLUGINS[name](reason)


def auto_choice():
    """(policy name, reason): bfloat16 where the hardware computes it natively."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        capability = details.get("compute_capability")
        name = details.get("device_name", "GPU")
        if capability and tuple(capability) >= (8, 0):
            return "mixed_bfloat16", f"{name} (compute capability {capability}) has bfloat16"
        if capability and tuple(capability) >= (7, 0):
            return "mixed_float16", (f"{name} (compute capability {capability}) has float16 "
                                     "tensor cores but no bfloat16")
        return "float32", f"{name} has neither fast bfloat16 nor float16"
    flags = cpu_flags()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if native:
        return "mixed_bfloat16", f"the CPU has native bfloat16 instructions ({', '.join(native)})"
    return "float32", "no GPU, and the CPU has no native bfloat16 instructions"


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags (Linux); empty where they cannot be read."""
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        for line in f:
            if line.startswith("flags"):
                return set(re.split(r"\s+", line.split(":", 1)[1].strip()))
    return set()


def set_mixed_policy(model, policy):
    """Puts the model's layers on `policy`, keeping the output layers in float32.

    Only layers on the plain "float32" policy are changed (a layer the user
    put on another policy keeps it). Output layers stay float32, as Keras'
    mixed-precision guide advises for the final layer and its activation; the
    variables of every layer stay float32 either way. Returns the layers changed.
    """
    changed = []
    outputs = set(id(layer) for layer in output_layers(model))
    # `_flatten_layers` is Keras' own walk over nested layers; there is no
    # public equivalent that includes layers of nested models.
    for layer in model._flatten_layers(include_self=False):
        if id(layer) in outputs or isinstance(layer, keras.layers.InputLayer):
            continue
        if layer.dtype_policy.name == "float32":
            layer.dtype_policy = policy
            changed.append(layer)
    return changed


def output_layers(model):
    """The layers that produce the model's outputs, where the model says so."""
    if isinstance(model, keras.Sequential) and model.layers:
        return [model.layers[-1]]
    layers = []
    for tensor in getattr(model, "outputs", None) or []:
        history = getattr(tensor, "_keras_history", None)
        if history is not None:
            layers.append(history[0])
    return layers


def warn_low_precision_outputs(model, y_pred):
    """Warns once, naming the model, when its outputs come out in low precision.

    They are cast to float32 before the loss either way; the warning is
    about the precision lost inside the last layer (a softmax in float16).
    """
    low = [t for t in tf.nest.flatten(y_pred)
           if t is not None and t.dtype in (tf.float16, tf.bfloat16)]
    if low:
        names = ", ".join(layer.name for layer in output_layers(model)) or model.name
        # A CorrectnessWarning (catchable with the rest of tapeworks'), at the user's line.
        from tapeworks.errors import CorrectnessWarning, warn
        warn(f"tapeworks: the outputs of `{model.name}` are computed in {low[0].dtype.name} "
             f"(by {names}). tapeworks casts them to float32 before the loss, but the last "
             "layer itself ran in low precision. Fix: give the final layer (and its "
             "activation) `dtype=\"float32\"`.", CorrectnessWarning, section="setup-mistakes")


def to_float32(y_pred):
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32)
        if t is not None and t.dtype in (tf.float16, tf.bfloat16) else t,
        y_pred,
    )


_PLUGINS = {"float32": Float32, "mixed_bfloat16": MixedBFloat16,
            "mixed_float16": MixedFloat16}
