"""tapeworks: fast, correct and debuggable training for TensorFlow 2 / Keras 3."""

from tapeworks.engine import StepHooks, Trainer
from tapeworks.errors import (
    ConfigError,
    DataSpecError,
    KerasLoopInStepError,
    LossError,
    MissingGradientError,
    TapeworksError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataSpecError",
    "KerasLoopInStepError",
    "LossError",
    "MissingGradientError",
    "StepHooks",
    "TapeworksError",
    "Trainer",
]
