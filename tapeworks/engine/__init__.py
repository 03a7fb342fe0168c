"""The engine: the Trainer, the compiled step, and the choice of how to run it.

`Trainer` and `StepHooks` are imported on first use (PEP 562): the modules
that need no TensorFlow (`plan_cache`, `autotune`) can be imported alone, so
`tapeworks cache show` answers without TensorFlow's import of about 10 s.
"""

import importlib

_EXPORTS = {"StepHooks": "tapeworks.engine.step.updater", "Trainer": "tapeworks.engine.trainer"}

__all__ = ["StepHooks", "Trainer"]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tapeworks.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
