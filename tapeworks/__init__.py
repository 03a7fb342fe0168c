"""tapeworks: fast, correct and debuggable training for TensorFlow 2 / Keras 3.

Names are imported on first use (PEP 562), so that `tapeworks --help` and the
CLI can configure TensorFlow's logging before TensorFlow is imported.
"""

import importlib
from typing import TYPE_CHECKING

from tapeworks import xla_cache as _xla_cache

__version__ = "0.1.0"

# Before TensorFlow's runtime starts, or never: TensorFlow reads the flag once.
_xla_cache.enable()

_EXPORTS = {
    "Trainer": "tapeworks.engine.trainer",
    "Task": "tapeworks.engine.step.task",
    "StepHooks": "tapeworks.engine.step.updater",
    "CaptureCallback": "tapeworks.engine.step.capture",
    "StaticWeights": "tapeworks.engine.step.weighting",
    "ScheduledWeights": "tapeworks.engine.step.weighting",
    "UncertaintyWeighting": "tapeworks.engine.step.weighting",
    "GradNorm": "tapeworks.engine.step.weighting",
    "gradient_penalty": "tapeworks.engine.step.penalties",
    "TapeworksError": "tapeworks.errors",
    "ConfigError": "tapeworks.errors",
    "DataSpecError": "tapeworks.errors",
    "KerasLoopInStepError": "tapeworks.errors",
    "LossError": "tapeworks.errors",
    "MissingGradientError": "tapeworks.errors",
    "NonFiniteError": "tapeworks.engine.checks.nonfinite",
    "CheckpointError": "tapeworks.engine.resume.run_checkpoint",
    "TapeworksWarning": "tapeworks.errors",
    "CorrectnessWarning": "tapeworks.errors",
    "PerformanceWarning": "tapeworks.errors",
}

if TYPE_CHECKING:
    # What type checkers and the API reference (griffe) see; at run time the
    # names load on first use, through `__getattr__` below (hence noqa: F401).
    from tapeworks.engine.checks.nonfinite import NonFiniteError  # noqa: F401
    from tapeworks.engine.resume.run_checkpoint import CheckpointError  # noqa: F401
    from tapeworks.engine.step.capture import CaptureCallback  # noqa: F401
    from tapeworks.engine.step.penalties import gradient_penalty  # noqa: F401
    from tapeworks.engine.step.task import Task  # noqa: F401
    from tapeworks.engine.step.updater import StepHooks  # noqa: F401
    from tapeworks.engine.step.weighting import (  # noqa: F401
        GradNorm, ScheduledWeights, StaticWeights, UncertaintyWeighting)
    from tapeworks.engine.trainer import Trainer  # noqa: F401
    from tapeworks.errors import (  # noqa: F401
        ConfigError, CorrectnessWarning, DataSpecError, KerasLoopInStepError, LossError,
        MissingGradientError, PerformanceWarning, TapeworksError, TapeworksWarning)

# Subpackages, imported on first use too: `import tapeworks; tapeworks.data.pipeline`
# works whatever was imported before.
_SUBPACKAGES = ("bench", "data", "demo", "deploy", "distribute", "engine", "lint", "prune",
                "serve")

__all__ = sorted(_EXPORTS) + list(_SUBPACKAGES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"tapeworks.{name}")
    else:
        raise AttributeError(f"module 'tapeworks' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
