"""Weights for several losses trained by one update: static, scheduled, learned.

Pass one as an update's `loss`: `self.add_update("model", loss=UncertaintyWeighting(
["depth", "segmentation"]), trains=model, optimizer="adam")`. Every current
weight appears in the logs as `weight/<loss name>`. All state is in variables,
so weights survive checkpoints and change without retracing the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import tensorflow as tf

from tapeworks.errors import ConfigError

# A scheduled weight: `f(step, epoch) -> weight`, both int64 tensors.
Schedule = Callable[[tf.Tensor, tf.Tensor], Any]


class Weighting(tf.Module):
    """Combines named losses into one scalar; subclasses say how."""

    def __init__(self, names: Iterable[str], name: str) -> None:
        super().__init__(name=name)
        names = list(names)
        if not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{type(self).__name__} needs loss names (strings). "
                              f"Received: {names!r}")
        self.names = names

    def combine(self, losses: Mapping[str, tf.Tensor], counters: Any) -> tf.Tensor:
        """The weighted sum of `losses`, at the weights of this step."""
        missing = [n for n in self.names if n not in losses]
        if missing:
            raise ConfigError(
                f"{type(self).__name__} weights {missing}, but `compute_losses` returned "
                f"{sorted(losses)}. Expected every weighted loss among them.")
        weights = self.current(counters)
        return tf.add_n([tf.cast(weights[n], tf.float32) * losses[n] for n in self.names])

    def current(self, counters: Any) -> dict[str, Any]:
        """This step's weight of each loss (name -> scalar tensor)."""
        raise NotImplementedError

    def logs(self) -> dict[str, tf.Tensor]:
        """What the logs show of the weights (`weight/<loss name>`)."""
        return {}


class StaticWeights(Weighting):
    """Fixed weights: `StaticWeights({"reconstruction": 1.0, "perceptual": 0.1})`."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        super().__init__(weights, name="static_weights")
        self.weights_by_name = {n: float(w) for n, w in weights.items()}

    def current(self, counters: Any) -> dict[str, Any]:
        return self.weights_by_name

    def logs(self) -> dict[str, tf.Tensor]:
        return {f"weight/{n}": tf.constant(w) for n, w in self.weights_by_name.items()}


class ScheduledWeights(Weighting):
    """Weights that are numbers or functions `f(step, epoch) -> weight`, evaluated in the graph.

    `step` and `epoch` arrive as int64 tensors read from variables, so a
    weight that changes every step never retraces the compiled step. Write
    the function with TensorFlow ops (`tf.minimum(1.0, tf.cast(step, tf.float32) / 1000)`).
    """

    def __init__(self, weights: Mapping[str, Union[float, Schedule]]) -> None:
        super().__init__(weights, name="scheduled_weights")
        self.schedule = dict(weights)
        self._last = {n: tf.Variable(0.0, trainable=False, name=f"last_{i}")
                      for i, n in enumerate(self.names)}

    def current(self, counters: Any) -> dict[str, Any]:
        values = {}
        for name, weight in self.schedule.items():
            value = weight(counters.step, counters.epoch) if callable(weight) else weight
            value = tf.cast(value, tf.float32)
            self._last[name].assign(value)
            values[name] = value
        return values

    def logs(self) -> dict[str, tf.Tensor]:
        return {f"weight/{n}": v.read_value() for n, v in self._last.items()}


class UncertaintyWeighting(Weighting):
    """Learned homoscedastic-uncertainty weights (Kendall, Gal & Cipolla, CVPR 2018).

    Total = sum_i exp(-s_i) * L_i + s_i, with s_i = log(sigma_i^2) learned
    together with the model (the update trains them). A noisy task's s_i
    grows, lowering its weight exp(-s_i); the `+ s_i` term stops all weights
    from collapsing to zero. This is the common form of the paper's equation
    (without its 1/2 factors, which rescale s_i).
    """

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(names, name="uncertainty_weighting")
        self.log_variances = [tf.Variable(0.0, trainable=True, name=f"log_variance_{i}")
                              for i, _ in enumerate(self.names)]

    def combine(self, losses: Mapping[str, tf.Tensor], counters: Any) -> tf.Tensor:
        super().combine(losses, counters)  # checks the names
        return tf.add_n([tf.exp(-s) * losses[n] + s
                         for n, s in zip(self.names, self.log_variances)])

    def current(self, counters: Any) -> dict[str, Any]:
        return {n: tf.exp(-s) for n, s in zip(self.names, self.log_variances)}

    def logs(self) -> dict[str, tf.Tensor]:
        return {f"weight/{n}": tf.exp(-s) for n, s in zip(self.names, self.log_variances)}


class GradNorm(Weighting):
    """GradNorm (Chen, Badrinarayanan, Lee & Rabinovich, ICML 2018).

    Balances the tasks' gradient norms on the last shared weights. After each
    step, with G_i = ||grad_W (w_i L_i)||, r_i the task's relative inverse
    training rate (L_i / L_i(0), over its mean), and the target
    mean(G) * r_i ** alpha held constant, the weights take one gradient step
    on sum_i |G_i - target_i| and are renormalised to sum to the number of
    tasks. The gradient is written out, d/dw_i = sign(G_i - target_i) *
    ||grad_W L_i||, instead of a second tape.

    Args:
        names: the losses to weight.
        shared: the shared variables (usually the last shared layer's kernel),
            or a layer whose trainable variables they are.
        alpha: the restoring force; larger pulls training rates together harder.
        learning_rate: step size of the weights' own update.
    """

    def __init__(self, names: Sequence[str], shared: Any, alpha: float = 1.5,
                 learning_rate: float = 0.025) -> None:
        super().__init__(names, name="gradnorm")
        self.shared = shared
        self.alpha = float(alpha)
        self.learning_rate = float(learning_rate)
        self.task_weights = [tf.Variable(1.0, trainable=False, name=f"weight_{i}")
                             for i, _ in enumerate(self.names)]
        self.initial_losses = [tf.Variable(0.0, trainable=False, name=f"initial_loss_{i}")
                               for i, _ in enumerate(self.names)]
        self.started = tf.Variable(False, trainable=False, name="started")

    def current(self, counters: Any) -> dict[str, Any]:
        return {n: w.read_value() for n, w in zip(self.names, self.task_weights)}

    def _shared_variables(self):
        if isinstance(self.shared, (list, tuple)):
            return list(self.shared)
        if isinstance(self.shared, tf.Variable) or hasattr(self.shared, "assign"):
            return [self.shared]
        return list(self.shared.trainable_variables)

    def after_gradients(self, tape: tf.GradientTape, losses: Mapping[str, tf.Tensor],
                        counters: Any) -> None:
        """Moves the weights towards balanced gradient norms (called by the step)."""
        shared = self._shared_variables()
        norms = []
        for name in self.names:
            grads = [g for g in tape.gradient(losses[name], shared) if g is not None]
            if not grads:
                raise ConfigError(
                    f"GradNorm: loss {name!r} has no gradient on the shared variables. "
                    "Expected `shared` to be weights every weighted loss depends on "
                    "(the last shared layer). Fix: pass that layer.")
            norms.append(tf.linalg.global_norm(grads))
        current = tf.stack([losses[n] for n in self.names])
        for variable, value in zip(self.initial_losses, tf.unstack(current)):
            variable.assign(tf.where(self.started, variable, tf.maximum(value, 1e-12)))
        self.started.assign(True)
        weights = tf.stack(self.task_weights)
        norms = tf.stack(norms)
        weighted_norms = weights * norms
        ratios = current / tf.stack(self.initial_losses)
        relative = ratios / tf.reduce_mean(ratios)
        target = tf.stop_gradient(tf.reduce_mean(weighted_norms) * relative ** self.alpha)
        step = tf.sign(weighted_norms - target) * norms
        new = tf.maximum(weights - self.learning_rate * step, 1e-3)
        new = new * (len(self.names) / tf.reduce_sum(new))
        for variable, value in zip(self.task_weights, tf.unstack(new)):
            variable.assign(value)

    def logs(self) -> dict[str, tf.Tensor]:
        return {f"weight/{n}": w.read_value() for n, w in zip(self.names, self.task_weights)}
