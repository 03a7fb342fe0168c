"""When to prune, and to what sparsity: the schedules of Zhu & Gupta (2017).

A schedule maps the index of an optimizer update (0 for the first update
applied to the pruned weights) to whether the masks are recomputed after it
(`due`) and to the target sparsity then (`sparsity`). Both work on Python
numbers (tests, reports) and on tensors (inside the compiled step, XLA
included). They follow TensorFlow Model Optimization's `ConstantSparsity` and
`PolynomialDecay`, which no longer run on Keras 3 models, with one change:
the masks are also recomputed at `end_step` itself, so the final sparsity is
reached even when `end_step - begin_step` is not a multiple of `frequency`.
"""

from __future__ import annotations

import tensorflow as tf

from tapeworks.errors import ConfigError


def _check_step(name, value, minimum=0):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}")


def _check_sparsity(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(
            f"`{name}` must be a number in [0, 1): the fraction of each kernel's weights set "
            f"to zero (1 would remove the whole kernel). Received: {name}={value!r}")


class Schedule:
    """The base of pruning schedules: when the masks are recomputed (`due`), and to what
    sparsity (`sparsity`, `final_sparsity`). `Pruning` accepts any subclass.
    """

    def __init__(self, begin_step: int, end_step: int | None, frequency: int) -> None:
        _check_step("begin_step", begin_step)
        if end_step is not None:
            _check_step("end_step", end_step)
            if end_step <= begin_step:
                raise ConfigError(
                    f"`end_step` must be after `begin_step`. Received: begin_step={begin_step}, "
                    f"end_step={end_step}. Fix: end_step > begin_step, or end_step=None to "
                    "keep pruning to the end of training.")
        _check_step("frequency", frequency, minimum=1)
        self.begin_step, self.end_step, self.frequency = begin_step, end_step, frequency

    def due(self, step: int | tf.Tensor) -> bool | tf.Tensor:
        """Whether the masks are recomputed after update `step` (a bool or a bool tensor)."""
        if isinstance(step, int):
            if step < self.begin_step or (self.end_step is not None and step > self.end_step):
                return False
            return (step - self.begin_step) % self.frequency == 0 or step == self.end_step
        step = tf.cast(step, tf.int64)
        due = tf.logical_and(step >= self.begin_step,
                             (step - self.begin_step) % self.frequency == 0)
        if self.end_step is not None:
            due = tf.logical_or(tf.logical_and(due, step <= self.end_step),
                                tf.equal(step, self.end_step))
        return due

    def final_sparsity(self) -> float:
        raise NotImplementedError

    def sparsity(self, step: int | tf.Tensor) -> float | tf.Tensor:
        raise NotImplementedError


class ConstantSparsity(Schedule):
    """The same target sparsity at every pruning step from `begin_step` on.

    Args:
        sparsity: fraction of each kernel's weights set to zero, in [0, 1).
        begin_step: index of the first update after which masks are computed.
        end_step: the last such update (None: until training ends).
        frequency: masks are recomputed every this many updates.
    """

    def __init__(self, sparsity: float, begin_step: int = 0, end_step: int | None = None,
                 frequency: int = 100) -> None:
        _check_sparsity("sparsity", sparsity)
        super().__init__(begin_step, end_step, frequency)
        self.target = float(sparsity)

    def final_sparsity(self) -> float:
        return self.target

    def sparsity(self, step: int | tf.Tensor) -> float | tf.Tensor:
        return self.target if isinstance(step, int) else tf.constant(self.target, tf.float32)

    def __repr__(self) -> str:
        return (f"ConstantSparsity({self.target}, begin_step={self.begin_step}, "
                f"end_step={self.end_step}, frequency={self.frequency})")


class PolynomialDecay(Schedule):
    """Sparsity rising from `initial_sparsity` to `final_sparsity` between two updates.

    s(t) = s_f + (s_i - s_f) * (1 - (t - begin_step) / (end_step - begin_step)) ** power,
    clamped to [begin_step, end_step]: fast pruning while many redundant
    weights remain, slower near the end (Zhu & Gupta 2017, power 3).

    Example:
        ```python
        schedule = tapeworks.prune.PolynomialDecay(0.0, 0.8, begin_step=0, end_step=2000)
        ```
    """

    end_step: int   # never None here (checked in __init__)

    def __init__(self, initial_sparsity: float, final_sparsity: float, begin_step: int,
                 end_step: int, power: float = 3, frequency: int = 100) -> None:
        _check_sparsity("initial_sparsity", initial_sparsity)
        _check_sparsity("final_sparsity", final_sparsity)
        if end_step is None:
            raise ConfigError("`end_step` must be given for PolynomialDecay: it is the update "
                              "at which final_sparsity is reached. Received: end_step=None")
        if isinstance(power, bool) or not isinstance(power, (int, float)) or power <= 0:
            raise ConfigError(f"`power` must be a number > 0. Received: power={power!r}")
        super().__init__(begin_step, end_step, frequency)
        self.initial, self.final, self.power = float(initial_sparsity), float(final_sparsity), power

    def final_sparsity(self) -> float:
        return self.final

    def sparsity(self, step: int | tf.Tensor) -> float | tf.Tensor:
        span = self.end_step - self.begin_step
        if isinstance(step, int):
            done = min(max(step - self.begin_step, 0), span) / span
            return self.final + (self.initial - self.final) * (1 - done) ** self.power
        done = tf.clip_by_value(tf.cast(step - self.begin_step, tf.float32) / span, 0.0, 1.0)
        return self.final + (self.initial - self.final) * (1.0 - done) ** self.power

    def __repr__(self) -> str:
        return (f"PolynomialDecay({self.initial}, {self.final}, begin_step={self.begin_step}, "
                f"end_step={self.end_step}, power={self.power}, frequency={self.frequency})")
