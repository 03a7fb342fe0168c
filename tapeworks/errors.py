"""Errors raised by tapeworks.

Every error says what was wrong, what was expected, and how to fix it. They all
derive from `TapeworksError`, so callers can catch tapeworks' own complaints
without swallowing TensorFlow's.
"""


class TapeworksError(Exception):
    """Base class of every error tapeworks raises on purpose."""


class ConfigError(TapeworksError, ValueError):
    """An argument to a tapeworks API has a value it cannot accept."""


class KerasLoopInStepError(TapeworksError, RuntimeError):
    """`model.predict()` (or another Keras loop) was called inside a training step."""


class MissingGradientError(TapeworksError, ValueError):
    """One or more trainable variables received no gradient."""


class DataSpecError(TapeworksError, ValueError):
    """The data's structure, shapes or dtypes do not fit the model."""


class LossError(TapeworksError, ValueError):
    """The loss is not a floating-point scalar."""
